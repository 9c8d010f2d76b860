"""The provisioner's I/O: a space's message streams, its presence, channel-registry and admission
buckets, and the bind-only durables and readers (issue 6 items 1-2, issue 19 item 4; spec
credential-authority "Provisioning"; docs/wire-layout.md).

Names and subjects all come from :mod:`cotal_trio.core.wire`; the connection is expected to hold
the ``provisioner`` profile (:func:`~cotal_trio.core.profiles.provisioner_permissions`), which
suffices for everything here and deletes nothing.

* :func:`ensure_space_streams`: ``COTAL_CHAT_<S>``, ``COTAL_DM_<S>``, ``COTAL_TASK_<S>``,
  ``COTAL_RUN_<S>`` (:func:`message_stream_shape`), the presence bucket ``cotal_presence_<S>``
  (KV, history 1, direct get on: agents read the roster by direct get), the channel registry
  ``cotal_channels_<S>`` (KV, history 1, no direct get: agents watch it) and the admission store
  ``cotal_admission_<S>`` (:func:`admission_shape`: write-once, no delete, no purge, direct get).
* :func:`ensure_dm_inbox`, :func:`ensure_task_queue`, :func:`ensure_replay`,
  :func:`ensure_delivery_durables`: the pull durables a principal, a role, a run or the delivery
  daemon binds (:data:`DURABLE_CONFIG`); an existing one with another configuration is refused.
* :func:`ensure_watches`, :func:`ensure_history_readers`: an agent's presence and channel-registry
  watch readers (:data:`WATCH_CONFIG`) and an observer's or admin's ``hist__<nonce>`` history
  readers (:data:`HISTORY_CONFIG`), pull-only: those profiles create no consumer, because a
  create grant cannot bound a push consumer's deliver subject (docs/wire-layout.md "Watches and
  history readers").

DM confidentiality (spec "Profiles") rests on these durables existing before their owner binds
them: the ``agent`` profile may pull and ack its own inbox durable but holds no consumer create or
delete on the DM stream, so it cannot make a consumer filtered to someone else's inbox.

Every async function here is trio-flavoured and a checkpoint, bounded by the caller's deadline.
Errors: :class:`~cotal_trio.natsio.StreamDrift` / :class:`~cotal_trio.natsio.ConsumerDrift`
(``ConfigError``: an existing object of another shape, named with the fix),
:class:`~cotal_trio.core.errors.Unavailable` (the broker), ``Refused`` (a bad name).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from cotal_trio.core import wire
from cotal_trio.core.ledger import LedgerRow
from cotal_trio.natsio import Connection, StreamShape, ensure_bucket, ensure_consumer, ensure_stream

__all__ = [
    "ACK_WAIT_S",
    "DURABLE_CONFIG",
    "HISTORY_CONFIG",
    "WATCH_CONFIG",
    "admission_shape",
    "ensure_delivery_durables",
    "ensure_dm_inbox",
    "ensure_durable",
    "ensure_history_readers",
    "ensure_replay",
    "ensure_space_streams",
    "ensure_task_queue",
    "ensure_watches",
    "message_stream_shape",
]

# A delivery not acked within this long is delivered again. Seconds.
ACK_WAIT_S = 30
DURABLE_CONFIG: MappingProxyType[str, Any] = MappingProxyType({
    "ack_policy": "explicit",
    "deliver_policy": "all",
    "replay_policy": "instant",
    "ack_wait": ACK_WAIT_S * 1_000_000_000,
    "max_deliver": -1,
    "max_ack_pending": 1000,
})  # fmt: skip
"""Every bind-only durable: a pull consumer (no deliver subject), explicit acks, from the start."""

WATCH_CONFIG: MappingProxyType[str, Any] = MappingProxyType({
    "ack_policy": "none",
    "deliver_policy": "last_per_subject",
    "replay_policy": "instant",
})  # fmt: skip
"""A watch reader: a pull consumer that delivers each key's last value, then every change, and
takes no acks (a watch re-reads nothing; spec "Profiles", the agent's watches)."""

HISTORY_CONFIG: MappingProxyType[str, Any] = MappingProxyType({
    "ack_policy": "none",
    "deliver_policy": "all",
    "replay_policy": "instant",
})  # fmt: skip
"""A history reader: a pull consumer from the stream's first message that takes no acks (spec
"Profiles", the observer's and admin's ``hist__`` readers)."""


def message_stream_shape(stream: wire.Stream) -> StreamShape:
    """Sync: a message stream's shape: file storage, no limits, no direct get (nobody reads
    these by direct get), message deletes and purges allowed (history purges), no rollups."""
    return StreamShape(
        name=stream.name, subjects=(stream.subject,), allow_direct=False, max_msgs_per_subject=-1,
        deny_delete=False, deny_purge=False,
    )  # fmt: skip


def admission_shape(space: str) -> StreamShape:
    """Sync: the admission store ``KV_cotal_admission_<S>``: one message per key, refused once
    the key holds it (write-once, so a ``run-admitter``'s write is a create), no message delete,
    no purge, no rollup, direct get on (per-key reads), per-message TTLs allowed."""
    bucket = wire.admission_bucket(space)
    return StreamShape(
        name=wire.kv_stream(bucket), subjects=(wire.kv_subject(bucket, ">"),), allow_direct=True,
        max_msgs_per_subject=1, discard_new_per_subject=True,
    )  # fmt: skip


async def ensure_space_streams(conn: Connection, space: str, *, replicas: int = 1) -> None:
    """Trio: create (or verify) the space's four message streams, presence bucket, channel
    registry and admission store, at ``replicas`` copies (an existing one is scaled up to it; issue 17 item 1). Idempotent.

    The durables made later on these streams follow their stream's count (no ``num_replicas``
    in :data:`DURABLE_CONFIG`), and the broker scales them with it.

    Raises:
        StreamDrift: a stream exists with another shape.
        ConfigError: the presence bucket exists with another ``allow_direct``/``allow_msg_ttl``.
        Refused: a bad space name.
        NoPlacement: the broker cannot place ``replicas`` copies.
        Unavailable: the broker or JetStream did not answer, or refused.
    """
    for stream in wire.all_streams(space):
        await ensure_stream(conn, message_stream_shape(stream), replicas=replicas)
    await ensure_bucket(conn, wire.presence_bucket(space), history=1, direct=True, allow_msg_ttl=True, replicas=replicas)
    await ensure_bucket(conn, wire.channels_bucket(space), history=1, direct=False, allow_msg_ttl=False, replicas=replicas)
    await ensure_stream(conn, admission_shape(space), replicas=replicas)


async def ensure_durable(conn: Connection, durable: wire.Durable, config: Mapping[str, Any] = DURABLE_CONFIG) -> None:
    """Trio: create (or verify) one bind-only pull durable with ``config`` (:data:`DURABLE_CONFIG`,
    :data:`WATCH_CONFIG` or :data:`HISTORY_CONFIG`); one that has a deliver subject is drift.

    Raises:
        ConsumerDrift: it exists with another configuration.
        Unavailable: its stream is missing, or the broker did not answer, or refused.
    """
    await ensure_consumer(conn, durable.stream, durable.name, durable.filter_subject, config)


async def ensure_watches(conn: Connection, space: str, owner: str, actor: str) -> tuple[wire.Durable, ...]:
    """Trio: a principal's two watch readers, ``watch-presence-<owner>-<actor>`` and
    ``watch-channels-<owner>-<actor>`` (:data:`WATCH_CONFIG`); returns them.

    Raises: as :func:`ensure_durable`.
    """
    durables = tuple(wire.watch_durable(space, kind, owner, actor) for kind in ("presence", "channels"))
    for durable in durables:
        await ensure_durable(conn, durable, WATCH_CONFIG)
    return durables


async def ensure_history_readers(conn: Connection, space: str, inbox_nonce: str, profile: str) -> tuple[wire.Durable, ...]:
    """Trio: the ``hist__<nonce>`` history readers of a credential of ``profile`` (:data:`HISTORY_CONFIG`):
    on chat for an ``observer``, on chat and DM for an ``admin``; returns them.

    Raises:
        ValueError: ``profile`` is neither ``observer`` nor ``admin``.
        ConsumerDrift, Unavailable: as :func:`ensure_durable`.
    """
    kinds = {"observer": ("chat",), "admin": ("chat", "dm")}.get(profile)
    if kinds is None:
        raise ValueError(f"history readers belong to an observer or an admin, not {profile!r}")
    durables = tuple(wire.history_reader(space, kind, inbox_nonce) for kind in kinds)
    for durable in durables:
        await ensure_durable(conn, durable, HISTORY_CONFIG)
    return durables


async def ensure_dm_inbox(conn: Connection, space: str, owner: str, actor: str, uid: str | None = None) -> wire.Durable:
    """Trio: the DM inbox durable ``dm-<owner>-<actor>`` of one principal (with ``uid``, a static
    agent's lifecycle UID: ``dm-<owner>-<actor>-<uid>``, :func:`~cotal_trio.core.wire.dm_durable`);
    returns it."""
    durable = wire.dm_durable(space, owner, actor, uid)
    await ensure_durable(conn, durable)
    return durable


async def ensure_task_queue(conn: Connection, space: str, role: str) -> wire.Durable:
    """Trio: the task queue durable ``task-<role>`` of one role; returns it."""
    durable = wire.task_durable(space, role)
    await ensure_durable(conn, durable)
    return durable


async def ensure_replay(conn: Connection, space: str, run_id: str) -> wire.Durable:
    """Trio: the replay durable ``replay-<runId>`` of one workflow run; returns it."""
    durable = wire.replay_durable(space, run_id)
    await ensure_durable(conn, durable)
    return durable


async def ensure_delivery_durables(conn: Connection, space: str) -> tuple[wire.Durable, ...]:
    """Trio: the delivery daemon's fan-out durables ``delivery-chat`` and ``delivery-dm``."""
    durables = tuple(wire.delivery_durable(space, kind) for kind in ("chat", "dm"))
    for durable in durables:
        await ensure_durable(conn, durable)
    return durables


class Provisioner:
    """The provisioner's per-principal step for one lane start (spec credential-authority
    "Provisioning"): before a principal's first agent bearer, its bind-only DM inbox durable, its
    presence and channel-registry watch readers and its role's task-queue durable exist.

    Each principal (and role) is ensured once per lane start; a failure is not remembered, so the
    next exchange tries again.

    Args:
        conn: a data-account connection allowed the ``provisioner`` profile's lists (the full
            lane's store user, :func:`~cotal_trio.lane.service_users.store_permissions`).
        space: the space.
    """

    def __init__(self, conn: Connection, space: str) -> None:
        self._conn, self._space = conn, space
        self._done: set[tuple[str, str, str | None]] = set()

    async def principal(self, row: LedgerRow) -> None:
        """Trio: ensure ``row``'s DM inbox, its two watch readers and, with a role, its task queue
        (idempotent).

        Raises:
            Unavailable: the broker or JetStream did not answer or refused.
            ConfigError: a durable exists with another shape (it is never changed).
        """
        key = (row.owner, row.actor, row.role)
        if key in self._done:
            return
        await ensure_dm_inbox(self._conn, self._space, row.owner, row.actor)
        await ensure_watches(self._conn, self._space, row.owner, row.actor)
        if row.role is not None:
            await ensure_task_queue(self._conn, self._space, row.role)
        self._done.add(key)
