"""An IdP subject that is not valid Unicode, through the real faces over TCP (issue 15 item 6).

A JWT payload is JSON, and JSON can carry ``"\\ud800x"``: Python decodes it to a str holding a
lone surrogate. The owner derivation contract (spec "Bridge contract" step 2; upstream-notes
1.2) is ``HMAC(secret, utf8("cotal-owner-v1:" + JSON.stringify([issuer, sub])))``, and
JSON.stringify writes a lone surrogate as the escape ``\\ud800``, so such a subject has an owner
like any other: the faces mint for it, and the password-proof door verifies it, instead of the
500 a UnicodeEncodeError used to answer.

Each test serves a face with hypercorn on 127.0.0.1 (``serve_app``) and speaks raw HTTP/1.1.
The tokens are signed by the pinned dev-IdP key with their JSON written ASCII-escaped, as any
IdP that emits a lone surrogate must write it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from cotal_trio.core.identity import derive_owner
from cotal_trio.core.ledger import LedgerKind
from cotal_trio.http import build_loopback_app, serve_app
from cotal_trio.http.loopback import PROOF_PATH
from tests.support.loopback import CEILING_S, DEV_IDP, HEADERS, NOW, OWNER_SECRET, _context, _http, _request, _row
from tests.support.public_face import JSON_ONLY, _app
from tests.support.idp_tokens import sign_ascii_escaped

SUB = "\ud800x"


def _expected_owner(issuer: str) -> str:
    """The owner built by hand from the contract: the array as JSON.stringify writes it."""
    message = 'cotal-owner-v1:["' + issuer + '","\\ud800x"]'
    mac = hmac.new(OWNER_SECRET, message.encode("ascii"), hashlib.sha256).digest()
    return "u_" + base64.b32encode(mac[:16]).decode().rstrip("=").lower()


OWNER = _expected_owner(DEV_IDP.issuer)


def _signed(**claims: object) -> str:
    """A compact JWS by the pinned IdP key, its JSON ASCII-escaped (so ``\\ud800`` travels as text)."""
    body = {"iss": DEV_IDP.issuer, "aud": DEV_IDP.audience, "sub": SUB, "iat": NOW - 10, "exp": NOW + 300, **claims}
    return sign_ascii_escaped(DEV_IDP, body)


def _context_with_row():
    row = _row(LedgerKind.INTERACTIVE, "cli", owner=OWNER, parent=None)
    return _context(ledger={(row.kind, row.owner, row.actor): row})


async def test_the_loopback_exchange_mints_for_a_lone_surrogate_subject(nursery):
    with trio.fail_after(CEILING_S):
        port = await nursery.start(functools.partial(serve_app, build_loopback_app(_context_with_row())))
        status, _, body = await _http(port, _request("/exchange", {"idpToken": _signed(), "actor": "cli"}, capability=True))
    assert status == 200, body
    assert json.loads(body)["owner"] == OWNER


async def test_the_public_exchange_mints_for_a_lone_surrogate_subject(nursery):
    with trio.fail_after(CEILING_S):
        port = await nursery.start(functools.partial(serve_app, _app(_context_with_row())))
        status, _, body = await _http(port, _request("/exchange", {"idpToken": _signed(), "actor": "cli"}, capability=False))
    assert status == 200, body
    assert json.loads(body)["owner"] == OWNER


async def test_the_password_proof_door_verifies_a_lone_surrogate_subject(nursery):
    with trio.fail_after(CEILING_S):
        port = await nursery.start(functools.partial(serve_app, build_loopback_app(_context_with_row())))
        proof = {"idpToken": _signed(auth_time=NOW - 60, amr=["pwd"]), "subject": SUB}
        status, _, body = await _http(port, _request(PROOF_PATH, proof, capability=True))
    assert status == 200, body
    assert json.loads(body) == {"verified": True, "sub": SUB, "owner": OWNER, "authTime": NOW - 60}


async def test_an_ungranted_lone_surrogate_subject_is_the_named_401(nursery):
    with trio.fail_after(CEILING_S):
        port = await nursery.start(functools.partial(serve_app, build_loopback_app(_context(ledger={}))))
        status, _, body = await _http(port, _request("/exchange", {"idpToken": _signed(), "actor": "cli"}, capability=True))
    assert status == 401
    assert "not granted" in json.loads(body)["error"]


# Any non-empty str a JWT's JSON can carry, lone surrogates included (json.dumps escapes them).
# Drawn one by one and joined: st.text(a | b) would drop the surrogates (see test_fuzz_faces.py).
subjects = st.lists(st.characters(codec=None) | st.characters(categories=["Cs"]), min_size=1, max_size=12).map("".join)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(sub=subjects)
async def test_any_subject_mints_on_both_faces_and_is_verified_by_the_proof_door(sub):
    """Property (quart's test client, for speed): whatever the signed subject, the exchange mints
    for its derived owner and the door verifies it; never a 500."""
    owner = derive_owner(OWNER_SECRET, DEV_IDP.issuer, sub)
    row = _row(LedgerKind.INTERACTIVE, "cli", owner=owner, parent=None)
    ctx = _context(ledger={(row.kind, row.owner, row.actor): row})
    exchange = json.dumps({"idpToken": _signed(sub=sub), "actor": "cli"}).encode()
    with trio.fail_after(CEILING_S):
        loopback = build_loopback_app(ctx).test_client()
        answer = await loopback.post("/exchange", data=exchange, headers=HEADERS)
        assert (answer.status_code, (await answer.get_json())["owner"]) == (200, owner)
        public = await _app(ctx).test_client().post("/exchange", data=exchange, headers=JSON_ONLY)
        assert (public.status_code, (await public.get_json())["owner"]) == (200, owner)
        proof = {"idpToken": _signed(sub=sub, auth_time=NOW - 60, amr=["pwd"]), "subject": sub}
        door = await loopback.post(PROOF_PATH, data=json.dumps(proof).encode(), headers=HEADERS)
        carried = json.loads(json.dumps(sub))  # JSON joins an escaped high+low pair into one character
        answered = {"verified": True, "sub": carried, "owner": owner, "authTime": NOW - 60}
        assert (door.status_code, await door.get_json()) == (200, answered)
