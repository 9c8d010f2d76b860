"""Views and manager-caller selection at ``POST /exchange`` on both faces (http/faces.py
``answer_exchange``, ``select_manager_for``; spec "Listener policy", "Proxy attribution";
upstream-notes 3.4, 3.5).

The apps run through quart's test client with the real core objects of ``support/loopback.py``
(issuer key, dev-IdP tokens, an in-memory ledger). The records store is :class:`FakeRecords`, an
in-memory stand-in for the store behind ``ExchangeContext.records`` (``faces.RecordsPort``): this
tests the faces, not the broker. Every minted bearer is decoded with the space's issuer key.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cotal_trio.core.managers import SHED_PINNED, SHED_UNPINNED
from cotal_trio.http.faces import NO_MANAGER_REGISTRY
from tests.support.loopback import LIFECYCLE, NOW, OWNER, FixedClock, ceiling
from tests.support.public_face import GHOST_BODY
from tests.support.views_exchange import (
    Face,
    FakeRecords,
    GHOST_401,
    HUMAN_EXP,
    MGR_A,
    MGR_B,
    MGR_C,
    MGR_OTHER,
    OWNER2,
    SUB2,
    TOO_MANY,
    agent,
    context,
    decode,
    face,
    human,
    manager,
)

TRANSFER = {"instanceId": "t" * 26, "hex": "ab" * 32}

NO_MANAGER = {
    "error": "no live manager instance is registered to you - register a running manager with "
    "`cotal manager register`, then exchange again"
}


def _pinned_refusal(instance_id: str) -> dict:
    return {
        "error": f"manager instance {instance_id} is not live or not registered to you - check that the pinned "
        "manager instance is live and registered to you: `cotal manager list`"
    }


def _ambiguous(*ids: str) -> dict:
    return {
        "error": f"{len(ids)} live manager instances are registered to you ({', '.join(ids)}), so none was chosen - "
        "pick one with --manager-instance <id> (`cotal manager list` shows them)"
    }


def _scope_refusal(view: str, scope: str, actor: str = "plain") -> dict:
    return {
        "error": f"view {view} needs ledger scope {scope} - the operator grants it with `cotal actor grant {actor} "
        f"--owner {OWNER} --scope {scope}` (listing the actor's other scope tokens too)"
    }


def _loopback_only(view: str) -> dict:
    return {
        "error": f"view {view} is served only on the loopback face - exchange it on the space's host, at the url "
        "of its auth-service.json"
    }


def _agent_view_refusal(view: str) -> dict:
    return {
        "error": f"a managed agent's exchange offers only view manager-caller, not {view} - exchange with view "
        "manager-caller or without a view"
    }


SESSION_CALLER_AT_EXCHANGE = {
    "error": "view session-caller is not minted by POST /exchange - open a chat session with POST "
    "/chat-session/open, then take its bearer from POST /chat-session/bearer"
}
INSTANCE_WITHOUT_VIEW = {
    "error": 'managerInstanceId goes only with view manager-caller - add "view": "manager-caller" or drop managerInstanceId'
}


# --- the fake store -----------------------------------------------------------------------------


# --- ledger, contexts, clients --------------------------------------------------------------------


FACES = ["public", "loopback"]


# --- 1. views at /exchange --------------------------------------------------------------------


@pytest.mark.parametrize("view", ["channel-writer", "channel-purger"])
@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_admin_gated_public_views_mint_with_admin_in_the_row(name, view):
    status, body = await face(name).post(human(view=view))
    assert status == 200, body
    assert set(body) == {"token", "owner", "exp"} and (body["owner"], body["exp"]) == (OWNER, HUMAN_EXP)
    bearer, act = decode(body["token"])
    assert (bearer.view, bearer.owner, bearer.actor, bearer.exp) == (view, OWNER, "cli", HUMAN_EXP)
    assert bearer.scope == ("spawn", "admin", "supervise")
    assert (bearer.manager_instance_id, bearer.session, bearer.transfer_writer) == (None, None, None)
    assert act == {
        "owner": OWNER, "actor": "cli", "scope": ["spawn", "admin", "supervise"], "lifecycleUid": LIFECYCLE, "view": view,
    }  # fmt: skip


@pytest.mark.parametrize("view", ["channel-writer", "channel-purger"])
@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_admin_gated_public_view_without_admin_is_401_naming_the_scope_flag(name, view):
    status, body = await face(name).post(human("plain", view=view))
    assert (status, body) == (401, _scope_refusal(view, "admin"))
    assert f"`cotal actor grant plain --owner {OWNER} --scope admin`" in body["error"]


@pytest.mark.parametrize("view", ["admin", "purger", "deployer", "manager-service"])
@ceiling
async def test_loopback_only_views_are_400_on_the_public_face_before_any_ledger_read(view):
    reads = []

    def read_ledger(owner, actor):
        reads.append((owner, actor))
        return None, None

    ctx = replace(context(FakeRecords()), read_ledger=read_ledger)
    public = Face("public", ctx)
    assert await public.post(human(view=view)) == (400, _loopback_only(view))
    assert reads == []


LOOPBACK_ONLY = [("admin", "admin"), ("purger", "admin"), ("deployer", "spawn"), ("manager-service", "supervise")]


@pytest.mark.parametrize(("view", "scope"), LOOPBACK_ONLY)
@ceiling
async def test_loopback_only_views_mint_on_the_loopback_face_when_the_scope_is_held(view, scope):
    status, body = await face("loopback").post(human(view=view))
    assert status == 200, body
    bearer, act = decode(body["token"])
    assert (bearer.view, bearer.actor, bearer.exp) == (view, "cli", HUMAN_EXP)
    assert scope in bearer.scope and act["view"] == view


@pytest.mark.parametrize(("view", "scope"), [("admin", "admin"), ("purger", "admin"), ("manager-service", "supervise")])
@ceiling
async def test_loopback_only_views_on_the_loopback_face_need_the_scope(view, scope):
    assert await face("loopback").post(human("plain", view=view)) == (401, _scope_refusal(view, scope))


@pytest.mark.parametrize("arm", ["human", "agent"])
@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_session_caller_at_exchange_is_400_naming_chat_session_bearer(name, arm):
    body = human(view="session-caller") if arm == "human" else agent(view="session-caller")
    assert await face(name).post(body) == (400, SESSION_CALLER_AT_EXCHANGE)


@pytest.mark.parametrize("view", ["admin", "purger", "channel-purger", "channel-writer", "deployer", "manager-service"])
@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_the_agent_arm_refuses_every_view_but_manager_caller(name, view):
    assert await face(name).post(agent(view=view)) == (400, _agent_view_refusal(view))


@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_the_agent_arm_refuses_transfer_writer_with_the_agent_sentence(name):
    # the agent arm takes no transferWriter member, so the only fix is the arm's own one
    assert await face(name).post(agent(view="transfer-writer")) == (400, _agent_view_refusal("transfer-writer"))


@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_transfer_writer_is_capped_at_300_seconds_even_when_900_are_asked(name):
    status, body = await face(name).post(human(view="transfer-writer", ttlSec=900, transferWriter=TRANSFER))
    assert status == 200, body
    assert body["exp"] == NOW + 300
    bearer, act = decode(body["token"])
    assert (bearer.view, bearer.exp - bearer.iat, bearer.exp) == ("transfer-writer", 300, NOW + 300)
    assert (bearer.transfer_writer.instance_id, bearer.transfer_writer.sha256_hex) == (TRANSFER["instanceId"], TRANSFER["hex"])
    assert act["transferWriter"] == TRANSFER and "managerInstanceId" not in act


@ceiling
async def test_transfer_writer_without_admin_is_401():
    status, body = await face("public").post(human("plain", view="transfer-writer", transferWriter=TRANSFER))
    assert (status, body) == (401, _scope_refusal("transfer-writer", "admin"))


@pytest.mark.parametrize("extra", [{}, {"view": "channel-writer"}])
@pytest.mark.parametrize("arm", ["human", "agent"])
@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_manager_instance_id_without_manager_caller_is_400(name, arm, extra):
    fields = {"managerInstanceId": MGR_A, **extra}
    body = human(**fields) if arm == "human" else agent(**fields)
    records = FakeRecords(manager(MGR_A))
    assert await face(name, records).post(body) == (400, INSTANCE_WITHOUT_VIEW)


# --- 2. manager-caller selection ----------------------------------------------------------------


@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_manager_caller_with_no_live_instance_is_401_with_the_remedy(name):
    records = FakeRecords(manager(MGR_OTHER, owner=OWNER2))  # another owner's does not count
    assert await face(name, records).post(human(view="manager-caller")) == (401, NO_MANAGER)


@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_manager_caller_with_one_live_instance_binds_the_bearer_to_it(name):
    records = FakeRecords(manager(MGR_A), manager(MGR_OTHER, owner=OWNER2))
    status, body = await face(name, records).post(human(view="manager-caller"))
    assert status == 200, body
    assert body == {"token": body["token"], "owner": OWNER, "exp": HUMAN_EXP, "managerInstanceId": MGR_A}
    bearer, act = decode(body["token"])
    assert (bearer.view, bearer.manager_instance_id, bearer.actor, bearer.exp) == ("manager-caller", MGR_A, "cli", HUMAN_EXP)
    assert (act["view"], act["managerInstanceId"]) == ("manager-caller", MGR_A)
    assert "session" not in act and "transferWriter" not in act


@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_manager_caller_with_two_live_instances_is_401_listing_both(name):
    records = FakeRecords(manager(MGR_B), manager(MGR_A))
    assert await face(name, records).post(human(view="manager-caller")) == (401, _ambiguous(MGR_A, MGR_B))


@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_manager_caller_pinned_to_an_own_live_instance_selects_it(name):
    records = FakeRecords(manager(MGR_A), manager(MGR_B))
    status, body = await face(name, records).post(human(view="manager-caller", managerInstanceId=MGR_B))
    assert (status, body["managerInstanceId"]) == (200, MGR_B)
    bearer, _ = decode(body["token"])
    assert bearer.manager_instance_id == MGR_B


@pytest.mark.parametrize("pinned", [MGR_OTHER, MGR_C])
@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_manager_caller_pinned_to_someone_elses_or_an_absent_instance_is_401(name, pinned):
    records = FakeRecords(manager(MGR_A), manager(MGR_OTHER, owner=OWNER2))
    status, body = await face(name, records).post(human(view="manager-caller", managerInstanceId=pinned))
    assert (status, body) == (401, _pinned_refusal(pinned))


@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_agent_arm_manager_caller_mints_for_the_managed_principal(name):
    records = FakeRecords(manager(MGR_A))
    status, body = await face(name, records).post(agent(view="manager-caller", ttlSec=900))
    assert status == 200, body
    assert body == {"token": body["token"], "owner": OWNER, "exp": NOW + 300, "managerInstanceId": MGR_A}
    bearer, act = decode(body["token"])
    assert (bearer.principal, bearer.parent, bearer.view) == (f"{OWNER}.worker", f"{OWNER}.cli", "manager-caller")
    assert (bearer.manager_instance_id, bearer.exp) == (MGR_A, NOW + 300)
    assert act["managerInstanceId"] == MGR_A


@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_agent_arm_manager_caller_pinned(name):
    records = FakeRecords(manager(MGR_A), manager(MGR_B))
    status, body = await face(name, records).post(agent(view="manager-caller", managerInstanceId=MGR_A))
    assert (status, body["managerInstanceId"]) == (200, MGR_A)
    assert await face(name, records).post(agent(view="manager-caller")) == (401, _ambiguous(MGR_A, MGR_B))


# --- 3. public per-principal selection windows --------------------------------------------------


async def _unpinned_failures(public: Face, times: int, **kwargs) -> list[tuple[int, dict]]:
    return [await public.post(human(view="manager-caller"), **kwargs) for _ in range(times)]


@ceiling
async def test_public_30_unpinned_failures_then_the_class_is_shed_even_when_it_would_succeed():
    records = FakeRecords()
    public = face("public", records)
    assert await _unpinned_failures(public, 30) == [(401, NO_MANAGER)] * 30
    await records.register_manager(manager(MGR_A))
    assert await public.post(human(view="manager-caller")) == (429, {"error": SHED_UNPINNED})
    assert "--manager-instance" in SHED_UNPINNED and "cotal manager register" in SHED_UNPINNED


@ceiling
async def test_public_shed_unpinned_leaves_the_pinned_class_open():
    records = FakeRecords()
    public = face("public", records)
    await _unpinned_failures(public, 30)
    await records.register_manager(manager(MGR_A))
    status, body = await public.post(human(view="manager-caller", managerInstanceId=MGR_A))
    assert (status, body["managerInstanceId"]) == (200, MGR_A)
    assert await public.post(human(view="manager-caller")) == (429, {"error": SHED_UNPINNED})


@ceiling
async def test_public_selection_failures_do_not_spend_the_peer_budget():
    public = face("public")
    await _unpinned_failures(public, 31)  # 30 reasons and one shed 429
    # the peer's bucket is still empty: 30 bad credentials get their reason, the 31st is 429
    assert [await public.post(GHOST_BODY) for _ in range(30)] == [(401, GHOST_401)] * 30
    assert await public.post(GHOST_BODY) == (429, TOO_MANY)


@ceiling
async def test_public_selection_failure_is_not_masked_by_a_full_peer_bucket():
    public = face("public")
    assert [(await public.post(GHOST_BODY))[0] for _ in range(30)] == [401] * 30
    assert await public.post(GHOST_BODY) == (429, TOO_MANY)
    assert await public.post(human(view="manager-caller")) == (401, NO_MANAGER)


@ceiling
async def test_public_window_is_per_principal_not_per_peer():
    public = face("public")
    first = await _unpinned_failures(public, 15, peer="192.0.2.1")
    second = await _unpinned_failures(public, 15, peer="192.0.2.2")
    assert first + second == [(401, NO_MANAGER)] * 30
    assert await public.post(human(view="manager-caller"), peer="192.0.2.3") == (429, {"error": SHED_UNPINNED})


@ceiling
async def test_public_another_principal_is_unaffected_by_a_full_window():
    records = FakeRecords()
    public = face("public", records)
    await _unpinned_failures(public, 30)
    # another IdP subject (its own owner and ledger row): its own reason, then its own selection
    assert await public.post(human(sub=SUB2, view="manager-caller")) == (401, NO_MANAGER)
    await records.register_manager(manager(MGR_OTHER, owner=OWNER2))
    status, body = await public.post(human(sub=SUB2, view="manager-caller"))
    assert (status, body["owner"], body["managerInstanceId"]) == (200, OWNER2, MGR_OTHER)
    # the managed agent of the same owner is its own principal (owner.actor)
    await records.register_manager(manager(MGR_A))
    status, body = await public.post(agent(view="manager-caller"))
    assert (status, body["managerInstanceId"]) == (200, MGR_A)
    assert await public.post(human(view="manager-caller")) == (429, {"error": SHED_UNPINNED})


@ceiling
async def test_public_agent_principal_has_its_own_windows():
    records = FakeRecords()
    public = face("public", records)
    assert [await public.post(agent(view="manager-caller")) for _ in range(30)] == [(401, NO_MANAGER)] * 30
    await records.register_manager(manager(MGR_A))
    assert await public.post(agent(view="manager-caller")) == (429, {"error": SHED_UNPINNED})
    status, body = await public.post(human(view="manager-caller"))  # the human owner is another key
    assert (status, body["managerInstanceId"]) == (200, MGR_A)


@ceiling
async def test_public_30_pinned_failures_shed_the_pinned_class_only():
    records = FakeRecords(manager(MGR_A))
    public = face("public", records)
    pinned = human(view="manager-caller", managerInstanceId=MGR_C)
    assert [await public.post(pinned) for _ in range(30)] == [(401, _pinned_refusal(MGR_C))] * 30
    # a pin that would succeed is shed too, with the pinned remedy
    own = human(view="manager-caller", managerInstanceId=MGR_A)
    assert await public.post(own) == (429, {"error": SHED_PINNED})
    assert "cotal manager list" in SHED_PINNED
    status, body = await public.post(human(view="manager-caller"))
    assert (status, body["managerInstanceId"]) == (200, MGR_A)
    assert [await public.post(GHOST_BODY) for _ in range(30)] == [(401, GHOST_401)] * 30


@ceiling
async def test_public_shed_class_reopens_after_a_minute():
    clock = FixedClock(NOW)
    records = FakeRecords()
    public = face("public", records, clock=clock)
    await _unpinned_failures(public, 30)
    await records.register_manager(manager(MGR_A))
    assert await public.post(human(view="manager-caller")) == (429, {"error": SHED_UNPINNED})
    clock.now = NOW + 60
    status, body = await public.post(human(view="manager-caller"))
    assert (status, body["managerInstanceId"]) == (200, MGR_A)


# --- 3b. loopback: the shared window ------------------------------------------------------------


@ceiling
async def test_loopback_unpinned_failures_keep_their_reason_and_spend_nothing():
    loopback = face("loopback")
    assert await _unpinned_failures(loopback, 35) == [(401, NO_MANAGER)] * 35
    assert [await loopback.post(GHOST_BODY) for _ in range(30)] == [(401, GHOST_401)] * 30
    assert await loopback.post(GHOST_BODY) == (429, TOO_MANY)


@ceiling
async def test_loopback_ambiguous_failures_keep_their_reason_and_spend_nothing():
    loopback = face("loopback", FakeRecords(manager(MGR_A), manager(MGR_B)))
    assert await _unpinned_failures(loopback, 31) == [(401, _ambiguous(MGR_A, MGR_B))] * 31
    assert await loopback.post(GHOST_BODY) == (401, GHOST_401)


@ceiling
async def test_loopback_unpinned_failure_keeps_its_reason_when_the_window_is_full():
    loopback = face("loopback")
    assert [(await loopback.post(GHOST_BODY))[0] for _ in range(30)] == [401] * 30
    assert await loopback.post(GHOST_BODY) == (429, TOO_MANY)
    assert await loopback.post(human(view="manager-caller")) == (401, NO_MANAGER)


@ceiling
async def test_loopback_pinned_failures_spend_the_shared_window():
    records = FakeRecords()
    loopback = face("loopback", records)
    pinned = human(view="manager-caller", managerInstanceId=MGR_C)
    assert [await loopback.post(pinned) for _ in range(30)] == [(401, _pinned_refusal(MGR_C))] * 30
    assert await loopback.post(GHOST_BODY) == (429, TOO_MANY)
    assert await loopback.post(pinned) == (429, TOO_MANY)
    # a valid selection still mints while the window is full
    await records.register_manager(manager(MGR_C))
    status, body = await loopback.post(pinned)
    assert (status, body["managerInstanceId"]) == (200, MGR_C)


# --- 5. no registry -----------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [{}, {"managerInstanceId": MGR_A}])
@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_manager_caller_without_a_registry_is_401_naming_the_full_service(name, extra):
    no_registry = Face(name, context(None))
    assert await no_registry.post(human(view="manager-caller", **extra)) == (401, {"error": NO_MANAGER_REGISTRY})
    assert await no_registry.post(agent(view="manager-caller", **extra)) == (401, {"error": NO_MANAGER_REGISTRY})


@pytest.mark.parametrize("name", FACES)
@ceiling
async def test_views_that_need_no_registry_still_mint_without_one(name):
    status, body = await Face(name, context(None)).post(human(view="channel-writer"))
    assert status == 200, body
