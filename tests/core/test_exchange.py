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
from cotal_trio.core.views import SessionBinding, TransferTarget

OWNER = "u_rbxbyevw4etgpbzfupdhu2zxwe"
NOW = 1_800_000_000
AGENT_SHAPE = "agent exchange needs { owner: string, actor: string, actorToken: string, ttlSec?: number }"
HUMAN_SHAPE = "human exchange needs { idpToken: string, actor: string, ttlSec?: number }"
BOTH = "exchange takes idpToken (human) OR owner+actorToken (agent), never both"
INSTANCE = "m" * 26
HEX = "c" * 64
TARGET = TransferTarget(instance_id="t" * 26, sha256_hex=HEX)
MANAGER_ONLY = 'managerInstanceId goes only with view manager-caller - add "view": "manager-caller" or drop managerInstanceId'
TRANSFER_ONLY = 'transferWriter goes only with view transfer-writer - add "view": "transfer-writer" or drop transferWriter'


PARSED = [
    ({"idpToken": "jwt", "actor": "cli"}, HumanExchange(id_token="jwt", actor="cli")),
    ({"idpToken": "jwt", "actor": "cli", "ttlSec": 600}, HumanExchange(id_token="jwt", actor="cli", ttl_s=600)),
    ({"owner": OWNER, "actor": "alpha", "actorToken": "s3cret"},
     AgentExchange(owner=OWNER, actor="alpha", actor_token="s3cret")),
    ({"owner": OWNER, "actor": "alpha", "actorToken": "s3cret", "ttlSec": 1},
     AgentExchange(owner=OWNER, actor="alpha", actor_token="s3cret", ttl_s=1)),
    ({"idpToken": "jwt", "actor": "cli", "view": "admin"}, HumanExchange(id_token="jwt", actor="cli", view="admin")),
    ({"idpToken": "jwt", "actor": "cli", "view": "manager-caller"},
     HumanExchange(id_token="jwt", actor="cli", view="manager-caller")),
    ({"idpToken": "jwt", "actor": "cli", "view": "manager-caller", "managerInstanceId": INSTANCE},
     HumanExchange(id_token="jwt", actor="cli", view="manager-caller", manager_instance_id=INSTANCE)),
    ({"idpToken": "jwt", "actor": "cli", "view": "transfer-writer", "transferWriter": {"instanceId": "t" * 26, "hex": HEX}},
     HumanExchange(id_token="jwt", actor="cli", view="transfer-writer", transfer_writer=TARGET)),
    # parsed, then refused by views.check_exchange_view (it names POST /chat-session/bearer)
    ({"idpToken": "jwt", "actor": "cli", "view": "session-caller"},
     HumanExchange(id_token="jwt", actor="cli", view="session-caller")),
    ({"owner": OWNER, "actor": "alpha", "actorToken": "s3cret", "view": "manager-caller"},
     AgentExchange(owner=OWNER, actor="alpha", actor_token="s3cret", view="manager-caller")),
    ({"owner": OWNER, "actor": "alpha", "actorToken": "s3cret", "view": "manager-caller", "managerInstanceId": INSTANCE},
     AgentExchange(owner=OWNER, actor="alpha", actor_token="s3cret", view="manager-caller", manager_instance_id=INSTANCE)),
    # parsed, then refused by views.check_exchange_view (the agent arm offers manager-caller only)
    ({"owner": OWNER, "actor": "alpha", "actorToken": "s3cret", "view": "admin"},
     AgentExchange(owner=OWNER, actor="alpha", actor_token="s3cret", view="admin")),
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
    ({"idpToken": "jwt", "actor": "a.b"}, "an actor name is 1 to 64 letters"),
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
    ({"idpToken": "jwt", "actor": "cli", "view": "god"},
     'view "god" is not a known view - name one of admin, purger, channel-purger, channel-writer, deployer, '
     "manager-service, manager-caller, session-caller, transfer-writer, service-host, or exchange without a view"),
    ({"owner": OWNER, "actor": "a", "actorToken": "s", "view": ""}, 'view "" is not a known view'),
    ({"idpToken": "jwt", "actor": "cli", "owner": OWNER},
     "a human exchange does not take owner - allowed keys: actor, idpToken, managerInstanceId, transferWriter, "
     "ttlSec, view"),
    ({"idpToken": "jwt", "actor": "cli", "view": "manager-caller", "sessionGrant": {}},
     "a human exchange does not take sessionGrant - allowed keys"),
    ({"owner": OWNER, "actor": "a", "actorToken": "s", "extra": 1},
     "an agent exchange does not take extra - allowed keys: actor, actorToken, managerInstanceId, owner, ttlSec, view"),
    ({"owner": OWNER, "actor": "a", "actorToken": "s", "view": "transfer-writer",
      "transferWriter": {"instanceId": "t" * 26, "hex": HEX}},
     "an agent exchange does not take transferWriter - allowed keys: actor, actorToken, managerInstanceId, owner"),
    # managerInstanceId: only with view manager-caller, a lifecycle token
    ({"idpToken": "jwt", "actor": "cli", "managerInstanceId": INSTANCE}, MANAGER_ONLY),
    ({"idpToken": "jwt", "actor": "cli", "view": "admin", "managerInstanceId": INSTANCE}, MANAGER_ONLY),
    ({"owner": OWNER, "actor": "a", "actorToken": "s", "managerInstanceId": INSTANCE}, MANAGER_ONLY),
    ({"idpToken": "jwt", "actor": "cli", "view": "manager-caller", "managerInstanceId": "M" * 26},
     "managerInstanceId must be a manager instance id (26 to 32 characters of a-z and 0-9) - "
     "copy it from `cotal manager list`"),
    ({"idpToken": "jwt", "actor": "cli", "view": "manager-caller", "managerInstanceId": 7},
     "managerInstanceId must be a manager instance id"),
    ({"owner": OWNER, "actor": "a", "actorToken": "s", "view": "manager-caller", "managerInstanceId": None},
     "managerInstanceId must be a manager instance id"),
    # transferWriter: only with view transfer-writer, which needs it
    ({"idpToken": "jwt", "actor": "cli", "transferWriter": {"instanceId": "t" * 26, "hex": HEX}}, TRANSFER_ONLY),
    ({"idpToken": "jwt", "actor": "cli", "view": "channel-writer",
      "transferWriter": {"instanceId": "t" * 26, "hex": HEX}}, TRANSFER_ONLY),
    ({"idpToken": "jwt", "actor": "cli", "view": "transfer-writer"},
     'view transfer-writer needs transferWriter {"instanceId", "hex"} - name the one transcript object to write'),
    ({"idpToken": "jwt", "actor": "cli", "view": "transfer-writer", "transferWriter": None},
     'transferWriter must be exactly {"instanceId"'),
    ({"idpToken": "jwt", "actor": "cli", "view": "transfer-writer", "transferWriter": {"instanceId": "t" * 26}},
     'transferWriter must be exactly {"instanceId"'),
    ({"idpToken": "jwt", "actor": "cli", "view": "transfer-writer",
      "transferWriter": {"instanceId": "t" * 26, "hex": HEX.upper()}}, 'transferWriter must be exactly {"instanceId"'),
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
    assert agent_bearer_ttl(requested, view="manager-caller") == expected
    assert AGENT_BEARER_TTL_S == 300


@pytest.mark.parametrize(
    ("requested", "idp_exp", "view", "expected"),
    [
        (None, NOW + 3600, "transfer-writer", 300),
        (600, NOW + 3600, "transfer-writer", 300),
        (120, NOW + 3600, "transfer-writer", 120),
        (None, NOW + 60, "transfer-writer", 60),
        (None, NOW + 3600, "admin", 900),
        (None, NOW + 3600, "manager-caller", 900),
        (None, NOW + 3600, None, 900),
    ],
)
def test_human_bearer_ttl_respects_the_view_cap(requested, idp_exp, view, expected):
    assert human_bearer_ttl(requested, idp_exp, NOW, view=view) == expected


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
    assert grant_from_row(row, view=None) == grant_from_row(row)


def _row(scope=("spawn",)) -> LedgerRow:
    return LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=OWNER, actor="cli", scope=scope, allow_subscribe=(">",),
        allow_publish=(), lifecycle_uid="a" * 26, granted_at="2026-11-29T10:00:00Z",
    )  # fmt: skip


SESSION = SessionBinding(endpoint="web", session_id="s" * 43, epoch=1, exp=NOW + 3600)


@pytest.mark.parametrize(
    ("scope", "view", "bindings"),
    [
        (("admin",), "admin", {}),
        (("admin", "spawn"), "channel-writer", {}),
        (("spawn",), "deployer", {}),
        (("supervise",), "manager-service", {}),
        ((), "manager-caller", {"manager_instance_id": INSTANCE}),
        (("spawn",), "manager-caller", {"manager_instance_id": INSTANCE}),
        ((), "session-caller", {"session": SESSION}),
        (("admin",), "transfer-writer", {"transfer_writer": TARGET}),
    ],
)
def test_grant_from_row_for_a_view(scope, view, bindings):
    assert grant_from_row(_row(scope), view=view, credential_id="root.x", **bindings) == BearerGrant(
        owner=OWNER, actor="cli", scope=scope, lifecycle_uid="a" * 26, view=view, credential_id="root.x", **bindings
    )


@pytest.mark.parametrize(
    ("scope", "view", "needed"),
    [((), "admin", "admin"), (("spawn",), "purger", "admin"), (("admin",), "deployer", "spawn"),
     (("admin",), "manager-service", "supervise"), (("spawn",), "transfer-writer", "admin")],
)  # fmt: skip
def test_grant_from_row_refuses_a_view_the_row_lacks_scope_for(scope, view, needed):
    bindings = {"transfer_writer": TARGET} if view == "transfer-writer" else {}
    with pytest.raises(Refused) as info:
        grant_from_row(_row(scope), view=view, **bindings)
    assert info.value.code is RefusalCode.NOT_GRANTED
    assert info.value.detail.startswith(f"view {view} needs ledger scope {needed} - the operator grants it with")


@pytest.mark.parametrize(
    ("view", "bindings", "fragment"),
    [
        ("manager-caller", {}, "managerInstanceId goes with view manager-caller"),
        ("session-caller", {}, "session goes with view session-caller"),
        (None, {"manager_instance_id": INSTANCE}, "managerInstanceId goes with view manager-caller"),
        ("manager-caller", {"manager_instance_id": INSTANCE, "transfer_writer": TARGET}, "transferWriter goes with"),
    ],
)
def test_grant_from_row_refuses_a_broken_pairing(view, bindings, fragment):
    with pytest.raises(Refused) as info:
        grant_from_row(_row(("admin",)), view=view, **bindings)
    assert info.value.code is RefusalCode.BAD_REQUEST
    assert fragment in info.value.detail
