"""One lane's Prometheus metrics, and reading them back (issue 4 item 7).

A :class:`LaneMetrics` belongs to one lane and holds its own ``CollectorRegistry`` (never the
process-wide default: lanes come and go, and a re-added lane must not collide with the one it
replaces). The loopback face serves it as ``GET /metrics`` in the Prometheus text format.
Every series is a count or a time; labels are closed sets, never an owner, actor, principal or
nonce (the route needs no capability, so it must say nothing about who connects):

=====================================  =========  ===========================  ===================================
metric                                 type       labels                       fed by
=====================================  =========  ===========================  ===================================
``cotal_callout_answers_total``        counter    ``space``, ``outcome``       the responder, per answered request
``cotal_callout_duration_seconds``     histogram  ``space``                    the same: total time, receipt to answer
``cotal_callout_dropped_total``        counter    ``space``                    requests that failed provenance
``cotal_callout_queue_depth``          gauge      ``space``                    admitted requests not yet started
``cotal_callout_in_flight``            gauge      ``space``                    requests in progress
``cotal_connect_limit_denials_total``  counter    ``space``, ``bucket``        connects refused by that bucket
``cotal_connect_limit_buckets``        gauge      ``space``, ``bucket``        buckets its table holds
``cotal_exchange_answers_total``       counter    ``space``, ``arm``, ``status`` both exchange faces, per answer
=====================================  =========  ===========================  ===================================

``outcome`` is ``minted|denied|timeout|shed``, ``bucket`` ``actor|owner|host``, ``arm``
``human|agent|none`` (``none``: answered before the body named an arm), ``status`` the HTTP
status. The callout gauges and drops are read from the responder's ``statistics()``, and the
connect-limit series from the lane's ``ConnectLimiter.statistics()`` (which counts its own
refusals), at scrape time, so they cost nothing per request (:meth:`LaneMetrics.watch`); those
counters carry the lane start's time as their ``_created``, so every counter has one (issue 18
item 8). The process's operator face serves every lane's registry at once (``lane/ops.py``).

:func:`read_summary` is the reverse, for ``cotal status``: a scrape's text to the few numbers
it prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from cotal_trio.core.callout_log import CalloutRecord, Outcome
from cotal_trio.core.limits import Limit, LimiterStatistics
from cotal_trio.lane.callout.responder import CalloutStatistics

__all__ = [
    "CALLOUT_SECONDS_BUCKETS",
    "CONTENT_TYPE",
    "EXCHANGE_ARMS",
    "LIMIT_BUCKETS",
    "LaneMetrics",
    "MetricsSummary",
    "read_summary",
]

# The text format generate_latest writes. prometheus-client pairs exactly these bytes with
# 0.0.4 unless a scraper asks for 1.0.0 (exposition.choose_encoder); every Prometheus reads it.
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# Callout time, seconds: the answer is due within the deadline (auth timeout less 250 ms; 1.75 s
# by default) and the target below the knee is a p99 under 50 ms (issue 4, "Benchmark").
CALLOUT_SECONDS_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
LIMIT_BUCKETS: Final = tuple(str(limit) for limit in Limit)  # actor, owner, host
EXCHANGE_ARMS: Final = ("human", "agent", "none")

Statistics = Callable[[], CalloutStatistics]
LimitStatistics = Callable[[], LimiterStatistics]


class LaneMetrics:
    """The metrics of one space's lane, in a registry of its own.

    Every method is sync, never blocks and never raises on the request path except for a
    caller bug (a label outside its closed set).

    Args:
        space: the space name; the ``space`` label of every series.
        created: the lane start's wall time, unix seconds (default: now): the ``_created`` of
            the counters read at scrape time (the drops and the connect-limit denials), so
            every counter has one, as prometheus-client gives its own.
    """

    def __init__(self, space: str, *, created: float | None = None) -> None:
        self.space = space
        self.created = time.time() if created is None else created
        self.registry = CollectorRegistry()
        self._statistics: Statistics | None = None
        self._limit_statistics: LimitStatistics | None = None
        self._answers = Counter(
            "cotal_callout_answers", "Answered auth callout requests by outcome.",
            ["space", "outcome"], registry=self.registry,
        )
        self._seconds = Histogram(
            "cotal_callout_duration_seconds", "Auth callout time from receipt to answer, seconds.",
            ["space"], buckets=CALLOUT_SECONDS_BUCKETS, registry=self.registry,
        ).labels(space)
        self._exchanges = Counter(
            "cotal_exchange_answers", "Token exchange answers by arm and HTTP status.",
            ["space", "arm", "status"], registry=self.registry,
        )
        for outcome in Outcome:  # every series exists from the start, at zero
            self._answers.labels(space, outcome)
        self.registry.register(_ScrapeTime(self))

    def watch(self, statistics: Statistics, *, limits: LimitStatistics | None = None) -> None:
        """Read these snapshots at every scrape; until then their series read zero.

        Args:
            statistics: the lane responder's ``statistics`` (queue depth, in-flight, drops);
                sync and cheap.
            limits: the lane's ``ConnectLimiter.statistics`` (denials and buckets per table);
                sync and cheap.
        """
        self._statistics, self._limit_statistics = statistics, limits

    def callout_answered(self, record: CalloutRecord) -> None:
        """Count one answered request by ``record.outcome`` and observe its total time (s)."""
        self._answers.labels(self.space, record.outcome).inc()
        self._seconds.observe(record.total_s())

    def exchange_answered(self, arm: str, status: int) -> None:
        """Count one ``POST /exchange`` answer (either face) by ``arm`` and HTTP ``status``.

        Raises:
            ValueError: ``arm`` is not one of :data:`EXCHANGE_ARMS`, or ``status`` is not an
                HTTP status (100-599) (a caller bug).
        """
        if arm not in EXCHANGE_ARMS or not 100 <= status <= 599:
            raise ValueError(f"exchange answer ({arm!r}, {status!r}) is not an arm of {EXCHANGE_ARMS} and an HTTP status")
        self._exchanges.labels(self.space, arm, str(status)).inc()

    def exposition(self) -> tuple[bytes, str]:
        """The registry in the Prometheus text format: ``(body, Content-Type)``."""
        return generate_latest(self.registry), CONTENT_TYPE

    def snapshots(self) -> tuple[CalloutStatistics | None, LimiterStatistics | None]:
        """The watched statistics now (None for one not watched)."""
        callout, limits = self._statistics, self._limit_statistics
        return (None if callout is None else callout()), (None if limits is None else limits())


class _ScrapeTime:
    """A collector reading the lane's statistics when scraped (no per-request cost)."""

    def __init__(self, metrics: LaneMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        callout, limits = self._metrics.snapshots()
        values = (0, 0, 0) if callout is None else (callout.waiting, callout.in_flight, callout.dropped)
        for (family, name, doc), value in zip(_CALLOUT_SERIES, values, strict=True):
            metric = family(name, doc, labels=["space"])
            self._add(metric, [self._metrics.space], value)
            yield metric
        per_bucket = ({}, {}) if limits is None else (limits.denied, limits.buckets)
        for (family, name, doc), counts in zip(_LIMIT_SERIES, per_bucket, strict=True):
            metric = family(name, doc, labels=["space", "bucket"])
            for bucket in LIMIT_BUCKETS:
                self._add(metric, [self._metrics.space, bucket], counts.get(bucket, 0))
            yield metric

    def _add(self, metric: Metric, labels: list[str], value: float) -> None:
        """One sample; a counter's with its ``_created`` (the lane start's time)."""
        if isinstance(metric, CounterMetricFamily):
            metric.add_metric(labels, value, created=self._metrics.created)
        else:
            assert isinstance(metric, GaugeMetricFamily)
            metric.add_metric(labels, value)


_CALLOUT_SERIES = (
    (GaugeMetricFamily, "cotal_callout_queue_depth", "Admitted callout requests not yet started."),
    (GaugeMetricFamily, "cotal_callout_in_flight", "Callout requests in progress."),
    (CounterMetricFamily, "cotal_callout_dropped", "Callout requests dropped unanswered (failed provenance)."),
)
_LIMIT_SERIES = (
    (CounterMetricFamily, "cotal_connect_limit_denials", "Connects refused by a connect-limit bucket."),
    (GaugeMetricFamily, "cotal_connect_limit_buckets", "Buckets a connect-limit table holds."),
)


# --- reading a scrape back (cotal status) -------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSummary:
    """What ``cotal status`` prints of one space's scrape.

    Attributes:
        answers: answered callouts by outcome, ``{"minted": n, "denied": n, "timeout": n,
            "shed": n}`` (every outcome present).
        in_flight: callout requests in progress.
        queue_depth: admitted callout requests not yet started.
    """

    answers: dict[str, int] = field(default_factory=lambda: dict.fromkeys(map(str, Outcome), 0))
    in_flight: int = 0
    queue_depth: int = 0


def read_summary(text: str, space: str) -> MetricsSummary:
    """The :class:`MetricsSummary` of ``space`` in a ``GET /metrics`` body.

    Series of other spaces are ignored; a missing series reads zero.

    Raises:
        ValueError: ``text`` is not the Prometheus text format.
    """
    answers = dict.fromkeys(map(str, Outcome), 0)
    gauges = {"cotal_callout_in_flight": 0, "cotal_callout_queue_depth": 0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("space") != space:
                continue
            if sample.name == "cotal_callout_answers_total" and sample.labels.get("outcome") in answers:
                answers[sample.labels["outcome"]] = int(sample.value)
            elif sample.name in gauges:
                gauges[sample.name] = int(sample.value)
    return MetricsSummary(
        answers=answers, in_flight=gauges["cotal_callout_in_flight"], queue_depth=gauges["cotal_callout_queue_depth"],
    )
