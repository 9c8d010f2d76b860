"""The CLI's view of each space's stores: replica count and leader (issue 17 item 1).

``cotal doctor auth`` lists every store of a space with its count and leader and finds the ones
below the count the space's ``spaces.json`` entry asks for; ``cotal status`` prints one compact
summary per space (:func:`summary`). Both read through :func:`read_spaces_stores`: per space, a
60-second data-account admin user (:func:`~cotal_trio.broker.spaces.open_space_admin`) asks
``STREAM.INFO`` of each of the space's streams (:func:`~cotal_trio.stores.replicas.read_store_replicas`).
Nothing is written or changed: scaling is the full lane's, at its start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import trio

from cotal_trio import natsio
from cotal_trio.broker.spaces import hosted_entries, open_space_admin
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.state import RootPaths, load_space
from cotal_trio.stores.replicas import StoreReplicas, below_wanted, read_store_replicas

__all__ = ["READ_S", "SpaceStores", "read_spaces_stores", "summary"]

# The whole read, every space (seconds): each store answers in milliseconds.
READ_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceStores:
    """One space's stores as the broker reports them.

    Attributes:
        space: the space.
        wanted: its ``spaces.json`` entry's ``replicas``, or None (not hosted there: a static
            space, or a root served from another manifest).
        stores: each existing store, in name order (empty: the full lane never ran).
        error: why they could not be read (a sentence), else None.
    """

    space: str
    wanted: int | None
    stores: tuple[StoreReplicas, ...] = ()
    error: str | None = None

    @property
    def below(self) -> list[StoreReplicas]:
        """The stores with fewer copies than ``wanted`` (none when nothing is wanted)."""
        return [] if self.wanted is None else below_wanted(self.stores, self.wanted)

    def to_json(self) -> dict[str, object]:
        """``{"wanted", "stores": [{"stream", "replicas", "leader", "current"}], "error"}``."""
        return {"wanted": self.wanted, "stores": [s.to_json() for s in self.stores], "error": self.error}


def summary(found: SpaceStores) -> str:
    """Sync: ``stores R3 (leader n2)`` - the counts (``R1/R3`` when they differ), the leaders,
    and ``, 2 below replicas 3`` when some store has fewer copies than wanted; ``stores: none``
    before the full lane made any; ``stores: unread (<why>)`` when the read failed."""
    if found.error is not None:
        return f"stores: unread ({found.error})"
    if not found.stores:
        return "stores: none"
    counts = "/".join(f"R{n}" for n in sorted({s.replicas for s in found.stores}))
    leaders = sorted({s.leader or "none" for s in found.stores})
    text = f"stores {counts} ({'leader' if len(leaders) == 1 else 'leaders'} {', '.join(leaders)})"
    if found.below:
        text += f", {len(found.below)} below replicas {found.wanted}"
    return text


def _wanted(paths: RootPaths) -> dict[str, int]:
    try:
        return {e.space: e.replicas for e in hosted_entries(paths)}
    except ConfigError:
        return {}  # a refused spaces.json is its own finding / line; the counts are still shown


async def read_spaces_stores(paths: RootPaths, url: str, spaces: Sequence[str], *, now: float) -> list[SpaceStores]:
    """Trio: each space's stores at the broker ``url``, in ``spaces`` order; bounded by
    :data:`READ_S` in all. A space whose material cannot be read, or whose read fails or runs
    out of time, carries its ``error`` sentence (nothing is raised for it).

    Opens its own :func:`~cotal_trio.natsio.open_loop`.
    """
    wanted = await trio.to_thread.run_sync(_wanted, paths)
    found: dict[str, SpaceStores] = {
        space: SpaceStores(space=space, wanted=wanted.get(space), error=f"the broker did not answer within {READ_S:g} s")
        for space in spaces
    }  # fmt: skip
    with trio.move_on_after(READ_S):
        async with natsio.open_loop():
            for space in spaces:
                found[space] = await _read_one(paths, url, space, wanted.get(space), now=now)
    return [found[space] for space in spaces]


async def _read_one(paths: RootPaths, url: str, space: str, wanted: int | None, *, now: float) -> SpaceStores:
    try:
        material = await trio.to_thread.run_sync(load_space, paths.space(space).callout_json, space)
        async with open_space_admin(url, material, now=now) as conn:
            stores = await read_store_replicas(conn, space)
    except (ConfigError, Unavailable) as exc:
        return SpaceStores(space=space, wanted=wanted, error=str(exc))
    except BaseExceptionGroup as group:  # natsio's nurseries may wrap a connect's refusal
        leaf = next((e for e in _leaves(group) if isinstance(e, (ConfigError, Unavailable))), None)
        if leaf is None:
            raise
        return SpaceStores(space=space, wanted=wanted, error=str(leaf))
    return SpaceStores(space=space, wanted=wanted, stores=tuple(stores))


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]
