"""The NATS codec: nkeys, xkeys, NATS JWTs and creds (issue 2 item 2).

Golden values were cross-checked once against the nkeys reference library (same public key and
signature for the same seed); seeds are built from fixed bytes here, never stored as strings.
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from cotal_trio.core import natsjwt
from cotal_trio.core.creds import format_creds, parse_creds
from cotal_trio.core.errors import CodecError
from cotal_trio.core.nkeys import (
    KeyPair,
    Prefix,
    decode_public_key,
    decode_seed,
    encode_public_key,
    verify,
)
from cotal_trio.core.xkeys import XKeyPair

RAW = bytes(range(32))

GOLDEN_PUBLIC = [
    (Prefix.OPERATOR, bytes([112]) * 32, "OAMSATEMHOUFXICZZUMKZEAXXUBKDDNF2EGGR63XTI2L4Q7PAZ3ZCTXF"),
    (Prefix.ACCOUNT, bytes([7]) * 32, "ADVEU3DD4KOFECV66VIHWEZOYX4ZKR3WV27L464SIIPOU2IUI3JCZW22"),
    (Prefix.USER, bytes([160]) * 32, "UC2THWFNT7H33XQLJAOBWM2N3Q6FGQJP2YKFMTT6LL6QEA3I2OBMGOQV"),
    (Prefix.SERVER, bytes([104]) * 32, "NBKLBWA5B6T5ADSKPVQA36V2N4VSEA23EL7DGXQX5X27TKS3WBIHJDS4"),
    (Prefix.USER, RAW, "UAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3RLKK"),
]


@pytest.mark.parametrize(("prefix", "raw", "public"), GOLDEN_PUBLIC)
def test_golden_public_keys(prefix, raw, public):
    key = KeyPair.from_raw(prefix, raw)
    assert key.public_key == public
    assert decode_public_key(public) == (prefix, bytes(key._signer.verify_key))
    assert key.seed[:2] == "S" + prefix.letter
    assert decode_seed(key.seed) == (prefix, raw)


def test_golden_signature_is_deterministic():
    key = KeyPair.from_raw(Prefix.ACCOUNT, RAW)
    assert key.sign(b"cotal").hex() == (
        "d0a6f2d8143a805bb3a2f90f300552dee32dbb01c069f8f8d58b6e177d9a45b2"
        "6952cb1c1781b90aaa26437d5bbe046d8cb6f63e266ab2fb96ab7c93a7752208"
    )
    assert verify(key.public_key, b"cotal", key.sign(b"cotal"))
    assert not verify(key.public_key, b"cotaL", key.sign(b"cotal"))


def test_golden_xkey_public():
    assert XKeyPair.from_raw(bytes([9]) * 32).public_key == (
        "XBL5WSZVT4R24XQUNZHCKEQFM4CHEJIGGSGBKDAUOU6QZEZ5ATKCD722"
    )


@given(st.binary(min_size=32, max_size=32), st.sampled_from([p for p in Prefix if p not in (Prefix.SEED, Prefix.PRIVATE, Prefix.CURVE)]))
def test_seed_round_trip(raw, prefix):
    key = KeyPair.from_raw(prefix, raw)
    again = KeyPair.from_seed(key.seed)
    assert again.public_key == key.public_key
    assert again.public_key[0] == prefix.letter
    assert len(key.public_key) == 56 and len(key.seed) == 58


MALFORMED_PUBLIC = [
    "",
    "A" * 55 + "B",  # bad checksum
    "UAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3RLKL",  # last char flipped
    "UAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3RLK",  # truncated
    "uab2cb576phbbpq5odorrz2lycmwpzgwgcn2kdk7dxoimzaskuy3rlkk",  # lower case
    "UAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3RLK!",
    "UAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3RLKÄ",
]


@pytest.mark.parametrize("key", MALFORMED_PUBLIC)
def test_malformed_public_keys_raise_codec_error(key):
    with pytest.raises(CodecError):
        decode_public_key(key)


def test_public_key_role_is_checked():
    with pytest.raises(CodecError, match="expected a public account nkey, got user"):
        decode_public_key(GOLDEN_PUBLIC[4][2], Prefix.ACCOUNT)


def test_seed_is_not_a_public_key_and_back():
    seed = KeyPair.from_raw(Prefix.USER, RAW).seed
    with pytest.raises(CodecError):
        decode_public_key(seed)
    with pytest.raises(CodecError):
        KeyPair.from_seed(GOLDEN_PUBLIC[4][2] + "AA")
    with pytest.raises(CodecError, match="curve"):
        KeyPair.from_seed(XKeyPair.from_raw(RAW).seed)
    with pytest.raises(CodecError, match="curve"):
        XKeyPair.from_seed(seed)


def test_repr_hides_seeds():
    key, xkey = KeyPair.from_raw(Prefix.USER, RAW), XKeyPair.from_raw(RAW)
    assert key.seed not in repr(key) and xkey.seed not in repr(xkey)


def test_encode_public_key_refuses_seed_prefix():
    with pytest.raises(CodecError):
        encode_public_key(Prefix.SEED, RAW)


# -- xkeys -----------------------------------------------------------------------------------


def test_xkey_seal_open_golden_nonce():
    alice, bob = XKeyPair.from_raw(bytes([1]) * 32), XKeyPair.from_raw(bytes([2]) * 32)
    sealed = alice.seal(b"request", bob.public_key, nonce=bytes(24))
    assert sealed[:4] == b"xkv1" and sealed[4:28] == bytes(24)
    assert len(sealed) == 4 + 24 + 16 + len(b"request")
    assert bob.open(sealed, alice.public_key) == b"request"


@given(st.binary(max_size=2048))
def test_xkey_round_trip(data):
    alice, bob = XKeyPair.from_raw(bytes([3]) * 32), XKeyPair.from_raw(bytes([4]) * 32)
    assert bob.open(alice.seal(data, bob.public_key), alice.public_key) == data


def test_xkey_open_failures():
    alice, bob, eve = (XKeyPair.from_raw(bytes([i]) * 32) for i in (5, 6, 7))
    sealed = alice.seal(b"secret", bob.public_key)
    with pytest.raises(CodecError, match="does not open"):
        eve.open(sealed, alice.public_key)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(CodecError, match="does not open"):
        bob.open(tampered, alice.public_key)
    with pytest.raises(CodecError, match="xkv1"):
        bob.open(b"eyJhbGciOi", alice.public_key)
    with pytest.raises(CodecError):
        bob.open(sealed, KeyPair.from_raw(Prefix.USER, RAW).public_key)


# -- NATS JWTs -------------------------------------------------------------------------------

GOLDEN_JWT = (
    "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ."
    "eyJzdWIiOiJBQUIyQ0I1NzZQSEJCUFE1T0RPUlJaMkxZQ01XUFpHV0dDTjJLREs3RFhPSU1aQVNLVVkzUVBaViIsIm5h"
    "dHMiOnsiYWNjb3VudHMiOlsiQSJdLCJ0eXBlIjoiZ2VuZXJpYyIsInZlcnNpb24iOjJ9LCJpc3MiOiJBQUIyQ0I1NzZQ"
    "SEJCUFE1T0RPUlJaMkxZQ01XUFpHV0dDTjJLREs3RFhPSU1aQVNLVVkzUVBaViIsImlhdCI6MTcwMDAwMDAwMCwianRp"
    "IjoiWU9GV1VXVVFaUVZRUDdBTkdVNUJQU0NZQlU3WENMWFFVQkpFUzZDUFdNRktYSDVSWkJHUSJ9."
    "5-fRYTgmmzza31OxiUWOt5-azNoyKXYL3FY6AjFFxDOZZxz7PByUcFSIhuKGWGyb8HJqOYNRch3mNb1-UKSZCg"
)


def test_golden_generic_jwt():
    key = KeyPair.from_raw(Prefix.ACCOUNT, RAW)
    claims = natsjwt.generic_claims(subject=key.public_key, data={"accounts": ["A"]})
    token = natsjwt.encode(claims, key, iat=1_700_000_000)
    assert token == GOLDEN_JWT
    verified = natsjwt.verify(token)
    assert verified["iss"] == key.public_key
    assert verified["nats"] == {"accounts": ["A"], "type": "generic", "version": 2}
    assert verified["jti"] == "YOFWUWUQZQVQP7ANGU5BPSCYBU7XCLXQUBJES6CPWMFKXH5RZBGQ"


def _claim_sets():
    op, acct, user, srv = (KeyPair.from_raw(p, RAW) for p in (Prefix.OPERATOR, Prefix.ACCOUNT, Prefix.USER, Prefix.SERVER))
    return {
        "operator": (natsjwt.operator_claims(operator=op.public_key, name="op", signing_keys=[op.public_key], system_account=acct.public_key), op),
        "account": (natsjwt.account_claims(account=acct.public_key, name="a", signing_keys=[acct.public_key], jetstream=True), op),
        "user": (natsjwt.user_claims(user=user.public_key, name="o-a", issuer_account=acct.public_key, permissions={"pub": {"allow": ["x"]}}, exp=2_000_000_000, tags=["owner:o"]), acct),
        "generic": (natsjwt.generic_claims(subject=op.public_key, data={"accounts": []}), op),
        "response": (natsjwt.authorization_response_claims(user_nkey=user.public_key, server_id=srv.public_key, issuer_account=acct.public_key, error="no"), acct),
    }


@pytest.mark.parametrize("kind", ["operator", "account", "user", "generic", "response"])
def test_round_trip_each_claim_kind(kind):
    claims, signer = _claim_sets()[kind]
    verified = natsjwt.verify(natsjwt.encode(claims, signer, iat=5))
    assert {k: v for k, v in verified.items() if k not in ("iss", "iat", "jti")} == claims
    assert verified["nats"]["version"] == 2


def test_account_claims_spell_out_limits():
    claims = natsjwt.account_claims(account="A", name="a", signing_keys=["B"])
    limits = claims["nats"]["limits"]
    assert limits["conn"] == -1 and limits["subs"] == -1 and limits["payload"] == -1
    assert limits["mem_storage"] == 0 and limits["disk_storage"] == 0
    data = natsjwt.account_claims(account="A", name="a", signing_keys=["B"], jetstream=True)
    assert data["nats"]["limits"]["disk_storage"] == -1


def test_response_requires_exactly_one_of_jwt_or_error():
    with pytest.raises(ValueError):
        natsjwt.authorization_response_claims(user_nkey="U", server_id="N", issuer_account="A")
    with pytest.raises(ValueError):
        natsjwt.authorization_response_claims(user_nkey="U", server_id="N", issuer_account="A", jwt="j", error="e")


def _swap_segment(token, index, new):
    parts = token.split(".")
    parts[index] = new
    return ".".join(parts)


MALFORMED_JWTS = [
    "",
    "a.b",
    "a.b.c.d",
    "!!!.e30.e30",
    _swap_segment(GOLDEN_JWT, 1, "bm90IGpzb24"),  # "not json"
    _swap_segment(GOLDEN_JWT, 1, "WzFd"),  # [1]
    _swap_segment(GOLDEN_JWT, 0, "eyJhbGciOiJub25lIn0"),  # alg none
    _swap_segment(GOLDEN_JWT, 2, "AAAA"),  # bad signature
    _swap_segment(GOLDEN_JWT, 1, GOLDEN_JWT.split(".")[1][:-4] + "fQ"),  # claims edited
]


@pytest.mark.parametrize("token", MALFORMED_JWTS)
def test_malformed_jwts_raise_codec_error(token):
    with pytest.raises(CodecError):
        natsjwt.verify(token)


def test_jwt_without_version_two_is_refused():
    key = KeyPair.from_raw(Prefix.ACCOUNT, RAW)
    token = natsjwt.encode({"sub": "x", "nats": {"type": "generic"}}, key, iat=1)
    with pytest.raises(CodecError, match="v2"):
        natsjwt.verify(token)


def test_decode_authorization_request():
    srv, user = KeyPair.from_raw(Prefix.SERVER, RAW), KeyPair.from_raw(Prefix.USER, RAW)
    claims = {
        "aud": natsjwt.AUTH_REQUEST_AUDIENCE, "sub": "AAUTH", "iat": 10, "exp": 12,
        "nats": {
            "type": "authorization_request", "version": 2,
            "server_id": {"id": srv.public_key, "xkey": "XK", "name": "s"},
            "user_nkey": user.public_key,
            "client_info": {"host": "127.0.0.1", "id": 7},
            "connect_opts": {"auth_token": "bearer", "name": "ibxnonce1", "jwt": "sent"},
        },
    }
    req = natsjwt.decode_authorization_request(claims)
    assert (req.server_id, req.server_xkey, req.account, req.user_nkey) == (srv.public_key, "XK", "AAUTH", user.public_key)
    assert (req.client_host, req.client_id, req.auth_token, req.connect_name, req.sentinel_jwt) == ("127.0.0.1", 7, "bearer", "ibxnonce1", "sent")
    assert (req.iat, req.exp) == (10, 12)
    bad = {**claims, "nats": {**claims["nats"], "user_nkey": srv.public_key}}
    with pytest.raises(CodecError):
        natsjwt.decode_authorization_request(bad)
    with pytest.raises(CodecError, match="integer"):
        natsjwt.decode_authorization_request({**claims, "exp": "12"})


# -- creds -----------------------------------------------------------------------------------


def test_creds_round_trip():
    key = KeyPair.from_raw(Prefix.USER, RAW)
    text = format_creds(GOLDEN_JWT, key.seed)
    assert text.startswith("-----BEGIN NATS USER JWT-----\n")
    assert parse_creds(text) == (GOLDEN_JWT, key.seed)


@pytest.mark.parametrize("text", ["", "just text", "-----BEGIN NATS USER JWT-----\nabc\n------END NATS USER JWT------\n"])
def test_malformed_creds(text):
    with pytest.raises(CodecError):
        parse_creds(text)


def test_jti_is_the_hash_of_the_other_claims():
    import base64 as b64mod
    import hashlib

    body = b64mod.urlsafe_b64decode(GOLDEN_JWT.split(".")[1] + "==")
    head, _, _ = body.rpartition(b',"jti":"')
    digest = hashlib.new("sha512_256", head + b"}").digest()
    assert natsjwt.verify(GOLDEN_JWT)["jti"] == b64mod.b32encode(digest).decode().rstrip("=")


@given(st.binary(min_size=32, max_size=32))
def test_the_jti_alphabet_walk_is_base32_without_padding(digest):
    # natsjwt encodes the jti ten bits at a time (the callout's hot path, issue 14); it must be
    # exactly RFC 4648 base32 of the digest, as nats-io/jwt writes it, for every digest.
    import base64 as b64mod

    assert natsjwt._jti_of(digest) == b64mod.b32encode(digest).rstrip(b"=")
