"""IdP token verification (spec "Bridge contract" step 1; reference/upstream-notes.md 3.5)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from nacl.signing import SigningKey

from cotal_trio.core.errors import CodecError, ConfigError, RefusalCode, Refused
from cotal_trio.core.idp import (
    IdpIdentity,
    IdpPin,
    check_password_proof,
    parse_jwks,
    parse_password_proof_body,
    verify_idp_token,
)

SEED = bytes([3] * 32)
OTHER_SEED = bytes([4] * 32)
NOW = 1_800_000_000
PIN = IdpPin(issuer="https://idp.example", audience="https://idp.example", jwks_uri="https://idp.example/jwks")
DROP = object()


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwk(seed: bytes, kid: str) -> dict:
    return {"kty": "OKP", "crv": "Ed25519", "x": b64(bytes(SigningKey(seed).verify_key)), "kid": kid}


KEYS = parse_jwks({"keys": [jwk(SEED, "idp-1"), {**jwk(OTHER_SEED, "idp-2"), "alg": "EdDSA", "use": "sig"}]})


def pem(public: bytes) -> bytes:
    """The SubjectPublicKeyInfo PEM of a raw Ed25519 public key (RFC 8410)."""
    der = bytes.fromhex("302a300506032b6570032100") + public
    return b"-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(der) + b"\n-----END PUBLIC KEY-----\n"


def hs256_token(secret: bytes) -> str:
    """A token whose ``alg`` is HS256, MACed with ``secret``: the key-confusion attack, where a
    verifier that trusts the header would check the MAC with the public key's bytes."""
    head = {"alg": "HS256", "kid": "idp-1", "typ": "JWT"}
    body = {"iss": PIN.issuer, "aud": PIN.audience, "sub": "alice", "iat": NOW - 10, "exp": NOW + 300}
    signing_input = f"{b64(json.dumps(head).encode())}.{b64(json.dumps(body).encode())}"
    return f"{signing_input}.{b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"


PUBLIC = bytes(SigningKey(SEED).verify_key)


def token(header: dict | None = None, seed: bytes = SEED, **overrides) -> str:
    head = {"alg": "EdDSA", "kid": "idp-1", "typ": "JWT", **(header or {})}
    body = {"iss": PIN.issuer, "aud": PIN.audience, "sub": "alice", "iat": NOW - 10, "exp": NOW + 300}
    body = {k: v for k, v in {**body, **overrides}.items() if v is not DROP}
    head = {k: v for k, v in head.items() if v is not DROP}
    signing_input = f"{b64(json.dumps(head).encode())}.{b64(json.dumps(body).encode())}"
    return f"{signing_input}.{b64(SigningKey(seed).sign(signing_input.encode()).signature)}"


def test_parse_jwks():
    assert sorted(KEYS) == ["idp-1", "idp-2"]
    assert bytes(KEYS["idp-1"]) == bytes(SigningKey(SEED).verify_key)


@pytest.mark.parametrize(
    "doc",
    [
        None,
        [],
        {},
        {"keys": []},
        {"keys": {"kid": "a"}},
        {"keys": [jwk(SEED, "")]},
        {"keys": [{k: v for k, v in jwk(SEED, "a").items() if k != "kid"}]},
        {"keys": [jwk(SEED, "a"), jwk(OTHER_SEED, "a")]},
        {"keys": [{"kty": "RSA", "kid": "r", "n": "AQAB", "e": "AQAB"}]},
        {"keys": [{"kty": "EC", "crv": "P-256", "kid": "e", "x": "AA", "y": "AA"}]},
        {"keys": [{**jwk(SEED, "a"), "crv": "Ed448"}]},
        {"keys": [{**jwk(SEED, "a"), "x": "short"}]},
        {"keys": [{**jwk(SEED, "a"), "d": b64(SEED)}]},
        {"keys": [jwk(SEED, "a"), "junk"]},
    ],
)
def test_parse_jwks_refuses(doc):
    with pytest.raises(CodecError):
        parse_jwks(doc)


def test_verify_returns_identity():
    assert verify_idp_token(token(), pin=PIN, keys=KEYS, now=NOW) == IdpIdentity(
        sub="alice", iat=NOW - 10, exp=NOW + 300, auth_time=None, amr=()
    )


@pytest.mark.parametrize(
    ("tok", "sub"),
    [
        (token(header={"alg": "Ed25519"}), "alice"),
        (token(header={"kid": "idp-2"}, seed=OTHER_SEED), "alice"),
        (token(aud=[PIN.audience]), "alice"),
        (token(iat=NOW + 5), "alice"),
        (token(nbf=NOW + 5), "alice"),
        (token(exp=NOW + 1), "alice"),
        (token(sub="github|12345"), "github|12345"),
    ],
)
def test_verify_accepts(tok, sub):
    assert verify_idp_token(tok, pin=PIN, keys=KEYS, now=NOW).sub == sub


def test_password_provenance_is_carried_when_well_formed():
    good = verify_idp_token(token(auth_time=NOW - 60, amr=["pwd", "otp"]), pin=PIN, keys=KEYS, now=NOW)
    assert (good.auth_time, good.amr) == (NOW - 60, ("pwd", "otp"))
    odd = verify_idp_token(token(auth_time="yesterday", amr="pwd"), pin=PIN, keys=KEYS, now=NOW)
    assert (odd.auth_time, odd.amr) == (None, ())


REFUSALS = [
    # (token, now, expected sentence fragment)
    (token(header={"kid": "idp-9"}), NOW, 'IdP token key "idp-9" is not in the pinned JWKS'),
    (token(header={"kid": DROP}), NOW, "is not in the pinned JWKS"),
    (token(header={"kid": "idp-2"}), NOW, "signature does not verify"),
    (token(seed=OTHER_SEED), NOW, "signature does not verify"),
    (token(header={"alg": "RS256"}), NOW, 'alg "RS256" is not accepted'),
    (token(header={"alg": "ES256"}), NOW, 'alg "ES256" is not accepted'),
    (token(header={"alg": "none"}), NOW, 'alg "none" is not accepted'),
    (hs256_token(PUBLIC), NOW, 'alg "HS256" is not accepted'),
    (hs256_token(pem(PUBLIC)), NOW, 'alg "HS256" is not accepted'),
    (hs256_token(b64(PUBLIC).encode()), NOW, 'alg "HS256" is not accepted'),
    (token(header={"jku": "https://evil.example/jwks"}), NOW, "key material (jku)"),
    (token(header={"jwk": jwk(SEED, "idp-1")}), NOW, "key material (jwk)"),
    (token(header={"x5u": "https://evil.example/x"}), NOW, "key material (x5u)"),
    (token(header={"x5c": ["MIIB"]}), NOW, "key material (x5c)"),
    (token(iss="https://evil.example"), NOW, "issuer is not the pinned issuer https://idp.example"),
    (token(iss="https://idp.example/"), NOW, "issuer is not the pinned issuer"),
    (token(iss=DROP), NOW, "issuer is not the pinned issuer"),
    (token(aud="other"), NOW, "audience is not the pinned audience"),
    (token(aud=[PIN.audience, "other"]), NOW, "audience is not the pinned audience"),
    (token(aud=DROP), NOW, "audience is not the pinned audience"),
    (token(exp=DROP), NOW, "needs integer exp and iat"),
    (token(iat=DROP), NOW, "needs integer exp and iat"),
    (token(exp=NOW + 0.5), NOW, "needs integer exp and iat"),
    (token(exp=NOW), NOW, "IdP token expired"),
    (token(exp=NOW - 1), NOW, "IdP token expired"),
    (token(exp=NOW - 6), NOW, "IdP token expired"),
    (token(iat=NOW + 6), NOW, "not valid yet"),
    (token(nbf=NOW + 6), NOW, "not valid yet"),
    (token(nbf="soon"), NOW, "not valid yet"),
    (token(sub=""), NOW, "has no subject"),
    (token(sub=DROP), NOW, "has no subject"),
    (token(sub=42), NOW, "has no subject"),
    ("not-a-jwt", NOW, "not a compact JWS"),
    (None, NOW, "missing"),
]


@pytest.mark.parametrize(("tok", "now", "fragment"), REFUSALS)
def test_verify_refuses(tok, now, fragment):
    with pytest.raises(Refused) as info:
        verify_idp_token(tok, pin=PIN, keys=KEYS, now=now)
    assert info.value.code is RefusalCode.BAD_CREDENTIAL
    assert fragment in info.value.detail
    assert info.value.detail.startswith("IdP token ")
    assert " - " in info.value.detail


def test_expiry_edge_has_no_skew():
    tok = token(exp=NOW + 10)
    assert verify_idp_token(tok, pin=PIN, keys=KEYS, now=NOW + 9.999).exp == NOW + 10
    with pytest.raises(Refused, match="expired"):
        verify_idp_token(tok, pin=PIN, keys=KEYS, now=NOW + 10)


@pytest.mark.parametrize(
    "fields",
    [
        {"issuer": "", "audience": "a"},
        {"issuer": "a", "audience": ""},
        {"issuer": None, "audience": "a"},
        {"issuer": "a", "audience": "a", "jwks_uri": "file:///etc/jwks"},
        {"issuer": "a", "audience": "a", "jwks_uri": ""},
    ],
)
def test_pin_refuses(fields):
    with pytest.raises(ConfigError):
        IdpPin(**fields)


def test_pin_without_jwks_uri():
    assert IdpPin(issuer="a", audience="b").jwks_uri is None


# --- spec "Password proof" ----------------------------------------------------------------------


def _proof(**claims) -> IdpIdentity:
    return verify_idp_token(token(**claims), pin=PIN, keys=KEYS, now=NOW)


def test_a_fresh_password_sign_in_of_the_subject_is_a_proof():
    check_password_proof(_proof(auth_time=NOW - 300, amr=["pwd"]), subject="alice", now=NOW)
    check_password_proof(_proof(auth_time=NOW, amr=["otp", "pwd"]), subject="alice", now=NOW)


@pytest.mark.parametrize(
    ("identity", "subject", "fragment"),
    [
        (_proof(auth_time=NOW - 10, amr=["pwd"]), "bob", "for another subject than the session's"),
        (_proof(amr=["pwd"]), "alice", "carries no integer auth_time"),
        (_proof(auth_time="recently", amr=["pwd"]), "alice", "carries no integer auth_time"),
        (_proof(auth_time=float(NOW - 10), amr=["pwd"]), "alice", "carries no integer auth_time"),
        (_proof(auth_time=True, amr=["pwd"]), "alice", "carries no integer auth_time"),
        (_proof(auth_time=NOW + 1, amr=["pwd"]), "alice", "auth_time is in the future"),
        (_proof(auth_time=NOW - 301, amr=["pwd"]), "alice", "password sign-in is 301 s old (at most 300 s)"),
        (_proof(auth_time=NOW - 10), "alice", "amr does not contain pwd"),
        (_proof(auth_time=NOW - 10, amr=["otp"]), "alice", "amr does not contain pwd"),
        (_proof(auth_time=NOW - 10, amr="pwd"), "alice", "amr does not contain pwd"),
        # a fresh iat is no password provenance
        (_proof(iat=NOW, amr=["pwd"]), "alice", "carries no integer auth_time"),
    ],
)
def test_what_is_no_password_proof(identity, subject, fragment):
    with pytest.raises(Refused) as info:
        check_password_proof(identity, subject=subject, now=NOW)
    assert info.value.code is RefusalCode.BAD_CREDENTIAL
    assert fragment in info.value.detail and " - " in info.value.detail


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (None, "must be a JSON object"),
        ([], "must be a JSON object"),
        ({"idpToken": "t"}, "subject must be a non-empty string"),
        ({"idpToken": "t", "subject": ""}, "subject must be a non-empty string"),
        ({"idpToken": 1, "subject": "alice"}, "idpToken must be a non-empty string"),
        ({"idpToken": "t", "subject": "alice", "actor": "cli"}, "unknown field 'actor'"),
    ],
)
def test_the_proof_body_is_closed(body, fragment):
    with pytest.raises(Refused) as info:
        parse_password_proof_body(body)
    assert info.value.code is RefusalCode.BAD_REQUEST and fragment in info.value.detail
    assert parse_password_proof_body({"idpToken": "t", "subject": "alice"}) == ("t", "alice")
