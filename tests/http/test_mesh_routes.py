"""The credential routes beside ``/exchange`` (http/mesh_routes.py; spec "Listener policy",
"Proxy attribution"; upstream-notes 3.6, 4.2): ``/manager-instances``, ``/chat-session/open``,
``/chat-session/bearer``, ``/chat-session/retire`` and ``/manager-service-authority``.

Driven through quart's test client on the public face (and the loopback face for the authority
route), with the real core objects of ``tests/support/loopback.py`` and :class:`FakeRecords`, the
in-memory records store of ``tests/support/views_exchange.py``.
"""

from __future__ import annotations

import json
import re

import pytest

from cotal_trio.core.identity import is_lifecycle_uid
from cotal_trio.core.sessions import ChatSession
from cotal_trio.core.views import SessionBinding
from cotal_trio.http import build_loopback_app
from cotal_trio.http.faces import NO_MANAGER_REGISTRY
from cotal_trio.http.mesh_routes import AGENT_NO_SESSION
from tests.support.loopback import HEADERS, NOW, OWNER, ceiling
from tests.support.public_face import GHOST_BODY, JSON_ONLY
from tests.support.views_exchange import (
    GHOST_401,
    HUMAN_EXP,
    MGR_A,
    MGR_B,
    MGR_C,
    MGR_OTHER,
    OWNER2,
    PEER,
    SUB2,
    TOO_MANY,
    Face,
    FakeRecords,
    agent,
    context,
    decode,
    face,
    human,
    manager,
)

SESSION_ID_43 = re.compile(r"[A-Za-z0-9_-]{43}")
BAD_CAPABILITY = {"error": "missing/invalid exchange capability - read it from the space's auth-service.json"}
CREDENTIAL = "the credential (idpToken and actor, or owner, actor and actorToken)"
AUTHORITY_BODY = {"error": "manager-service authority needs { idpToken, request } and nothing else"}
AUTHORITY_REQUEST = {
    "error": 'request must be {"kind": "register", "actor": "<manager actor>", "label"?: "<text>"} or '
    '{"kind": "retire", "actor": "<manager actor>", "instanceId": "<id>"}'
}
SEEDED_SESSION = "s" * 43


def _not_yours(session_id: str) -> dict:
    return {"error": f"no open chat session {session_id} of yours - open one with POST /chat-session/open"}


def _no_supervise(actor: str) -> dict:
    return {
        "error": f"actor {actor} may not serve as a manager: its ledger row lacks scope supervise - the operator "
        f"grants it with `cotal actor grant {actor} --owner {OWNER} --scope supervise`"
    }


def _unregistered(instance_id: str, actor: str = "mgr") -> dict:
    return {
        "error": f"manager instance {instance_id} is not registered to {actor} of owner {OWNER} - see `cotal manager list`"
    }


def register(actor: str = "mgr", **request) -> dict:
    return {"idpToken": human()["idpToken"], "request": {"kind": "register", "actor": actor, **request}}


def retire(instance_id: str, actor: str = "mgr") -> dict:
    return {"idpToken": human()["idpToken"], "request": {"kind": "retire", "actor": actor, "instanceId": instance_id}}


def seeded(*, owner: str = OWNER, actor: str = "cli", opened_at: int = NOW - 60, exp: int | None = None) -> ChatSession:
    return ChatSession(
        session_id=SEEDED_SESSION, endpoint="chat", owner=owner, actor=actor, epoch=3, opened_at=opened_at,
        exp=opened_at + 3600 if exp is None else exp,
    )  # fmt: skip


async def _open(public: Face, credential: dict | None = None, endpoint: str = "chat-1") -> dict:
    status, body = await public.post({**(credential or human()), "endpoint": endpoint}, path="/chat-session/open")
    assert status == 200, body
    return body


# --- /manager-instances -------------------------------------------------------------------------


@pytest.mark.parametrize("arm", ["human", "agent"])
@ceiling
async def test_manager_instances_lists_only_the_callers_owners_instances_sorted(arm):
    records = FakeRecords(
        manager(MGR_C, registered_at=NOW - 100, label="third"),
        manager(MGR_OTHER, owner=OWNER2, registered_at=NOW - 400),
        manager(MGR_A, registered_at=NOW - 300, label="build box"),
        manager(MGR_B, actor="cli", registered_at=NOW - 200),
    )  # fmt: skip
    credential = human() if arm == "human" else agent()
    status, body = await face("public", records).post(credential, path="/manager-instances")
    assert (status, body) == (200, {"owner": OWNER, "instances": [
        {"instanceId": MGR_A, "actor": "mgr", "serveEpoch": 1, "registeredAt": NOW - 300, "label": "build box"},
        {"instanceId": MGR_B, "actor": "cli", "serveEpoch": 1, "registeredAt": NOW - 200, "label": None},
        {"instanceId": MGR_C, "actor": "mgr", "serveEpoch": 1, "registeredAt": NOW - 100, "label": "third"},
    ]})  # fmt: skip


@ceiling
async def test_manager_instances_of_another_owner_and_none():
    records = FakeRecords(manager(MGR_A))
    status, body = await face("public", records).post(human(sub=SUB2), path="/manager-instances")
    assert (status, body) == (200, {"owner": OWNER2, "instances": []})


@ceiling
async def test_manager_instances_refuses_a_bad_credential_with_its_reason():
    assert await face("public").post(GHOST_BODY, path="/manager-instances") == (401, GHOST_401)


# --- /chat-session/open, /bearer, /retire -------------------------------------------------------


@ceiling
async def test_open_answers_a_fresh_session_of_the_caller():
    records = FakeRecords()
    public = face("public", records)
    credential = human()
    body = await _open(public, credential)
    session_id = body["sessionId"]
    assert SESSION_ID_43.fullmatch(session_id), session_id
    assert body == {"sessionId": session_id, "endpoint": "chat-1", "epoch": 1, "exp": NOW + 3600}
    actor = "cli"
    assert records.sessions == {session_id: ChatSession(
        session_id=session_id, endpoint="chat-1", owner=OWNER, actor=actor, epoch=1, opened_at=NOW, exp=NOW + 3600,
    )}  # fmt: skip
    assert records.session_ttls == {session_id: 3600 + 60}
    again = await _open(public, credential)
    assert again["sessionId"] != session_id and len(records.sessions) == 2


@ceiling
async def test_bearer_is_a_session_caller_bound_to_the_session():
    records = FakeRecords()
    public = face("public", records)
    opened = await _open(public)
    status, body = await public.post(human(sessionId=opened["sessionId"]), path="/chat-session/bearer")
    assert status == 200, body
    assert body == {"token": body["token"], "owner": OWNER, "exp": HUMAN_EXP, "sessionId": opened["sessionId"]}
    bearer, act = decode(body["token"])
    binding = SessionBinding(endpoint="chat-1", session_id=opened["sessionId"], epoch=1, exp=NOW + 3600)
    assert (bearer.view, bearer.session, bearer.actor, bearer.exp) == ("session-caller", binding, "cli", HUMAN_EXP)
    assert bearer.exp <= opened["exp"]
    assert act["session"] == {"endpoint": "chat-1", "sessionId": opened["sessionId"], "epoch": 1, "exp": NOW + 3600}
    assert "managerInstanceId" not in act and "transferWriter" not in act


@pytest.mark.parametrize(
    ("path", "extra"),
    [("/chat-session/open", {"endpoint": "chat"}), ("/chat-session/bearer", {"sessionId": SEEDED_SESSION}),
     ("/chat-session/retire", {"sessionId": SEEDED_SESSION})],
)  # fmt: skip
@ceiling
async def test_a_managed_agent_gets_no_chat_session(path, extra):
    # spec "Listener policy": a managed-agent secret exchange refuses every view but manager-caller
    records = FakeRecords()
    records.sessions[SEEDED_SESSION] = seeded(actor="worker")
    assert await face("public", records).post(agent(**extra), path=path) == (400, {"error": AGENT_NO_SESSION})
    assert list(records.sessions) == [SEEDED_SESSION]


NEAR_EXPIRY = [("human", None, NOW + 100), ("human", 50, NOW + 50)]


@pytest.mark.parametrize(("credential", "ttl", "exp"), NEAR_EXPIRY)
@ceiling
async def test_a_session_100_seconds_from_expiry_gives_a_bearer_of_at_most_100_seconds(credential, ttl, exp):
    actor = "cli" if credential == "human" else "worker"
    records = FakeRecords()
    records.sessions[SEEDED_SESSION] = seeded(actor=actor, opened_at=NOW - 3500)
    extra = {"sessionId": SEEDED_SESSION} if ttl is None else {"sessionId": SEEDED_SESSION, "ttlSec": ttl}
    body = human(**extra) if credential == "human" else agent(**extra)
    status, answer = await face("public", records).post(body, path="/chat-session/bearer")
    assert (status, answer["exp"]) == (200, exp), answer
    bearer, _ = decode(answer["token"])
    assert bearer.exp == exp and bearer.session.exp == NOW + 100 and bearer.session.epoch == 3


@ceiling
async def test_an_expired_session_gives_no_bearer():
    records = FakeRecords()
    records.sessions[SEEDED_SESSION] = seeded(opened_at=NOW - 3600)
    status, body = await face("public", records).post(human(sessionId=SEEDED_SESSION), path="/chat-session/bearer")
    assert (status, body) == (
        401, {"error": f"chat session {SEEDED_SESSION} expired at {NOW} - open a new one with /chat-session/open"}
    )  # fmt: skip


@pytest.mark.parametrize("stranger", ["other owner", "other actor"])
@ceiling
async def test_another_principals_session_is_401(stranger):
    records = FakeRecords()
    records.sessions[SEEDED_SESSION] = seeded()
    credential = {"other owner": human(sub=SUB2), "other actor": human("plain")}[stranger]
    public = face("public", records)
    bearer = await public.post({**credential, "sessionId": SEEDED_SESSION}, path="/chat-session/bearer")
    assert bearer == (401, _not_yours(SEEDED_SESSION))
    retired = await public.post({**credential, "sessionId": SEEDED_SESSION}, path="/chat-session/retire")
    assert retired == (401, _not_yours(SEEDED_SESSION))
    assert SEEDED_SESSION in records.sessions


@ceiling
async def test_retire_then_bearer_is_401():
    records = FakeRecords()
    public = face("public", records)
    session_id = (await _open(public))["sessionId"]
    retired = await public.post(human(sessionId=session_id), path="/chat-session/retire")
    assert retired == (200, {"retired": True, "sessionId": session_id})
    assert records.sessions == {}
    assert await public.post(human(sessionId=session_id), path="/chat-session/bearer") == (401, _not_yours(session_id))
    assert await public.post(human(sessionId=session_id), path="/chat-session/retire") == (401, _not_yours(session_id))


@ceiling
async def test_an_expired_session_can_still_be_retired_by_its_owner():
    records = FakeRecords()
    records.sessions[SEEDED_SESSION] = seeded(opened_at=NOW - 4000)
    retired = await face("public", records).post(human(sessionId=SEEDED_SESSION), path="/chat-session/retire")
    assert retired == (200, {"retired": True, "sessionId": SEEDED_SESSION})


# --- /manager-service-authority -----------------------------------------------------------------


@ceiling
async def test_register_with_supervise_puts_a_live_instance_in_the_store():
    records = FakeRecords()
    public = face("public", records)
    status, body = await public.post(register(label="build box"), path="/manager-service-authority")
    assert status == 200, body
    instance_id = body["instanceId"]
    assert is_lifecycle_uid(instance_id)
    assert body == {"instanceId": instance_id, "owner": OWNER, "actor": "mgr", "serveEpoch": 1, "registeredAt": NOW}
    assert records.managers == {(OWNER, instance_id): manager(instance_id, registered_at=NOW, label="build box")}
    # the new instance is what a manager-caller selects
    status, minted = await public.post(human(view="manager-caller"))
    assert (status, minted["managerInstanceId"]) == (200, instance_id)
    retired = await public.post(retire(instance_id), path="/manager-service-authority")
    assert retired == (200, {"retired": True, "instanceId": instance_id})
    assert records.managers == {}


@ceiling
async def test_register_without_supervise_is_403():
    records = FakeRecords()
    status, body = await face("public", records).post(register("plain"), path="/manager-service-authority")
    assert (status, body) == (403, _no_supervise("plain"))
    assert records.managers == {}


@ceiling
async def test_retire_of_an_unknown_instance_is_404():
    records = FakeRecords(manager(MGR_B, actor="cli"))
    public = face("public", records)
    assert await public.post(retire(MGR_A), path="/manager-service-authority") == (404, _unregistered(MGR_A))
    # registered to another actor of the owner: not this manager's to retire
    assert await public.post(retire(MGR_B), path="/manager-service-authority") == (404, _unregistered(MGR_B))
    assert (OWNER, MGR_B) in records.managers


@ceiling
async def test_authority_and_exchange_refusals_share_the_peer_bucket():
    records = FakeRecords()
    public = face("public", records)
    statuses = []
    for _ in range(15):
        statuses.append(await public.post(register("plain"), path="/manager-service-authority"))
        statuses.append(await public.post(GHOST_BODY))
    assert statuses == [(403, _no_supervise("plain")), (401, GHOST_401)] * 15
    assert await public.post(GHOST_BODY) == (429, TOO_MANY)
    assert await public.post(register("plain"), path="/manager-service-authority") == (429, TOO_MANY)
    assert await public.post(retire(MGR_A), path="/manager-service-authority") == (429, TOO_MANY)
    assert await public.post(human(sessionId=SEEDED_SESSION), path="/chat-session/bearer") == (429, TOO_MANY)
    # a valid credential still gets its answer; another peer has its own bucket
    status, body = await public.post(register(), path="/manager-service-authority")
    assert status == 200, body
    assert await public.post(register("plain"), path="/manager-service-authority", peer="192.0.2.50") == (
        403, _no_supervise("plain")
    )  # fmt: skip


@ceiling
async def test_exchange_refusals_then_authority_refusal_is_429():
    public = face("public")
    assert [(await public.post(GHOST_BODY))[0] for _ in range(30)] == [401] * 30
    assert await public.post(register("plain"), path="/manager-service-authority") == (429, TOO_MANY)
    assert await public.post([], path="/chat-session/open") == (429, TOO_MANY)
    assert await public.post(register("plain"), path="/manager-service-authority", peer=PEER + "0") == (
        403, _no_supervise("plain")
    )  # fmt: skip


@ceiling
async def test_loopback_authority_needs_the_capability():
    records = FakeRecords()
    ctx = context(records)
    client = build_loopback_app(ctx).test_client()
    data = json.dumps(register()).encode()
    for headers in (JSON_ONLY, {**JSON_ONLY, "Authorization": "Bearer " + "d" * 64}):
        response = await client.post("/manager-service-authority", data=data, headers=headers)
        assert (response.status_code, await response.get_json()) == (401, BAD_CAPABILITY)
    assert records.managers == {}
    response = await client.post("/manager-service-authority", data=data, headers=HEADERS)
    body = await response.get_json()
    assert response.status_code == 200, body
    assert list(records.managers) == [(OWNER, body["instanceId"])]


@ceiling
async def test_loopback_authority_refusals_spend_the_shared_window():
    loopback = Face("loopback", context(FakeRecords()))
    assert [await loopback.post(register("plain"), path="/manager-service-authority") for _ in range(30)] == [
        (403, _no_supervise("plain"))
    ] * 30  # fmt: skip
    assert await loopback.post(GHOST_BODY) == (429, TOO_MANY)


@pytest.mark.parametrize("path", ["/manager-instances", "/chat-session/open", "/chat-session/bearer", "/chat-session/retire"])
@ceiling
async def test_the_loopback_face_serves_no_session_or_listing_route(path):
    loopback = Face("loopback", context(FakeRecords()))
    status, body = await loopback.post(human(endpoint="chat"), path=path)
    assert status == 404 and body["error"].startswith("unknown path - ")


# --- bad bodies -----------------------------------------------------------------------------------


NO_VIEW = "takes no view - the route decides what it answers; drop them"
BAD_SESSION_ID = "sessionId must be the id /chat-session/open answered (22 to 128 characters of A-Z a-z 0-9 _ -)"
BAD_BODIES = [
    ("/chat-session/open", [], f"/chat-session/open takes a JSON object: {CREDENTIAL} and endpoint"),
    ("/chat-session/open", "endpoint", f"/chat-session/open takes a JSON object: {CREDENTIAL} and endpoint"),
    ("/chat-session/open", None, f"/chat-session/open takes a JSON object: {CREDENTIAL} and endpoint"),
    ("/chat-session/open", {}, "/chat-session/open needs endpoint beside the credential"),
    ("/chat-session/open", {"view": "session-caller", "endpoint": "chat"}, f"/chat-session/open {NO_VIEW}"),
    ("/chat-session/open", {"view": "manager-caller", "endpoint": "chat"}, f"/chat-session/open {NO_VIEW}"),
    ("/chat-session/open", {"ttlSec": 60, "endpoint": "chat"}, "/chat-session/open takes no ttlSec"),
    ("/chat-session/open", {"endpoint": "a.b"}, "endpoint must be 1 to 64 characters of A-Z a-z 0-9 _ -"),
    ("/chat-session/open", {"endpoint": "x" * 65}, "endpoint must be 1 to 64 characters of A-Z a-z 0-9 _ -"),
    ("/chat-session/open", {"endpoint": 7}, "endpoint must be 1 to 64 characters of A-Z a-z 0-9 _ -"),
    ("/chat-session/bearer", [], f"/chat-session/bearer takes a JSON object: {CREDENTIAL} and sessionId"),
    ("/chat-session/bearer", {}, "/chat-session/bearer needs sessionId beside the credential"),
    ("/chat-session/bearer", {"sessionId": SEEDED_SESSION, "view": "session-caller"}, f"/chat-session/bearer {NO_VIEW}"),
    ("/chat-session/bearer", {"sessionId": "short"}, BAD_SESSION_ID),
    ("/chat-session/retire", {}, "/chat-session/retire needs sessionId beside the credential"),
    ("/chat-session/retire", {"sessionId": SEEDED_SESSION, "ttlSec": 60}, "/chat-session/retire takes no ttlSec"),
    ("/manager-instances", {"view": "manager-caller"}, f"/manager-instances {NO_VIEW}"),
    ("/manager-instances", {"managerInstanceId": "a" * 26}, "/manager-instances takes no managerInstanceId - the route decides what it answers; drop them"),
    ("/manager-instances", {"ttlSec": 60}, "/manager-instances takes no ttlSec"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "extra", "sentence"), BAD_BODIES)
@ceiling
async def test_bad_bodies_are_400_with_the_routes_sentence(path, extra, sentence):
    records = FakeRecords()
    records.sessions[SEEDED_SESSION] = seeded()
    body = {**human(), **extra} if isinstance(extra, dict) else extra
    assert await face("public", records).post(body, path=path) == (400, {"error": sentence})
    assert list(records.sessions) == [SEEDED_SESSION]


@ceiling
async def test_a_manager_instances_body_that_is_not_an_object_is_400_with_a_whole_sentence():
    # the route takes no field of its own: the sentence must not end in a dangling "and "
    status, body = await face("public").post([], path="/manager-instances")
    assert (status, body) == (400, {"error": f"/manager-instances takes a JSON object: {CREDENTIAL}"})


@ceiling
async def test_an_agent_credential_lists_its_owners_managers():
    records = FakeRecords()
    status, body = await face("public", records).post(agent(), path="/manager-instances")
    assert (status, body) == (200, {"owner": OWNER, "instances": []})


AUTHORITY_BAD = [
    ([], AUTHORITY_BODY),
    ({"request": {"kind": "register", "actor": "mgr"}}, AUTHORITY_BODY),
    ({"idpToken": "x", "request": {"kind": "register", "actor": "mgr"}, "actor": "mgr"}, AUTHORITY_BODY),
    ({"idpToken": 7, "request": {"kind": "register", "actor": "mgr"}}, AUTHORITY_BODY),
    ({"idpToken": "x", "request": []}, AUTHORITY_REQUEST),
    ({"idpToken": "x", "request": {"kind": "enroll", "actor": "mgr"}}, AUTHORITY_REQUEST),
    ({"idpToken": "x", "request": {"kind": ["register"], "actor": "mgr"}}, AUTHORITY_REQUEST),
    ({"idpToken": "x", "request": {"kind": {"register": 1}, "actor": "mgr"}}, AUTHORITY_REQUEST),
    ({"idpToken": "x", "request": {"kind": "register"}}, AUTHORITY_REQUEST),
    ({"idpToken": "x", "request": {"kind": "register", "actor": "mgr", "instanceId": MGR_A}}, AUTHORITY_REQUEST),
    (
        {"idpToken": "x", "request": {"kind": "retire", "actor": "mgr"}},
        {"error": "instanceId must be the id the registration answered ([a-z0-9]{26,32})"},
    ),
    (
        {"idpToken": "x", "request": {"kind": "register", "actor": "mgr", "label": "x" * 129}},
        {"error": "label must be printable text of at most 128 characters"},
    ),
    (
        {"idpToken": "x", "request": {"kind": "register", "actor": "mgr", "label": "a\nb"}},
        {"error": "label must be printable text of at most 128 characters"},
    ),
]


@pytest.mark.parametrize(("body", "answer"), AUTHORITY_BAD)
@ceiling
async def test_bad_authority_bodies_are_400(body, answer):
    records = FakeRecords()
    assert await face("public", records).post(body, path="/manager-service-authority") == (400, answer)
    assert records.managers == {}


INSTANCE_RULE = {"error": "instanceId must be the id the registration answered ([a-z0-9]{26,32})"}
LABEL_RULE = {"error": "label must be printable text of at most 128 characters"}


@pytest.mark.parametrize(
    ("request_", "answer"),
    [
        ({"kind": "register", "actor": 7}, AUTHORITY_REQUEST),
        ({"kind": "register", "actor": "mgr", "endpoint": "search"}, AUTHORITY_REQUEST),  # the service door's member
        ({"kind": "retire", "actor": "mgr", "instanceId": MGR_A, "label": "x"}, AUTHORITY_REQUEST),
        ({"kind": "retire", "actor": 7}, AUTHORITY_REQUEST),  # the shape is checked before instanceId
        ({"kind": "retire", "actor": "mgr", "instanceId": "NOPE"}, INSTANCE_RULE),
        ({"kind": "retire", "actor": "mgr", "instanceId": 7}, INSTANCE_RULE),
        ({"kind": "register", "actor": "mgr", "label": 7}, LABEL_RULE),
    ],
)  # fmt: skip
@ceiling
async def test_each_authority_request_is_400_with_the_first_rule_it_breaks(request_, answer):
    records = FakeRecords()
    body = {"idpToken": "x", "request": request_}
    assert await face("public", records).post(body, path="/manager-service-authority") == (400, answer)
    assert records.managers == {}


@ceiling
async def test_a_null_label_registers_an_unlabelled_instance():
    records = FakeRecords()
    status, body = await face("public", records).post(register(label=None), path="/manager-service-authority")
    assert status == 200, body
    assert records.managers == {(OWNER, body["instanceId"]): manager(body["instanceId"], registered_at=NOW)}


# --- 5. no registry -------------------------------------------------------------------------------


NO_REGISTRY_CALLS = [
    ("/manager-instances", human()),
    ("/chat-session/open", human(endpoint="chat")),
    ("/chat-session/bearer", human(sessionId=SEEDED_SESSION)),
    ("/chat-session/retire", human(sessionId=SEEDED_SESSION)),
    ("/manager-service-authority", register()),
    ("/manager-service-authority", retire(MGR_A)),
]


@pytest.mark.parametrize(("path", "body"), NO_REGISTRY_CALLS)
@ceiling
async def test_mesh_routes_without_a_registry_are_401_naming_the_full_service(path, body):
    assert await Face("public", context(None)).post(body, path=path) == (401, {"error": NO_MANAGER_REGISTRY})


@ceiling
async def test_loopback_authority_without_a_registry_is_401():
    loopback = Face("loopback", context(None))
    assert await loopback.post(register(), path="/manager-service-authority") == (401, {"error": NO_MANAGER_REGISTRY})


@pytest.mark.parametrize(
    ("path", "body", "sentence"),
    [
        ("/chat-session/open", {"endpoint": "chat", "sessionId": SEEDED_SESSION},
         "/chat-session/open takes the credential and endpoint, not sessionId"),
        ("/chat-session/bearer", {"sessionId": SEEDED_SESSION, "endpoint": "chat"},
         "/chat-session/bearer takes the credential and sessionId, ttlSec, not endpoint"),
        ("/manager-instances", {"extra": 1}, "/manager-instances takes the credential, not extra"),
    ],
)  # fmt: skip
@ceiling
async def test_an_unknown_member_is_named_with_what_the_route_takes(path, body, sentence):
    status, answer = await face("public", FakeRecords()).post(human(**body), path=path)
    assert (status, answer) == (400, {"error": sentence})
