"""IdP tokens the exchange must refuse, over HTTP on both faces (issue 5 "Tests"; spec "IdP
compatibility" and "Bridge contract" step 1).

Each token is refused with 401 before any ledger read: the ledger port is a spy that fails the
test if it is called. Tokens are signed with the development IdP's real key unless the row is
about the signature itself, so each refusal is the one its row names.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import replace

import pytest

from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.jose import IssuerKey, sign_ed25519_jws
from cotal_trio.http import build_loopback_app
from cotal_trio.devidp import mint_dev_token
from tests.support.loopback import DEV_IDP, HEADERS, NOW, SUB, FixedClock, _context, ceiling
from tests.support.public_face import JSON_ONLY, _app

KEY = DEV_IDP.key
HEADER = {"alg": "EdDSA", "kid": KEY.kid, "typ": "JWT"}
CLAIMS = {"iss": DEV_IDP.issuer, "aud": DEV_IDP.audience, "sub": SUB, "iat": NOW - 10, "exp": NOW + 300}
DROP = object()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _signed(header: dict | None = None, **claims) -> str:
    merged = {k: v for k, v in {**CLAIMS, **claims}.items() if v is not DROP}
    return sign_ed25519_jws({**HEADER, **(header or {})}, merged, KEY)


def _hs256(secret: bytes) -> str:
    """HS256 MACed with ``secret``: the key-confusion attack on a verifier that trusts ``alg``."""
    head = _b64(json.dumps({"alg": "HS256", "kid": KEY.kid, "typ": "JWT"}).encode())
    signing_input = f"{head}.{_b64(json.dumps(CLAIMS).encode())}"
    return f"{signing_input}.{_b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"


def _pem(public: bytes) -> bytes:
    der = bytes.fromhex("302a300506032b6570032100") + public
    return b"-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(der) + b"\n-----END PUBLIC KEY-----\n"


PUBLIC = base64.urlsafe_b64decode(KEY.x + "=" * (-len(KEY.x) % 4))
JWK = {"kty": "OKP", "crv": "Ed25519", "x": KEY.x, "kid": KEY.kid}

REFUSED = {
    "aud of another app": (_signed(aud="https://other.example"), "audience is not the pinned audience"),
    "aud list without ours": (_signed(aud=["https://other.example", "x"]), "audience is not the pinned audience"),
    "aud missing": (_signed(aud=DROP), "audience is not the pinned audience"),
    "iss with a trailing slash": (_signed(iss=DEV_IDP.issuer + "/"), "issuer is not the pinned issuer"),
    "empty sub": (_signed(sub=""), "has no subject"),
    "HS256 with the raw public key": (_hs256(PUBLIC), 'alg "HS256" is not accepted'),
    "HS256 with the PEM public key": (_hs256(_pem(PUBLIC)), 'alg "HS256" is not accepted'),
    "HS256 with the JWK x": (_hs256(KEY.x.encode()), 'alg "HS256" is not accepted'),
    "alg none": (_signed({"alg": "none"}), 'alg "none" is not accepted'),
    "jku header": (_signed({"jku": "https://evil.example/jwks"}), "key material (jku)"),
    "jwk header": (_signed({"jwk": JWK}), "key material (jwk)"),
    "x5u header": (_signed({"x5u": "https://evil.example/cert"}), "key material (x5u)"),
    "x5c header": (_signed({"x5c": ["MIIB"]}), "key material (x5c)"),
    "exp 6 s ago": (_signed(iat=NOW - 600, exp=NOW - 6), "IdP token expired"),
}


class _NoLedger:
    """A ledger port that must not be read."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, str]] = []

    def __call__(self, owner: str, actor: str):
        self.reads.append((owner, actor))
        raise AssertionError("the ledger was read for a token that should have been refused first")


@pytest.mark.parametrize("face", ["public", "loopback"])
@pytest.mark.parametrize("case", list(REFUSED))
@ceiling
async def test_each_bad_idp_token_is_a_401_before_any_ledger_read(face, case):
    token, fragment = REFUSED[case]
    ledger = _NoLedger()
    ctx = replace(_context(), read_ledger=ledger)
    app = _app(ctx) if face == "public" else build_loopback_app(ctx)
    headers = JSON_ONLY if face == "public" else HEADERS
    response = await app.test_client().post(
        "/exchange", data=json.dumps({"idpToken": token, "actor": "cli"}).encode(), headers=headers,
        scope_base={"client": ("203.0.113.9", 40000)},
    )
    body = await response.get_json()
    assert response.status_code == 401, body
    assert body["error"].startswith("IdP token ") and fragment in body["error"], body
    assert ledger.reads == []


@ceiling
async def test_the_table_signs_with_the_pinned_key():
    """The control row: the same construction with nothing wrong mints, so each refusal above is
    the one its row names."""
    ctx = _context()
    response = await _app(ctx).test_client().post(
        "/exchange", data=json.dumps({"idpToken": _signed(), "actor": "cli"}).encode(), headers=JSON_ONLY,
        scope_base={"client": ("203.0.113.9", 40000)},
    )
    assert response.status_code == 200, await response.get_json()


def _slow_ledger_context(seconds: float):
    """A context whose ledger read takes ``seconds`` of wall time (the clock moves during it)."""
    clock = FixedClock(NOW)
    ctx = _context(clock=clock)
    read = ctx.read_ledger

    def slow_read(owner: str, actor: str):
        clock.now += seconds
        return read(owner, actor)

    return replace(ctx, read_ledger=slow_read)


@ceiling
async def test_a_proof_that_expires_before_signing_is_refused():
    """Spec "Bridge contract" step 1: the bearer's lifetime is the earlier of the request's and
    the proof's ``exp``, read when the bearer is signed. The proof (exp NOW + 590) runs out while
    the ledger is read: refused, not a bearer that is born expired."""
    proof = mint_dev_token(DEV_IDP, sub=SUB, now=NOW - 10, ttl_s=600)
    response = await _app(_slow_ledger_context(590)).test_client().post(
        "/exchange", data=json.dumps({"idpToken": proof, "actor": "cli"}).encode(), headers=JSON_ONLY,
        scope_base={"client": ("203.0.113.9", 40000)},
    )
    assert (response.status_code, (await response.get_json())["error"]) == (
        401, "IdP token expired - sign in to the IdP again for a fresh token and retry",
    )


@ceiling
async def test_the_bearer_is_dated_when_it_is_signed():
    """100 s pass during the ledger read: the bearer's iat is NOW + 100 and its exp the proof's
    (NOW + 590), not NOW + 900."""
    proof = mint_dev_token(DEV_IDP, sub=SUB, now=NOW - 10, ttl_s=600)
    response = await _app(_slow_ledger_context(100)).test_client().post(
        "/exchange", data=json.dumps({"idpToken": proof, "actor": "cli"}).encode(), headers=JSON_ONLY,
        scope_base={"client": ("203.0.113.9", 40000)},
    )
    body = await response.get_json()
    assert response.status_code == 200, body
    claims = json.loads(base64.urlsafe_b64decode(body["token"].split(".")[1] + "=="))
    assert (claims["iat"], claims["exp"], body["exp"]) == (NOW + 100, NOW + 590, NOW + 590)


ROTATED = IssuerKey(seed=bytes([9] * 32))  # the IdP's next key, not in the pinned key set yet


def _rotated_token() -> str:
    return sign_ed25519_jws({**HEADER, "kid": ROTATED.kid}, CLAIMS, ROTATED)


def _rotating_context(*, refetch: bool):
    """A context whose key set gains ROTATED when (and only when) it is re-read."""
    ctx = _context()
    keys = dict(ctx.idp_keys())
    asked: list[str] = []

    async def refetch_idp_keys(kid: str) -> None:
        asked.append(kid)
        keys[ROTATED.kid] = parse_jwks({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": ROTATED.x, "kid": ROTATED.kid}]})[ROTATED.kid]

    ctx = replace(ctx, idp_keys=lambda: keys, refetch_idp_keys=refetch_idp_keys if refetch else None)
    return ctx, asked


@pytest.mark.parametrize("face", ["public", "loopback"])
@ceiling
async def test_a_token_from_the_idps_next_key_mints_after_one_reread(face):
    """Issue 5 item 6: an unknown ``kid`` re-reads the pinned JWKS (the IdP rotated) before the
    token is verified; a known one never does."""
    ctx, asked = _rotating_context(refetch=True)
    app = _app(ctx) if face == "public" else build_loopback_app(ctx)
    headers = JSON_ONLY if face == "public" else HEADERS
    client = app.test_client()
    for token in (_rotated_token(), _signed()):
        response = await client.post(
            "/exchange", data=json.dumps({"idpToken": token, "actor": "cli"}).encode(), headers=headers,
            scope_base={"client": ("203.0.113.9", 40000)},
        )
        assert response.status_code == 200, await response.get_json()
    assert asked == [ROTATED.kid]


@ceiling
async def test_without_a_reread_the_next_key_is_refused():
    ctx, _ = _rotating_context(refetch=False)
    response = await _app(ctx).test_client().post(
        "/exchange", data=json.dumps({"idpToken": _rotated_token(), "actor": "cli"}).encode(), headers=JSON_ONLY,
        scope_base={"client": ("203.0.113.9", 40000)},
    )
    body = await response.get_json()
    assert response.status_code == 401 and "is not in the pinned JWKS" in body["error"], body
