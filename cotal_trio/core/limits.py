"""Connect limits: token buckets per actor, per owner and per client host (spec "Connect limits").

The auth service limits how often each principal may connect, so one client stuck in a
reconnect loop cannot spend the callout for everyone else in the space. Each lane keeps one
:class:`ConnectLimiter` (one set of buckets per space and process) shared by its callout and its
exchange faces:

* a bearer whose **signature verifies** is charged to its actor (``<owner>.<actor>``) and to its
  owner, even when it has expired (:func:`cotal_trio.core.callout.check_connect`, which validates
  the bearer and charges these buckets);
* a bearer that **does not verify** (or no bearer at all) is charged to the client host the
  broker reports (``client_info.host``), and to nothing else;
* a bucket holds one minute's allowance (:class:`ConnectLimits`: 60 per actor, 600 per owner,
  60 per host) and refills continuously at that rate, ``per_minute / 60`` connects a second;
* a connect passes only when every bucket it draws on holds a whole connect, and then takes
  one from each; a refused connect spends nothing (all or nothing);
* the exchange only peeks (:meth:`ConnectLimiter.peek_principal`): it never spends a connect.

**Bounded tables, and why a drained bucket is never reset.** Each of the three tables holds at
most ``max_buckets`` buckets, kept in the order of their last spend. A bucket is only ever
evicted once it has refilled to capacity: forgetting it then hands back exactly the allowance
it already has, so a limiter with bounded tables admits precisely what one with unbounded
tables would. Only the least recently spent bucket is looked at (O(1) per connect); it is the
one spent longest ago, and any bucket is full at most one minute after its last spend. When a
new key arrives while its table is full and that bucket has not refilled yet, the connect is
refused (``table_full``) rather than any drained bucket being reset; its ``retry-after`` is the
time until that bucket is full, at most a minute. Reaching that takes ``max_buckets`` distinct
keys each spending within one minute; the host table, which unverified callers can fill, only
ever charges connects that are denied anyway.

Pure and synchronous: the caller passes the time in (``now``, seconds on any monotonic clock;
the lane uses trio's), so tests drive it with plain numbers. A clock that steps back refills
nothing and takes nothing back.
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from dataclasses import dataclass

from .errors import ConfigError, RateLimited
from .identity import principal
from .jose import shown
from .natsjwt import MAX_CLIENT_HOST_CHARS, is_plain_host

__all__ = [
    "DEFAULT_LIMITS",
    "PERIOD_S",
    "REPLICA_LIMITS",
    "BucketTable",
    "ConnectLimiter",
    "ConnectLimits",
    "Limit",
    "Limited",
    "LimiterStatistics",
]

# A bucket holds one period's allowance and refills over one period (spec: "a minute's allowance").
PERIOD_S = 60.0
# A replica limits at the defaults (spec: "A replica limits at the defaults"; "No flag sets them").
REPLICA_LIMITS = (
    "a callout-only replica limits connects at the defaults - drop its connect limits,"
    " or run the full auth service with them"
)
# Float noise (a wait of 1.0000000002 s) must not round a whole second up to the next one.
_RETRY_EPSILON_S = 1e-6


class Limit(enum.StrEnum):
    """Which bucket ran out; the exchange's 429 names it as ``limit``."""

    ACTOR = "actor"
    OWNER = "owner"
    HOST = "host"


def _positive_int(value: object, name: str) -> None:
    if type(value) is not int or value <= 0:
        raise ConfigError(f"connect limits: {name} must be a positive whole number, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectLimits:
    """``connectLimits`` of the spec, for a hosted composition (``FullLane.connect_limits``).

    No flag sets them, and a callout replica always uses the defaults.

    Attributes:
        actor_per_minute: connects a minute per actor ``<owner>.<actor>`` (default 60).
        owner_per_minute: connects a minute per owner, across all its actors (default 600).
        host_per_minute: connects a minute per client host with a bearer that does not verify
            (default 60).
        max_buckets: the most buckets each of the three tables keeps (default 16384); see the
            module docstring for what happens when one is full.

    Raises:
        ConfigError: a value that is not a positive whole number.
    """

    actor_per_minute: int = 60
    owner_per_minute: int = 600
    host_per_minute: int = 60
    max_buckets: int = 16384

    def __post_init__(self) -> None:
        for name in ("actor_per_minute", "owner_per_minute", "host_per_minute", "max_buckets"):
            _positive_int(getattr(self, name), name)

    def per_minute(self, limit: Limit) -> int:
        """The allowance (bucket capacity) of ``limit``'s buckets, connects a minute."""
        return {Limit.ACTOR: self.actor_per_minute, Limit.OWNER: self.owner_per_minute}.get(
            limit, self.host_per_minute
        )


DEFAULT_LIMITS = ConnectLimits()


class _Bucket:
    """``tokens`` as of ``stamp`` (seconds); the level at a later time adds the refill."""

    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens, self.stamp = tokens, stamp


class BucketTable:
    """Token buckets of one kind, one per key, at most ``max_buckets`` of them.

    A bucket holds ``per_minute`` connects and refills at ``per_minute / 60`` a second. A key
    without a bucket is full. Buckets are ordered by their last spend; only a full bucket is
    ever evicted (module docstring).

    Raises:
        ConfigError: ``per_minute`` or ``max_buckets`` is not a positive whole number.
    """

    __slots__ = ("_buckets", "_capacity", "_max_buckets", "_rate")

    def __init__(self, per_minute: int, max_buckets: int) -> None:
        _positive_int(per_minute, "per_minute")
        _positive_int(max_buckets, "max_buckets")
        self._capacity = float(per_minute)
        self._rate = per_minute / PERIOD_S  # connects a second
        self._max_buckets = max_buckets
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    @property
    def capacity(self) -> int:
        """Connects a full bucket holds (one minute's allowance)."""
        return int(self._capacity)

    def _level(self, bucket: _Bucket, now: float) -> float:
        refill = max(0.0, now - bucket.stamp) * self._rate
        return min(self._capacity, bucket.tokens + refill)

    def level(self, key: str, now: float) -> float:
        """Connects ``key``'s bucket holds at ``now``, in ``[0, capacity]`` (capacity if none)."""
        bucket = self._buckets.get(key)
        return self._capacity if bucket is None else self._level(bucket, now)

    def wait_s(self, key: str, now: float) -> tuple[float, bool]:
        """Seconds from ``now`` until ``key`` may spend one connect, and whether the wait is
        for room in a full table (``0.0`` when it may spend now)."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            return max(0.0, 1.0 - self._level(bucket, now)) / self._rate, False
        if len(self._buckets) < self._max_buckets:
            return 0.0, False
        oldest = next(iter(self._buckets.values()))
        wait_s = (self._capacity - self._level(oldest, now)) / self._rate
        return wait_s, wait_s > 0.0

    def spend(self, key: str, now: float) -> None:
        """Take one connect from ``key``'s bucket; the caller saw ``wait_s(key, now)`` be 0.

        A new key evicts the least recently spent bucket when the table is full (it is full
        too, which ``wait_s`` checked).
        """
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self._max_buckets:
                self._buckets.popitem(last=False)
            bucket = self._buckets[key] = _Bucket(self._capacity, now)
        bucket.tokens = self._level(bucket, now) - 1.0
        bucket.stamp = max(bucket.stamp, now)
        self._buckets.move_to_end(key)

    def __len__(self) -> int:
        return len(self._buckets)

    def __contains__(self, key: object) -> bool:
        return key in self._buckets


def _retry_after(wait_s: float) -> int:
    return max(1, math.ceil(wait_s - _RETRY_EPSILON_S))


@dataclass(frozen=True, slots=True, kw_only=True)
class Limited:
    """A refused connect (or a peek that would be refused): which bucket, and for how long.

    Attributes:
        limit: the bucket that ran out (of those the connect draws on, the one with the
            longest wait; the owner's on a tie).
        retry_after_s: whole seconds, at least 1, until every bucket the connect draws on has
            a connect again, if nothing else spends it first.
        per_minute: that bucket's allowance.
        table_full: the key had no bucket and its table is full of buckets still refilling.
        owner, actor: the principal (``None`` for the host bucket).
        host: the client host (``None`` for a principal).
    """

    limit: Limit
    retry_after_s: int
    per_minute: int
    table_full: bool = False
    owner: str | None = None
    actor: str | None = None
    host: str | None = None

    def _who(self) -> str:
        if self.limit is Limit.HOST:  # a plain host as it is; anything else JSON-quoted, ASCII
            host = self.host or "-"
            return f"host={host if is_plain_host(host) else shown(host)}"
        return f"actor={self.actor} owner={self.owner}"

    def _why(self) -> str:
        n = self.retry_after_s
        if self.table_full:
            return f"every {self.limit} bucket this auth service keeps was spent within the last minute - retry after {n}s"
        if self.limit is Limit.HOST:
            return (
                f"more than {self.per_minute} connects a minute from this host with a bearer that does not"
                f" verify - exchange a fresh bearer from this space's auth service and retry after {n}s"
            )
        if self.limit is Limit.ACTOR:
            return f"this actor connected more than {self.per_minute} times a minute - stop its reconnect loop and retry after {n}s"
        return (
            f"this owner's actors connected more than {self.per_minute} times a minute - stop their"
            f" reconnect loops and retry after {n}s"
        )

    def reason(self) -> str:
        """The callout denial: ``RATE_LIMITED retry-after <n>s actor=<a> owner=<o> limit=<b>: <why>``
        (``host=<h>`` instead of actor and owner for the host bucket)."""
        return f"RATE_LIMITED retry-after {self.retry_after_s}s {self._who()} limit={self.limit}: {self._why()}"

    def sentence(self) -> str:
        """The exchange's 429 ``error`` sentence (actor or owner bucket), naming the fix."""
        n = self.retry_after_s
        if self.table_full:
            return (
                f'actor "{self.actor}" cannot connect now: every {self.limit} bucket this auth service keeps'
                f" was spent within the last minute - retry after {n}s"
            )
        if self.limit is Limit.ACTOR:
            return (
                f'actor "{self.actor}" connected more than {self.per_minute} times in the last minute - stop its'
                f" reconnect loop and retry after {n}s"
            )
        return (
            f"the actors of owner {self.owner} connected more than {self.per_minute} times in the last minute,"
            f' actor "{self.actor}" included - stop their reconnect loops and retry after {n}s'
        )

    def error(self) -> RateLimited:
        """This refusal as the typed error the callout and the exchange answer."""
        return RateLimited(
            self.sentence() if self.limit is not Limit.HOST else self.reason(),
            callout_reason=self.reason(), limit=str(self.limit), retry_after_s=self.retry_after_s,
            owner=self.owner, actor=self.actor,
        )  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class LimiterStatistics:
    """A snapshot of one lane's connect limits (STYLE.md practice 11).

    Attributes:
        buckets: buckets held per table, ``{"actor": n, "owner": n, "host": n}``.
        denied: refused charges per bucket that ran out, since the lane started.
    """

    buckets: dict[str, int]
    denied: dict[str, int]


class ConnectLimiter:
    """One lane's connect limits: three :class:`BucketTable` and the all-or-nothing charge.

    Args:
        limits: the allowances and the table bound (default: the spec's).
    """

    def __init__(self, limits: ConnectLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._tables = {limit: BucketTable(limits.per_minute(limit), limits.max_buckets) for limit in Limit}
        self._denied = dict.fromkeys(Limit, 0)

    def charge_principal(self, owner: str, actor: str, now: float) -> Limited | None:
        """Charge one connect to the actor and its owner, both or neither.

        Args:
            owner, actor: the principal of a bearer whose signature verified.
            now: seconds, monotonic.

        Returns:
            ``None`` when it passed (one connect taken from each), else the :class:`Limited`
            refusal (nothing taken).
        """
        return self._draw(((Limit.ACTOR, principal(owner, actor)), (Limit.OWNER, owner)), now, owner=owner, actor=actor)

    def charge_host(self, host: str, now: float) -> Limited | None:
        """Charge one connect with a bearer that does not verify to the client ``host``.

        Returns:
            ``None`` when it passed (one connect taken), else the refusal (nothing taken).
        """
        host = host[:MAX_CLIENT_HOST_CHARS]  # the key is bounded whoever decoded the request
        return self._draw(((Limit.HOST, host),), now, host=host)

    def peek_principal(self, owner: str, actor: str, now: float) -> Limited | None:
        """What :meth:`charge_principal` would answer at ``now``, spending and counting nothing.

        The exchange asks this (spec: "While an actor or its owner is limited, ``POST
        /exchange`` for that actor answers 429").
        """
        return self._limited(((Limit.ACTOR, principal(owner, actor)), (Limit.OWNER, owner)), now, owner=owner, actor=actor)

    def level(self, limit: Limit, key: str, now: float) -> float:
        """Connects the ``limit`` bucket of ``key`` holds at ``now`` (``<owner>.<actor>`` for an
        actor, the owner, or the host); capacity when it has no bucket."""
        return self._tables[limit].level(key, now)

    def statistics(self) -> LimiterStatistics:
        """Buckets held and charges refused, per table."""
        return LimiterStatistics(
            buckets={str(limit): len(table) for limit, table in self._tables.items()},
            denied={str(limit): n for limit, n in self._denied.items()},
        )

    def _limited(self, draws: tuple[tuple[Limit, str], ...], now: float, **who: str) -> Limited | None:
        waits = [(*self._tables[limit].wait_s(key, now), limit) for limit, key in draws]
        wait_s, table_full, limit = max(waits, key=lambda w: (w[0], w[2] is Limit.OWNER))
        if wait_s <= 0.0:
            return None
        return Limited(
            limit=limit, retry_after_s=_retry_after(wait_s), per_minute=self.limits.per_minute(limit),
            table_full=table_full, **who,
        )  # fmt: skip

    def _draw(self, draws: tuple[tuple[Limit, str], ...], now: float, **who: str) -> Limited | None:
        limited = self._limited(draws, now, **who)
        if limited is not None:
            self._denied[limited.limit] += 1
            return limited
        for limit, key in draws:
            self._tables[limit].spend(key, now)
        return None
