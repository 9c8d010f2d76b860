"""The exchange's decision order, pure (core/exchange.py ``decide_exchange``; upstream-notes 3.5,
3.4; spec "Listener policy", "Proxy attribution", "Connect limits"): each refusal at its place
in the order, with its code and sentence, and the steps a face performs between them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cotal_trio.core.errors import ConfigError, RefusalCode, Refused
from cotal_trio.core.exchange import (
    AgentExchange,
    ExchangeFacts,
    ExchangeStep,
    HumanExchange,
    decide_exchange,
)
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.views import VIEWS

OWNER = "u_" + "a" * 26
LIFECYCLE = "l" * 26


def _row(scope: tuple[str, ...] = ()) -> LedgerRow:
    return LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=OWNER, actor="cli", scope=scope, allow_subscribe=(), allow_publish=(),
        token_hash=None, lifecycle_uid=LIFECYCLE, granted_at="2026-11-29T10:00:00.000Z",
    )  # fmt: skip


def _human(view: str | None = None, **fields) -> HumanExchange:
    return HumanExchange(id_token="idp.jwt.token", actor="cli", view=view, **fields)


def _agent(view: str | None = None) -> AgentExchange:
    return AgentExchange(owner=OWNER, actor="alpha", actor_token="secret", view=view)


def _refusal(request, facts) -> Refused:
    with pytest.raises(Refused) as refused:
        decide_exchange(request, facts)
    return refused.value


def test_session_caller_is_refused_first_on_every_face_and_arm():
    for face in ("public", "loopback"):
        refused = _refusal(_human("session-caller"), ExchangeFacts(face=face))
        assert refused.code is RefusalCode.BAD_REQUEST
        assert refused.detail.startswith("view session-caller is not minted by POST /exchange - open a chat session")


def test_the_agent_arm_is_refused_every_view_but_manager_caller_before_the_ledger():
    refused = _refusal(_agent("admin"), ExchangeFacts(face="loopback"))
    assert (refused.code, refused.detail) == (
        RefusalCode.BAD_REQUEST,
        "a managed agent's exchange offers only view manager-caller, not admin - "
        "exchange with view manager-caller or without a view",
    )
    assert decide_exchange(_agent("manager-caller"), ExchangeFacts(face="public")) is ExchangeStep.AUTHENTICATE


def test_the_public_face_is_refused_a_loopback_view_before_the_ledger():
    refused = _refusal(_human("admin"), ExchangeFacts(face="public"))
    assert (refused.code, refused.detail) == (
        RefusalCode.BAD_REQUEST,
        "view admin is served only on the loopback face - exchange it on the space's host, "
        "at the url of its auth-service.json",
    )


def test_the_face_refusal_comes_before_the_scope_refusal():
    """A public admin view for a row without admin: the 400 of the face, not the 401 of the row."""
    refused = _refusal(_human("admin"), ExchangeFacts(face="public", row=_row()))
    assert refused.code is RefusalCode.BAD_REQUEST


def test_the_credential_is_verified_before_any_scope_or_selection():
    for view in (None, "admin", "manager-caller"):
        assert decide_exchange(_human(view), ExchangeFacts(face="loopback", provisioning=True)) is ExchangeStep.AUTHENTICATE


def test_a_row_without_the_views_scope_is_refused_not_granted_after_the_credential():
    refused = _refusal(_human("admin"), ExchangeFacts(face="loopback", row=_row(("spawn",))))
    assert (refused.code, refused.detail) == (
        RefusalCode.NOT_GRANTED,
        f"view admin needs ledger scope admin - the operator grants it with `cotal actor grant cli --owner {OWNER} "
        "--scope admin` (listing the actor's other scope tokens too)",
    )
    assert decide_exchange(_human("admin"), ExchangeFacts(face="loopback", row=_row(("admin",)))) is ExchangeStep.MINT


def test_manager_caller_selects_a_manager_then_mints_and_never_provisions():
    facts = ExchangeFacts(face="public", provisioning=True, row=_row())
    assert decide_exchange(_human("manager-caller"), facts) is ExchangeStep.SELECT_MANAGER
    chosen = replace(facts, manager_instance_id="m" * 26)
    assert decide_exchange(_human("manager-caller"), chosen) is ExchangeStep.MINT


def test_a_bearer_without_a_view_is_provisioned_before_it_is_minted_when_the_face_provisions():
    facts = ExchangeFacts(face="loopback", provisioning=True, row=_row())
    assert decide_exchange(_agent(), facts) is ExchangeStep.PROVISION
    assert decide_exchange(_agent(), replace(facts, provisioned=True)) is ExchangeStep.MINT
    assert decide_exchange(_agent(), replace(facts, provisioning=False)) is ExchangeStep.MINT
    assert decide_exchange(_human("admin"), replace(facts, row=_row(("admin",)))) is ExchangeStep.MINT  # a view: none


def test_every_mintable_view_reaches_mint_within_as_many_steps_as_there_are():
    """The face's bounded loop (http/faces.py ``_performed``) relies on this: each step records
    one fact and the next answer moves on."""
    outcome = {ExchangeStep.AUTHENTICATE: lambda f: replace(f, row=_row(("admin", "spawn", "supervise"))),
               ExchangeStep.SELECT_MANAGER: lambda f: replace(f, manager_instance_id="m" * 26),
               ExchangeStep.PROVISION: lambda f: replace(f, provisioned=True)}  # fmt: skip
    for view in (None, *[v for v in VIEWS if v not in ("session-caller", "transfer-writer", "service-host")]):
        facts, steps = ExchangeFacts(face="loopback", provisioning=True), []
        for _ in ExchangeStep:
            steps.append(decide_exchange(_human(view), facts))
            if steps[-1] is ExchangeStep.MINT:
                break
            facts = outcome[steps[-1]](facts)
        assert steps[-1] is ExchangeStep.MINT, (view, steps)
        assert decide_exchange(_human(view), facts) is ExchangeStep.MINT  # asked again: the same


def test_an_unknown_face_is_a_caller_bug():
    with pytest.raises(ConfigError, match="face in"):
        decide_exchange(_human(), ExchangeFacts(face="sideways"))
