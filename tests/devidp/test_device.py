"""The development IdP's device-code grants and sessions (devidp/device.py; issue 19 item 5):
Better Auth's answers, RFC 8628's slow_down and expired_token, driven by ``now`` alone."""

from __future__ import annotations

import itertools

import pytest

from cotal_trio.core.errors import ConfigError
from cotal_trio.devidp import DeviceGrants, DevicePolicy
from cotal_trio.devidp.device import SESSION_TTL_S, normalize_user_code

NOW = 1_800_000_000.0
URI = "http://127.0.0.1:9/device"


def _grants(interval_s: int = 5, expires_in_s: int = 600) -> DeviceGrants:
    counter = itertools.count(1)
    return DeviceGrants(policy=DevicePolicy(interval_s=interval_s, expires_in_s=expires_in_s),
                        random_bytes=lambda n: bytes([next(counter) % 256]) * n)  # fmt: skip


def _issue(grants: DeviceGrants) -> dict:
    return grants.issue(client_id="cotal-cli", scope="", verification_uri=URI, now=NOW)


def _poll(grants: DeviceGrants, code: dict, at: float) -> tuple[int, dict]:
    return grants.poll(device_code=code["device_code"], client_id="cotal-cli", now=at)


def test_issue_answers_in_better_auths_shape():
    code = _issue(_grants())
    assert set(code) == {"device_code", "user_code", "verification_uri", "verification_uri_complete", "expires_in", "interval"}
    assert (code["verification_uri"], code["expires_in"], code["interval"]) == (URI, 600, 5)
    assert code["verification_uri_complete"] == f"{URI}?user_code={code['user_code']}"
    assert len(code["user_code"]) == 9 and code["user_code"][4] == "-"


def test_pending_then_approved_gives_an_opaque_session_once():
    grants = _grants()
    code = _issue(grants)
    assert _poll(grants, code, NOW + 5) == (400, {"error": "authorization_pending",
                                                  "error_description": "the user has not approved the code yet"})
    assert grants.approve(user_code=code["user_code"].lower(), subject="alice", now=NOW + 7)
    status, body = _poll(grants, code, NOW + 10)
    assert status == 200 and body["token_type"] == "Bearer" and body["expires_in"] == SESSION_TTL_S
    assert grants.session_subject(body["access_token"], now=NOW + 11) == ("alice", NOW + 7)
    assert _poll(grants, code, NOW + 15)[1]["error"] == "invalid_grant"  # the device code is spent


def test_a_poll_sooner_than_the_interval_is_slow_down_and_the_interval_grows():
    grants = _grants()
    code = _issue(grants)
    assert _poll(grants, code, NOW + 4)[1]["error"] == "slow_down"  # 4 s after the issue
    assert _poll(grants, code, NOW + 9)[1]["error"] == "slow_down"  # now 10 s are needed
    assert _poll(grants, code, NOW + 24)[1]["error"] == "authorization_pending"  # 15 s after the last


def test_expired_token_after_the_lifetime_then_the_code_is_gone():
    grants = _grants(expires_in_s=10)
    code = _issue(grants)
    assert _poll(grants, code, NOW + 10)[1]["error"] == "expired_token"
    assert not grants.approve(user_code=code["user_code"], subject="alice", now=NOW + 11)


def test_an_expired_code_cannot_be_approved():
    grants = _grants(expires_in_s=10)
    code = _issue(grants)
    assert not grants.approve(user_code=code["user_code"], subject="alice", now=NOW + 10)


def test_denied_is_access_denied():
    grants = _grants()
    code = _issue(grants)
    assert grants.deny(user_code=code["user_code"], now=NOW + 1)
    assert not grants.approve(user_code=code["user_code"], subject="alice", now=NOW + 2)  # answered already
    assert _poll(grants, code, NOW + 5)[1]["error"] == "access_denied"


def test_another_client_id_is_invalid_grant():
    grants = _grants()
    code = _issue(grants)
    assert grants.poll(device_code=code["device_code"], client_id="other", now=NOW + 5)[1]["error"] == "invalid_grant"


def test_a_revoked_session_is_gone():
    grants = _grants(interval_s=0)
    code = _issue(grants)
    grants.approve(user_code=code["user_code"], subject="alice", now=NOW)
    session = _poll(grants, code, NOW)[1]["access_token"]
    assert grants.revoke(session) and not grants.revoke(session)
    assert grants.session_subject(session, now=NOW) is None


def test_a_session_expires():
    grants = _grants(interval_s=0)
    code = _issue(grants)
    grants.approve(user_code=code["user_code"], subject="alice", now=NOW)
    session = _poll(grants, code, NOW)[1]["access_token"]
    assert grants.session_subject(session, now=NOW + SESSION_TTL_S) is None


def test_user_codes_normalize():
    assert normalize_user_code(" bcdf-ghjk ") == "BCDFGHJK"


@pytest.mark.parametrize("policy", [{"interval_s": -1}, {"expires_in_s": 0}, {"interval_s": 1.5}])
def test_a_bad_policy_is_refused(policy):
    with pytest.raises(ConfigError):
        DevicePolicy(**policy)
