"""The pure callout steps (DESIGN.md section 6): provenance, bearer, ledger match, mint, respond.

Requests are built here as the broker builds them (reference/nats-operator-mode.md 4.3): a NATS
JWT signed by a server key, sealed to the space xkey, with the server's xkey in the header.
"""

from __future__ import annotations

import pytest

from cotal_trio.core import natsjwt
from cotal_trio.core.admission import broker_gave_up
from cotal_trio.core.bearer import BearerGrant, issue_bearer
from cotal_trio.core.callout import (
    SERVER_XKEY_HEADER,
    CalloutKeys,
    Dropped,
    check_bearer,
    decide_connect,
    encode_response,
    mint_user_jwt,
    open_request,
)
from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.nkeys import Prefix
from cotal_trio.core.views import SessionBinding, TransferTarget
from cotal_trio.core.xkeys import XKeyPair
from tests.support.callout_requests import (
    ISSUER,
    KEYS,
    NOW,
    OTHER_SERVER,
    OWNER,
    SERVER,
    SERVER_X,
    SPACE,
    UID,
    USER_NKEY,
    VERIFIER,
    _bearer,
    _claims,
    _key,
    _row,
    _sealed,
)


def test_open_request_reads_a_good_request():
    payload, headers = _sealed()
    request = open_request(payload, headers, keys=KEYS, now=NOW)
    assert (request.server_id, request.user_nkey, request.client_id) == (SERVER.public_key, USER_NKEY, 42)
    assert (request.auth_token, request.connect_name) == ("tok", "ibx0123456789")


def _other_xkey_header():
    return {SERVER_XKEY_HEADER: XKeyPair.from_raw(bytes([11]) * 32).public_key}


DROPS = [
    ("no header", lambda: (_sealed()[0], {}), "unsealed"),
    ("plain JWT", lambda: (natsjwt.encode(_claims(), SERVER, iat=NOW).encode(), _sealed()[1]), "not a valid sealed"),
    ("header names another xkey", lambda: (_sealed()[0], _other_xkey_header()), "not a valid sealed"),
    ("signed by another server", lambda: _sealed(signer=OTHER_SERVER), "issuer is not the server"),
    ("signed by an account key", lambda: _sealed(signer=_key(Prefix.ACCOUNT, 12)), "issuer is not the server"),
    ("wrong audience", lambda: _sealed(_claims(aud="nats")), "audience"),
    ("another account", lambda: _sealed(_claims(sub=_key(Prefix.ACCOUNT, 13).public_key)), "not this space"),
    ("expired", lambda: _sealed(_claims(exp=NOW - 1)), "expired"),
    ("garbage", lambda: (b"xkv1" + bytes(40), _sealed()[1]), "not a valid sealed"),
]


@pytest.mark.parametrize(("name", "build", "match"), DROPS, ids=[d[0] for d in DROPS])
def test_provenance_failures_are_dropped(name, build, match):
    payload, headers = build()
    with pytest.raises(Dropped, match=match):
        open_request(payload, headers, keys=KEYS, now=NOW)


def test_request_exp_is_whole_seconds_truncated_by_the_broker():
    # nats-server truncates exp to the second: at NOW + 0.9 an exp of NOW is still live.
    payload, headers = _sealed(_claims(exp=NOW))
    assert open_request(payload, headers, keys=KEYS, now=NOW + 0.9).exp == NOW
    with pytest.raises(Dropped, match="expired"):
        open_request(payload, headers, keys=KEYS, now=NOW + 1)


def test_request_expiry_allows_for_the_clock_skew_as_the_give_up_rule_does():
    """``open_request`` drops exactly when :func:`broker_gave_up` says the broker has surely
    given up: at ``exp + 1 + skew`` on our clock (it ignored the skew, review of issue 14)."""
    payload, headers = _sealed(_claims(exp=NOW))
    assert open_request(payload, headers, keys=KEYS, now=NOW + 1.5, skew_s=0.75).exp == NOW  # ours 0.75 ahead
    with pytest.raises(Dropped, match="expired"):
        open_request(payload, headers, keys=KEYS, now=NOW + 1.75, skew_s=0.75)
    with pytest.raises(Dropped, match="expired"):  # ours behind: it gave up earlier on our clock
        open_request(payload, headers, keys=KEYS, now=NOW + 0.5, skew_s=-0.5)
    for now, skew_s in ((NOW + 0.5, -0.5), (NOW + 1.5, 0.75), (NOW + 1.75, 0.75), (NOW + 0.25, 0.0)):
        try:
            open_request(payload, headers, keys=KEYS, now=now, skew_s=skew_s)
            dropped = False
        except Dropped:
            dropped = True
        assert dropped == broker_gave_up(now=now, exp=NOW, skew_s=skew_s)


def test_signed_xkey_must_equal_the_header_key():
    other = XKeyPair.from_raw(bytes([14]) * 32)
    claims = _claims()
    claims["nats"]["server_id"]["xkey"] = other.public_key
    payload, headers = _sealed(claims)
    with pytest.raises(Dropped, match="header xkey differs"):
        open_request(payload, headers, keys=KEYS, now=NOW)


def test_server_allow_list():
    pinned = CalloutKeys(**{**{f: getattr(KEYS, f) for f in KEYS.__dataclass_fields__}, "server_ids": frozenset({OTHER_SERVER.public_key})})
    payload, headers = _sealed()
    with pytest.raises(Dropped, match="allow-list"):
        open_request(payload, headers, keys=pinned, now=NOW)


def _request(token="tok", name="ibx0123456789"):
    claims = _claims()
    claims["nats"]["connect_opts"] = {k: v for k, v in (("auth_token", token), ("name", name)) if v is not None}
    return open_request(*_sealed(claims), keys=KEYS, now=NOW)


def test_missing_bearer_is_refused():
    with pytest.raises(Refused, match="no user token presented"):
        check_bearer(_request(token=None), space=SPACE, verifier=VERIFIER, now=NOW)


def test_bearer_for_another_space_is_refused():
    with pytest.raises(Refused):
        check_bearer(_request(token=_bearer()), space="beta", verifier=VERIFIER, now=NOW)


def test_allowed_connect_mints_the_rows_grant():
    request = _request(token=_bearer())
    bearer = check_bearer(request, space=SPACE, verifier=VERIFIER, now=NOW)
    grant = decide_connect(request, bearer, (_row(), None), space=SPACE, now=NOW)
    user = natsjwt.verify(mint_user_jwt(request, grant, keys=KEYS, now=NOW))
    assert user["sub"] == USER_NKEY and user["iss"] == KEYS.data_signer.public_key
    assert user["name"] == f"{OWNER}-cli" and user["exp"] == NOW + 600
    assert user["nats"]["issuer_account"] == KEYS.data_account
    assert user["nats"]["tags"] == [f"owner:{OWNER}", "actor:cli", f"principal:{OWNER}.cli"]
    assert user["nats"]["pub"]["allow"] == AGENT_PUB
    assert user["nats"]["sub"]["allow"] == ["cotal.alpha.ch.team.>", f"cotal.alpha.dm.{OWNER}.cli.>", "_INBOX_ibx0123456789.>"]


# The agent profile of the row above (docs/wire-layout.md): its channel, any DM, its own control
# subjects and the spawn capability its scope declares, its DM inbox bind, presence, USER.INFO.
AGENT_PUB = [
    "cotal.alpha.ch.team.news", f"cotal.alpha.dm.*.*.{OWNER}.cli", f"cotal.alpha.dm.*.*.{OWNER}.cli.>",
    f"cotal.alpha.ctl.despawn.{OWNER}.cli",
    f"cotal.alpha.ctl.turn.{OWNER}.cli", "cotal.alpha.ctl.spawn", f"cotal.alpha.ctl.stop.{OWNER}.cli.*",
    "cotal.alpha.ctl.persona", f"$JS.API.CONSUMER.INFO.COTAL_DM_alpha.dm-{OWNER}-cli",
    f"$JS.API.CONSUMER.MSG.NEXT.COTAL_DM_alpha.dm-{OWNER}-cli", f"$JS.ACK.COTAL_DM_alpha.dm-{OWNER}-cli.>",
    *(f"$JS.API.CONSUMER.{verb}.KV_cotal_{kind}_alpha.watch-{kind}-{OWNER}-cli"
      for kind in ("presence", "channels") for verb in ("INFO", "MSG.NEXT")),
    "$JS.API.DIRECT.GET.KV_cotal_presence_alpha", "$JS.API.DIRECT.GET.KV_cotal_presence_alpha.>",
    f"$KV.cotal_presence_alpha.{OWNER}.cli", "$SYS.REQ.USER.INFO",
]  # fmt: skip


def test_the_rows_role_and_capabilities_reach_the_minted_profile():
    # spec credential-authority "Capabilities": run is a declared capability minted into the cred;
    # the row's role binds its task queue
    request = _request(token=_bearer(scope=("spawn", "run")))
    bearer = check_bearer(request, space=SPACE, verifier=VERIFIER, now=NOW)
    grant = decide_connect(request, bearer, (_row(role="ops", scope=("spawn", "run")), None), space=SPACE, now=NOW)
    added = set(grant.permissions.pub_allow) - set(AGENT_PUB)
    assert added == {
        *(f"cotal.alpha.ctl.run.{verb}" for verb in ("start", "resume", "answer", "status", "list")),
        "$JS.API.CONSUMER.INFO.COTAL_TASK_alpha.task-ops", "$JS.API.CONSUMER.MSG.NEXT.COTAL_TASK_alpha.task-ops",
        "$JS.ACK.COTAL_TASK_alpha.task-ops.>",
    }  # fmt: skip
    plain = decide_connect(request, check_bearer(_request(token=_bearer(scope=())), space=SPACE, verifier=VERIFIER, now=NOW),
                           (_row(scope=()), None), space=SPACE, now=NOW)
    assert not [s for s in plain.permissions.pub_allow if s in ("cotal.alpha.ctl.spawn", "cotal.alpha.ctl.persona")]


@pytest.mark.parametrize(
    ("rows", "name", "match"),
    [
        ((None, None), "ibx0123456789", "not granted"),
        ((_row(lifecycle_uid="b" * 26), None), "ibx0123456789", "re-granted or revoked"),
        ((_row(scope=()), None), "ibx0123456789", "scope"),
        ((_row(), None), None, "has no name"),
        ((_row(), None), "bad name!", "nonce"),
    ],
)
def test_ledger_and_name_refusals(rows, name, match):
    request = _request(token=_bearer(), name=name)
    bearer = check_bearer(request, space=SPACE, verifier=VERIFIER, now=NOW)
    with pytest.raises(Refused, match=match):
        decide_connect(request, bearer, rows, space=SPACE, now=NOW)


def test_bearer_inside_the_skew_is_not_minted_an_expired_user():
    # validate_bearer accepts up to exp + 5 s of skew; a user JWT with that exp would be dead.
    request = _request(token=_bearer())
    bearer = check_bearer(request, space=SPACE, verifier=VERIFIER, now=NOW + 602)
    with pytest.raises(Refused, match="bearer expired"):
        decide_connect(request, bearer, (_row(), None), space=SPACE, now=NOW + 600)
    assert decide_connect(request, bearer, (_row(), None), space=SPACE, now=NOW + 599).exp == NOW + 600


def test_response_is_signed_by_the_auth_key_and_sealed_to_the_server():
    request = _request()
    sealed = encode_response(request, keys=KEYS, now=NOW, error="nope")
    claims = natsjwt.verify(SERVER_X.open(sealed, KEYS.xkey.public_key))
    assert claims["sub"] == USER_NKEY and claims["aud"] == SERVER.public_key
    assert claims["iss"] == KEYS.auth_signer.public_key
    assert claims["nats"] == {"type": "authorization_response", "version": 2, "issuer_account": KEYS.auth_account, "error": "nope"}


# --- view bearers (docs/views.md; spec "Listener policy") -----------------------------------

INSTANCE = "m" * 26
SESSION_ID = "S" * 43
HEX = "7e" * 32
NONCE = "ibx0123456789"


def _view_bearer(view, *, scope, ttl_s=300, **bindings):
    grant = BearerGrant(owner=OWNER, actor="cli", scope=scope, lifecycle_uid=UID, view=view, **bindings)
    return issue_bearer(grant, key=ISSUER, space=SPACE, now=NOW, ttl_s=ttl_s)[0]


def _decide(token, row):
    request = _request(token=token)
    bearer = check_bearer(request, space=SPACE, verifier=VERIFIER, now=NOW)
    return decide_connect(request, bearer, (row, None), space=SPACE, now=NOW)


VIEW_CONNECTS = [
    # (view, bearer scope, bindings, row scope, pub allow, sub allow)
    ("admin", ("admin",), {}, ("admin", "spawn"),
     ["$SYS.REQ.USER.INFO"], ["cotal.alpha.>", f"_INBOX_{NONCE}.>"]),
    ("channel-writer", ("admin",), {}, ("admin",),
     ["cotal.alpha.ctl.channels.set", "cotal.alpha.ctl.channels.defaults", "$SYS.REQ.USER.INFO"], [f"_INBOX_{NONCE}.>"]),
    ("deployer", ("spawn",), {}, ("spawn",), ["cotal.alpha.ctl.deploy.>", "$SYS.REQ.USER.INFO"], [f"_INBOX_{NONCE}.>"]),
    ("manager-caller", (), {"manager_instance_id": INSTANCE}, ("spawn",),
     [f"cotal.alpha.mgr.{INSTANCE}.call", "$SYS.REQ.USER.INFO"], [f"_INBOX_{NONCE}.>"]),
    ("manager-caller", ("spawn",), {"manager_instance_id": INSTANCE}, ("spawn",),
     [f"cotal.alpha.mgr.{INSTANCE}.call", f"cotal.alpha.mgr.{INSTANCE}.status", f"cotal.alpha.mgr.{INSTANCE}.models",
      f"cotal.alpha.mgr.{INSTANCE}.resolve-cwd", "$SYS.REQ.USER.INFO"], [f"_INBOX_{NONCE}.>"]),
    ("session-caller", (), {"session": SessionBinding(endpoint="web", session_id=SESSION_ID, epoch=1, exp=NOW + 3600)},
     (), [f"cotal.alpha.session.{SESSION_ID}.in", "$SYS.REQ.USER.INFO"],
     [f"cotal.alpha.session.{SESSION_ID}.out", f"_INBOX_{NONCE}.>"]),
    ("transfer-writer", ("admin",), {"transfer_writer": TransferTarget(instance_id=INSTANCE, sha256_hex=HEX)},
     ("admin",), [f"cotal.alpha.transfer.{INSTANCE}.{HEX}", "$SYS.REQ.USER.INFO"], [f"_INBOX_{NONCE}.>"]),
]  # fmt: skip


@pytest.mark.parametrize(("view", "scope", "bindings", "row_scope", "pub", "sub"), VIEW_CONNECTS)
def test_a_view_bearer_is_minted_the_view_profile(view, scope, bindings, row_scope, pub, sub):
    request = _request(token=_view_bearer(view, scope=scope, **bindings))
    grant = _decide(request.auth_token, _row(scope=row_scope))
    user = natsjwt.verify(mint_user_jwt(request, grant, keys=KEYS, now=NOW))
    assert (grant.owner, grant.actor, grant.exp) == (OWNER, "cli", NOW + 300)
    assert user["nats"]["pub"] == {"allow": pub}
    assert user["nats"]["sub"] == {"allow": sub}
    assert not any(".ch." in subject or ".dm." in subject for subject in pub + sub)


def test_a_view_bearer_whose_row_lost_the_scope_is_refused():
    token = _view_bearer("channel-purger", scope=("admin",))
    assert _decide(token, _row(scope=("admin",))).permissions.pub_allow[0] == "cotal.alpha.ctl.channels.delete"
    with pytest.raises(Refused) as info:
        _decide(token, _row(scope=("spawn",)))  # revoked admin since the exchange
    assert info.value.code is RefusalCode.NOT_GRANTED
    assert "bearer scope admin is no longer granted" in info.value.detail


def test_a_view_bearer_without_the_scope_is_refused_on_the_fresh_row():
    # A bearer signed without the view's scope (never minted by grant_from_row) still gets no view.
    token = _view_bearer("admin", scope=("spawn",))
    with pytest.raises(Refused) as info:
        _decide(token, _row(scope=("spawn",)))
    assert info.value.code is RefusalCode.NOT_GRANTED
    assert info.value.detail == (
        f"view admin needs ledger scope admin - the operator grants it with `cotal actor grant cli --owner "
        f"{OWNER} --scope admin` (listing the actor's other scope tokens too)"
    )
    with pytest.raises(Refused, match="view admin needs scope admin in the bearer too") as info:
        _decide(token, _row(scope=("spawn", "admin")))
    assert info.value.code is RefusalCode.NOT_GRANTED


def test_a_bearer_without_a_view_keeps_the_agent_profile():
    grant = _decide(_bearer(), _row(scope=("spawn", "admin")))
    assert list(grant.permissions.pub_allow) == AGENT_PUB
