"""Issue 15 item 6 on a real ``run_up``: an IdP subject that is not valid Unicode connects.

A JWT payload is JSON, and JSON can carry ``"\\ud800x"``: Python decodes it to a str holding a
lone surrogate, and the owner derivation (spec "Bridge contract" step 2; upstream-notes 1.2)
answered 500 with a UnicodeEncodeError. The owner is ``HMAC(secret, utf8("cotal-owner-v1:" +
JSON.stringify([issuer, sub])))`` and JSON.stringify writes a lone surrogate as the escape
``\\ud800``, so such a subject has an owner like any other.

Here, on the bundled broker with the development IdP and one full lane: a row is granted for the
owner built by hand from the Node-computed vector of ``tests/core/test_identity.py`` (the space's
own secret, the dev IdP's issuer), a token for ``"\\ud800x"`` signed by the pinned dev-IdP key is
exchanged on the lane's loopback face, and its bearer connects to the real broker; the broker
reports the user JWT it admitted (system ``CONNZ``), whose tags name that owner. The
password-proof door (spec "Password proof") verifies the same subject.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time

import pytest
import trio

from cotal_trio.broker.accounts import open_system_connection
from cotal_trio.cli.actor import build_row, grant_from_flags
from cotal_trio.core.ledger import LedgerKind
from cotal_trio.devidp import DevIdpMaterial
from cotal_trio.http.loopback import PROOF_PATH
from cotal_trio.lane.callout import connect as callout_lane  # where the lane mints (issue 16)
from cotal_trio.natsio import open_loop
from cotal_trio.state import load_broker, load_owner_secret, read_json, write_row
from tests.support.identity import LONE_SURROGATE_VECTORS, _base32_lower_nopad
from tests.support.idp_tokens import sign_ascii_escaped

from tests.support.stack import SPACE, Stack, client, post_answer

pytestmark = pytest.mark.broker

CEILING_S = 30
SUB = "\ud800x"
VECTOR_ISSUER = "https://idp.example"  # the issuer the Node vectors were computed with
VECTOR_SECRET = bytes(range(32, 64))


def _owner_by_hand(secret: bytes, issuer: str) -> str:
    """The owner of ``SUB`` from the Node-computed vector: its JSON.stringify text, the vector's
    issuer swapped for ``issuer`` (a dev issuer needs no JSON escape), HMAC-SHA256, base32."""
    [(_, external, mac16)] = [vector for vector in LONE_SURROGATE_VECTORS if vector[0] == SUB]
    vector_mac = hmac.new(VECTOR_SECRET, f"cotal-owner-v1:{external}".encode(), hashlib.sha256).digest()
    assert vector_mac[:16].hex() == mac16  # the text below is the one Node signed
    assert json.dumps(issuer) == f'"{issuer}"'
    message = "cotal-owner-v1:" + external.replace(json.dumps(VECTOR_ISSUER), json.dumps(issuer), 1)
    return "u_" + _base32_lower_nopad(hmac.new(secret, message.encode("ascii"), hashlib.sha256).digest()[:16])


def _token(stack: Stack, **claims: object) -> str:
    """A token for ``SUB`` by the stack's pinned dev-IdP key, valid for five minutes from now."""
    idp = DevIdpMaterial.from_json(stack.paths.devidp_json.read_bytes())
    now = int(time.time())
    body = {"iss": idp.issuer, "aud": idp.audience, "sub": SUB, "iat": now - 1, "exp": now + 300, **claims}
    return sign_ascii_escaped(idp, body)


def _grant_by_hand(stack: Stack, owner: str, actor: str) -> None:
    """Write the ledger row as ``cotal actor grant`` builds it, for ``owner`` (not derived here:
    the service's own derivation is what the exchange tests)."""
    acl = grant_from_flags(False, "spawn", "team.>", "team.>")
    row = build_row(LedgerKind.INTERACTIVE, owner, actor, acl, role=None, parent=None, label=None, token_hash=None)
    write_row(stack.space_paths, row)


async def _authorized_user(stack: Stack, name: str) -> str:
    """The user the broker admitted for the connection named ``name``: the ``name`` claim of the
    user JWT the callout answered with (system ``CONNZ`` with ``auth: true``)."""
    broker = load_broker(stack.paths.broker_json)
    async with open_loop(), open_system_connection(stack.info.server_url, broker) as system:
        reply = await system.request("$SYS.REQ.SERVER.PING.CONNZ", json.dumps({"limit": 4096, "auth": True}).encode())
    [user] = [c["authorized_user"] for c in json.loads(reply.data)["data"]["connections"] if c.get("name") == name]
    return user


def _claims(jwt: str) -> dict:
    payload = jwt.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


async def test_a_lone_surrogate_subject_exchanges_and_connects_on_a_real_broker(stack, monkeypatch):
    # CONNZ reports no tags of a callout user, so the lane's real mint is watched on the way out;
    # the broker's authorized user (the JWT's name) says which minted JWT it admitted.
    minted: list[str] = []
    mint = callout_lane.mint_user_jwt

    def watched(*args, **kwargs) -> str:
        minted.append(mint(*args, **kwargs))
        return minted[-1]

    monkeypatch.setattr(callout_lane, "mint_user_jwt", watched)
    owner = _owner_by_hand(load_owner_secret(stack.space_paths.owner_secret_json), stack.info.pin.issuer)
    _grant_by_hand(stack, owner, "cli")
    nonce = "ibx" + secrets.token_hex(8)
    received = trio.open_memory_channel(4)
    with trio.fail_after(CEILING_S):
        status, body = await stack.exchange({"idpToken": _token(stack), "actor": "cli"})
        assert status == 200, body  # was 500 (UnicodeEncodeError in the owner derivation)
        assert body["owner"] == owner
        async with client(stack, body["token"], nonce=nonce) as conn:
            await conn.subscribe(f"cotal.{SPACE}.ch.team.>", on_message=received[0].send_nowait)
            await conn.publish(f"cotal.{SPACE}.ch.team.news", b"hello")
            await conn.flush()
            message = await received[1].receive()
            admitted = await _authorized_user(stack, nonce)
    assert (message.subject, message.data) == (f"cotal.{SPACE}.ch.team.news", b"hello")  # admitted, on its grant
    [claims] = [claims for claims in map(_claims, minted) if claims["name"] == admitted]
    assert admitted == f"{owner}-cli"
    assert claims["nats"]["tags"] == [f"owner:{owner}", "actor:cli", f"principal:{owner}.cli"]


async def test_the_password_proof_door_verifies_a_lone_surrogate_subject_on_a_real_stack(stack):
    owner = _owner_by_hand(load_owner_secret(stack.space_paths.owner_secret_json), stack.info.pin.issuer)
    service = read_json(stack.space_paths.auth_service_json)
    auth_time = int(time.time()) - 5
    proof = {"idpToken": _token(stack, auth_time=auth_time, amr=["pwd"]), "subject": SUB}
    with trio.fail_after(CEILING_S):
        status, body, _ = await trio.to_thread.run_sync(post_answer, service["url"] + PROOF_PATH, service["cap"], proof)
    assert (status, body) == (200, {"verified": True, "sub": SUB, "owner": owner, "authTime": auth_time})
