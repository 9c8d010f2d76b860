"""The device-code login's polling decision (core/device_flow.py; spec "IdP compatibility",
RFC 8628 sections 3.2 and 3.5): one row per answer the IdP can give."""

from __future__ import annotations

import pytest

from dataclasses import replace

from cotal_trio.core.device_flow import (
    DEFAULT_INTERVAL_S,
    MAX_BACKOFF_S,
    DeviceAuthorization,
    Failed,
    NoAnswer,
    PollState,
    Signed,
    Wait,
    next_poll,
    start_polling,
)
from cotal_trio.core.errors import ConfigError

NOW = 1_800_000_000.0
STATE = PollState(space="alpha", interval_s=5, expires_at=NOW + 600)
CODE = {
    "device_code": "d" * 64, "user_code": "BCDF-GHJK", "verification_uri": "http://127.0.0.1:9/device",
    "verification_uri_complete": "http://127.0.0.1:9/device?user_code=BCDF-GHJK", "expires_in": 600, "interval": 5,
}  # fmt: skip
AGAIN = "run `cotal login --space alpha` again"


def _error(code: str, description: str = "") -> tuple[int, dict]:
    return 400, {"error": code, **({"error_description": description} if description else {})}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ((200, {"access_token": "s3cr3t", "token_type": "Bearer", "expires_in": 604800}),
         Signed(session="s3cr3t", expires_in_s=604800)),
        ((200, {"access_token": "s3cr3t"}), Signed(session="s3cr3t", expires_in_s=None)),
        (_error("authorization_pending"), Wait(until=NOW + 5, state=STATE)),
        # RFC 8628 3.5: slow_down adds 5 s to the interval, for this and every later poll.
        (_error("slow_down"), Wait(until=NOW + 10, state=PollState(space="alpha", interval_s=10, expires_at=NOW + 600))),
        (_error("expired_token"), Failed(error="expired_token", reason=(
            f"the user code expired before it was approved - {AGAIN} and approve the new code in time"))),
        (_error("access_denied"), Failed(error="access_denied", reason=(
            f"the sign-in was denied at the IdP - {AGAIN} and approve the code"))),
        (_error("invalid_grant", "unknown device code"), Failed(error="invalid_grant", reason=(
            f"the IdP refused the login (invalid_grant: unknown device code) - {AGAIN}"))),
        ((200, {"token_type": "Bearer"}), Failed(error="invalid_response", reason=(
            f"the IdP refused the login (HTTP 200) - {AGAIN}"))),
        # RFC 8628 3.5: a poll without an answer is retried, at a reduced frequency (twice the wait).
        ((500, {"message": "boom"}), Wait(until=NOW + 10, state=replace(STATE, failures=1))),
        ((503, {}), Wait(until=NOW + 10, state=replace(STATE, failures=1))),
        (NoAnswer(detail="cannot reach the IdP at http://127.0.0.1:9 (Connection refused)"),
         Wait(until=NOW + 10, state=replace(STATE, failures=1))),
        # an OAuth error the RFC says ends the flow ends it, whatever the status it came with
        ((503, {"error": "expired_token"}), Failed(error="expired_token", reason=(
            f"the user code expired before it was approved - {AGAIN} and approve the new code in time"))),
    ],
    ids=["signed", "signed-no-lifetime", "pending", "slow-down", "expired", "denied", "other-error", "no-token", "5xx",
         "503-empty", "no-answer", "expired-in-a-5xx"],
)
def test_next_poll_decides_each_answer(answer, expected):
    assert next_poll(STATE, answer, NOW) == expected


def test_slow_down_accumulates():
    wait = next_poll(STATE, _error("slow_down"), NOW)
    again = next_poll(wait.state, _error("slow_down"), NOW + 10)
    assert again == Wait(until=NOW + 25, state=PollState(space="alpha", interval_s=15, expires_at=NOW + 600))
    # a later authorization_pending keeps the grown interval
    assert next_poll(again.state, _error("authorization_pending"), NOW + 25).until == NOW + 40


def test_polling_is_bounded_by_the_codes_lifetime():
    """A pending answer whose next poll would fall at or after the expiry ends the flow, even
    against an IdP that never says expired_token."""
    late = next_poll(STATE, _error("authorization_pending"), NOW + 595)
    assert isinstance(late, Failed) and late.error == "expired_token"
    slowed = next_poll(STATE, _error("slow_down"), NOW + 591)
    assert isinstance(slowed, Failed) and slowed.error == "expired_token"


def test_transient_failures_back_off_then_an_answer_resets_the_wait():
    """RFC 8628 3.5: each poll without an answer doubles the next wait (at most MAX_BACKOFF_S);
    the first real answer goes back to the interval, slow_down's growth included."""
    waits, state, now = [], STATE, NOW
    for _ in range(5):
        wait = next_poll(state, NoAnswer(detail="timed out"), now)
        waits.append(wait.until - now)
        state, now = wait.state, wait.until
    assert MAX_BACKOFF_S == 60
    assert waits == [10, 20, 40, 60, 60] and state.failures == 5
    assert next_poll(state, _error("authorization_pending"), now) == Wait(until=now + 5, state=STATE)
    assert next_poll(state, _error("slow_down"), now).state == replace(STATE, interval_s=10)


def test_an_interval_past_the_backoff_cap_is_still_waited():
    slowed = replace(STATE, interval_s=90)
    assert next_poll(slowed, (502, {}), NOW) == Wait(until=NOW + 90, state=replace(slowed, failures=1))


def test_transient_failures_until_the_expiry_end_the_flow_naming_the_last_one():
    """Polling stays bounded by the code's lifetime: a retry that would fall at or after the
    expiry ends the flow, with the last failure and both fixes."""
    late = next_poll(STATE, (503, {"message": "overloaded"}), NOW + 590)
    assert late == Failed(error="temporarily_unavailable", reason=(
        "the IdP did not answer the login's polls before the user code expired (HTTP 503: overloaded) - check that"
        f" the IdP runs, then {AGAIN}"))  # fmt: skip
    unreachable = next_poll(STATE, NoAnswer(detail="cannot reach the IdP at http://idp (timed out)"), NOW + 590)
    assert unreachable.reason.startswith(
        "the IdP did not answer the login's polls before the user code expired (cannot reach the IdP at http://idp"
        " (timed out)) - ")


def test_start_polling_waits_one_interval():
    authorization = DeviceAuthorization.from_answer(CODE, idp="http://idp")
    assert start_polling(authorization, space="alpha", now=NOW) == Wait(until=NOW + 5, state=STATE)


def test_a_missing_interval_means_five_seconds():
    authorization = DeviceAuthorization.from_answer({k: v for k, v in CODE.items() if k != "interval"}, idp="http://idp")
    assert authorization.interval_s == DEFAULT_INTERVAL_S == 5
    assert authorization.verification_uri_complete == CODE["verification_uri_complete"]


@pytest.mark.parametrize(
    ("change", "member"),
    [({"device_code": ""}, "device_code"), ({"user_code": 7}, "user_code"), ({"verification_uri": None}, "verification_uri"),
     ({"expires_in": 0}, "expires_in"), ({"expires_in": "600"}, "expires_in"), ({"interval": -1}, "interval"),
     ({"interval": True}, "interval")],
)
def test_a_device_code_answer_of_another_shape_is_named(change, member):
    with pytest.raises(ConfigError, match=f"without a valid {member} - it does not speak the device-code flow"):
        DeviceAuthorization.from_answer({**CODE, **change}, idp="http://idp")


def test_an_interval_of_zero_still_waits_a_second():
    authorization = DeviceAuthorization.from_answer({**CODE, "interval": 0}, idp="http://idp")
    assert start_polling(authorization, space="alpha", now=NOW).until == NOW + 1


def test_an_expires_in_past_the_cap_polls_for_the_cap_only():
    """An IdP naming an absurd code lifetime (here more digits than a float holds): the client
    still bounds its polling, at MAX_EXPIRES_IN_S, instead of an OverflowError traceback."""
    from cotal_trio.core.device_flow import MAX_EXPIRES_IN_S

    authorization = DeviceAuthorization.from_answer({**CODE, "expires_in": 10**400}, idp="http://idp")
    assert authorization.expires_in_s == MAX_EXPIRES_IN_S == 86400
    assert start_polling(authorization, space="alpha", now=NOW).state.expires_at == NOW + 86400
