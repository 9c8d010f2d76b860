"""The manager doors (cotal_trio/http/manager_doors.py; spec "Host-only routes", "Password proof").

Served by a quart-trio app of the test's own: ``install_edge`` with ``routes(ctx, guard=...)``,
the guard running ``check_transport`` and ``read_json_body`` as the loopback face's does (the
capability is the face's, tested there). Real core objects: a real issuer key, IdP tokens signed
by the dev IdP's key, an in-memory ledger dict and an in-memory records store.
"""

from __future__ import annotations

import base64
import json
import logging

import pytest
from quart import request
from quart_trio import QuartTrio

from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.jose import BearerKeySet, IssuerKey, JwsWording, verify_ed25519_jws
from cotal_trio.core.windows import SlidingWindow
from cotal_trio.devidp import jwks
from cotal_trio.http.errors import install_edge
from cotal_trio.http.transport import check_transport, read_json_body
from cotal_trio.http.manager_doors import CONSENT_PATH, VERIFY_ENROLLMENT_PATH, ManagerDoors, routes
from tests.support.loopback import DEV_IDP, ISSUER_KEY, NOW, OWNER, ceiling
from tests.support.manager_doors import INSTANCE, MemoryRecords, SHA, _consent, _doors, _instance, _token

UNKNOWN = "unknown path - test app"
JSON = {"Content-Type": "application/json"}
CONSENT_ID = "AAECAwQFBgcICQoLDA0ODw"  # base64url of RANDOM


def _app(ctx: ManagerDoors) -> QuartTrio:
    async def guard() -> object:
        check_transport(request.headers)
        return await read_json_body()

    app = QuartTrio("tests.manager_doors")
    install_edge(app, routes=routes(ctx, guard=guard), unknown_path=UNKNOWN)
    return app


async def _post(ctx: ManagerDoors, path: str, body, headers=JSON):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await _app(ctx).test_client().post(path, data=data, headers=headers)
    return response.status_code, await response.get_json(), response


# --- verify-enrollment -------------------------------------------------------------------------


def _enroll(actor: str = "mgr", **request) -> dict:
    base = {"kind": "enroll", "actor": actor, "instanceId": INSTANCE, "serveEpoch": 2, "agent": "worker"}
    return {"owner": OWNER, "request": {**base, **request}}


def _hosted(actor: str = "mgr", **request) -> dict:
    return {"owner": OWNER, "request": {"kind": "create", "actor": actor, "instanceId": INSTANCE, "target": "worker", **request}}


@ceiling
async def test_enroll_and_release_are_authorized_with_the_registered_epoch():
    for kind in ("enroll", "release"):
        status, body, response = await _post(_doors(), VERIFY_ENROLLMENT_PATH, _enroll(kind=kind))
        assert status == 200, body
        assert body == {"authorized": True, "owner": OWNER, "actor": "mgr", "instanceId": INSTANCE, "serveEpoch": 2}
        assert response.headers["Cache-Control"] == "no-store"


@ceiling
async def test_a_managed_manager_row_counts_too():
    records = MemoryRecords(_instance(actor="remote_mgr", serve_epoch=7))
    status, body, _ = await _post(_doors(records), VERIFY_ENROLLMENT_PATH, _enroll("remote_mgr", serveEpoch=7))
    assert (status, body["serveEpoch"]) == (200, 7)


@ceiling
async def test_create_and_status_answer_the_hosted_shape():
    for kind in ("create", "status"):
        status, body, _ = await _post(_doors(), VERIFY_ENROLLMENT_PATH, _hosted(kind=kind))
        assert status == 200, body
        assert body == {"authorized": True, "owner": OWNER, "instanceId": INSTANCE, "actor": "mgr", "target": "worker"}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ([1], "the body is exactly {owner, request} must be a JSON object"),
        ({**_enroll(), "extra": 1}, 'unknown field "extra" - the body is exactly {owner, request}'),
        (_enroll(kind="adopt"), 'request kind "adopt" is not one of enroll, release, create, status - send one of those'),
        (_enroll(serveEpoch="2"), "request serveEpoch must be an integer of at least 1"),
    ],
)
@ceiling
async def test_a_bad_body_is_a_400(body, error):
    status, answer, _ = await _post(_doors(), VERIFY_ENROLLMENT_PATH, body)
    assert (status, answer) == (400, {"error": error})


@ceiling
async def test_a_scope_in_the_body_is_refused_and_never_grants_supervise():
    """``plain`` lacks ``supervise`` in the ledger; a body claiming it gets a 400, at either level."""
    records = MemoryRecords(_instance(actor="plain"))
    for body in ({**_enroll("plain"), "scope": ["supervise"]}, _enroll("plain", scope=["supervise"])):
        status, answer, _ = await _post(_doors(records), VERIFY_ENROLLMENT_PATH, body)
        assert status == 400 and answer["error"].startswith('unknown field "scope"'), answer
    status, answer, _ = await _post(_doors(records), VERIFY_ENROLLMENT_PATH, _enroll("plain"))
    assert status == 403 and "lacks ledger scope supervise" in answer["error"]


@pytest.mark.parametrize(
    ("body", "records", "status", "error"),
    [
        (_enroll("ghost"), None, 401, f'manager actor "ghost" has no ledger row for owner {OWNER} - the operator grants '
         f"it with `cotal actor grant ghost --owner {OWNER} --scope supervise`"),
        (_enroll("plain"), None, 403, f"manager actor {OWNER}.plain lacks ledger scope supervise - the operator grants "
         f"it with `cotal actor grant plain --owner {OWNER} --scope supervise`"),
        (_enroll(), MemoryRecords(), 412, f"manager instance {INSTANCE} is not registered for owner {OWNER} - register "
         "it first: cotal manager register"),
        (_hosted(kind="status"), MemoryRecords(), 412, f"manager instance {INSTANCE} is not registered for owner "
         f"{OWNER} - register it first: cotal manager register"),
        (_enroll(), MemoryRecords(_instance(actor="remote_mgr")), 409, f"manager instance {INSTANCE} is registered to "
         "another manager actor than \"mgr\" - send the instance's own actor, or register this actor's instance: "
         "cotal manager register"),
        (_enroll(serveEpoch=1), None, 409, f"serve epoch 1 is not the registered serve epoch 2 of manager instance "
         f"{INSTANCE} - restart the manager so it serves under its current registration"),
    ],
)
@ceiling
async def test_each_refusal_maps_to_its_status(body, records, status, error):
    got, answer, _ = await _post(_doors(records), VERIFY_ENROLLMENT_PATH, body)
    assert (got, answer) == (status, {"error": error})


@ceiling
async def test_a_store_that_does_not_answer_is_a_503():
    status, body, _ = await _post(_doors(MemoryRecords(unavailable=True)), VERIFY_ENROLLMENT_PATH, _enroll())
    assert (status, body) == (503, {"error": "a dependency of the auth service is unavailable - retry shortly"})


@ceiling
async def test_the_guard_runs_first():
    status, _, _ = await _post(_doors(), VERIFY_ENROLLMENT_PATH, _enroll(), {**JSON, "Origin": "http://localhost"})
    assert status == 403
    status, _, _ = await _post(_doors(), VERIFY_ENROLLMENT_PATH, _enroll(), {"Content-Type": "text/plain"})
    assert status == 415


@ceiling
async def test_refusals_count_in_the_faces_window(caplog):
    window = SlidingWindow()
    ctx = _doors(admit_refusal=window.try_acquire)
    app = _app(ctx).test_client()
    with caplog.at_level(logging.WARNING, logger="cotal.http"):
        statuses = [(await app.post(VERIFY_ENROLLMENT_PATH, data=json.dumps(_enroll("ghost")), headers=JSON)).status_code
                    for _ in range(31)]  # fmt: skip
    assert statuses == [401] * 30 + [429]
    assert caplog.messages[0].startswith('auth-service: refused a manager enrollment: manager actor "ghost" has no')
    assert (await app.post(VERIFY_ENROLLMENT_PATH, data=json.dumps(_enroll()), headers=JSON)).status_code == 200


# --- tool-result consent -----------------------------------------------------------------------


CONSENT_CLAIMS = {
    "iss": "urn:cotal:auth:alpha", "aud": "alpha", "sub": OWNER, "act": {"owner": OWNER, "actor": "cli"},
    "toolCallId": "call_42", "resultSha256": SHA, "jti": CONSENT_ID, "iat": NOW, "exp": NOW + 300,
}  # fmt: skip


@ceiling
async def test_a_fresh_password_proof_gets_a_signed_consent_recorded_once():
    records = MemoryRecords()
    status, body, response = await _post(_doors(records), CONSENT_PATH, _consent())
    assert status == 200, body
    assert body == {"consentId": CONSENT_ID, "consent": body["consent"], "exp": NOW + 300}
    assert response.headers["Cache-Control"] == "no-store"
    token = body["consent"]
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"alg": "EdDSA", "kid": ISSUER_KEY.kid, "typ": "cotal-consent+jwt"}
    published = BearerKeySet.from_jwks({"keys": [ISSUER_KEY.public_jwk()]})  # what GET /jwks serves
    claims = verify_ed25519_jws(token, published, wording=JwsWording(what="consent", fix="-", unknown_key="{kid}"))
    assert claims == CONSENT_CLAIMS
    value, ttl_s = records.records[f"consent.{CONSENT_ID}"]
    assert ttl_s == 360 and list(records.records) == [f"consent.{CONSENT_ID}"]
    assert json.loads(value) == {"ver": 1, "consentId": CONSENT_ID, "owner": OWNER, "actor": "cli",
                                 "toolCallId": "call_42", "resultSha256": SHA, "iat": NOW, "exp": NOW + 300}  # fmt: skip


@ceiling
async def test_a_replayed_consent_id_is_not_recorded_twice():
    records = MemoryRecords()
    ctx = _doors(records)
    assert (await _post(ctx, CONSENT_PATH, _consent()))[0] == 200
    first = dict(records.records)
    status, body, _ = await _post(ctx, CONSENT_PATH, _consent(toolCallId="call_43"))  # the same random id again
    assert (status, body) == (409, {"error": "this consent id is already recorded, so it is not issued twice - "
                                             "request a fresh consent"})  # fmt: skip
    assert records.records == first


@ceiling
async def test_fresh_random_ids_record_two_consents():
    records = MemoryRecords()
    draws = iter([bytes([1] * 16), bytes([2] * 16)])
    ctx = _doors(records, random_bytes=lambda n: next(draws))
    ids = [(await _post(ctx, CONSENT_PATH, _consent()))[1]["consentId"] for _ in range(2)]
    assert ids == ["AQEBAQEBAQEBAQEBAQEBAQ", "AgICAgICAgICAgICAgICAg"]
    assert sorted(records.records) == [f"consent.{i}" for i in ids]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (_consent(idpToken=_token(auth_time=NOW - 301)), "password sign-in is 301 s old (at most 300 s)"),
        (_consent(idpToken=_token(auth_time=None)), "carries no integer auth_time"),
        (_consent(idpToken=_token(auth_time=NOW - 60.5)), "carries no integer auth_time"),
        (_consent(idpToken=_token(amr=["otp"])), "amr does not contain pwd"),
        (_consent(idpToken=_token(amr=None)), "amr does not contain pwd"),
        (_consent(subject="someone-else"), "another subject than the session's"),
        (_consent(idpToken=_token(key=ISSUER_KEY)), "is not in the pinned JWKS"),
        (_consent("worker"), 'actor "worker" is not granted to this user interactively'),
        (_consent("ghost"), 'actor "ghost" is not granted to this user interactively'),
    ],
)
@ceiling
async def test_no_consent_without_a_fresh_proof_and_an_interactive_row(body, fragment):
    records = MemoryRecords()
    status, answer, _ = await _post(_doors(records), CONSENT_PATH, body)
    assert status == 401 and fragment in answer["error"], answer
    assert records.records == {}


@ceiling
async def test_a_bad_consent_body_is_a_400_and_records_nothing():
    records = MemoryRecords()
    status, answer, _ = await _post(_doors(records), CONSENT_PATH, _consent(result="the private result"))
    assert (status, answer) == (400, {"error": 'unknown field "result" - the body is exactly '
                                               "{idpToken, subject, actor, toolCallId, resultSha256}"})  # fmt: skip
    assert records.records == {}


@ceiling
async def test_no_consent_is_issued_when_the_store_is_down():
    status, body, _ = await _post(_doors(MemoryRecords(unavailable=True)), CONSENT_PATH, _consent())
    assert status == 503 and set(body) == {"error"}


@ceiling
async def test_an_unknown_idp_kid_is_refetched_once_by_the_loopback_faces_guard():
    # The face's guard re-reads the JWKS for every door (the door no longer does it a second time).
    from dataclasses import replace

    from cotal_trio.http import build_loopback_app
    from tests.support.loopback import HEADERS, _context

    rotated = IssuerKey.generate(bytes(range(64, 96)))
    keys = parse_jwks(jwks(DEV_IDP))
    fetched: list[str] = []

    async def refetch(kid: str) -> None:
        fetched.append(kid)
        keys[kid] = rotated.verify_key

    face_ctx = replace(_context(), idp_keys=lambda: keys, refetch_idp_keys=refetch)
    doors = _doors(MemoryRecords(), idp_keys=lambda: keys)
    app = build_loopback_app(face_ctx, doors=[lambda guard, admit: routes(doors, guard=guard)])
    response = await app.test_client().post(CONSENT_PATH, json=_consent(idpToken=_token(key=rotated)), headers=HEADERS)
    assert (response.status_code, fetched) == (200, [rotated.kid]), await response.get_json()


@ceiling
async def test_the_consent_door_is_not_served_without_the_opt_in():
    ctx = _doors(consent=False)
    assert set(routes(ctx, guard=read_json_body)) == {VERIFY_ENROLLMENT_PATH}
    status, body, _ = await _post(ctx, CONSENT_PATH, _consent())
    assert (status, body) == (404, {"error": UNKNOWN})
