"""The connect check (cotal_trio/core/callout.py ``check_connect``; spec "Connect limits"): the
bearer, then the buckets of :mod:`cotal_trio.core.limits` it draws on (DESIGN.md 6 steps 3-4).

A bearer whose signature verifies is charged to its actor and owner (expired or not); anything
else to the client host, refused with its own reason until that host is limited.
"""

from __future__ import annotations

import pytest

from cotal_trio.core.bearer import BearerGrant, issue_bearer
from cotal_trio.core.callout import NO_TOKEN_REASON, check_connect, open_request
from cotal_trio.core.errors import RateLimited, Refused
from cotal_trio.core.jose import IssuerKey
from cotal_trio.core.limits import ConnectLimiter, Limit
from tests.support.callout_requests import ISSUER, KEYS, NOW, OWNER, SPACE, UID, VERIFIER, _claims, _sealed

HOST = "198.51.100.7"


# --- check_connect: the bearer, then the limits (DESIGN.md 6 steps 3-4) ------------------------


def _request(token: str | None, host: str = HOST):
    claims = _claims()
    claims["nats"]["client_info"]["host"] = host
    claims["nats"]["connect_opts"] = {"name": "ibx0123456789", **({"auth_token": token} if token else {})}
    return open_request(*_sealed(claims), keys=KEYS, now=NOW)


def _token(*, key: IssuerKey = ISSUER, now: int = NOW, ttl_s: int = 600) -> str:
    grant = BearerGrant(owner=OWNER, actor="cli", scope=("spawn",), lifecycle_uid=UID)
    return issue_bearer(grant, key=key, space=SPACE, now=now, ttl_s=ttl_s)[0]


def _check(limiter: ConnectLimiter, request, at: float = 0.0):
    return check_connect(request, space=SPACE, verifier=VERIFIER, limiter=limiter, now=NOW, at=at)


def test_a_verified_bearer_is_charged_to_its_actor_and_owner():
    limiter = ConnectLimiter()
    bearer = _check(limiter, _request(_token()))
    assert (bearer.owner, bearer.actor) == (OWNER, "cli")
    assert limiter.statistics().buckets == {"actor": 1, "owner": 1, "host": 0}
    assert limiter.level(Limit.ACTOR, f"{OWNER}.cli", 0.0) == 59.0


def test_an_expired_bearer_whose_signature_verifies_is_still_charged_to_its_actor():
    limiter, expired = ConnectLimiter(), _request(_token(now=NOW - 700))
    for _ in range(60):
        with pytest.raises(Refused, match="bearer expired - exchange a fresh one") as refused:
            _check(limiter, expired)
        assert not isinstance(refused.value, RateLimited)
    with pytest.raises(RateLimited) as limited:
        _check(limiter, _request(_token()))
    assert limited.value.reason().startswith(f"RATE_LIMITED retry-after 1s actor=cli owner={OWNER} limit=actor: ")
    assert (limited.value.owner, limited.value.actor) == (OWNER, "cli")
    assert limiter.statistics().buckets == {"actor": 1, "owner": 1, "host": 0}


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (None, NO_TOKEN_REASON),
        ("not-a-jwt", "bearer is not a compact JWS"),
        (_token(key=IssuerKey.generate(bytes([77]) * 32)), "bearer key "),
    ],
    ids=["no bearer", "garbage", "another issuer key"],
)
def test_a_bearer_that_does_not_verify_is_charged_to_the_host_with_its_own_reason(token, reason):
    limiter = ConnectLimiter()
    for _ in range(60):
        with pytest.raises(Refused) as refused:
            _check(limiter, _request(token))
        assert not isinstance(refused.value, RateLimited) and refused.value.reason().startswith(reason)
    with pytest.raises(RateLimited) as limited:
        _check(limiter, _request(token))
    assert limited.value.reason().startswith(f"RATE_LIMITED retry-after 1s host={HOST} limit=host: ")
    assert (limited.value.owner, limited.value.actor) == (None, None)
    assert limiter.statistics().buckets == {"actor": 0, "owner": 0, "host": 1}
    assert _check(limiter, _request(_token())).actor == "cli"  # the host's good bearer still passes
