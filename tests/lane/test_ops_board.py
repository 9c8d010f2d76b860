"""The process's metrics board (cotal_trio/lane/ops.py; issue 18 item 8), without a broker.

Two lanes' registries in one exposition, each family once with both spaces' samples; the lane
states from the event bus's lane events; the build; a lane leaves the board with its start.
"""

from __future__ import annotations

import platform

from prometheus_client.parser import text_string_to_metric_families

from cotal_trio import __version__
from cotal_trio.core.events import lane_event
from cotal_trio.lane.events import EventBus
from cotal_trio.lane.metrics import CONTENT_TYPE, LaneMetrics
from cotal_trio.lane.ops import LANE_STATE_VALUES, OpsBoard


def _families(board: OpsBoard) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    body, content_type = board.exposition()
    assert content_type == CONTENT_TYPE
    families: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        assert family.name not in families  # one family per name, whatever the lanes
        families[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return families


def test_two_lanes_share_each_family_and_keep_their_space_label():
    board = OpsBoard(EventBus())
    alpha, beta = LaneMetrics("alpha", created=100.0), LaneMetrics("beta", created=200.0)
    alpha.exchange_answered("human", 200)
    with board.serving(alpha), board.serving(beta):
        families = _families(board)
    answers = {(labels["space"], labels["outcome"]): value for name, labels, value in families["cotal_callout_answers"]
               if name == "cotal_callout_answers_total"}
    assert answers == {(space, outcome): 0 for space in ("alpha", "beta") for outcome in ("minted", "denied", "timeout", "shed")}
    # the text format writes a counter's _created as a gauge family of its own
    created = {labels["space"]: value for _, labels, value in families["cotal_callout_dropped_created"]}
    assert created == {"alpha": 100.0, "beta": 200.0}
    assert [labels["space"] for _, labels, _ in families["cotal_exchange_answers"]] == ["alpha"]


def test_lane_states_follow_the_bus_and_a_stopped_lane_has_none():
    bus = EventBus()
    board = OpsBoard(bus)
    bus.publish(lane_event("alpha", "serving"))
    bus.publish(lane_event("beta", "fenced", "the lease lapsed"))
    bus.publish(lane_event("gamma", "serving"))
    bus.publish(lane_event("gamma", "stopped"))
    states = {(labels["space"], labels["state"]): value for _, labels, value in _families(board)["cotal_lane_state"]}
    assert states == {
        **{("alpha", state): float(state == "serving") for state in LANE_STATE_VALUES},
        **{("beta", state): float(state == "fenced") for state in LANE_STATE_VALUES},
    }


def test_build_info_names_the_versions_and_the_first_known_broker():
    board = OpsBoard(EventBus())
    assert _families(board)["cotal_build_info"] == [("cotal_build_info", {
        "version": __version__, "python": platform.python_version(), "nats_server": "unknown"}, 1.0)]
    with board.serving(LaneMetrics("alpha"), nats_server="2.10.22"), board.serving(LaneMetrics("beta"), nats_server="2.11.0"):
        assert board.build()["nats_server"] == "2.10.22"
    assert OpsBoard(EventBus(), nats_server="v2.12.1").build()["nats_server"] == "2.12.1"


def test_a_lane_leaves_the_board_with_its_start_only():
    board = OpsBoard(EventBus())
    first, second = LaneMetrics("alpha"), LaneMetrics("alpha")
    with board.serving(first):
        with board.serving(second):  # a second start of the space replaced the first
            pass
        assert board.lanes() == []  # the second's exit took its own series
    with board.serving(first):
        outer = board.serving(second)
        outer.__enter__()
    assert board.lanes() == [second]  # the first's exit leaves the start that replaced it
    outer.__exit__(None, None, None)
    assert board.lanes() == []
