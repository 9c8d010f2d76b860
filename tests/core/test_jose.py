"""Ed25519 JWK keys, key sets and compact JWS signing (RFC 7515, RFC 7638, RFC 8037; reference/upstream-notes.md 3.1)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from nacl.signing import SigningKey

from cotal_trio.core.errors import CodecError, Refused
from cotal_trio.core.jose import (
    BearerKeySet,
    IssuerKey,
    JwsWording,
    b64url_encode,
    header_kid,
    parse_ed25519_jwks,
    sign_ed25519_jws,
    verify_ed25519_jws,
)

SEED = bytes(range(32))
KEY = IssuerKey.generate(SEED)
OTHER_SEED = bytes([7] * 32)
OTHER = IssuerKey.generate(OTHER_SEED)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()



def test_rfc8037_vectors():
    """RFC 8037 appendix A: public key, RFC 7638 thumbprint and the EdDSA signature."""
    d = base64.urlsafe_b64decode("nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=")
    key = IssuerKey(seed=d)
    assert key.x == "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    assert key.kid == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    signature = key.sign(b"eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc")
    assert b64(signature) == (
        "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg"
    )


def test_kid_is_the_rfc7638_thumbprint():
    canonical = '{"crv":"Ed25519","kty":"OKP","x":"%s"}' % KEY.x
    assert KEY.kid == b64(hashlib.sha256(canonical.encode()).digest())
    assert KEY.x == b64(bytes(SigningKey(SEED).verify_key))


def test_public_and_private_jwk():
    assert KEY.public_jwk() == {
        "kty": "OKP", "crv": "Ed25519", "x": KEY.x, "kid": KEY.kid, "alg": "EdDSA", "use": "sig",
    }  # fmt: skip
    assert KEY.private_jwk() == {**KEY.public_jwk(), "d": b64(SEED)}
    assert IssuerKey.from_private_jwk(KEY.private_jwk()) == KEY
    stored = {"kty": "OKP", "crv": "Ed25519", "x": KEY.x, "d": b64(SEED)}  # issuer.json shape
    assert IssuerKey.from_private_jwk(stored) == KEY


def test_sign_compact_jws_golden_bytes():
    """Compact JSON in insertion order, UTF-8 kept, deterministic signature; verifies back."""
    header = {"alg": "EdDSA", "kid": KEY.kid, "typ": "JWT"}
    token = sign_ed25519_jws(header, {"sub": "\u00fc", "n": 1}, KEY)
    header_b64, payload_b64, signature_b64 = token.split(".")
    assert header_b64 == b64(f'{{"alg":"EdDSA","kid":"{KEY.kid}","typ":"JWT"}}'.encode())
    assert payload_b64 == b64('{"sub":"\u00fc","n":1}'.encode()) == "eyJzdWIiOiLDvCIsIm4iOjF9"
    assert signature_b64 == (
        "3NEePnYx00rB1Ngnop25KKfMa0aUYz6rfvzvJsLXOSb5oReJ7zX7KTGkpupNMGiWX15SfI1HLYckMAyAJORrCA"
    )
    wording = JwsWording(what="token", fix="sign again", unknown_key="unknown kid {kid}")
    keys = BearerKeySet.from_keys([KEY])
    assert verify_ed25519_jws(token, keys, wording=wording) == {"sub": "\u00fc", "n": 1}


def test_seed_never_in_repr():
    assert b64(SEED) not in repr(KEY)
    assert "seed" not in repr(KEY)
    assert repr(KEY) == f"IssuerKey(x='{KEY.x}', kid='{KEY.kid}')"


@pytest.mark.parametrize(
    "jwk",
    [
        {**KEY.private_jwk(), "x": OTHER.x},
        {**KEY.private_jwk(), "kid": OTHER.kid},
        {**KEY.private_jwk(), "d": b64(SEED[:31])},
        {**KEY.private_jwk(), "d": b64(SEED) + "="},
        {**KEY.private_jwk(), "kty": "EC"},
        {**KEY.private_jwk(), "crv": "X25519"},
        {k: v for k, v in KEY.private_jwk().items() if k != "d"},
        "not a jwk",
    ],
)
def test_from_private_jwk_refuses(jwk):
    with pytest.raises(CodecError):
        IssuerKey.from_private_jwk(jwk)


@pytest.mark.parametrize("seed", [bytes(31), bytes(33), b"", "x" * 32])
def test_issuer_key_needs_32_bytes(seed):
    with pytest.raises(CodecError):
        IssuerKey(seed=seed)


def test_key_set_from_jwks():
    keys = BearerKeySet.from_jwks({"keys": [KEY.public_jwk(), OTHER.public_jwk()]})
    assert sorted(keys) == sorted([KEY.kid, OTHER.kid])
    assert len(keys) == 2 and KEY.kid in keys and "nope" not in keys
    assert bytes(keys[KEY.kid]) == bytes(KEY.verify_key)


@pytest.mark.parametrize(
    "doc",
    [
        [KEY.public_jwk()],
        {"keys": []},
        {"keys": "x"},
        {"keys": [{k: v for k, v in KEY.public_jwk().items() if k != "kid"}]},
        {"keys": [KEY.public_jwk(), KEY.public_jwk()]},
        {"keys": [KEY.private_jwk()]},
        {"keys": [{**KEY.public_jwk(), "alg": "RS256"}]},
        {"keys": [{**KEY.public_jwk(), "use": "enc"}]},
        {"keys": [{"kty": "RSA", "kid": "r", "n": "AQAB", "e": "AQAB"}]},
    ],
)
def test_key_set_from_jwks_refuses(doc):
    with pytest.raises(CodecError):
        BearerKeySet.from_jwks(doc)


@pytest.mark.parametrize(
    ("token", "kid"),
    [
        (b64url_encode(b'{"alg":"EdDSA","kid":"k1"}') + ".e30.sig", "k1"),
        (b64url_encode(b'{"alg":"EdDSA"}') + ".e30.sig", None),
        (b64url_encode(b'{"kid":""}') + ".e30.sig", None),
        (b64url_encode(b'{"kid":7}') + ".e30.sig", None),
        (b64url_encode(b'{"kid":"a","kid":"b"}') + ".e30.sig", None),  # duplicate keys: no header
        ("not base64!.e30.sig", None),
        ("", None),
        (None, None),
        (42, None),
    ],
)
def test_header_kid_reads_only_a_plain_string_kid(token, kid):
    # Used only to decide whether to re-read an IdP's JWKS; verification is verify_ed25519_jws.
    assert header_kid(token) == kid


@pytest.mark.parametrize("alg", [["EdDSA"], {"a": 1}, 1, None])
def test_an_alg_that_is_not_a_string_is_refused_not_a_crash(alg):
    # Found by tests/http/test_fuzz_faces.py: a list alg raised TypeError (unhashable) -> 500.
    header = b64url_encode(json.dumps({"alg": alg, "kid": KEY.kid}).encode())
    with pytest.raises(Refused, match="is not accepted"):
        verify_ed25519_jws(f"{header}.e30.AA", {KEY.kid: KEY.verify_key}, wording=JwsWording(what="token", fix="fix it", unknown_key="{kid}"))


def test_a_jwks_key_whose_alg_is_not_a_string_is_refused():
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": KEY.x, "kid": "k", "alg": ["EdDSA"]}
    with pytest.raises(CodecError):
        parse_ed25519_jwks({"keys": [jwk]})
