"""A space's stores at the replica count its manifest entry asks for (issue 17 item 1).

The full lane creates every store of its space at the entry's ``replicas`` and scales an existing
one up to it (``ensure_*`` of :mod:`.records`, :mod:`.streams`, :mod:`.issued` and the plane
claim's bucket, each through :func:`~cotal_trio.natsio.ensure_stream` /
:func:`~cotal_trio.natsio.ensure_bucket`). This module is what is shared around that:

* :func:`space_stream_names`: every JetStream stream of a space (docs/wire-layout.md), the
  twelve the lane creates.
* :func:`placing`: the broker's refusal of a count it cannot place
  (:class:`~cotal_trio.natsio.NoPlacement`: a single node and ``replicas`` above 1, err_code
  10074; a cluster with fewer nodes, err_code 10005) as one sentence naming the fix.
* :func:`read_store_replicas`: each existing stream's replica count and leader (``STREAM.INFO``
  ``config.num_replicas`` and ``cluster.leader``), for the lane's start and for ``cotal doctor
  auth`` / ``cotal status``.
* :func:`above_wanted` / :func:`below_wanted`: the stores whose count differs from the entry's.

**Scaling down is not done.** A store with more copies than ``replicas`` is left as it is and the
lane logs one warning naming it: a surplus costs disk, never availability, and a root that
followed the earlier hand-scaling recipe (R3 stores, no ``replicas`` in its entry) keeps its
copies instead of losing them on the next start. Lowering a count is the operator's step
(``nats stream edit <stream> --replicas N``).

Every async function here is trio-flavoured and a checkpoint, bounded by the caller's deadline.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from cotal_trio.core import wire
from cotal_trio.core.errors import ConfigError
from cotal_trio.natsio import Connection, NoPlacement, StreamNotFound, js_api

__all__ = [
    "StoreReplicas",
    "above_wanted",
    "below_wanted",
    "placing",
    "read_store_replicas",
    "space_stream_names",
    "unplaceable",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreReplicas:
    """One stream's copies as ``STREAM.INFO`` reports them.

    Attributes:
        stream: the stream's name (``KV_cotal_auth_<S>``, ``COTAL_CHAT_<S>``, ...).
        replicas: its ``config.num_replicas`` (1..5).
        leader: the node that leads it (``cluster.leader``; a single node reports its server
            name or id), or None while it has no leader (an election, a lost quorum).
        current: how many of its other copies are current (``cluster.replicas[].current``).
    """

    stream: str
    replicas: int
    leader: str | None
    current: int

    def to_json(self) -> dict[str, object]:
        """``{"stream", "replicas", "leader", "current"}``."""
        return {"stream": self.stream, "replicas": self.replicas, "leader": self.leader, "current": self.current}


def space_stream_names(space: str) -> tuple[str, ...]:
    """Sync: every stream of ``space``'s data account the full lane creates, sorted: the auth,
    records, sessions, issued, accepted, presence, channel-registry and admission buckets' ``KV_`` streams and the
    four message streams (docs/wire-layout.md).

    Raises:
        Refused: a bad space name.
    """
    buckets = (
        wire.auth_bucket(space), wire.records_bucket(space), wire.sessions_bucket(space), wire.issued_bucket(space),
        wire.accepted_bucket(space), wire.presence_bucket(space), wire.channels_bucket(space),
        wire.admission_bucket(space),
    )  # fmt: skip
    return tuple(sorted([*(wire.kv_stream(b) for b in buckets), *(s.name for s in wire.all_streams(space))]))


def unplaceable(space: str, replicas: int, exc: NoPlacement) -> ConfigError:
    """Sync: the sentence for a count the broker cannot place (``exc`` names the stream and the
    broker's words)."""
    return ConfigError(
        f"space {space} asks for replicas {replicas}, and the broker cannot place {replicas} copies of a store"
        f" ({exc}) - lower \"replicas\" in the space's entry of spaces.json (`cotal space add {space} --replicas 1`"
        f" on a single node), or run a cluster of at least {replicas} nodes"
    )


@contextmanager
def placing(space: str, replicas: int) -> Iterator[None]:
    """Sync context: a :class:`~cotal_trio.natsio.NoPlacement` inside becomes
    :func:`unplaceable`'s ConfigError (the lane's start refuses with it).

    Raises:
        ConfigError: the broker refused to place ``replicas`` copies.
    """
    try:
        yield
    except NoPlacement as exc:
        raise unplaceable(space, replicas, exc) from exc


async def read_store_replicas(conn: Connection, space: str) -> list[StoreReplicas]:
    """Trio: each existing stream of ``space`` (:func:`space_stream_names`) with its replica count
    and leader, in name order; a stream that does not exist is left out.

    Args:
        conn: a data-account connection allowed ``STREAM.INFO`` of the streams (the full lane's
            store user; a CLI's short-lived admin user).

    Raises:
        Unavailable: the broker or JetStream did not answer, or refused.
    """
    found = []
    for name in space_stream_names(space):
        try:
            info = await js_api(conn, wire.js_stream_info(name))
        except StreamNotFound:
            continue
        found.append(_replicas_of(name, info))
    return found


def _replicas_of(name: str, info: dict) -> StoreReplicas:
    config, cluster = info.get("config") or {}, info.get("cluster") or {}
    count = config.get("num_replicas")
    peers = cluster.get("replicas") or []
    return StoreReplicas(
        stream=name, replicas=count if isinstance(count, int) and count >= 1 else 1,
        leader=cluster.get("leader") or None,
        current=sum(1 for peer in peers if isinstance(peer, dict) and peer.get("current") is True),
    )  # fmt: skip


def above_wanted(stores: Sequence[StoreReplicas], replicas: int) -> list[StoreReplicas]:
    """Sync: the stores with more copies than ``replicas`` (left as they are: module docstring)."""
    return [s for s in stores if s.replicas > replicas]


def below_wanted(stores: Sequence[StoreReplicas], replicas: int) -> list[StoreReplicas]:
    """Sync: the stores with fewer copies than ``replicas`` (the next full-lane start scales them)."""
    return [s for s in stores if s.replicas < replicas]
