"""The event bus of one host process: publish is sync, consumers are bounded (issue 7 item 1).

One :class:`EventBus` per process (``cotal up``, ``cotal auth-service``), created where the
host is and handed to each lane (``LaneCommon.events``). Producers call :meth:`EventBus.publish`
with an event built by :mod:`cotal_trio.core.events`:

=====================  ==========================================================================
producer               where
=====================  ==========================================================================
callout                the responder's ``on_answer`` hook (:func:`callout_hook`, beside the metrics)
exchange               each face's ``ExchangeContext.metrics`` (:func:`exchange_hook`)
lane                   ``Host`` on every state change (``service/host.py``); ``run_service`` for one space
manifest               ``Host`` on every apply and refusal
=====================  ==========================================================================

``publish`` never awaits and never raises for a consumer's sake: it stamps ``seq`` and ``at``
and hands the event to each subscriber with ``send_nowait`` into that subscriber's bounded
channel (``buffer`` events). A subscriber whose channel is full is dropped there and then: its
channel is closed, its :attr:`Subscription.reason` set and its :attr:`Subscription.dropped`
event set; the callout that published goes on at once (DESIGN.md 5: "never await"). The
websocket door (``http/loopback.py``) then closes the connection with code 1008 and that reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from cotal_trio.core.callout_log import CalloutRecord
from cotal_trio.core.events import (
    EXCHANGE_FACES,
    Event,
    callout_event,
    exchange_event,
    hello_event,
    slow_consumer_reason,
    stamped,
    view_for,
)

__all__ = ["SUBSCRIBER_BUFFER", "EventBus", "EventBusStatistics", "Subscription", "callout_hook", "exchange_hook"]

log = logging.getLogger("cotal.events")

# Events a subscriber may be behind before it is dropped (issue 7 design "Bus"): about 0.5 s of
# a saturated lane's callouts, and a few hundred KiB of JSON at most per consumer.
SUBSCRIBER_BUFFER = 1024


@dataclass(eq=False, slots=True)
class Subscription:
    """One consumer's feed (:meth:`EventBus.subscribe`).

    Attributes:
        space: the face's space (``None``: every event, unfiltered).
        events: the bounded channel of stamped events, a :func:`~cotal_trio.core.events.hello_event`
            first; it ends (``EndOfChannel``) once the consumer is dropped and drained.
        dropped: set when the bus dropped this consumer (its channel was full).
        reason: why it was dropped (:func:`~cotal_trio.core.events.slow_consumer_reason`), or None.
    """

    space: str | None
    events: trio.MemoryReceiveChannel[Event]
    dropped: trio.Event = field(default_factory=trio.Event)
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EventBusStatistics:
    """A snapshot of the bus (STYLE.md practice 11): events ``published``, ``subscribers``
    now, and consumers ``dropped`` for being slow, since the bus was made."""

    published: int
    subscribers: int
    dropped: int


class EventBus:
    """Fan events out to bounded subscribers; see the module docstring.

    Args:
        buffer: events a subscriber may be behind before it is dropped (a positive int).
        clock: wall time, unix seconds (each event's ``at``); read once per publish.

    Raises:
        ValueError: ``buffer`` is not a positive int.
    """

    def __init__(self, *, buffer: int = SUBSCRIBER_BUFFER, clock: Callable[[], float] = time.time) -> None:
        if type(buffer) is not int or buffer < 1:
            raise ValueError(f"an event bus buffer is a positive number of events, not {buffer!r}")
        self.buffer, self._clock = buffer, clock
        self._seq = 0
        self._subscribers: dict[Subscription, trio.MemorySendChannel[Event]] = {}
        self._lanes: dict[str, dict[str, Any]] = {}
        self._dropped = 0

    def publish(self, event: Mapping[str, Any]) -> None:
        """Stamp ``event`` (``seq`` + 1, ``at`` now) and offer it to every subscriber; sync.

        Never blocks and never raises for a subscriber's sake: a full subscriber is dropped. A
        lane event also updates the lane states a new subscriber's hello starts from.
        """
        self._seq += 1
        event = stamped(event, seq=self._seq, at=self._clock())
        if event.get("type") == "lane":
            self._track(event)
        for subscription, send in list(self._subscribers.items()):
            shown = view_for(event, subscription.space)
            if shown is None:
                continue
            try:
                send.send_nowait(shown)
            except trio.WouldBlock:
                self._drop(subscription, send)

    def _track(self, event: Event) -> None:
        if event["state"] == "stopped":
            self._lanes.pop(event["space"], None)
        else:
            self._lanes[event["space"]] = {"state": event["state"], "reason": event["reason"]}

    def _drop(self, subscription: Subscription, send: trio.MemorySendChannel[Event]) -> None:
        del self._subscribers[subscription]
        send.close()
        subscription.reason = slow_consumer_reason(self.buffer)
        subscription.dropped.set()
        self._dropped += 1
        log.warning("events: dropped a consumer of space %s: %s", subscription.space, subscription.reason)

    def lanes(self) -> dict[str, dict[str, Any]]:
        """Every lane's last published ``{"state", "reason"}`` by space (a copy; stopped ones gone)."""
        return {space: dict(lane) for space, lane in self._lanes.items()}

    def statistics(self) -> EventBusStatistics:
        """The bus's :class:`EventBusStatistics` now."""
        return EventBusStatistics(published=self._seq, subscribers=len(self._subscribers), dropped=self._dropped)

    @asynccontextmanager
    async def subscribe(self, space: str | None) -> AsyncIterator[Subscription]:
        """Subscribe for the events the face of ``space`` streams (``None``: all of them).

        Yields a :class:`Subscription` whose channel already holds the hello (the lane states
        now and the last ``seq``). On exit the subscriber is removed and its channel closed.
        Not a checkpoint on entry.
        """
        send, receive = trio.open_memory_channel[Event](self.buffer)
        subscription = Subscription(space=space, events=receive)
        send.send_nowait(hello_event(space, self._lanes, seq=self._seq, at=self._clock()))
        self._subscribers[subscription] = send
        try:
            with receive:
                yield subscription
        finally:
            self._subscribers.pop(subscription, None)
            send.close()


def callout_hook(
    metrics: Callable[[CalloutRecord], None], bus: EventBus | None
) -> Callable[[CalloutRecord], None]:
    """The responder's ``on_answer``: ``metrics`` (``LaneMetrics.callout_answered``), then the
    callout event on ``bus`` (when there is one). Sync, never blocks."""
    if bus is None:
        return metrics

    def answered(record: CalloutRecord) -> None:
        metrics(record)
        try:
            bus.publish(callout_event(record))
        except Exception:  # our bug: the answer went out; lose the event, never the lane
            log.exception("events: space %s lost the event of one callout answer", getattr(record, "space", "?"))

    return answered


def exchange_hook(
    metrics: Callable[[str, int], None], bus: EventBus | None, *, space: str, face: str
) -> Callable[[str, int], None]:
    """A face's ``ExchangeContext.metrics``: ``metrics(arm, status)`` (``LaneMetrics.exchange_answered``),
    then the exchange event naming ``face`` (``loopback`` | ``public``) on ``bus``. Sync.

    Raises:
        ValueError: ``face`` is not an exchange face (a caller bug).
    """
    if face not in EXCHANGE_FACES:
        raise ValueError(f"{face!r} is not an exchange face {EXCHANGE_FACES}")
    if bus is None:
        return metrics

    def answered(arm: str, status: int) -> None:
        metrics(arm, status)
        try:
            bus.publish(exchange_event(space, arm=arm, face=face, status=status))
        except Exception:  # our bug: the answer stands; lose the event, never the request
            log.exception("events: space %s lost the event of one exchange answer", space)

    return answered
