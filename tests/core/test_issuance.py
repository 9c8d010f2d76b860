"""The issuance row (core/issuance.py): key, fields, codec, lifetime, denial reasons."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core import natsjwt
from cotal_trio.core.bearer import BearerGrant, issue_bearer
from cotal_trio.core.callout import decide_connect, mint_user_jwt, open_request
from cotal_trio.core.errors import CodecError
from cotal_trio.core.issuance import (
    EXPIRY_TOLERANCE_S,
    LEGACY_ROWS,
    IssuanceRow,
    is_expired,
    issuance_key,
    issuance_row,
    parse_row,
    principal_rows,
    render_row,
    row_ttl_s,
)
from cotal_trio.core.nkeys import Prefix
from tests.support.callout_requests import (
    ISSUER,
    KEYS,
    NOW,
    OWNER,
    SPACE,
    UID,
    USER_NKEY,
    VERIFIER,
    _claims,
    _key,
    _row,
    _sealed,
)

ROW = IssuanceRow(
    space=SPACE, owner=OWNER, actor="cli", lifecycle_uid=UID, credential_id=None, view=None, iat=NOW, exp=NOW + 300,
)
STORED = (
    '{"ver":1,"space":"alpha","owner":"%s","actor":"cli","lifecycleUid":"%s","credentialId":null,'
    '"view":null,"iat":%d,"exp":%d}' % (OWNER, UID, NOW, NOW + 300)
).encode()


def test_the_key_is_natkey_the_principal_and_the_user_nkey():
    # issue 15 item 1: keyed by principal, so one filtered listing finds a principal's rows
    assert issuance_key(OWNER, "cli", USER_NKEY) == f"natkey.{OWNER}.cli.{USER_NKEY}"
    assert principal_rows(OWNER, "cli") == f"natkey.{OWNER}.cli.>"
    assert LEGACY_ROWS == "natkey.*"  # the upstream form natkey.<user nkey>: one token, never a keyed row


@pytest.mark.parametrize(
    "bad", [_key(Prefix.ACCOUNT, 9).public_key, "UABC", "", f"{USER_NKEY}.x", USER_NKEY.lower()]
)
def test_only_a_user_nkey_makes_a_key(bad):
    with pytest.raises(CodecError, match="user_nkey is not a public user nkey"):
        issuance_key(OWNER, "cli", bad)


@pytest.mark.parametrize(("owner", "actor"), [("u_x", "cli"), (OWNER, "a.b"), (OWNER, ">"), (OWNER, "")])
def test_only_a_principal_makes_a_key(owner, actor):
    """Owner and actor become subject tokens: a dot or a wildcard in either would widen a filter."""
    with pytest.raises(CodecError, match="is not a derived owner|is not an actor name"):
        issuance_key(owner, actor, USER_NKEY)
    with pytest.raises(CodecError, match="is not a derived owner|is not an actor name"):
        principal_rows(owner, actor)


def test_the_row_is_stored_as_compact_json_in_the_documented_order():
    assert render_row(ROW) == STORED
    assert parse_row(STORED) == ROW


def test_the_row_carries_the_minted_jwts_iat_and_exp_and_the_bearers_authority():
    """Built from the grant the JWT is minted from and the mint's ``now``, the row's iat/exp
    are exactly the user JWT's; lifecycle, credential and view come from the bearer."""
    token, _ = issue_bearer(
        BearerGrant(owner=OWNER, actor="cli", scope=("spawn",), lifecycle_uid=UID, credential_id="c" * 26),
        key=ISSUER, space=SPACE, now=NOW, ttl_s=600,
    )
    claims = _claims()
    claims["nats"]["connect_opts"]["auth_token"] = token
    request = open_request(*_sealed(claims), keys=KEYS, now=NOW)
    bearer = VERIFIER.validate(token, space=SPACE, now=NOW + 0.7)
    grant = decide_connect(request, bearer, (_row(), None), space=SPACE, now=NOW + 0.7)
    row = issuance_row(bearer, grant, space=SPACE, iat=int(NOW + 0.7))
    user = natsjwt.verify(mint_user_jwt(request, grant, keys=KEYS, now=int(NOW + 0.7)))
    assert (row.iat, row.exp) == (user["iat"], user["exp"]) == (NOW, NOW + 600)
    assert (row.owner, row.actor, row.lifecycle_uid, row.credential_id, row.view) == (OWNER, "cli", UID, "c" * 26, None)
    assert row.space == SPACE


def _obj(**changes) -> bytes:
    obj = json.loads(STORED)
    obj.update(changes)
    return json.dumps(obj).encode()


def _without(key: str) -> bytes:
    obj = json.loads(STORED)
    del obj[key]
    return json.dumps(obj).encode()


BAD_ROWS = {
    "not json": (b"{nope", "it is not UTF-8 JSON"),
    "not utf-8": (b"\xff\xfe", "it is not UTF-8 JSON"),
    "a list": (b"[]", "keys must be exactly"),
    "missing exp": (_without("exp"), "keys must be exactly"),
    "an unknown key": (_obj(extra=1), "keys must be exactly"),
    "ver 2": (_obj(ver=2), "ver 2 is not understood"),
    "ver true": (_obj(ver=True), "ver True is not understood"),
    "bad space": (_obj(space="Alpha!"), "space is not a space name"),
    "bad owner": (_obj(owner="alice"), "owner is not a derived owner"),
    "bad actor": (_obj(actor="a b"), "actor is not an actor name"),
    "bad lifecycle": (_obj(lifecycleUid="x"), "lifecycleUid is malformed"),
    "bad credential": (_obj(credentialId="!"), "credentialId is malformed"),
    "unknown view": (_obj(view="god"), "view is not a known view"),
    "a list view": (_obj(view=["manager-caller"]), "view is not a known view"),  # was a TypeError
    "float iat": (_obj(iat=1.5), "iat and exp must be whole unix seconds"),
    "bool exp": (_obj(exp=True), "iat and exp must be whole unix seconds"),
    "exp before iat": (_obj(exp=NOW), "exp must be after iat"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_unreadable_rows_are_named(case):
    data, problem = BAD_ROWS[case]
    with pytest.raises(CodecError, match="^issuance row: " + problem.replace("(", r"\(")):
        parse_row(data)


@pytest.mark.parametrize(
    ("now", "expired", "ttl_s"),
    [
        (NOW, False, 305),
        (NOW + 0.5, False, 305),  # whole seconds, rounded up: never before exp + tolerance
        (NOW + 300, False, 5),
        (NOW + 304.9, False, 1),
        (NOW + 305, True, 1),  # the server rejects a TTL of 0: the sweep prunes it instead
        (NOW + 900, True, 1),
    ],
)
def test_a_row_lives_until_its_exp_plus_the_clock_tolerance(now, expired, ttl_s):
    assert EXPIRY_TOLERANCE_S == 5
    assert (is_expired(ROW, now=now), row_ttl_s(ROW, now=now)) == (expired, ttl_s)


@given(
    iat=st.integers(min_value=0, max_value=2**40),
    life=st.integers(min_value=1, max_value=10**6),
    now=st.floats(min_value=0, max_value=2**40, allow_nan=False),
    credential=st.sampled_from([None, "c" * 26]),
)
def test_codec_round_trips_and_the_ttl_never_ends_before_expiry(iat, life, now, credential):
    row = IssuanceRow(
        space=SPACE, owner=OWNER, actor="cli", lifecycle_uid=UID, credential_id=credential, view=None,
        iat=iat, exp=iat + life,
    )
    assert parse_row(render_row(row)) == row
    ttl_s = row_ttl_s(row, now=now)
    assert ttl_s >= 1 and (now + ttl_s >= row.exp + EXPIRY_TOLERANCE_S)
    assert is_expired(row, now=now) == (now >= row.exp + EXPIRY_TOLERANCE_S)
