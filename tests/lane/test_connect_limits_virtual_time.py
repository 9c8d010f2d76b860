"""The callout's connect limits on fake NATS messages and virtual time (spec "Connect limits").

The responder charges its limiter on trio time, after the bearer check and before any ledger
read, so ``autojump_clock`` drives the refill and every time below is exact. The fake ports,
the message builder and the line parser are those of ``test_responder_virtual_time.py``.
"""

from __future__ import annotations

import logging

import pytest
import trio

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.limits import (
    DEFAULT_LIMITS,
    REPLICA_LIMITS,
    ConnectLimiter,
    ConnectLimits,
)
from cotal_trio.core.manifest import SpaceEntry
from cotal_trio.lane.spec import FullLane, LaneCommon, ReplicaLane
from cotal_trio.service.hosting import FullLanes, ReplicaLanes, ServiceConfig, lane_factory
from cotal_trio.natsio import Message
from cotal_trio.state import RootPaths
from tests.support.callout_requests import NOW, OWNER
from tests.support.responder import CEILING_S, LIMITS, Lane, _lines, _message

ACTOR_LIMITED = f"RATE_LIMITED retry-after 1s actor=cli owner={OWNER} limit=actor: "
HOST_LIMITED = "RATE_LIMITED retry-after 1s host=127.0.0.1 limit=host: "
BAD_BEARER = "bearer is not a compact JWS"


@pytest.fixture(autouse=True)
def _capture(caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")


def _at(cid: int, **kwargs) -> Message:
    """``_message`` as the broker would send it now: issued at the current virtual second."""
    return _message(cid, **kwargs, issued_at=NOW + int(trio.current_time()))


def _outcomes(lane: Lane, first: int = 0) -> list[str]:
    """Per answer from ``first`` on: ``"jwt"`` or the denial reason, cut at its first colon."""
    return [answer.split(":")[0] for _, answer, _ in lane.answers()[first:]]


async def _send(lane: Lane, cids: range, **kwargs) -> None:
    for cid in cids:
        lane.responder.on_message(_at(cid, **kwargs))
    await lane.wait_published(len(lane.published) + len(cids))


async def test_the_61st_connect_of_an_actor_in_a_minute_is_denied_before_any_ledger_read(
    nursery, autojump_clock, caplog
):
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        await nursery.start(lane.responder.run)
        await _send(lane, range(1, 62))
        assert trio.current_time() == 0.0
        await trio.sleep_until(1.0)  # one connect back
        await _send(lane, range(62, 64))
    assert _outcomes(lane) == ["jwt"] * 60 + [ACTOR_LIMITED.split(":")[0], "jwt", ACTOR_LIMITED.split(":")[0]]
    assert lane.answers()[60][1].startswith(ACTOR_LIMITED)
    assert [t for t, _ in lane.ledger_reads] == [0.0] * 60 + [1.0]
    limited = [line for line in _lines(caplog) if line["outcome"] == "denied"]
    assert [(line["cid"], line["owner"], line["actor"], line["level"]) for line in limited] == [
        (61, OWNER, "cli", "info"), (63, OWNER, "cli", "info"),
    ]
    assert all(line["reason"].startswith(ACTOR_LIMITED) for line in limited)


async def test_a_bad_bearer_is_limited_per_host_and_never_touches_an_actor(nursery, autojump_clock, caplog):
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        await nursery.start(lane.responder.run)
        await _send(lane, range(1, 62), token="not-a-jwt")
        await _send(lane, range(62, 122))  # the actor's 60 from the same host all pass
    assert [reason[: len(BAD_BEARER)] for reason in _outcomes(lane)[:60]] == [BAD_BEARER] * 60
    assert lane.answers()[60][1].startswith(HOST_LIMITED)
    assert _outcomes(lane, 61) == ["jwt"] * 60
    assert len(lane.ledger_reads) == 60
    host_line = _lines(caplog)[60]
    assert (host_line["cid"], host_line["owner"], host_line["actor"]) == (61, "-", "-")
    assert host_line["reason"].startswith(HOST_LIMITED)


async def test_retry_after_counts_down_on_trio_time(nursery, autojump_clock):
    """Two a minute: one connect back every 30 s."""
    with trio.fail_after(30 + CEILING_S):
        lane = Lane(autojump_clock, connect_limits=ConnectLimiter(ConnectLimits(actor_per_minute=2)))
        await nursery.start(lane.responder.run)
        await _send(lane, range(1, 4))
        for cid, at in ((4, 10.0), (5, 28.5), (6, 29.5), (7, 30.0)):
            await trio.sleep_until(at)
            await _send(lane, range(cid, cid + 1))
    assert [(answer.split(" limit=")[0], at) for _, answer, at in lane.answers()] == [
        ("jwt", 0.0), ("jwt", 0.0),
        (f"RATE_LIMITED retry-after 30s actor=cli owner={OWNER}", 0.0),
        (f"RATE_LIMITED retry-after 20s actor=cli owner={OWNER}", 10.0),
        (f"RATE_LIMITED retry-after 2s actor=cli owner={OWNER}", 28.5),
        (f"RATE_LIMITED retry-after 1s actor=cli owner={OWNER}", 29.5),
        ("jwt", 30.0),
    ]  # fmt: skip


# --- configuration: a hosted composition sets them, a replica keeps the defaults --------------

FEWER = ConnectLimits(actor_per_minute=5)


def test_a_hosted_composition_passes_its_connect_limits_to_every_lane(tmp_path):
    root = RootPaths(tmp_path)
    common = LaneCommon(server_url="nats://127.0.0.1:4222", limits=LIMITS)
    start = lane_factory(root=root, common=common, lanes=FullLanes(connect_limits=FEWER))
    assert start(SpaceEntry(space="a")).args[0].connect_limits == FEWER
    assert ServiceConfig(root=root, server_url="nats://x", space="a", connect_limits=FEWER).connect_limits == FEWER
    lane = FullLane(space="a", paths=root.space("a"), common=common, idp_keys=dict)
    assert lane.connect_limits == DEFAULT_LIMITS


def test_a_replica_refuses_connect_limits_other_than_the_defaults(tmp_path):
    root = RootPaths(tmp_path)
    common = LaneCommon(server_url="nats://x")
    with pytest.raises(TypeError, match="connect_limits"):  # a replica spec has no such field (issue 16)
        ReplicaLane(space="a", paths=root.space("a"), common=common, connect_limits=FEWER)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=f"^{REPLICA_LIMITS}$"):
        ServiceConfig(root=root, server_url="nats://x", space="a", callout_only=True, connect_limits=FEWER)
    assert ReplicaLane(space="a", paths=root.space("a"), common=common).connect_limits == DEFAULT_LIMITS
    start = lane_factory(root=root, common=common, lanes=ReplicaLanes())
    assert start(SpaceEntry(space="a")).args[0].connect_limits == DEFAULT_LIMITS
