"""The plane claim: one lease row per space, with a fencing generation (DESIGN.md section 8).

A full auth service holds its space's plane claim, the row under key ``plane`` in bucket
``cotal_auth_<space>``. Replicas never touch it. This module is the pure half: the row codec and
the decisions. The shell (:mod:`cotal_trio.lane.plane`) reads and writes the row and passes the
time in.

Row (closed, version 1)::

    {"v": 1, "generation": 3, "holder": "host:1234:ab12cd34", "state": "held",
     "renewedAt": 1767225600.25, "leaseS": 15.0}

The rules, in times of one consistent clock:

* The holder renews every ``lease_s / 3``. When it has not renewed successfully for
  ``lease_s - margin_s`` it fences itself (:func:`must_fence`): its lane stops serving.
* A contender refuses while the row is ``held`` and fresh, and may reclaim it (generation + 1)
  only once it has gone unrenewed for a full lease (:func:`decide_acquire`). The holder fences
  ``margin_s`` before that point, which covers clock skew and the time a fenced lane takes to
  stop.
* A clean stop writes ``released`` (:func:`release`); the next holder takes over at once.

Every write is a compare-and-set on the row's revision, so of two contenders one wins and the
other reads again. An unreadable row is never overwritten: the operator must look at it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from cotal_trio.core import wire
from cotal_trio.core.errors import CodecError, ConfigError

__all__ = [
    "PLANE_KEY",
    "ROW_VERSION",
    "Acquire",
    "Lease",
    "PlaneRow",
    "PlaneState",
    "Refuse",
    "decide_acquire",
    "decide_renew",
    "must_fence",
    "parse_row",
    "plane_bucket",
    "release",
    "render_row",
]

ROW_VERSION = 1
PLANE_KEY = "plane"
_FIELDS = ("v", "generation", "holder", "state", "renewedAt", "leaseS")
_MAX_HOLDER = 256


def plane_bucket(space: str) -> str:
    """The KV bucket that holds ``space``'s plane claim (and its issuance rows):
    ``cotal_auth_<space>`` (:func:`cotal_trio.core.wire.auth_bucket`)."""
    return wire.auth_bucket(space)


class PlaneState(StrEnum):
    """Whether the claim is held or was released by a clean stop."""

    HELD = "held"
    RELEASED = "released"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_holder(holder: object) -> str:
    if not isinstance(holder, str) or not holder or len(holder) > _MAX_HOLDER:
        raise ValueError(f"holder must be a non-empty string of at most {_MAX_HOLDER} characters")
    if not holder.isprintable():
        raise ValueError("holder must be printable (no control characters)")
    return holder


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaneRow:
    """One plane claim row.

    Attributes:
        generation: the fencing generation (>= 1); every change of holder adds one.
        holder: who holds (or last held) the claim, e.g. ``host:pid:random``.
        state: held or released.
        renewed_at: wall time of the last write, unix seconds.
        lease_s: the holder's lease in seconds (> 0).

    Raises:
        ValueError: a field out of range (a caller bug; :func:`parse_row` raises CodecError).
    """

    generation: int
    holder: str
    state: PlaneState
    renewed_at: float
    lease_s: float

    def __post_init__(self) -> None:
        if type(self.generation) is not int or self.generation < 1:
            raise ValueError(f"generation must be an int >= 1, got {self.generation!r}")
        _check_holder(self.holder)
        if not isinstance(self.state, PlaneState):
            raise TypeError(f"state must be a PlaneState, got {self.state!r}")
        if not _is_number(self.renewed_at) or self.renewed_at < 0:
            raise ValueError(f"renewed_at must be finite unix seconds, got {self.renewed_at!r}")
        if not _is_number(self.lease_s) or self.lease_s <= 0:
            raise ValueError(f"lease_s must be a finite number > 0, got {self.lease_s!r}")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise CodecError(f"plane row has field {key!r} twice")
        out[key] = value
    return out


def _no_constant(name: str) -> object:
    raise CodecError(f"plane row contains {name}, which is not JSON")


def parse_row(data: bytes) -> PlaneRow:
    """Parse a stored plane row (closed JSON, version 1).

    Raises:
        CodecError: not UTF-8 JSON, an unknown version, a missing or extra field, or a value out
            of range. The message names what is wrong.
    """
    try:
        doc = json.loads(
            data.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"plane row is not UTF-8 JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CodecError("plane row is not a JSON object")
    if type(doc.get("v")) is not int or doc.get("v") != ROW_VERSION:
        raise CodecError(f"plane row has version {doc.get('v')!r}, expected {ROW_VERSION}")
    if set(doc) != set(_FIELDS):
        missing = sorted(set(_FIELDS) - set(doc))
        extra = sorted(set(doc) - set(_FIELDS))
        raise CodecError(f"plane row fields differ: missing {missing}, unknown {extra}")
    state = doc["state"]
    if not isinstance(state, str) or state not in {s.value for s in PlaneState}:
        raise CodecError(f"plane row state must be 'held' or 'released', got {state!r}")
    for name in ("renewedAt", "leaseS"):
        if not _is_number(doc[name]):
            raise CodecError(f"plane row {name} must be a finite number, got {doc[name]!r}")
    try:
        return PlaneRow(
            generation=doc["generation"],
            holder=doc["holder"],
            state=PlaneState(state),
            renewed_at=float(doc["renewedAt"]),
            lease_s=float(doc["leaseS"]),
        )
    except ValueError as exc:
        raise CodecError(f"plane row is out of range: {exc}") from exc


def render_row(row: PlaneRow) -> bytes:
    """The stored form of ``row``: compact JSON, fields in a fixed order."""
    doc = {
        "v": ROW_VERSION,
        "generation": row.generation,
        "holder": row.holder,
        "state": row.state.value,
        "renewedAt": float(row.renewed_at),
        "leaseS": float(row.lease_s),
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Lease:
    """Lease parameters of a holder.

    Attributes:
        lease_s: how long a row stays fresh without renewal (contenders wait this long).
        margin_s: the holder fences this long before its lease runs out.

    Raises:
        ConfigError: ``lease_s`` is not > 0, or ``margin_s`` is not in ``[0, 2/3 lease_s)``
            (the holder needs at least one renewal attempt before it fences).
    """

    lease_s: float = 15.0
    margin_s: float = 2.0

    def __post_init__(self) -> None:
        if not _is_number(self.lease_s) or self.lease_s <= 0:
            raise ConfigError(f"a plane lease must be a positive number of seconds, got {self.lease_s!r}")
        if not _is_number(self.margin_s) or not 0 <= self.margin_s < self.lease_s * 2 / 3:
            raise ConfigError(
                f"a plane lease margin must be at least 0 and under two thirds of the lease"
                f" ({self.lease_s} s), got {self.margin_s!r}"
            )

    @property
    def renew_every_s(self) -> float:
        """The renewal period: a third of the lease."""
        return self.lease_s / 3

    @property
    def fence_after_s(self) -> float:
        """How long after its last successful renewal a holder fences."""
        return self.lease_s - self.margin_s


@dataclass(frozen=True, slots=True)
class Acquire:
    """Write ``row``: ``create`` (no row) or ``update`` (compare-and-set on ``revision``)."""

    kind: Literal["create", "update"]
    row: PlaneRow
    revision: int | None = None


@dataclass(frozen=True, slots=True)
class Refuse:
    """The claim cannot be taken now; ``reason`` is the sentence shown to the operator.

    Attributes:
        reason: names the holder and when the claim may be reclaimed, or why the row is unusable.
        holder: the current holder, None when the row is unreadable.
        reclaim_at: the earliest time (the caller's clock) a reclaim may succeed if the holder
            stops renewing now; None when the row is unreadable.
    """

    reason: str
    holder: str | None = None
    reclaim_at: float | None = None


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.1f}".removesuffix(".0")


def decide_acquire(
    current: tuple[PlaneRow | bytes, int] | None, *, holder: str, now: float, lease: Lease
) -> Acquire | Refuse:
    """Decide how ``holder`` may take the claim, given the current row and its revision.

    ``current`` is None when the key has no live value; otherwise ``(row, revision)`` where the
    row may be the stored bytes (parsed here; unreadable bytes are refused, never overwritten).

    * no row: create generation 1;
    * ``released``: update to generation + 1;
    * ``held`` by ``holder`` itself: take it back at once with generation + 1 (an earlier
      start of the same lane, which its host has fully stopped before starting it again, e.g.
      after a broker outage that its release could not reach);
    * ``held`` and ``now - renewed_at < wait``: refuse, naming the holder;
    * ``held`` and unrenewed for ``wait`` or longer: reclaim with generation + 1.

    ``wait`` is the longer of the row's lease and ours, so a holder with a longer lease than
    ours is never reclaimed before it has fenced.
    """
    _check_holder(holder)
    if current is None:
        row = PlaneRow(
            generation=1, holder=holder, state=PlaneState.HELD, renewed_at=now, lease_s=lease.lease_s
        )
        return Acquire("create", row)
    stored, revision = current
    if isinstance(stored, bytes):
        try:
            stored = parse_row(stored)
        except CodecError as exc:
            return Refuse(
                f"the plane claim row is unreadable ({exc}) - inspect key {PLANE_KEY!r} in the"
                f" space's cotal_auth bucket and delete it once no auth service serves the space"
            )
    mine = PlaneRow(
        generation=stored.generation + 1,
        holder=holder,
        state=PlaneState.HELD,
        renewed_at=now,
        lease_s=lease.lease_s,
    )
    if stored.state is PlaneState.RELEASED or stored.holder == holder:
        return Acquire("update", mine, revision)
    wait = max(stored.lease_s, lease.lease_s)
    if now - stored.renewed_at < wait:
        return Refuse(
            f"space held by {stored.holder} (generation {stored.generation}) - stop that auth"
            f" service, or wait {_fmt_s(wait)} s after it stops renewing"
            f" (last renewed {_fmt_s(max(now - stored.renewed_at, 0.0))} s ago)",
            holder=stored.holder,
            reclaim_at=stored.renewed_at + wait,
        )
    return Acquire("update", mine, revision)


def decide_renew(mine: PlaneRow, *, now: float, lease: Lease) -> PlaneRow:
    """The row a holder writes to renew: same generation and holder, ``renewed_at = now``.

    Raises:
        ValueError: ``mine`` is not held (a released claim is not renewed).
    """
    if mine.state is not PlaneState.HELD:
        raise ValueError("only a held claim is renewed")
    return replace(mine, renewed_at=now, lease_s=lease.lease_s)


def must_fence(last_renewed_at: float, *, now: float, lease: Lease) -> bool:
    """True once the holder has gone ``lease_s - margin_s`` without a successful renewal.

    Contenders wait a full lease, so a holder that fences here stops before any may reclaim.
    Both times come from one clock (the shell uses trio time).
    """
    return now >= last_renewed_at + lease.fence_after_s


def release(mine: PlaneRow) -> PlaneRow:
    """The row a clean stop writes: same generation and holder, ``released``."""
    return replace(mine, state=PlaneState.RELEASED)
