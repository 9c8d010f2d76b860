"""Exchange bodies, bearer lifetimes and grants (DESIGN 7; reference/upstream-notes.md 3.5)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core.bearer import BearerGrant
from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.exchange import (
    AGENT_BEARER_TTL_S,
    HUMAN_TTL_DEFAULT_S,
    AgentExchange,
    HumanExchange,
    agent_bearer_ttl,
    grant_from_row,
    human_bearer_ttl,
    parse_exchange_body,
)
from cotal_trio.core.ledger import LedgerKind, LedgerRow

OWNER = "u_rbxbyevw4etgpbzfupdhu2zxwe"
NOW = 1_800_000_000
AGENT_SHAPE = "agent exchange needs { owner: string, actor: string, actorToken: string, ttlSec?: number }"
HUMAN_SHAPE = "human exchange needs { idpToken: string, actor: string, ttlSec?: number }"
BOTH = "exchange takes idpToken (human) OR owner+actorToken (agent), never both"


PARSED = [
    ({"idpToken": "jwt", "actor": "cli"}, HumanExchange(id_token="jwt", actor="cli")),
    ({"idpToken": "jwt", "actor": "cli", "ttlSec": 600}, HumanExchange(id_token="jwt", actor="cli", ttl_s=600)),
    ({"owner": OWNER, "actor": "alpha", "actorToken": "s3cret"},
     AgentExchange(owner=OWNER, actor="alpha", actor_token="s3cret")),
    ({"owner": OWNER, "actor": "alpha", "actorToken": "s3cret", "ttlSec": 1},
     AgentExchange(owner=OWNER, actor="alpha", actor_token="s3cret", ttl_s=1)),
]  # fmt: skip


@pytest.mark.parametrize(("body", "expected"), PARSED)
def test_parse(body, expected):
    assert parse_exchange_body(body) == expected


def test_secrets_stay_out_of_repr():
    assert "s3cret" not in repr(parse_exchange_body({"owner": OWNER, "actor": "a", "actorToken": "s3cret"}))
    assert "eyJ" not in repr(parse_exchange_body({"idpToken": "eyJhbGc", "actor": "cli"}))


REFUSED = [
    # (body, exact sentence or fragment)
    ([], "the exchange body must be a JSON object"),
    ("x", "the exchange body must be a JSON object"),
    (None, "the exchange body must be a JSON object"),
    ({"idpToken": "jwt", "actorToken": "s", "owner": OWNER, "actor": "cli"}, BOTH),
    ({}, BOTH + " - the body has neither"),
    ({"actor": "cli"}, BOTH + " - the body has neither"),
    ({"owner": OWNER, "actor": "alpha"}, AGENT_SHAPE),
    ({"actorToken": "s", "actor": "alpha"}, AGENT_SHAPE),
    ({"owner": OWNER, "actorToken": "s"}, AGENT_SHAPE),
    ({"owner": 5, "actor": "alpha", "actorToken": "s"}, AGENT_SHAPE),
    ({"owner": OWNER, "actor": "alpha", "actorToken": ""}, AGENT_SHAPE),
    ({"owner": OWNER, "actor": "alpha", "actorToken": 7}, AGENT_SHAPE),
    ({"idpToken": "jwt"}, HUMAN_SHAPE),
    ({"idpToken": "", "actor": "cli"}, HUMAN_SHAPE),
    ({"idpToken": 3, "actor": "cli"}, HUMAN_SHAPE),
    ({"idpToken": "jwt", "actor": 3}, HUMAN_SHAPE),
    ({"idpToken": "jwt", "actor": "a.b"}, "an actor name uses only letters"),
    ({"owner": "local", "actor": "alpha", "actorToken": "s"}, "an owner is u_"),
    ({"idpToken": "jwt", "actor": "cli", "ttlSec": 0}, "ttlSec must be a positive whole number"),
    ({"idpToken": "jwt", "actor": "cli", "ttlSec": -5}, "ttlSec must be a positive whole number"),
    ({"idpToken": "jwt", "actor": "cli", "ttlSec": 1.5}, "ttlSec must be a positive whole number"),
    ({"idpToken": "jwt", "actor": "cli", "ttlSec": "60"}, "ttlSec must be a positive whole number"),
    ({"idpToken": "jwt", "actor": "cli", "ttlSec": True}, "ttlSec must be a positive whole number"),
    ({"idpToken": "jwt", "actor": "cli", "ttlSec": None}, "ttlSec must be a positive whole number"),
    ({"owner": OWNER, "actor": "a", "actorToken": "s", "ttlSec": 0}, "ttlSec must be a positive whole number"),
    ({"idpToken": "jwt", "actor": "cli", "view": 3}, "view must be a string"),
    ({"idpToken": "jwt", "actor": "cli", "view": None}, "view must be a string"),
    ({"idpToken": "jwt", "actor": "cli", "view": "manager-caller"},
     'view "manager-caller" is not offered by this auth service'),
    ({"owner": OWNER, "actor": "a", "actorToken": "s", "view": "admin"},
     'view "admin" is not offered by this auth service'),
    ({"idpToken": "jwt", "actor": "cli", "owner": OWNER},
     "a human exchange does not take owner - allowed keys: actor, idpToken, ttlSec, view"),
    ({"idpToken": "jwt", "actor": "cli", "managerInstanceId": "x", "sessionGrant": {}},
     "a human exchange does not take managerInstanceId, sessionGrant - allowed keys"),
    ({"owner": OWNER, "actor": "a", "actorToken": "s", "extra": 1},
     "an agent exchange does not take extra - allowed keys: actor, actorToken, owner, ttlSec, view"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "fragment"), REFUSED)
def test_parse_refuses(body, fragment):
    with pytest.raises(Refused) as info:
        parse_exchange_body(body)
    assert info.value.code is RefusalCode.BAD_REQUEST
    assert fragment in info.value.detail


@pytest.mark.parametrize(
    ("requested", "idp_exp", "expected"),
    [
        (None, NOW + 3600, HUMAN_TTL_DEFAULT_S),
        (600, NOW + 3600, 600),
        (5000, NOW + 3600, 900),
        (None, NOW + 120, 120),
        (600, NOW + 1, 1),
    ],
)
def test_human_bearer_ttl(requested, idp_exp, expected):
    assert human_bearer_ttl(requested, idp_exp, NOW) == expected


@pytest.mark.parametrize("idp_exp", [NOW, NOW - 1])
def test_human_bearer_ttl_refuses_an_expired_proof(idp_exp):
    with pytest.raises(Refused) as info:
        human_bearer_ttl(None, idp_exp, NOW)
    assert info.value.code is RefusalCode.BAD_CREDENTIAL
    assert "sign in to the IdP again" in info.value.detail


@given(st.none() | st.integers(min_value=1, max_value=10**6), st.integers(min_value=1, max_value=10**5))
def test_human_bearer_never_outlives_its_proof(requested, remaining):
    ttl = human_bearer_ttl(requested, NOW + remaining, NOW)
    assert 1 <= ttl <= min(900, remaining)


@pytest.mark.parametrize(("requested", "expected"), [(None, 300), (60, 60), (300, 300), (301, 300), (10**6, 300)])
def test_agent_bearer_ttl(requested, expected):
    assert agent_bearer_ttl(requested) == expected
    assert AGENT_BEARER_TTL_S == 300


def test_grant_from_row():
    row = LedgerRow(
        kind=LedgerKind.MANAGED, owner=OWNER, actor="alpha", scope=("spawn",), allow_subscribe=(">",),
        allow_publish=(), parent=f"{OWNER}.cli", role="default", token_hash="0" * 64,
        lifecycle_uid="a" * 26, granted_at="2026-11-29T10:00:00Z",
    )  # fmt: skip
    assert grant_from_row(row) == BearerGrant(
        owner=OWNER, actor="alpha", scope=("spawn",), lifecycle_uid="a" * 26, parent=f"{OWNER}.cli"
    )
    assert grant_from_row(row, credential_id="root.x").credential_id == "root.x"
