"""The development IdP (cotal_trio/devidp; issue 2 item 8)."""

from __future__ import annotations

import base64
import json
import os

import pytest
import trio

from cotal_trio.core.errors import ConfigError, Refused
from cotal_trio.core.idp import IdpPin, parse_jwks, verify_idp_token
from cotal_trio.core.jose import IssuerKey
from cotal_trio.devidp import (
    DEV_AUDIENCE,
    DevIdpMaterial,
    build_dev_idp_app,
    create_dev_idp,
    jwks,
    mint_dev_token,
)

NOW = 1_800_000_000
CEILING_S = 10
MATERIAL = create_dev_idp(lambda n: bytes(range(n)))


def _b64url(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def test_created_material_has_the_dev_shape():
    assert MATERIAL.issuer == "urn:cotal:dev-idp:000102030405"
    assert MATERIAL.audience == DEV_AUDIENCE == "cotal-dev"
    assert MATERIAL.pin() == IdpPin(issuer=MATERIAL.issuer, audience="cotal-dev")
    fresh = create_dev_idp(os.urandom)
    assert fresh.issuer != MATERIAL.issuer and fresh.kid != MATERIAL.kid


def test_a_minted_token_verifies_against_the_published_jwks():
    token = mint_dev_token(MATERIAL, sub="alice", now=NOW, ttl_s=600)
    identity = verify_idp_token(token, pin=MATERIAL.pin(), keys=parse_jwks(jwks(MATERIAL)), now=NOW + 1)
    assert (identity.sub, identity.iat, identity.exp) == ("alice", NOW, NOW + 600)
    assert (identity.auth_time, identity.amr) == (NOW, ("pwd",))


def test_the_token_header_names_the_kid():
    header_b64 = mint_dev_token(MATERIAL, sub="alice", now=NOW).split(".")[0]
    header = json.loads(_b64url(header_b64))
    assert header == {"alg": "EdDSA", "kid": MATERIAL.kid, "typ": "JWT"}


def test_a_token_of_another_dev_idp_does_not_verify():
    other = create_dev_idp(lambda n: b"\x42" * n)
    token = mint_dev_token(other, sub="alice", now=NOW)
    with pytest.raises(Refused):
        verify_idp_token(token, pin=MATERIAL.pin(), keys=parse_jwks(jwks(MATERIAL)), now=NOW)


def test_jwks_is_public_only():
    (key,) = jwks(MATERIAL)["keys"]
    assert set(key) == {"kty", "crv", "x", "kid", "alg", "use"}
    assert key["kid"] == MATERIAL.kid


def test_material_round_trips_through_its_json_document():
    text = MATERIAL.to_json()
    doc = json.loads(text)
    assert doc["devOnly"] is True and "development IdP" in doc["note"]
    loaded = DevIdpMaterial.from_json(text)
    assert loaded == MATERIAL
    assert DevIdpMaterial.from_json(text.encode()) == MATERIAL
    assert mint_dev_token(loaded, sub="bob", now=NOW) == mint_dev_token(MATERIAL, sub="bob", now=NOW)


def _doc(**changes) -> str:
    doc = json.loads(MATERIAL.to_json())
    doc.update(changes)
    return json.dumps(doc)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        _doc(ver=2),
        _doc(devOnly=False),
        _doc(issuer="https://idp.example"),
        _doc(issuer=None),
        _doc(audience=""),
        _doc(privateJwk={"kty": "OKP", "crv": "Ed25519", "x": "AAAA", "d": "AAAA"}),
        _doc(privateJwk={**IssuerKey(seed=b"\x01" * 32).private_jwk(), "x": MATERIAL.key.x}),
    ],
)
def test_a_bad_document_is_a_config_error(text):
    with pytest.raises(ConfigError, match="restore it from a backup; to start over instead"):
        DevIdpMaterial.from_json(text)


@pytest.mark.parametrize(
    "kwargs", [{"sub": ""}, {"sub": "a", "now": 0}, {"sub": "a", "ttl_s": 0}, {"sub": "a", "amr": (1,)}]
)
def test_mint_refuses_bad_arguments(kwargs):
    with pytest.raises(ConfigError):
        mint_dev_token(MATERIAL, **{"now": NOW, **kwargs})


def test_create_refuses_a_short_random_source():
    with pytest.raises(ConfigError):
        create_dev_idp(lambda n: b"\x00")


async def test_the_app_serves_jwks_and_health():
    client = build_dev_idp_app(MATERIAL).test_client()
    with trio.fail_after(CEILING_S):
        response = await client.get("/jwks")
        health = await client.get("/health")
    assert response.status_code == 200
    assert await response.get_json() == jwks(MATERIAL)
    assert response.headers["Cache-Control"] == "max-age=300"
    assert await health.get_json() == {"ok": True, "devOnly": True, "issuer": MATERIAL.issuer}


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/token", 405),
        ("GET", "/token", 401),  # a JWT only for a live session (issue 19 item 5)
        ("POST", "/mint", 404),
        ("GET", "/authorize", 404),
        ("POST", "/device/token", 400),  # only for an approved device code
        ("POST", "/device/approve", 401),  # only for a person signed in with the key's JWT
        ("POST", "/jwks", 405),
        ("POST", "/health", 405),
    ],
)
async def test_the_app_mints_nothing_unasked(method, path, status):
    client = build_dev_idp_app(MATERIAL).test_client()
    with trio.fail_after(CEILING_S):
        response = await client.open(path, method=method, json={"sub": "alice", "userCode": "BCDF-GHJK"})
    assert response.status_code == status
    body = await response.get_json()
    assert "error" in body and "token" not in body and "access_token" not in body
