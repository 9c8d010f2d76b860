"""``POST /tool-result-human-proof/verify`` on the loopback face (issue 5 item 7; spec "Host-only
routes" and "Password proof"): capability-gated, decides only, never on the public face."""

from __future__ import annotations

import json

import pytest

from cotal_trio.core.identity import derive_owner
from cotal_trio.core.jose import sign_ed25519_jws
from cotal_trio.http import build_loopback_app
from cotal_trio.http.loopback import BAD_CAPABILITY, PROOF_PATH
from tests.support.loopback import CAP, DEV_IDP, HEADERS, NOW, OWNER_SECRET, SUB, _context, ceiling
from tests.support.public_face import JSON_ONLY, _app

KEY = DEV_IDP.key


def _token(**claims) -> str:
    body = {"iss": DEV_IDP.issuer, "aud": DEV_IDP.audience, "sub": SUB, "iat": NOW - 10, "exp": NOW + 300, **claims}
    return sign_ed25519_jws({"alg": "EdDSA", "kid": KEY.kid, "typ": "JWT"}, body, KEY)


async def _verify(body, headers=HEADERS, app=None):
    client = (app or build_loopback_app(_context())).test_client()
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await client.post(PROOF_PATH, data=data, headers=headers)
    return response.status_code, await response.get_json(), response


@ceiling
async def test_a_fresh_password_sign_in_is_verified_and_nothing_is_issued():
    status, body, response = await _verify({"idpToken": _token(auth_time=NOW - 60, amr=["pwd"]), "subject": SUB})
    assert status == 200, body
    owner = derive_owner(OWNER_SECRET, DEV_IDP.issuer, SUB)
    assert body == {"verified": True, "sub": SUB, "owner": owner, "authTime": NOW - 60}  # no token, no consent
    assert response.headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize(
    ("claims", "subject", "fragment"),
    [
        ({"auth_time": NOW - 60, "amr": ["pwd"]}, "someone-else", "another subject"),
        ({"amr": ["pwd"]}, SUB, "no integer auth_time"),
        ({"auth_time": NOW + 30, "amr": ["pwd"]}, SUB, "in the future"),
        ({"auth_time": NOW - 301, "amr": ["pwd"]}, SUB, "301 s old"),
        ({"auth_time": NOW - 60, "amr": ["webauthn"]}, SUB, "amr does not contain pwd"),
        ({"auth_time": NOW - 60, "amr": ["pwd"], "exp": NOW - 1}, SUB, "IdP token expired"),
        ({"auth_time": NOW - 60, "amr": ["pwd"], "aud": "another-app"}, SUB, "audience is not the pinned audience"),
    ],
)
@ceiling
async def test_no_proof_is_a_401_naming_why(claims, subject, fragment):
    status, body, _ = await _verify({"idpToken": _token(**claims), "subject": subject})
    assert status == 401 and fragment in body["error"], body


@pytest.mark.parametrize(
    ("headers", "status", "error"),
    [
        ({"Content-Type": "application/json"}, 401, BAD_CAPABILITY),
        ({"Content-Type": "application/json", "Authorization": "Bearer " + "0" * 64}, 401, BAD_CAPABILITY),
        ({**HEADERS, "Origin": "http://localhost"}, 403, None),
        ({"Authorization": f"Bearer {CAP}", "Content-Type": "text/plain"}, 415, None),
    ],
)
@ceiling
async def test_the_door_takes_the_loopback_pre_checks(headers, status, error):
    got, body, _ = await _verify({"idpToken": _token(auth_time=NOW - 60, amr=["pwd"]), "subject": SUB}, headers=headers)
    assert got == status, body
    if error is not None:
        assert body == {"error": error}


@ceiling
async def test_a_body_that_is_not_the_closed_shape_is_a_400():
    status, body, _ = await _verify({"idpToken": _token(), "subject": SUB, "actor": "cli"})
    assert (status, body) == (400, {"error": "unknown field 'actor' - the body is exactly {idpToken, subject}"})


@ceiling
async def test_refusals_share_the_faces_window():
    """The 31st refusal within a minute answers 429, counted with the exchange's refusals."""
    app = build_loopback_app(_context())
    bad = {"idpToken": _token(amr=["pwd"]), "subject": SUB}
    statuses = [(await _verify(bad, app=app))[0] for _ in range(31)]
    assert statuses == [401] * 30 + [429]


@ceiling
async def test_the_public_face_does_not_serve_it():
    response = await _app().test_client().post(
        PROOF_PATH, data=json.dumps({"idpToken": _token(auth_time=NOW - 60, amr=["pwd"]), "subject": SUB}).encode(),
        headers=JSON_ONLY, scope_base={"client": ("203.0.113.9", 40000)},
    )
    assert response.status_code == 404
