"""The view table and its pure checks (spec "Listener policy"; reference/upstream-notes.md 3.2, 3.4)."""

from __future__ import annotations

import pytest

from cotal_trio.core.errors import ConfigError, RefusalCode, Refused
from cotal_trio.core.views import (
    AGENT_VIEWS,
    MAX_TOKEN_TTL_S,
    PUBLIC_VIEWS,
    TRANSFER_WRITER_TTL_S,
    VIEW_REQUIRED_SCOPE,
    VIEWS,
    ServiceEndpointBinding,
    SessionBinding,
    TransferTarget,
    binding_mismatch,
    check_exchange_view,
    check_view,
    check_view_scope,
    is_view,
    view_ttl_cap,
)

INSTANCE = "m" * 26
HEX = "ab" * 32
SESSION_ID = "s" * 43

# --- the table -------------------------------------------------------------------------------


def test_the_table_in_order():
    assert VIEWS == (
        "admin", "purger", "channel-purger", "channel-writer", "deployer", "manager-service",
        "manager-caller", "session-caller", "transfer-writer", "service-host",
    )  # fmt: skip
    assert dict(VIEW_REQUIRED_SCOPE) == {
        "admin": "admin", "purger": "admin", "channel-purger": "admin", "channel-writer": "admin",
        "deployer": "spawn", "manager-service": "supervise", "manager-caller": None, "session-caller": None,
        "transfer-writer": "admin", "service-host": "service-endpoint",
    }  # fmt: skip
    assert PUBLIC_VIEWS == {
        "channel-purger", "channel-writer", "manager-caller", "session-caller", "transfer-writer", "service-host",
    }  # fmt: skip
    assert AGENT_VIEWS == {"manager-caller", "service-host"}


def test_the_table_cannot_be_changed():
    with pytest.raises(TypeError):
        VIEW_REQUIRED_SCOPE["admin"] = None  # type: ignore[index]


def test_lifetime_caps():
    assert (MAX_TOKEN_TTL_S, TRANSFER_WRITER_TTL_S) == (900, 300)
    assert view_ttl_cap(None) == 900
    assert view_ttl_cap("transfer-writer") == 300
    assert {view: view_ttl_cap(view) for view in VIEWS if view != "transfer-writer"} == {
        view: 900 for view in VIEWS if view != "transfer-writer"
    }


@pytest.mark.parametrize("view", ["god", "", "Admin", 3, ["admin"]])
def test_an_unknown_view(view):
    assert not is_view(view)
    with pytest.raises(Refused) as info:
        check_view(view)
    assert info.value.code is RefusalCode.BAD_REQUEST
    assert info.value.detail.endswith(f"is not a known view - name one of {', '.join(VIEWS)}, or exchange without a view")
    with pytest.raises(ConfigError, match="not a known view"):
        view_ttl_cap(view)  # type: ignore[arg-type]


def test_known_views_pass_check_view():
    assert [check_view(view) for view in VIEWS] == list(VIEWS)
    assert all(is_view(view) for view in VIEWS)


# --- check_exchange_view: every (view, face, arm) ---------------------------------------------

SESSION = (
    "view session-caller is not minted by POST /exchange - open a chat session with "
    "POST /chat-session/open, then take its bearer from POST /chat-session/bearer"
)


def _agent_only(view: str) -> str:
    return (
        f"a managed agent's exchange offers only view manager-caller, not {view} - "
        "exchange with view manager-caller or without a view"
    )


def _loopback_only(view: str) -> str:
    return (
        f"view {view} is served only on the loopback face - exchange it on the space's host, at the url "
        "of its auth-service.json"
    )


SERVICE_HOST_ONLY = (
    "view service-host is not minted by POST /exchange - register the endpoint with POST "
    "/service-endpoint-authority, then take its bearer from POST /service-endpoint-host"
)
# (view, face, arm) -> None (allowed) or the refusal sentence
EXCHANGE_VIEW_TABLE = {
    (None, "public", "human"): None,
    (None, "public", "agent"): None,
    (None, "loopback", "human"): None,
    (None, "loopback", "agent"): None,
    ("admin", "public", "human"): _loopback_only("admin"),
    ("admin", "public", "agent"): _agent_only("admin"),
    ("admin", "loopback", "human"): None,
    ("admin", "loopback", "agent"): _agent_only("admin"),
    ("purger", "public", "human"): _loopback_only("purger"),
    ("purger", "public", "agent"): _agent_only("purger"),
    ("purger", "loopback", "human"): None,
    ("purger", "loopback", "agent"): _agent_only("purger"),
    ("channel-purger", "public", "human"): None,
    ("channel-purger", "public", "agent"): _agent_only("channel-purger"),
    ("channel-purger", "loopback", "human"): None,
    ("channel-purger", "loopback", "agent"): _agent_only("channel-purger"),
    ("channel-writer", "public", "human"): None,
    ("channel-writer", "public", "agent"): _agent_only("channel-writer"),
    ("channel-writer", "loopback", "human"): None,
    ("channel-writer", "loopback", "agent"): _agent_only("channel-writer"),
    ("deployer", "public", "human"): _loopback_only("deployer"),
    ("deployer", "public", "agent"): _agent_only("deployer"),
    ("deployer", "loopback", "human"): None,
    ("deployer", "loopback", "agent"): _agent_only("deployer"),
    ("manager-service", "public", "human"): _loopback_only("manager-service"),
    ("manager-service", "public", "agent"): _agent_only("manager-service"),
    ("manager-service", "loopback", "human"): None,
    ("manager-service", "loopback", "agent"): _agent_only("manager-service"),
    ("manager-caller", "public", "human"): None,
    ("manager-caller", "public", "agent"): None,
    ("manager-caller", "loopback", "human"): None,
    ("manager-caller", "loopback", "agent"): None,
    ("session-caller", "public", "human"): SESSION,
    ("session-caller", "public", "agent"): SESSION,
    ("session-caller", "loopback", "human"): SESSION,
    ("session-caller", "loopback", "agent"): SESSION,
    ("transfer-writer", "public", "human"): None,
    ("transfer-writer", "public", "agent"): _agent_only("transfer-writer"),
    ("transfer-writer", "loopback", "human"): None,
    ("transfer-writer", "loopback", "agent"): _agent_only("transfer-writer"),
    ("service-host", "public", "human"): SERVICE_HOST_ONLY,
    ("service-host", "public", "agent"): SERVICE_HOST_ONLY,
    ("service-host", "loopback", "human"): SERVICE_HOST_ONLY,
    ("service-host", "loopback", "agent"): SERVICE_HOST_ONLY,
}


def test_the_exchange_table_covers_every_combination():
    assert set(EXCHANGE_VIEW_TABLE) == {
        (view, face, arm) for view in (None, *VIEWS) for face in ("public", "loopback") for arm in ("human", "agent")
    }


@pytest.mark.parametrize(("view", "face", "arm"), sorted(EXCHANGE_VIEW_TABLE, key=str))
def test_check_exchange_view(view, face, arm):
    expected = EXCHANGE_VIEW_TABLE[(view, face, arm)]
    if expected is None:
        assert check_exchange_view(view, face=face, arm=arm) is None
        return
    with pytest.raises(Refused) as info:
        check_exchange_view(view, face=face, arm=arm)
    assert info.value.code is RefusalCode.BAD_REQUEST
    assert info.value.detail == expected


def test_check_exchange_view_refuses_an_unknown_view_on_every_face():
    for face in ("public", "loopback"):
        with pytest.raises(Refused, match='view "god" is not a known view') as info:
            check_exchange_view("god", face=face, arm="human")
        assert info.value.code is RefusalCode.BAD_REQUEST


@pytest.mark.parametrize(("face", "arm"), [("private", "human"), ("public", "robot"), ("loopback", None)])
def test_check_exchange_view_refuses_a_caller_bug(face, arm):
    with pytest.raises(ConfigError):
        check_exchange_view("admin", face=face, arm=arm)


# --- check_view_scope ------------------------------------------------------------------------


def _needs(view: str, scope: str) -> str:
    return (
        f"view {view} needs ledger scope {scope} - the operator grants it with "
        f"`cotal actor grant <actor> --owner <owner> --scope {scope}` (listing the actor's other scope tokens too)"
    )


@pytest.mark.parametrize(
    ("view", "row_scope", "bearer_scope"),
    [
        ("admin", ("admin",), ("admin",)),
        ("purger", ("spawn", "admin"), ("admin",)),
        ("deployer", ("spawn",), ("spawn", "role:x")),
        ("manager-service", ("supervise",), ("supervise",)),
        ("manager-caller", (), ()),
        ("session-caller", (), ()),
        ("transfer-writer", ("admin",), ("admin",)),
    ],
)
def test_check_view_scope_passes(view, row_scope, bearer_scope):
    assert check_view_scope(view, row_scope=row_scope, bearer_scope=bearer_scope) is None


@pytest.mark.parametrize(
    ("view", "row_scope", "bearer_scope", "expected"),
    [
        ("admin", (), (), _needs("admin", "admin")),
        ("admin", ("spawn",), ("admin",), _needs("admin", "admin")),
        ("channel-writer", ("spawn", "run"), (), _needs("channel-writer", "admin")),
        ("deployer", ("admin",), ("admin",), _needs("deployer", "spawn")),
        ("manager-service", ("spawn",), ("spawn",), _needs("manager-service", "supervise")),
        ("transfer-writer", ("admin:x",), ("admin:x",), _needs("transfer-writer", "admin")),
        ("purger", ("admin",), (), "view purger needs scope admin in the bearer too - it was exchanged "
         "before admin was granted: exchange a fresh bearer with view purger"),
    ],
)  # fmt: skip
def test_check_view_scope_refuses(view, row_scope, bearer_scope, expected):
    with pytest.raises(Refused) as info:
        check_view_scope(view, row_scope=row_scope, bearer_scope=bearer_scope)
    assert info.value.code is RefusalCode.NOT_GRANTED
    assert info.value.detail == expected


def test_check_view_scope_refuses_an_unknown_view():
    with pytest.raises(Refused) as info:
        check_view_scope("god", row_scope=("admin",), bearer_scope=("admin",))
    assert info.value.code is RefusalCode.BAD_REQUEST


# --- bindings ---------------------------------------------------------------------------------


def test_session_binding_round_trip():
    binding = SessionBinding(endpoint="web_1-a", session_id=SESSION_ID, epoch=3, exp=1_800_003_600)
    claim = binding.to_claim()
    assert claim == {"endpoint": "web_1-a", "sessionId": SESSION_ID, "epoch": 3, "exp": 1_800_003_600}
    assert SessionBinding.from_claim(claim) == binding


@pytest.mark.parametrize(
    "fields",
    [
        {"endpoint": ""},
        {"endpoint": "a" * 65},
        {"endpoint": "a.b"},
        {"session_id": "s" * 21},
        {"session_id": "s" * 129},
        {"session_id": "s" * 21 + "."},
        {"epoch": -1},
        {"epoch": True},
        {"epoch": 1.0},
        {"exp": "1"},
        {"exp": 2**53},
    ],
)
def test_session_binding_refuses(fields):
    with pytest.raises(Refused) as info:
        SessionBinding(**{"endpoint": "web", "session_id": SESSION_ID, "epoch": 1, "exp": 5, **fields})
    assert info.value.code is RefusalCode.BAD_REQUEST
    assert "a chat session binding is" in info.value.detail


@pytest.mark.parametrize(
    "claim",
    [
        None,
        [],
        {"endpoint": "web", "sessionId": SESSION_ID, "epoch": 1},
        {"endpoint": "web", "sessionId": SESSION_ID, "epoch": 1, "exp": 5, "extra": 1},
        {"endpoint": "web", "session_id": SESSION_ID, "epoch": 1, "exp": 5},
    ],
)
def test_session_claim_refuses(claim):
    with pytest.raises(Refused) as info:
        SessionBinding.from_claim(claim)
    assert info.value.code is RefusalCode.BAD_REQUEST


def test_transfer_target_round_trip():
    target = TransferTarget(instance_id=INSTANCE, sha256_hex=HEX)
    assert target.to_claim() == {"instanceId": INSTANCE, "hex": HEX}
    assert TransferTarget.from_claim({"instanceId": INSTANCE, "hex": HEX}) == target


@pytest.mark.parametrize(
    "claim",
    [
        None,
        "x",
        {"instanceId": INSTANCE},
        {"instanceId": INSTANCE, "hex": HEX, "more": 1},
        {"instanceId": "M" * 26, "hex": HEX},
        {"instanceId": "m" * 25, "hex": HEX},
        {"instanceId": INSTANCE, "hex": "AB" * 32},
        {"instanceId": INSTANCE, "hex": "ab" * 31},
        {"instanceId": INSTANCE, "hex": 7},
    ],
)
def test_transfer_claim_refuses(claim):
    with pytest.raises(Refused) as info:
        TransferTarget.from_claim(claim)
    assert info.value.code is RefusalCode.BAD_REQUEST
    assert info.value.detail.startswith('transferWriter must be exactly {"instanceId"')


BINDING = {
    "manager_instance_id": INSTANCE,
    "session": SessionBinding(endpoint="web", session_id=SESSION_ID, epoch=1, exp=5),
    "transfer_writer": TransferTarget(instance_id=INSTANCE, sha256_hex=HEX),
    "service_endpoint": ServiceEndpointBinding(endpoint="search", instance_id=INSTANCE),
}
OWN = {
    "manager-caller": "manager_instance_id", "session-caller": "session", "transfer-writer": "transfer_writer",
    "service-host": "service_endpoint",
}  # fmt: skip
CLAIM = {
    "manager_instance_id": "managerInstanceId", "session": "session", "transfer_writer": "transferWriter",
    "service_endpoint": "serviceEndpoint",
}  # fmt: skip


@pytest.mark.parametrize("view", [None, *VIEWS])
def test_binding_mismatch(view):
    none = dict.fromkeys(BINDING)
    own = OWN.get(view)
    right = {**none, own: BINDING[own]} if own else none
    assert binding_mismatch(view, **right) is None
    for name in BINDING:
        if name == own:
            assert binding_mismatch(view, **none) == f"{CLAIM[name]} goes with view {view}, always and only"
        else:
            wrong = {**right, name: BINDING[name]}
            owner_view = next(v for v, n in OWN.items() if n == name)
            assert binding_mismatch(view, **wrong) == f"{CLAIM[name]} goes with view {owner_view}, always and only"
