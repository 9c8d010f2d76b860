"""core/enrollment.py: the verify-enrollment and consent decisions (spec "Host-only routes").

Sync tables: (body, ledger rows, registered instance) -> 200 body or (code, sentence).
"""

from __future__ import annotations

import base64
import json

import pytest

from cotal_trio.core.enrollment import (
    CONSENT_TYP,
    ConsentRequest,
    EnrollmentRequest,
    authorize_consent,
    consent_claims,
    consent_key,
    decide_enrollment,
    new_consent_id,
    parse_consent_body,
    parse_enrollment_body,
    render_consent_record,
    sign_consent,
)
from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.jose import BearerKeySet, IssuerKey, JwsWording, verify_ed25519_jws
from cotal_trio.core.ledger import LedgerKind, LedgerRow, hash_actor_token
from cotal_trio.core.managers import ManagerInstance

OWNER = "u_" + "a" * 26
OTHER_OWNER = "u_" + "b" * 26
INSTANCE = "m" * 26
LIFECYCLE = "l" * 26
KEY = IssuerKey.generate(bytes(range(32)))
SHA = "0123456789abcdef" * 4


def _row(kind: LedgerKind, actor: str = "mgr", *, owner: str = OWNER, scope=("supervise",)) -> LedgerRow:
    token_hash = hash_actor_token("secret") if kind is LedgerKind.MANAGED else None
    return LedgerRow(
        kind=kind, owner=owner, actor=actor, scope=tuple(scope), allow_subscribe=(), allow_publish=(),
        token_hash=token_hash, lifecycle_uid=LIFECYCLE, granted_at="2026-11-29T10:00:00.000Z",
    )  # fmt: skip


def _instance(actor: str = "mgr", serve_epoch: int = 3, owner: str = OWNER) -> ManagerInstance:
    return ManagerInstance(instance_id=INSTANCE, owner=owner, actor=actor, serve_epoch=serve_epoch, registered_at=1_800_000_000)


def _enroll(**request) -> dict:
    base = {"kind": "enroll", "actor": "mgr", "instanceId": INSTANCE, "serveEpoch": 3, "agent": "worker"}
    return {"owner": OWNER, "request": {**base, **request}}


def _hosted(**request) -> dict:
    return {"owner": OWNER, "request": {"kind": "create", "actor": "mgr", "instanceId": INSTANCE, "target": "worker", **request}}


# --- parse_enrollment_body ---------------------------------------------------------------------


def test_an_enroll_body_parses():
    assert parse_enrollment_body(_enroll(kind="release")) == EnrollmentRequest(
        owner=OWNER, kind="release", actor="mgr", instance_id=INSTANCE, serve_epoch=3, agent="worker"
    )


def test_a_hosted_body_parses():
    assert parse_enrollment_body(_hosted(kind="status")) == EnrollmentRequest(
        owner=OWNER, kind="status", actor="mgr", instance_id=INSTANCE, target="worker"
    )


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        ([], "the body is exactly {owner, request} must be a JSON object"),
        ({**_enroll(), "scope": ["supervise"]}, "unknown field \"scope\" - the body is exactly {owner, request}"),
        ({"owner": OWNER}, "missing field 'request' - the body is exactly {owner, request}"),
        ({**_enroll(), "owner": "alice"}, "owner must be a derived owner (u_ followed by 26 characters a-z and 2-7)"),
        ({"owner": OWNER, "request": "enroll"}, "request must be a JSON object {kind, actor, instanceId, ...}"),
        (_enroll(kind="adopt"), 'request kind "adopt" is not one of enroll, release, create, status - send one of those'),
        (_enroll(kind=None), "request kind None is not one of enroll, release, create, status - send one of those"),
        (
            _enroll(scope=["supervise"]),
            'unknown field "scope" - request is exactly {kind: enroll|release, actor, instanceId, serveEpoch, agent}',
        ),
        (_enroll(target="worker"), 'unknown field "target" - request is exactly {kind: enroll|release, actor, instanceId, serveEpoch, agent}'),
        (_hosted(serveEpoch=3), 'unknown field "serveEpoch" - request is exactly {kind: create|status, actor, instanceId, target}'),
        ({"owner": OWNER, "request": {"kind": "status", "actor": "mgr", "instanceId": INSTANCE}},
         "missing field 'target' - request is exactly {kind: create|status, actor, instanceId, target}"),
        (_enroll(actor="m.gr"), "request actor must be the manager's actor name (letters, digits and _)"),
        (_enroll(instanceId="short"), "request instanceId must be 26 to 32 characters of a-z and 0-9"),
        (_enroll(serveEpoch=0), "request serveEpoch must be an integer of at least 1"),
        (_enroll(serveEpoch=True), "request serveEpoch must be an integer of at least 1"),
        (_enroll(serveEpoch=3.0), "request serveEpoch must be an integer of at least 1"),
        (_enroll(agent=""), "request agent must be the managed agent's actor name (letters, digits and _)"),
        (_hosted(target="a b"), "request target must be an actor name (letters, digits and _)"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(body, sentence):
    with pytest.raises(Refused) as refused:
        parse_enrollment_body(body)
    assert (refused.value.code, refused.value.detail) == (RefusalCode.BAD_REQUEST, sentence)


# --- decide_enrollment -------------------------------------------------------------------------


def _decide(body: dict, *, interactive=None, managed=None, instance=None):
    return decide_enrollment(parse_enrollment_body(body), interactive=interactive, managed=managed, instance=instance)


@pytest.mark.parametrize("kind", [LedgerKind.INTERACTIVE, LedgerKind.MANAGED])
def test_enroll_is_authorized_from_either_kind_of_row(kind):
    rows = {"interactive": _row(kind)} if kind is LedgerKind.INTERACTIVE else {"managed": _row(kind)}
    assert _decide(_enroll(), instance=_instance(), **rows) == {
        "authorized": True, "owner": OWNER, "actor": "mgr", "instanceId": INSTANCE, "serveEpoch": 3,
    }  # fmt: skip


def test_hosted_create_answers_the_target():
    assert _decide(_hosted(), interactive=_row(LedgerKind.INTERACTIVE), instance=_instance()) == {
        "authorized": True, "owner": OWNER, "instanceId": INSTANCE, "actor": "mgr", "target": "worker",
    }  # fmt: skip


def test_hosted_status_ignores_the_serve_epoch():
    answer = _decide(_hosted(kind="status"), interactive=_row(LedgerKind.INTERACTIVE), instance=_instance(serve_epoch=9))
    assert answer["authorized"] is True and "serveEpoch" not in answer


SUPERVISE_FIX = f"`cotal actor grant mgr --owner {OWNER} --scope supervise`"


@pytest.mark.parametrize(
    ("rows", "instance", "code", "sentence"),
    [
        ({}, _instance(), RefusalCode.NOT_GRANTED,
         f'manager actor "mgr" has no ledger row for owner {OWNER} - the operator grants it with {SUPERVISE_FIX}'),
        ({"interactive": _row(LedgerKind.INTERACTIVE, "other")}, _instance(), RefusalCode.NOT_GRANTED,
         f'manager actor "mgr" has no ledger row for owner {OWNER} - the operator grants it with {SUPERVISE_FIX}'),
        ({"interactive": _row(LedgerKind.INTERACTIVE), "managed": _row(LedgerKind.MANAGED)}, _instance(),
         RefusalCode.NOT_GRANTED, f"manager actor {OWNER}.mgr has both an interactive and a managed ledger row, "
         "which is a broken ledger - revoke one of them with `cotal actor revoke`"),
        ({"interactive": _row(LedgerKind.INTERACTIVE, scope=("spawn", "admin"))}, _instance(), RefusalCode.FORBIDDEN,
         f"manager actor {OWNER}.mgr lacks ledger scope supervise - the operator grants it with {SUPERVISE_FIX}"),
        ({"managed": _row(LedgerKind.MANAGED, scope=())}, None, RefusalCode.FORBIDDEN,
         f"manager actor {OWNER}.mgr lacks ledger scope supervise - the operator grants it with {SUPERVISE_FIX}"),
        ({"interactive": _row(LedgerKind.INTERACTIVE)}, None, RefusalCode.PRECONDITION_FAILED,
         f"manager instance {INSTANCE} is not registered for owner {OWNER} - register it first: cotal manager register"),
        ({"interactive": _row(LedgerKind.INTERACTIVE)}, _instance(owner=OTHER_OWNER), RefusalCode.PRECONDITION_FAILED,
         f"manager instance {INSTANCE} is not registered for owner {OWNER} - register it first: cotal manager register"),
        ({"interactive": _row(LedgerKind.INTERACTIVE)}, _instance(actor="mgr2"), RefusalCode.CONFLICT,
         f'manager instance {INSTANCE} is registered to another manager actor than "mgr" - send the instance\'s own '
         "actor, or register this actor's instance: cotal manager register"),
        ({"interactive": _row(LedgerKind.INTERACTIVE)}, _instance(serve_epoch=4), RefusalCode.CONFLICT,
         f"serve epoch 3 is not the registered serve epoch 4 of manager instance {INSTANCE} - restart the manager so "
         "it serves under its current registration"),
    ],
)
def test_each_refusal_names_its_fix(rows, instance, code, sentence):
    with pytest.raises(Refused) as refused:
        _decide(_enroll(), instance=instance, **rows)
    assert (refused.value.code, refused.value.detail) == (code, sentence)


def test_hosted_kinds_are_refused_for_another_actors_instance():
    with pytest.raises(Refused) as refused:
        _decide(_hosted(), interactive=_row(LedgerKind.INTERACTIVE), instance=_instance(actor="mgr2"))
    assert refused.value.code is RefusalCode.CONFLICT


# --- consent -----------------------------------------------------------------------------------


def _consent_body(**fields) -> dict:
    return {"idpToken": "t.t.t", "subject": "dev-user-1", "actor": "cli", "toolCallId": "call_1-a", "resultSha256": SHA, **fields}


def test_a_consent_body_parses():
    assert parse_consent_body(_consent_body()) == ConsentRequest(
        idp_token="t.t.t", subject="dev-user-1", actor="cli", tool_call_id="call_1-a", result_sha256=SHA
    )


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        ("x", "the body is exactly {idpToken, subject, actor, toolCallId, resultSha256} must be a JSON object"),
        (_consent_body(result="secret"), 'unknown field "result" - the body is exactly {idpToken, subject, actor, toolCallId, resultSha256}'),
        ({"idpToken": "t", "subject": "s"}, "missing field 'actor' - the body is exactly {idpToken, subject, actor, toolCallId, resultSha256}"),
        (_consent_body(idpToken=""), "idpToken must be a non-empty string"),
        (_consent_body(subject=7), "subject must be a non-empty string"),
        (_consent_body(actor="a-b"), "actor must be an actor name (letters, digits and _)"),
        (_consent_body(toolCallId="x" * 129), "toolCallId must be 1 to 128 characters of letters, digits, _ and -"),
        (_consent_body(toolCallId="a.b"), "toolCallId must be 1 to 128 characters of letters, digits, _ and -"),
        (_consent_body(resultSha256=SHA.upper()), "resultSha256 must be the result's SHA-256 as 64 lowercase hex characters"),
        (_consent_body(resultSha256=SHA[:-1]), "resultSha256 must be the result's SHA-256 as 64 lowercase hex characters"),
    ],
)
def test_a_bad_consent_body_is_a_400(body, sentence):
    with pytest.raises(Refused) as refused:
        parse_consent_body(body)
    assert (refused.value.code, refused.value.detail) == (RefusalCode.BAD_REQUEST, sentence)


def test_consent_needs_an_interactive_row_of_the_same_owner():
    row = _row(LedgerKind.INTERACTIVE, "cli")
    assert authorize_consent(OWNER, "cli", row) is row
    for wrong in (None, _row(LedgerKind.MANAGED, "cli"), _row(LedgerKind.INTERACTIVE, "cli", owner=OTHER_OWNER)):
        with pytest.raises(Refused) as refused:
            authorize_consent(OWNER, "cli", wrong)
        assert refused.value.code is RefusalCode.NOT_GRANTED
        assert refused.value.detail == (
            'actor "cli" is not granted to this user interactively, so they cannot consent for it - the operator '
            f"grants it with `cotal actor grant cli --owner {OWNER}`"
        )


def test_consent_ids_are_22_base64url_characters():
    assert new_consent_id(bytes(range(16))) == "AAECAwQFBgcICQoLDA0ODw"
    assert consent_key("AAECAwQFBgcICQoLDA0ODw") == "consent.AAECAwQFBgcICQoLDA0ODw"
    with pytest.raises(ValueError):
        new_consent_id(bytes(15))


def test_the_consent_jws_has_exactly_the_documented_header_and_claims():
    claims = consent_claims(parse_consent_body(_consent_body()), space="alpha", owner=OWNER, consent_id="j" * 22, now=1_800_000_000)
    token = sign_consent(claims, KEY)
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"alg": "EdDSA", "kid": KEY.kid, "typ": CONSENT_TYP} and CONSENT_TYP == "cotal-consent+jwt"
    wording = JwsWording(what="consent", fix="-", unknown_key="unknown {kid}")
    assert verify_ed25519_jws(token, BearerKeySet.from_keys([KEY]), wording=wording) == {
        "iss": "urn:cotal:auth:alpha", "aud": "alpha", "sub": OWNER, "act": {"owner": OWNER, "actor": "cli"},
        "toolCallId": "call_1-a", "resultSha256": SHA, "jti": "j" * 22, "iat": 1_800_000_000, "exp": 1_800_000_300,
    }  # fmt: skip
    assert json.loads(render_consent_record(claims)) == {
        "ver": 1, "consentId": "j" * 22, "owner": OWNER, "actor": "cli", "toolCallId": "call_1-a",
        "resultSha256": SHA, "iat": 1_800_000_000, "exp": 1_800_000_300,
    }  # fmt: skip
    # compact, in the documented order (the bytes the records store keeps)
    assert render_consent_record(claims) == (
        b'{"ver":1,"consentId":"%s","owner":"%s","actor":"cli","toolCallId":"call_1-a","resultSha256":"%s",'
        b'"iat":1800000000,"exp":1800000300}' % (b"j" * 22, OWNER.encode(), SHA.encode())
    )
