"""A hostile ``client_info.host`` cannot kill a worker or the lane (review of issue 15 item 2).

A lone surrogate in the host, with the host bucket spent, went into the RATE_LIMITED denial and
``.encode()`` raised UnicodeEncodeError inside ``_decide``'s own except handler, out of the
worker and through the lane's nursery. Three layers now: the host is validated at decode
(printable ASCII, at most ``MAX_CLIENT_HOST_CHARS``, else ``""``), ``Limited`` quotes a host
that is not plain, and each request is caught on its own in the workers, the deadline keeper
and the shed path (a failure is that request's drop, with its line).
"""

from __future__ import annotations

import json

import pytest
import trio

from cotal_trio.core import natsjwt
from cotal_trio.core.callout import SERVER_XKEY_HEADER
from cotal_trio.core.limits import ConnectLimiter, ConnectLimits, Limit, Limited
from cotal_trio.lane.callout.responder import CALLOUT_SUBJECT
from cotal_trio.natsio import Message
from tests.support.callout_requests import KEYS, NOW, SERVER, SERVER_X, _claims, signed_with
from tests.support.responder import CEILING_S, Lane, _message, _user

HOST_LIMITED = ConnectLimits(host_per_minute=1)


def _with_host(cid: int, host: object, *, iat: int = NOW) -> Message:
    """A request with an unverifiable bearer (charged to its host) and ``client_info.host``."""
    claims = _claims(exp=iat + 2)
    claims["nats"]["user_nkey"] = _user(cid)
    claims["nats"]["client_info"] = {"host": host, "id": cid}
    claims["nats"]["connect_opts"] = {"auth_token": "not-a-bearer", "name": "ibx0123456789"}
    claims.update(iss=SERVER.public_key, iat=iat)
    token = signed_with(SERVER, json.dumps(claims)).encode()
    return Message(CALLOUT_SUBJECT, f"_INBOX.r.{cid}", SERVER_X.seal(token, KEYS.xkey.public_key),
                   {SERVER_XKEY_HEADER: SERVER_X.public_key})


def _request_claims(host: object) -> dict:
    claims = _claims(exp=NOW + 2)
    claims["nats"]["client_info"] = {"host": host, "id": 1}
    return {**claims, "iss": SERVER.public_key, "iat": NOW}


@pytest.mark.parametrize(
    ("host", "kept"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("fe80::1%eth0", "fe80::1%eth0"),
        ("h" * natsjwt.MAX_CLIENT_HOST_CHARS, "h" * natsjwt.MAX_CLIENT_HOST_CHARS),
        ("h" * (natsjwt.MAX_CLIENT_HOST_CHARS + 1), ""),
        ("x" * 190_000, ""),
        ("\ud800x", ""),
        ("a b", ""),
        ("a\nb", ""),
        ("\x00", ""),
        ("ümlaut", ""),
        (7, ""),
    ],
    ids=["ipv4", "ipv6-zone", "at-bound", "past-bound", "190kb", "surrogate", "space", "newline", "nul", "non-ascii", "int"],
)
def test_the_client_host_is_plain_ascii_and_bounded_or_empty(host, kept):
    assert natsjwt.decode_authorization_request(_request_claims(host)).client_host == kept


def test_a_host_that_is_not_plain_is_quoted_in_the_reason():
    reason = Limited(limit=Limit.HOST, retry_after_s=1, per_minute=60, host="\ud800x").reason()
    assert reason.startswith('RATE_LIMITED retry-after 1s host="\\ud800x" limit=host: ')
    reason.encode("utf-8")  # raised UnicodeEncodeError before the fix
    plain = Limited(limit=Limit.HOST, retry_after_s=1, per_minute=60, host="10.0.0.9").reason()
    assert plain.startswith("RATE_LIMITED retry-after 1s host=10.0.0.9 limit=host: ")


def test_the_host_bucket_key_is_bounded():
    limiter = ConnectLimiter(HOST_LIMITED)
    assert limiter.charge_host("h" * 190_000, 0.0) is None
    limited = limiter.charge_host("h" * 190_000 + "other tail", 0.0)  # the same bounded key: spent
    assert limited is not None and len(limited.host) <= natsjwt.MAX_CLIENT_HOST_CHARS


async def test_a_surrogate_host_with_its_bucket_spent_is_denied_and_the_lane_lives(nursery, autojump_clock):
    """Before the fix the second request's denial raised UnicodeEncodeError out of the lane."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, connect_limits=ConnectLimiter(HOST_LIMITED))
        await nursery.start(lane.responder.run)
        for cid in (1, 2):
            lane.responder.on_message(_with_host(cid, "\ud800x"))
            await lane.wait_published(cid)
        lane.responder.on_message(_message(3))
        await lane.wait_published(3)
    reasons = [answer for _, answer, _ in lane.answers()]
    assert reasons[0].startswith("bearer is not a compact JWS")
    assert reasons[1].startswith("RATE_LIMITED retry-after 60s host=- limit=host: ")
    assert reasons[2] == "jwt"


class _FailingPublish:
    """The lane's publish, raising RuntimeError for the first ``failures`` calls (our bug)."""

    def __init__(self, lane: Lane, failures: int) -> None:
        self.lane, self.failures, self.inner = lane, failures, lane.responder._publish
        lane.responder._publish = self

    def __call__(self, reply: str, payload: bytes) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("a bug in the publish path")
        self.inner(reply, payload)


async def test_a_failure_in_the_worker_path_drops_that_request_only(nursery, autojump_clock, caplog):
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        _FailingPublish(lane, 1)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        lane.responder.on_message(_message(2))
        await lane.wait_published(1)
    assert [(reply, answer) for reply, answer, _ in lane.answers()] == [("_INBOX.r.2", "jwt")]
    assert lane.responder.statistics().dropped == 1
    assert "failed on one request" in caplog.text


async def test_a_failure_in_the_shed_path_drops_that_request_only(nursery, autojump_clock, caplog):
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        _FailingPublish(lane, 1)
        lane.responder.on_message(_message(1))  # nobody takes it yet
        await trio.sleep_until(0.625)  # the oldest waited past half the budget: the next is shed
        lane.responder.on_message(_message(2))  # shed, and its publish fails: only its own drop
        await nursery.start(lane.responder.run)
        await lane.wait_published(1)
    assert [(reply, answer) for reply, answer, _ in lane.answers()] == [("_INBOX.r.1", "jwt")]
    assert lane.responder.statistics().dropped == 1


async def test_a_failure_in_the_deadline_keeper_drops_that_request_only(nursery, autojump_clock, caplog):
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, waits=[(1.5, True)])
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))  # holds the one worker past its deadline, shielded
        await trio.sleep(0)
        lane.responder.on_message(_message(2))  # queued: the keeper answers it at its deadline
        _FailingPublish(lane, 2)  # 1's and 2's timeout denials both fail to publish
        await trio.sleep_until(3.0)
        lane.responder.on_message(_message(3))  # the keeper and the worker still run
        await lane.wait_published(1)
    assert [(reply, answer) for reply, answer, _ in lane.answers()] == [("_INBOX.r.3", "jwt")]
    assert lane.responder.statistics().dropped == 2
