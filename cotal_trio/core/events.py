"""The operator's event stream: one schema, pure builders, and the view ``cotal watch`` folds (issue 7 items 1-2).

Every event is one JSON object (one websocket text message on the loopback face's ``/events``;
docs/events.md), keys camelCase::

    {"seq": <int, per process, from 1>, "at": <unix seconds, float>, "type": ..., "space": <str | null>, ...}

======================  ==================================================================================
``type``                fields beside ``seq``, ``at``, ``type``, ``space``
======================  ==================================================================================
``callout``             the log line's (spec "Callout deadlines"; :mod:`~cotal_trio.core.callout_log`):
                        ``outcome`` (minted|denied|timeout|shed), ``req``, ``cid``, ``owner``, ``actor``,
                        ``queueMs``, ``verifyMs``, ``ledgerMs``, ``policyMs``, ``signMs``, ``totalMs`` (int
                        ms), ``limited`` (bool: a connect-limit denial, spec "Connect limits"); plus
                        ``reason`` and ``limit`` (actor|owner|host, limit denials only) when denied,
                        ``step`` on a timeout, ``waitedMs`` and ``ahead`` when shed
``lane``                ``state`` (:data:`LANE_EVENT_STATES`), ``reason`` (str | null)
``manifest``            ``outcome`` ``applied`` with ``sha256``, ``spaces``, ``added``, ``removed``,
                        ``changed`` (sorted lists); or ``refused`` with ``reason``; ``space`` is null
``exchange``            ``arm`` (human|agent|none), ``face`` (loopback|public), ``status`` (HTTP int);
                        never a bearer, a token or an IdP token
``hello``               first message of a connection: ``lanes`` ``{space: {"state", "reason"}}``;
                        its ``seq`` is the last one assigned (it is not itself counted)
======================  ==================================================================================

A space's face streams that space's events, host-level ones (``space`` null) and the lane
events of every space of its process, the latter with ``reason`` only for its own space
(:func:`view_for`). A consumer more than N events behind is closed with code
:data:`SLOW_CONSUMER_CODE` and :func:`slow_consumer_reason`.

Pure and synchronous (DESIGN.md 3): the bus (``lane/events.py``) passes ``seq`` and ``at``
in; :class:`WatchModel` takes the wall time it is asked about.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .callout_log import TIMED_STEPS, CalloutRecord, Outcome, Step

__all__ = [
    "EVENT_TYPES",
    "EXCHANGE_FACES",
    "LANE_EVENT_STATES",
    "SLOW_CONSUMER_CODE",
    "Event",
    "SeqFilter",
    "SpaceView",
    "WatchModel",
    "callout_event",
    "exchange_event",
    "hello_event",
    "lane_event",
    "limit_of",
    "manifest_applied",
    "manifest_refused",
    "nearest_rank",
    "slow_consumer_reason",
    "stamped",
    "view_for",
]

Event = dict[str, Any]

EVENT_TYPES = ("callout", "lane", "manifest", "exchange", "hello")
# The host's states (service/host.py, `.applied`), plus `fenced` (the lane lost its plane claim,
# DESIGN.md 8) and `stopped` (the manifest dropped the lane and it has fully exited).
LANE_EVENT_STATES = ("starting", "serving", "retrying", "fenced", "stopping", "stopped")
EXCHANGE_FACES = ("loopback", "public")
# RFC 6455 7.4.1: 1008 "policy violation", the close code a dropped slow consumer gets.
SLOW_CONSUMER_CODE = 1008
# A connect-limit denial's reason, as core/limits.py `Limited.reason` writes it:
# "RATE_LIMITED retry-after <n>s <who> limit=<actor|owner|host>: <why>".
_LIMIT_REASON = re.compile(r"RATE_LIMITED retry-after \d+s .*? limit=(actor|owner|host):")
_MS_KEYS = {Step.QUEUE: "queueMs", Step.VERIFY: "verifyMs", Step.LEDGER: "ledgerMs", Step.POLICY: "policyMs", Step.SIGN: "signMs"}


def slow_consumer_reason(behind: int) -> str:
    """The close reason of a dropped consumer: ``slow consumer: more than <behind> events behind - reconnect``."""
    return f"slow consumer: more than {behind} events behind - reconnect"


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))  # as the log line renders it (callout_log._ms)


def limit_of(reason: str | None) -> str | None:
    """The bucket (``actor``, ``owner`` or ``host``) a callout denial ``reason`` names when a
    connect limit refused it (spec "Connect limits"), else ``None``."""
    match = _LIMIT_REASON.match(reason or "")
    return match.group(1) if match else None


def callout_event(record: CalloutRecord) -> Event:
    """One answered callout request as an event (the log line's fields; see the module table).

    ``record`` is the responder's finished record (its ``on_answer`` argument); nothing of it
    is kept. Times are whole milliseconds rounded as the log line rounds them.
    """
    event: Event = {
        "type": "callout", "space": record.space, "outcome": str(record.outcome), "req": record.req,
        "cid": record.cid, "owner": record.owner, "actor": record.actor,
        **{_MS_KEYS[step]: _ms(record.durations_s.get(step, 0.0)) for step in TIMED_STEPS},
        "totalMs": _ms(record.total_s()), "limited": False,
    }  # fmt: skip
    if record.outcome is Outcome.DENIED:
        limit = limit_of(record.reason)
        event.update(reason=record.reason or "", limited=limit is not None)
        if limit is not None:
            event["limit"] = limit
    elif record.outcome is Outcome.TIMEOUT:
        event["step"] = str(record.at or Step.QUEUE)
    elif record.outcome is Outcome.SHED:
        event.update(waitedMs=_ms(record.waited_s), ahead=record.ahead)
    return event


def lane_event(space: str, state: str, reason: str | None = None) -> Event:
    """A lane's state change (issue 7 item 1).

    Raises:
        ValueError: ``state`` is not one of :data:`LANE_EVENT_STATES` (a caller bug).
    """
    if state not in LANE_EVENT_STATES:
        raise ValueError(f"{state!r} is not a lane event state {LANE_EVENT_STATES}")
    return {"type": "lane", "space": space, "state": state, "reason": reason}


def manifest_applied(
    *, sha256: str, spaces: Iterable[str], added: Iterable[str], removed: Iterable[str], changed: Iterable[str]
) -> Event:
    """A manifest the host applied: its SHA-256 (hex), its spaces and the reconcile (sorted lists)."""
    return {
        "type": "manifest", "space": None, "outcome": "applied", "sha256": sha256, "spaces": sorted(spaces),
        "added": sorted(added), "removed": sorted(removed), "changed": sorted(changed),
    }  # fmt: skip


def manifest_refused(reason: str) -> Event:
    """A manifest the host refused whole (DESIGN.md 9); ``reason`` is the refusal's sentence."""
    return {"type": "manifest", "space": None, "outcome": "refused", "reason": reason}


def exchange_event(space: str, *, arm: str, face: str, status: int) -> Event:
    """One ``POST /exchange`` answer: ``arm``, ``face`` and the HTTP ``status``; nothing else.

    Raises:
        ValueError: ``face`` is not ``loopback`` or ``public`` (a caller bug).
    """
    if face not in EXCHANGE_FACES:
        raise ValueError(f"{face!r} is not an exchange face {EXCHANGE_FACES}")
    return {"type": "exchange", "space": space, "arm": arm, "face": face, "status": status}


def stamped(event: Mapping[str, Any], *, seq: int, at: float) -> Event:
    """``event`` with its ``seq`` and ``at`` (unix seconds) first; a new dict."""
    return {"seq": seq, "at": at, **event}


def view_for(event: Event, space: str | None) -> Event | None:
    """What the face of ``space`` streams of ``event`` (``None``: all of it, unfiltered).

    Its own space's events, host-level ones (``space`` null) and every space's lane events, as
    they are (a lane that cannot start has no face of its own, so the others carry its state and
    reason; every face's capability is the root holder's); any other event of another space not
    at all (``None``). Never copies an event.
    """
    if space is None or event.get("space") in (None, space) or event.get("type") == "lane":
        return event
    return None


def hello_event(space: str | None, lanes: Mapping[str, Mapping[str, Any]], *, seq: int, at: float) -> Event:
    """A connection's first message: every lane's ``{"state", "reason"}`` now (as
    :func:`view_for` passes lane events) and the last ``seq`` assigned."""
    shown = {name: {"state": lane["state"], "reason": lane.get("reason")} for name, lane in sorted(lanes.items())}
    return {"seq": seq, "at": at, "type": "hello", "space": space, "lanes": shown}


# --- the view `cotal watch` renders (issue 7 item 2) ---------------------------------------------

RATE_WINDOW_S = 10.0  # connects per second are averaged over this many seconds
LATENCY_WINDOW_S = 60.0  # p50 and p99 are over the callouts of this many seconds
LAST_DENIALS = 5  # denial reasons kept per space, newest first
SEQ_MEMORY = 4096  # seqs remembered per process for dedupe (a face lags another by far fewer)


def nearest_rank(values: Iterable[int], percent: float) -> int | None:
    """The nearest-rank percentile of ``values`` (``None`` when empty): the smallest value
    with at least ``percent`` % of the values at or below it (p50 of 1..100 is 50, p99 is 99)."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]


@dataclass(slots=True)
class _Source:
    seen: set[int] = field(default_factory=set)
    order: deque[int] = field(default_factory=deque)  # `seen` in arrival order, to forget the oldest
    highest: int = 0
    open: int = 0  # connections to the process now


class SeqFilter:
    """Dedupe events that reach a watcher through several faces of one process (pure, sync).

    ``seq`` is per process, so a key is ``(source, seq)``, ``source`` naming the process: the
    pid in its ``auth-service.json``. A pid names one process at a time only: in a container
    the service is pid 1 on every start, and a restarted process counts from seq 1 again. So
    the watcher reports each connection (:meth:`opened`, :meth:`closed`) and each connection's
    ``hello`` (:meth:`hello`): a hello below the highest seq seen for its source, arriving
    while that connection is the source's only open one, means the process restarted, and the
    source's memory starts again (the status page does the same on its one connection). While
    another face of the source is open, the process has not restarted (a restart closes every
    face), and a low hello is only a face that connected before the other passed later seqs on.
    Remembers the last :data:`SEQ_MEMORY` seqs per source.
    """

    def __init__(self) -> None:
        self._sources: dict[object, _Source] = {}

    def _source(self, source: object) -> _Source:
        return self._sources.setdefault(source, _Source())

    def opened(self, source: object) -> None:
        """A connection to ``source`` is open (its hello follows)."""
        self._source(source).open += 1

    def closed(self, source: object) -> None:
        """A connection to ``source`` that :meth:`opened` reported has ended."""
        entry = self._source(source)
        entry.open = max(0, entry.open - 1)

    def hello(self, source: object, seq: int) -> bool:
        """A connection's hello, ``seq`` the last one its process assigned (int, from 0).

        Returns:
            True when ``source`` restarted (its seqs were forgotten), else False.
        """
        entry = self._source(source)
        restarted = seq < entry.highest and entry.open <= 1
        if restarted:
            self._sources[source] = entry = _Source(open=entry.open)
        entry.highest = max(entry.highest, seq)
        return restarted

    def fresh(self, source: object, seq: int) -> bool:
        """True the first time ``(source, seq)`` is offered (since the source's last restart), False after."""
        entry = self._source(source)
        if seq in entry.seen:
            return False
        entry.seen.add(seq)
        entry.order.append(seq)
        entry.highest = max(entry.highest, seq)
        if len(entry.order) > SEQ_MEMORY:
            entry.seen.discard(entry.order.popleft())
        return True


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceView:
    """One space's line of the watch view at one moment.

    Attributes:
        space: the space name.
        connected: a face of this space streams to the watcher now.
        state: the lane's last known state (``unknown`` before any), ``reason`` why (or None).
        rates: connects per second by outcome over the last :data:`RATE_WINDOW_S` (every
            outcome present).
        p50_ms, p99_ms: nearest-rank callout ``totalMs`` over the last :data:`LATENCY_WINDOW_S`,
            None without callouts.
        limit_denials: connect-limit denials seen since the watcher started.
        denials: the last :data:`LAST_DENIALS` denial reasons, newest first.
    """

    space: str
    connected: bool
    state: str
    reason: str | None
    rates: dict[str, float]
    p50_ms: int | None
    p99_ms: int | None
    limit_denials: int
    denials: tuple[str, ...]


@dataclass(slots=True)
class _Space:
    connected: bool = False
    state: str = "unknown"
    reason: str | None = None
    callouts: deque[tuple[float, str, int]] = field(default_factory=deque)  # (at, outcome, totalMs), by at
    limit_denials: int = 0
    denials: deque[str] = field(default_factory=lambda: deque(maxlen=LAST_DENIALS))


class WatchModel:
    """The fold of a watcher's events into :class:`SpaceView` lines (pure; time passed in).

    Args:
        spaces: the spaces shown from the start (more appear as their events arrive, unless
            ``only`` is set).
        only: show ``spaces`` and nothing else (``cotal watch --space``).
    """

    def __init__(self, spaces: Iterable[str] = (), *, only: bool = False) -> None:
        self._spaces = {name: _Space() for name in spaces}
        self._only = only

    def _space(self, name: object) -> _Space | None:
        if not isinstance(name, str) or (self._only and name not in self._spaces):
            return None
        return self._spaces.setdefault(name, _Space())

    def connected(self, space: str, up: bool) -> None:
        """Record whether a face of ``space`` streams now (False shows ``disconnected``)."""
        entry = self._space(space)
        if entry is not None:
            entry.connected = up

    def add(self, event: Mapping[str, Any]) -> None:
        """Fold one (deduped) event in; unknown types and malformed events are ignored."""
        kind = event.get("type")
        if kind == "hello":
            for name, lane in dict(event.get("lanes") or {}).items():
                self._lane(name, lane.get("state"), lane.get("reason"))
        elif kind == "lane":
            self._lane(event.get("space"), event.get("state"), event.get("reason"))
        elif kind == "callout":
            self._callout(event)

    def _lane(self, name: object, state: object, reason: object) -> None:
        entry = self._space(name)
        if entry is not None and isinstance(state, str):
            entry.state, entry.reason = state, reason if isinstance(reason, str) else None

    def _callout(self, event: Mapping[str, Any]) -> None:
        entry = self._space(event.get("space"))
        at, outcome, total = event.get("at"), event.get("outcome"), event.get("totalMs")
        if entry is None or not isinstance(at, int | float) or not isinstance(total, int) or outcome not in set(Outcome):
            return
        entry.callouts.append((float(at), str(outcome), total))
        if outcome == Outcome.DENIED:
            entry.denials.appendleft(str(event.get("reason", "")))
            entry.limit_denials += event.get("limited") is True

    def views(self, now: float) -> list[SpaceView]:
        """Every shown space's :class:`SpaceView` at wall time ``now`` (unix seconds), by name.

        Forgets callouts older than :data:`LATENCY_WINDOW_S` before ``now``.
        """
        return [self._view(name, entry, now) for name, entry in sorted(self._spaces.items())]

    def _view(self, name: str, entry: _Space, now: float) -> SpaceView:
        # Arrival order is `at` order per process; several processes may interleave a little,
        # so the windows filter by `at` and the pruning only bounds memory.
        while entry.callouts and entry.callouts[0][0] <= now - LATENCY_WINDOW_S:
            entry.callouts.popleft()
        counts = dict.fromkeys(map(str, Outcome), 0)
        totals = []
        for at, outcome, total in entry.callouts:
            if now - LATENCY_WINDOW_S < at <= now:
                totals.append(total)
                counts[outcome] += now - RATE_WINDOW_S < at
        return SpaceView(
            space=name, connected=entry.connected, state=entry.state, reason=entry.reason,
            rates={outcome: n / RATE_WINDOW_S for outcome, n in counts.items()},
            p50_ms=nearest_rank(totals, 50), p99_ms=nearest_rank(totals, 99),
            limit_denials=entry.limit_denials, denials=tuple(entry.denials),
        )  # fmt: skip
