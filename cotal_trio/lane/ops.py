"""The process's metrics board: every lane's metrics in one scrape (issue 18 item 8).

One :class:`OpsBoard` per host process (``cotal up``, ``cotal auth-service``), made where the
event bus is and handed to each lane (``LaneCommon.board``). A lane puts its start's
:class:`~cotal_trio.lane.metrics.LaneMetrics` on the board while it serves
(:meth:`OpsBoard.serving`), so a restarted lane's counters start again from zero with a new
``_created``, and a lane that is not serving has no series but its state. The process's
operator face (``http/ops.py``) serves :meth:`OpsBoard.exposition` as ``GET /metrics``:

=============================  =====  ================================  ==================================
metric                         type   labels                            value
=============================  =====  ================================  ==================================
every lane metric              as is  ``space`` and its own             ``lane/metrics.py``'s table
``cotal_lane_state``           gauge  ``space``, ``state``              1 for the lane's state now, else 0
``cotal_build_info``           gauge  ``version``, ``python``,          1
                                      ``nats_server``
=============================  =====  ================================  ==================================

``state`` is one of :data:`LANE_STATE_VALUES` (the host's lane states, plus ``fenced`` between
a lost plane claim and its retry); the states come from the event bus's lane events
(:meth:`~cotal_trio.lane.events.EventBus.lanes`), so a single-space process and a host report
alike, and a stopped lane has no series. ``nats_server`` is the version given by the process
(``cotal up`` knows the binary it runs), else the one the first serving lane's broker announced,
else ``unknown``. Every counter keeps prometheus-client's ``_created`` sample (nothing here
disables it: ``PROMETHEUS_DISABLE_CREATED_SERIES`` is never read by this code, and the test
asserts the samples).
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from cotal_trio import __version__
from cotal_trio.lane.events import EventBus
from cotal_trio.lane.metrics import CONTENT_TYPE, LaneMetrics

__all__ = ["LANE_STATE_VALUES", "OpsBoard"]

# The values of cotal_lane_state's `state` label, a closed set (core.events.LANE_EVENT_STATES less
# `stopped`: a stopped lane leaves the board).
LANE_STATE_VALUES: Final = ("starting", "serving", "retrying", "fenced", "stopping")
UNKNOWN: Final = "unknown"


class OpsBoard:
    """Every serving lane's metrics, the lanes' states and the build, as one registry.

    Args:
        events: the process's event bus; its lane states feed ``cotal_lane_state``.
        nats_server: the broker's version when the process knows it (``cotal up``); None: the
            first lane's broker says it (:meth:`serving`).

    Attributes:
        url: the operator face's URL once it listens (``http://127.0.0.1:<port>``), else None;
            a full lane records it in its ``auth-service.json`` as ``opsUrl``.
    """

    def __init__(self, events: EventBus, *, nats_server: str | None = None) -> None:
        self._events = events
        self._nats_server = nats_server
        self._lanes: dict[str, LaneMetrics] = {}
        self.url: str | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Board(self))

    @contextlib.contextmanager
    def serving(self, metrics: LaneMetrics, *, nats_server: str | None = None) -> Iterator[None]:
        """Show ``metrics`` (one lane start's) on the board for the block; sync.

        ``nats_server`` is the version the lane's broker announced (None: not known). On exit
        the lane's series go, unless another start of the space has replaced them meanwhile.
        """
        self._lanes[metrics.space] = metrics
        if self._nats_server is None and nats_server:
            self._nats_server = nats_server
        try:
            yield
        finally:
            if self._lanes.get(metrics.space) is metrics:
                del self._lanes[metrics.space]

    def lanes(self) -> list[LaneMetrics]:
        """The serving lanes' metrics, by space name."""
        return [self._lanes[space] for space in sorted(self._lanes)]

    def lane_states(self) -> dict[str, str]:
        """Every lane's state now by space (the event bus's view; stopped lanes gone)."""
        return {space: str(lane["state"]) for space, lane in sorted(self._events.lanes().items())}

    def build(self) -> dict[str, str]:
        """``{"version", "python", "nats_server"}``: the build-info labels (``nats_server`` as
        ``2.10.22``, without ``--version``'s leading ``v``)."""
        nats = (self._nats_server or UNKNOWN).removeprefix("v")  # `--version` says v2.10.22, INFO 2.10.22
        return {"version": __version__, "python": platform.python_version(), "nats_server": nats}

    def exposition(self) -> tuple[bytes, str]:
        """The board in the Prometheus text format: ``(body, Content-Type)``; sync."""
        return generate_latest(self.registry), CONTENT_TYPE


class _Board:
    """A collector merging the lanes' registries: one family per name, every lane's samples in it."""

    def __init__(self, board: OpsBoard) -> None:
        self._board = board

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for lane in self._board.lanes():
            for family in lane.registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                merged.samples.extend(family.samples)
        yield from families.values()
        states = GaugeMetricFamily(
            "cotal_lane_state", "The lane's state: 1 for the state it is in, 0 for the others.", labels=["space", "state"]
        )
        for space, now in self._board.lane_states().items():
            for state in LANE_STATE_VALUES:
                states.add_metric([space, state], 1 if state == now else 0)
        yield states
        build = self._board.build()
        info = GaugeMetricFamily("cotal_build_info", "The running cotal-trio build; always 1.", labels=list(build))
        info.add_metric(list(build.values()), 1)
        yield info
