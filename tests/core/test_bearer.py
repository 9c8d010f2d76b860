"""Bearer keys, issuance and validation (reference/upstream-notes.md 3.1-3.3)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nacl.signing import SigningKey

from cotal_trio.core.bearer import (
    CLOCK_SKEW_S,
    KNOWN_VIEWS,
    MAX_TOKEN_TTL_S,
    BearerGrant,
    BearerVerifier,
    ValidatedBearer,
    check_bearer_claims,
    issue_bearer,
    space_issuer,
    validate_bearer,
    verify_bearer_signature,
)
from cotal_trio.core.errors import ConfigError, RefusalCode, Refused
from cotal_trio.core.jose import BearerKeySet, IssuerKey
from cotal_trio.core.views import VIEWS, ServiceEndpointBinding, SessionBinding, TransferTarget

SEED = bytes(range(32))
KEY = IssuerKey.generate(SEED)
OTHER_SEED = bytes([7] * 32)
OTHER = IssuerKey.generate(OTHER_SEED)
KEYS = BearerKeySet.from_keys([KEY])
SPACE = "demo"
NOW = 1_800_000_000
OWNER = "u_rbxbyevw4etgpbzfupdhu2zxwe"
UID = "k3x9" * 7  # 28 chars
DROP = object()


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign_raw(header: bytes, payload: bytes, seed: bytes = SEED) -> str:
    """A compact JWS signed directly with PyNaCl, whatever the header says."""
    signing_input = f"{b64(header)}.{b64(payload)}"
    return f"{signing_input}.{b64(SigningKey(seed).sign(signing_input.encode()).signature)}"


def sign(header: dict, claims: dict, seed: bytes = SEED) -> str:
    return sign_raw(json.dumps(header).encode(), json.dumps(claims).encode(), seed)


def header(**overrides) -> dict:
    base = {"alg": "EdDSA", "kid": KEY.kid}
    return {k: v for k, v in {**base, **overrides}.items() if v is not DROP}


def claims(act_overrides=None, **overrides) -> dict:
    act = {"owner": OWNER, "actor": "cli", "scope": ["spawn"], "lifecycleUid": UID}
    act = {k: v for k, v in {**act, **(act_overrides or {})}.items() if v is not DROP}
    base = {
        "scope": ["spawn"], "ver": 1, "act": act, "sub": OWNER, "iss": "urn:cotal:auth:demo",
        "aud": SPACE, "iat": NOW, "nbf": NOW, "exp": NOW + 600,
    }  # fmt: skip
    return {k: v for k, v in {**base, **overrides}.items() if v is not DROP}


def grant(**overrides) -> BearerGrant:
    fields = {"owner": OWNER, "actor": "cli", "scope": ("spawn", "role:default"), "lifecycle_uid": UID}
    return BearerGrant(**{**fields, **overrides})


def decode_part(token: str, index: int) -> dict:
    part = token.split(".")[index]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


# --- issuance --------------------------------------------------------------------------------


def test_issue_writes_the_upstream_shape():
    token, exp = issue_bearer(
        grant(parent=f"{OWNER}.spawner", credential_id="root.abc"), key=KEY, space=SPACE, now=NOW, ttl_s=600
    )
    assert exp == NOW + 600
    assert decode_part(token, 0) == {"alg": "EdDSA", "kid": KEY.kid, "typ": "JWT"}
    assert decode_part(token, 1) == {
        "scope": ["spawn", "role:default"],
        "ver": 1,
        "act": {
            "owner": OWNER, "actor": "cli", "scope": ["spawn", "role:default"],
            "parent": f"{OWNER}.spawner", "lifecycleUid": UID, "credentialId": "root.abc",
        },
        "sub": OWNER, "iss": "urn:cotal:auth:demo", "aud": "demo",
        "iat": NOW, "nbf": NOW, "exp": NOW + 600,
    }  # fmt: skip


def test_issue_omits_unset_act_keys():
    token, _ = issue_bearer(grant(scope=()), key=KEY, space=SPACE, now=NOW, ttl_s=60)
    payload = decode_part(token, 1)
    assert payload["scope"] == []
    assert payload["act"] == {"owner": OWNER, "actor": "cli", "lifecycleUid": UID}


def test_issue_signature_is_plain_ed25519():
    token, _ = issue_bearer(grant(), key=KEY, space=SPACE, now=NOW, ttl_s=60)
    h, p, s = token.split(".")
    signature = base64.urlsafe_b64decode(s + "==")
    SigningKey(SEED).verify_key.verify(f"{h}.{p}".encode(), signature)  # raises if not


@pytest.mark.filterwarnings("ignore:EdDSA is deprecated")
def test_issue_verifies_with_joserfc():
    from joserfc import jwt
    from joserfc.jwk import OKPKey

    token, _ = issue_bearer(grant(), key=KEY, space=SPACE, now=NOW, ttl_s=60)
    decoded = jwt.decode(token, OKPKey.import_key(KEY.public_jwk()), algorithms=["EdDSA"])
    assert decoded.claims["act"]["lifecycleUid"] == UID
    assert OKPKey.import_key(KEY.public_jwk()).thumbprint() == KEY.kid


@pytest.mark.parametrize("ttl_s", [0, -1, MAX_TOKEN_TTL_S + 1, 10_000, 1.5, True, None])
def test_issue_refuses_bad_ttl(ttl_s):
    with pytest.raises(ConfigError):
        issue_bearer(grant(), key=KEY, space=SPACE, now=NOW, ttl_s=ttl_s)


def test_issue_accepts_max_ttl():
    _, exp = issue_bearer(grant(), key=KEY, space=SPACE, now=NOW, ttl_s=MAX_TOKEN_TTL_S)
    assert exp == NOW + 900


@pytest.mark.parametrize("now", [1.5, 0, "1"])
def test_issue_refuses_bad_now(now):
    with pytest.raises(ConfigError):
        issue_bearer(grant(), key=KEY, space=SPACE, now=now, ttl_s=60)


@pytest.mark.parametrize(
    "overrides",
    [
        {"owner": "local"},
        {"actor": "a.b"},
        {"scope": ("a b",)},
        {"scope": ["spawn"]},
        {"lifecycle_uid": "short"},
        {"parent": "cli"},
        {"view": "nope"},
        {"credential_id": "a..b"},
    ],
)
def test_grant_refuses_bad_fields(overrides):
    with pytest.raises(Refused) as info:
        grant(**overrides)
    assert info.value.code is RefusalCode.BAD_REQUEST


# --- validation: the happy path --------------------------------------------------------------


def test_validate_issued_bearer():
    token, exp = issue_bearer(grant(parent=f"{OWNER}.spawner"), key=KEY, space=SPACE, now=NOW, ttl_s=600)
    assert validate_bearer(token, keys=KEYS, space=SPACE, now=NOW + 1) == ValidatedBearer(
        owner=OWNER, actor="cli", scope=("spawn", "role:default"), lifecycle_uid=UID,
        parent=f"{OWNER}.spawner", view=None, credential_id=None, iat=NOW, exp=exp,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("hdr", "body"),
    [
        (header(alg="Ed25519"), claims()),
        (header(typ="JWT"), claims()),
        (header(), claims(aud=[SPACE])),
        (header(), claims(scope=[])),  # empty top-level scope does not have to match
        (header(), claims(scope=["spawn", "spawn"])),  # set equality
        (header(), claims(jti="x")),  # unknown top-level claims are ignored
    ],
)
def test_validate_accepts(hdr, body):
    result = validate_bearer(sign(hdr, body), keys=KEYS, space=SPACE, now=NOW)
    assert (result.owner, result.actor, result.scope, result.exp) == (OWNER, "cli", ("spawn",), NOW + 600)


def test_validate_accepts_a_plain_dict_of_keys():
    keys = {KEY.kid: KEY.verify_key}
    assert validate_bearer(sign(header(), claims()), keys=keys, space=SPACE, now=NOW).actor == "cli"


# --- validation: refusals --------------------------------------------------------------------


def _tampered_signature() -> str:
    token = sign(header(), claims())
    h, p, s = token.split(".")
    return f"{h}.{p}.{'B' if s[0] == 'A' else 'A'}{s[1:]}"


def _tampered_payload() -> str:
    h, _, s = sign(header(), claims()).split(".")
    return f"{h}.{b64(json.dumps(claims(act_overrides={'scope': ['admin']}, scope=['admin'])).encode())}.{s}"


def _hs256() -> str:
    h = b64(json.dumps({"alg": "HS256", "kid": KEY.kid}).encode())
    p = b64(json.dumps(claims()).encode())
    mac = hmac.new(bytes(KEY.verify_key), f"{h}.{p}".encode(), hashlib.sha256).digest()
    return f"{h}.{p}.{b64(mac)}"


def _alg_none() -> str:
    h = b64(json.dumps({"alg": "none", "kid": KEY.kid}).encode())
    return f"{h}.{b64(json.dumps(claims()).encode())}."


SIGNATURE_REFUSALS = [
    # (token, expected sentence fragment)
    (_tampered_signature(), "signature does not verify"),
    (_tampered_payload(), "signature does not verify"),
    (sign(header(kid=OTHER.kid), claims(), seed=OTHER_SEED), "is not one this space's auth service signs with"),
    (sign(header(kid=DROP), claims()), "is not one this space's auth service signs with"),
    (sign(header(kid=7), claims()), "is not one this space's auth service signs with"),
    (sign(header(), claims(), seed=OTHER_SEED), "signature does not verify"),
    (sign(header(jku="https://evil.example/jwks"), claims()), "key material (jku)"),
    (sign(header(jwk=OTHER.public_jwk()), claims()), "key material (jwk)"),
    (sign(header(x5u="https://evil.example/cert"), claims()), "key material (x5u)"),
    (sign(header(x5c=["MIIB"]), claims()), "key material (x5c)"),
    (sign(header(crit=["exp"]), claims()), "crit"),
    # a consent (or any other JWS the issuer key signs) is never a bearer (RFC 8725 3.11)
    (sign(header(typ="cotal-consent+jwt"), claims()), 'header typ "cotal-consent+jwt" is not this token\'s type'),
    (sign(header(typ=["JWT"]), claims()), "is not this token's type"),
    (_alg_none(), 'alg "none" is not accepted'),
    (_hs256(), 'alg "HS256" is not accepted'),
    (sign(header(alg=DROP), claims()), "is not accepted (EdDSA only)"),
    (sign(header(alg="ES256"), claims()), 'alg "ES256" is not accepted'),
    (sign_raw(b'{"alg":"EdDSA","kid":"%s","alg":"none"}' % KEY.kid.encode(), json.dumps(claims()).encode()),
     "header is not a base64url JSON object"),
    (sign_raw(b'["EdDSA"]', json.dumps(claims()).encode()), "header is not a base64url JSON object"),
    (sign_raw(b"\xff\xfe", json.dumps(claims()).encode()), "header is not a base64url JSON object"),
    (sign_raw(json.dumps(header()).encode(), b"[1, 2]"), "payload is not a base64url JSON object"),
    (sign_raw(json.dumps(header()).encode(), b'{"exp": NaN}'), "payload is not a base64url JSON object"),
    (sign_raw(json.dumps(header()).encode(), b'{"sub": "a", "sub": "b"}'), "payload is not a base64url JSON object"),
    ("a.b", "not a compact JWS"),
    ("a.b.c.d", "not a compact JWS"),
    ("", "missing, empty or too long"),
    (None, "missing, empty or too long"),
    ("a" * 20000, "missing, empty or too long"),
    (sign(header(), claims()) + "=", "not a compact JWS"),
    # a non-ASCII segment was a UnicodeEncodeError (a traceback at the callout, a 500 at the exchange)
    (sign(header(), claims()).split(".")[0] + ".é." + "A" * 86, "not a compact JWS"),
    ("a b.c.d", "not a compact JWS"),
    (sign(header(), claims())[:-2], "signature does not verify"),
]  # fmt: skip


@pytest.mark.parametrize(("token", "fragment"), SIGNATURE_REFUSALS)
def test_signature_refusals(token, fragment):
    with pytest.raises(Refused) as info:
        verify_bearer_signature(token, KEYS)
    assert info.value.code is RefusalCode.BAD_CREDENTIAL
    assert fragment in info.value.detail
    assert info.value.detail.startswith("bearer ")
    assert " - " in info.value.detail  # every sentence names a fix


def test_noncanonical_base64_is_refused():
    token = sign(header(), claims())
    h, p, s = token.split(".")
    # 86 chars encode 64 bytes with 4 spare bits; setting them keeps the bytes, changes the text.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    forged = f"{h}.{p}.{s[:-1]}{alphabet[alphabet.index(s[-1]) ^ 1]}"
    assert base64.urlsafe_b64decode(forged.split(".")[2] + "==") == base64.urlsafe_b64decode(s + "==")
    with pytest.raises(Refused, match="signature does not verify"):
        verify_bearer_signature(forged, KEYS)


CLAIM_REFUSALS = [
    # (claims, now, expected sentence fragment)
    (claims(iss="urn:cotal:auth:other"), NOW, "iss must be urn:cotal:auth:demo"),
    (claims(iss=DROP), NOW, "iss must be"),
    (claims(aud="other"), NOW, "is not for space demo"),
    (claims(aud=[SPACE, "other"]), NOW, "is not for space demo"),
    (claims(aud=[]), NOW, "is not for space demo"),
    (claims(aud=DROP), NOW, "is not for space demo"),
    (claims(ver=2), NOW, "version 2 is not understood"),
    (claims(ver=DROP), NOW, "version"),
    (claims(ver=True), NOW, "version"),
    (claims(exp=DROP), NOW, "claim exp is missing or not an integer"),
    (claims(iat=DROP), NOW, "claim iat is missing"),
    (claims(nbf=DROP), NOW, "claim nbf is missing"),
    (claims(exp=float(NOW + 600)), NOW, "claim exp is missing or not an integer"),
    (claims(exp=True), NOW, "claim exp"),
    (claims(exp="1800000600"), NOW, "claim exp"),
    (claims(), NOW + 600 + CLOCK_SKEW_S, "bearer expired - exchange a fresh one"),
    (claims(), NOW + 10_000, "bearer expired - exchange a fresh one"),
    (claims(iat=NOW + 6, nbf=NOW, exp=NOW + 606), NOW, "not valid yet"),
    (claims(nbf=NOW + 6), NOW, "not valid yet"),
    (claims(exp=NOW + 901), NOW, "lifetime exp - iat must be 1 to 900"),
    (claims(exp=NOW), NOW, "lifetime exp - iat must be 1 to 900"),
    (claims(sub="local", act_overrides={"owner": "local"}), NOW, "sub must be a derived owner"),
    (claims(sub="u_" + "A" * 26, act_overrides={"owner": "u_" + "A" * 26}), NOW, "sub must be a derived owner"),
    (claims(act_overrides={"owner": "u_" + "a" * 26}), NOW, "equal to act.owner"),
    (claims(act=DROP), NOW, "act must be an object"),
    (claims(act=["cli"]), NOW, "act must be an object"),
    (claims(act_overrides={"extra": {}}), NOW, "act must be an object with only"),
    (claims(act_overrides={"sessionGrant": {}}), NOW, "act must be an object with only"),
    (claims(act_overrides={"actor": "a.b"}), NOW, "act.actor is not an actor name"),
    (claims(act_overrides={"actor": DROP}), NOW, "act.actor is not an actor name"),
    (claims(act_overrides={"lifecycleUid": DROP}), NOW, "no valid act.lifecycleUid"),
    (claims(act_overrides={"lifecycleUid": "UPPER" * 6}), NOW, "no valid act.lifecycleUid"),
    (claims(scope=["spawn", "admin"]), NOW, "scope and act.scope disagree"),
    (claims(scope=["admin"]), NOW, "scope and act.scope disagree"),
    (claims(scope=["spawn"], act_overrides={"scope": DROP}), NOW, "scope and act.scope disagree"),
    (claims(scope=DROP), NOW, "scope must be a list of scope tokens"),
    (claims(scope="spawn"), NOW, "scope must be a list of scope tokens"),
    (claims(act_overrides={"scope": ["a b"]}), NOW, "act.scope must be a list of scope tokens"),
    (claims(act_overrides={"parent": "cli"}), NOW, "act.parent is malformed"),
    (claims(act_overrides={"parent": f"{OWNER}.a.b"}), NOW, "act.parent is malformed"),
    (claims(act_overrides={"view": "god"}), NOW, "act.view is malformed"),
    (claims(act_overrides={"credentialId": "a..b"}), NOW, "act.credentialId is malformed"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "now", "fragment"), CLAIM_REFUSALS)
def test_claim_refusals(body, now, fragment):
    token = sign(header(), body)
    verify_bearer_signature(token, KEYS)  # the signature half passes: limits may charge it
    with pytest.raises(Refused) as info:
        validate_bearer(token, keys=KEYS, space=SPACE, now=now)
    assert info.value.code is RefusalCode.BAD_CREDENTIAL
    assert fragment in info.value.detail
    assert " - " in info.value.detail


@pytest.mark.parametrize(
    ("body", "now", "accepted"),
    [
        (claims(), NOW + 600 + CLOCK_SKEW_S - 0.001, True),  # expired, but inside the skew
        (claims(), NOW + 600 + CLOCK_SKEW_S - 1, True),
        (claims(), NOW + 600 + CLOCK_SKEW_S, False),  # the skew edge itself is expired
        (claims(iat=NOW + 5, nbf=NOW + 5, exp=NOW + 605), NOW, True),  # 5 s in the future is fine
        (claims(iat=NOW + 5, nbf=NOW + 5, exp=NOW + 605), NOW - 0.001, False),
        (claims(exp=NOW + 900), NOW, True),  # exactly the maximum lifetime
    ],
)
def test_clock_edges(body, now, accepted):
    token = sign(header(), body)
    if accepted:
        assert validate_bearer(token, keys=KEYS, space=SPACE, now=now).exp == body["exp"]
    else:
        with pytest.raises(Refused):
            validate_bearer(token, keys=KEYS, space=SPACE, now=now)


def test_expired_and_not_yet_valid_read_differently():
    expired = sign(header(), claims())
    future = sign(header(), claims(iat=NOW + 100, nbf=NOW + 100, exp=NOW + 700))
    with pytest.raises(Refused) as first:
        validate_bearer(expired, keys=KEYS, space=SPACE, now=NOW + 700)
    with pytest.raises(Refused) as second:
        validate_bearer(future, keys=KEYS, space=SPACE, now=NOW)
    assert first.value.detail == "bearer expired - exchange a fresh one"
    assert second.value.detail.startswith("bearer is not valid yet")


def test_signature_half_returns_claims_of_an_expired_bearer():
    token = sign(header(), claims())
    assert verify_bearer_signature(token, KEYS) == claims()
    with pytest.raises(Refused, match="expired"):
        check_bearer_claims(verify_bearer_signature(token, KEYS), space=SPACE, now=NOW + 10_000)


def test_a_bearer_of_another_space_is_refused():
    token, _ = issue_bearer(grant(), key=KEY, space="other", now=NOW, ttl_s=60)
    with pytest.raises(Refused, match="urn:cotal:auth:demo"):
        validate_bearer(token, keys=KEYS, space=SPACE, now=NOW)
    assert space_issuer("other") == "urn:cotal:auth:other"


# --- property --------------------------------------------------------------------------------

owners = st.from_regex(r"u_[a-z2-7]{26}", fullmatch=True)
actors = st.from_regex(r"[A-Za-z0-9_]{1,12}", fullmatch=True)
scope_tokens = st.from_regex(r"[A-Za-z0-9_:-]{1,12}", fullmatch=True)
uids = st.from_regex(r"[a-z0-9]{26,32}", fullmatch=True)
spaces = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)


@st.composite
def grants(draw) -> BearerGrant:
    owner = draw(owners)
    parent = draw(st.none() | actors.map(lambda actor: f"{owner}.{actor}"))
    return BearerGrant(
        owner=owner, actor=draw(actors), scope=tuple(draw(st.lists(scope_tokens, max_size=5))),
        lifecycle_uid=draw(uids), parent=parent,
        credential_id=draw(st.none() | st.from_regex(r"[a-z0-9]{1,8}(\.[a-z0-9_-]{1,8}){0,2}", fullmatch=True)),
    )  # fmt: skip


@given(
    grant_=grants(),
    space=spaces,
    seed=st.binary(min_size=32, max_size=32),
    now=st.integers(min_value=1, max_value=2**40),
    ttl_s=st.integers(min_value=1, max_value=MAX_TOKEN_TTL_S),
    elapsed=st.floats(min_value=-CLOCK_SKEW_S, max_value=CLOCK_SKEW_S),
)
def test_issue_then_validate_round_trips(grant_, space, seed, now, ttl_s, elapsed):
    key = IssuerKey.generate(seed)
    token, exp = issue_bearer(grant_, key=key, space=space, now=now, ttl_s=ttl_s)
    checked_at = now + elapsed * ttl_s / CLOCK_SKEW_S if elapsed > 0 else now + elapsed
    result = validate_bearer(token, keys=BearerKeySet.from_keys([key]), space=space, now=checked_at)
    assert result == ValidatedBearer(
        owner=grant_.owner, actor=grant_.actor, scope=grant_.scope, lifecycle_uid=grant_.lifecycle_uid,
        parent=grant_.parent, view=None, credential_id=grant_.credential_id, iat=now, exp=exp,
    )  # fmt: skip


# -- the verified-token memo (the callout's verifier) ------------------------------------------


def _issued(actor: str = "cli", ttl_s: int = 600) -> str:
    grant = BearerGrant(owner=OWNER, actor=actor, scope=("spawn",), lifecycle_uid=UID)
    return issue_bearer(grant, key=KEY, space=SPACE, now=NOW, ttl_s=ttl_s)[0]


def test_verifier_remembers_good_signatures_and_still_checks_claims():
    verifier, token = BearerVerifier(KEYS), _issued(ttl_s=60)
    first = verifier.validate(token, space=SPACE, now=NOW)
    assert verifier.verify(token) is verifier.verify(token)  # the memo answers
    assert verifier.validate(token, space=SPACE, now=NOW) == first
    with pytest.raises(Refused, match="expired"):
        verifier.validate(token, space=SPACE, now=NOW + 60 + CLOCK_SKEW_S)
    with pytest.raises(Refused):
        verifier.validate(token, space="other", now=NOW)


def test_verifier_never_remembers_a_failure():
    verifier, token = BearerVerifier(KEYS), _issued()
    head, body, sig = token.split(".")
    tampered = f"{head}.{body}.{'A' if sig[3] != 'A' else 'B'}{sig[:3]}{sig[4:]}"[: len(token)]
    for _ in range(2):
        with pytest.raises(Refused, match="signature"):
            verifier.verify(tampered)
    assert tampered not in verifier._verified
    assert verifier.validate(token, space=SPACE, now=NOW).actor == "cli"


def test_verifier_memo_is_bounded_least_recently_used_first():
    verifier = BearerVerifier(KEYS, capacity=2)
    a, b, c = (_issued(actor) for actor in ("a", "b", "c"))
    verifier.verify(a)
    verifier.verify(b)
    verifier.verify(a)  # a is now the most recent
    verifier.verify(c)
    assert list(verifier._verified) == [a, c]


def test_verifier_does_not_trust_another_keys_token():
    other_keys = BearerVerifier(BearerKeySet.from_keys([OTHER]))
    with pytest.raises(Refused):
        other_keys.verify(_issued())


@pytest.mark.parametrize("view", [["manager-caller"], {"v": 1}])
def test_a_view_that_is_not_a_string_is_refused_not_a_crash(view):
    # The same class of bug as the fuzzed unhashable alg: a list in a set membership test.
    with pytest.raises(Refused, match="act.view is malformed"):
        check_bearer_claims(claims({"view": view}), space=SPACE, now=NOW)


# --- views and their bindings (upstream-notes 3.2-3.4) -------------------------------------------

INSTANCE = "m" * 26
HEX = "0f" * 32
SESSION = SessionBinding(endpoint="web", session_id="S" * 43, epoch=2, exp=NOW + 3600)
TARGET = TransferTarget(instance_id="t" * 28, sha256_hex=HEX)
# view -> (grant fields, act members the bearer carries)
VIEW_BINDINGS = {
    "manager-caller": ({"manager_instance_id": INSTANCE}, {"managerInstanceId": INSTANCE}),
    "session-caller": (
        {"session": SESSION},
        {"session": {"endpoint": "web", "sessionId": "S" * 43, "epoch": 2, "exp": NOW + 3600}},
    ),
    "transfer-writer": ({"transfer_writer": TARGET}, {"transferWriter": {"instanceId": "t" * 28, "hex": HEX}}),
    "service-host": (
        {"service_endpoint": ServiceEndpointBinding(endpoint="search", instance_id="e" * 26)},
        {"serviceEndpoint": {"endpoint": "search", "instanceId": "e" * 26}},
    ),
    "admin": ({}, {}),
}


def test_known_views_come_from_the_view_table():
    assert KNOWN_VIEWS == frozenset(VIEWS)
    assert len(KNOWN_VIEWS) == 10


@pytest.mark.parametrize("view", sorted(VIEW_BINDINGS))
def test_a_view_bearer_round_trips_with_its_binding(view):
    fields, act = VIEW_BINDINGS[view]
    token, exp = issue_bearer(grant(view=view, **fields), key=KEY, space=SPACE, now=NOW, ttl_s=300)
    assert decode_part(token, 1)["act"] == {
        "owner": OWNER, "actor": "cli", "scope": ["spawn", "role:default"], "lifecycleUid": UID, "view": view, **act,
    }  # fmt: skip
    assert validate_bearer(token, keys=KEYS, space=SPACE, now=NOW + 1) == ValidatedBearer(
        owner=OWNER, actor="cli", scope=("spawn", "role:default"), lifecycle_uid=UID, parent=None, view=view,
        credential_id=None, iat=NOW, exp=exp, manager_instance_id=fields.get("manager_instance_id"),
        session=fields.get("session"), transfer_writer=fields.get("transfer_writer"),
        service_endpoint=fields.get("service_endpoint"),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"view": "manager-caller"}, "managerInstanceId goes with view manager-caller, always and only"),
        ({"manager_instance_id": INSTANCE}, "managerInstanceId goes with view manager-caller"),
        ({"view": "admin", "manager_instance_id": INSTANCE}, "managerInstanceId goes with view manager-caller"),
        ({"view": "session-caller"}, "session goes with view session-caller"),
        ({"view": "manager-caller", "manager_instance_id": INSTANCE, "session": SESSION},
         "session goes with view session-caller"),
        ({"session": SESSION}, "session goes with view session-caller"),
        ({"view": "transfer-writer"}, "transferWriter goes with view transfer-writer"),
        ({"view": "channel-writer", "transfer_writer": TARGET}, "transferWriter goes with view transfer-writer"),
        ({"view": "manager-caller", "manager_instance_id": "M" * 26}, "manager instance id"),
        ({"view": "session-caller", "session": {"endpoint": "web"}}, "session must be a SessionBinding"),
        ({"view": "transfer-writer", "transfer_writer": ("t" * 28, HEX)}, "transfer_writer must be a TransferTarget"),
    ],
)  # fmt: skip
def test_grant_refuses_a_broken_pairing(fields, fragment):
    with pytest.raises(Refused) as info:
        grant(**fields)
    assert info.value.code is RefusalCode.BAD_REQUEST
    assert fragment in info.value.detail


def test_transfer_writer_lifetime_is_capped_at_issue():
    fields, _ = VIEW_BINDINGS["transfer-writer"]
    _, exp = issue_bearer(grant(view="transfer-writer", **fields), key=KEY, space=SPACE, now=NOW, ttl_s=300)
    assert exp == NOW + 300
    with pytest.raises(ConfigError, match="a transfer-writer bearer lifetime must be 1 to 300 seconds, got 301"):
        issue_bearer(grant(view="transfer-writer", **fields), key=KEY, space=SPACE, now=NOW, ttl_s=301)
    # every other view keeps the 900 s cap
    _, exp = issue_bearer(grant(view="admin"), key=KEY, space=SPACE, now=NOW, ttl_s=900)
    assert exp == NOW + 900


def _transfer_claims(**overrides) -> dict:
    act = {"view": "transfer-writer", "transferWriter": {"instanceId": "t" * 28, "hex": HEX}}
    return claims(act, **overrides)


def test_transfer_writer_lifetime_is_capped_at_validation():
    assert validate_bearer(sign(header(), _transfer_claims(exp=NOW + 300)), keys=KEYS, space=SPACE, now=NOW).exp == NOW + 300
    with pytest.raises(Refused) as info:
        validate_bearer(sign(header(), _transfer_claims(exp=NOW + 301)), keys=KEYS, space=SPACE, now=NOW)
    assert info.value.code is RefusalCode.BAD_CREDENTIAL
    assert info.value.detail == (
        "bearer lifetime exp - iat must be 1 to 300 seconds for view transfer-writer - "
        "exchange a fresh bearer from this space's auth service"
    )


VIEW_CLAIM_REFUSALS = [
    # (act members, expected fragment)
    ({"view": "manager-caller"}, "act.managerInstanceId goes with view manager-caller, always and only"),
    ({"managerInstanceId": INSTANCE}, "act.managerInstanceId goes with view manager-caller"),
    ({"view": "purger", "managerInstanceId": INSTANCE}, "act.managerInstanceId goes with view manager-caller"),
    ({"view": "manager-caller", "managerInstanceId": "x"}, "act.managerInstanceId is malformed"),
    ({"view": "manager-caller", "managerInstanceId": 7}, "act.managerInstanceId is malformed"),
    ({"view": "session-caller"}, "act.session goes with view session-caller"),
    ({"session": VIEW_BINDINGS["session-caller"][1]["session"]}, "act.session goes with view session-caller"),
    ({"view": "session-caller", "session": {"endpoint": "web"}}, "act.session is malformed"),
    ({"view": "session-caller", "session": {**VIEW_BINDINGS["session-caller"][1]["session"], "x": 1}},
     "act.session is malformed"),
    ({"view": "session-caller", "session": {**VIEW_BINDINGS["session-caller"][1]["session"], "epoch": -1}},
     "act.session is malformed"),
    ({"view": "session-caller", "session": None}, "act.session is malformed"),
    ({"view": "transfer-writer"}, "act.transferWriter goes with view transfer-writer"),
    ({"view": "admin", "transferWriter": {"instanceId": "t" * 28, "hex": HEX}},
     "act.transferWriter goes with view transfer-writer"),
    ({"view": "transfer-writer", "transferWriter": {"instanceId": "t" * 28, "hex": HEX.upper()}},
     "act.transferWriter is malformed"),
    ({"view": "transfer-writer", "transferWriter": [HEX]}, "act.transferWriter is malformed"),
    ({"view": "manager-caller", "managerInstanceId": INSTANCE, "extra": 1}, "act must be an object with only"),
]  # fmt: skip


@pytest.mark.parametrize(("act", "fragment"), VIEW_CLAIM_REFUSALS)
def test_view_claim_refusals(act, fragment):
    with pytest.raises(Refused) as info:
        check_bearer_claims(claims(act, exp=NOW + 300), space=SPACE, now=NOW)
    assert info.value.code is RefusalCode.BAD_CREDENTIAL
    assert fragment in info.value.detail
    assert info.value.detail.endswith(" - exchange a fresh bearer from this space's auth service")


@given(
    view=st.sampled_from(sorted(VIEW_BINDINGS)),
    ttl_s=st.integers(min_value=1, max_value=MAX_TOKEN_TTL_S),
)
def test_every_view_bearer_the_issuer_signs_validates(view, ttl_s):
    fields, _ = VIEW_BINDINGS[view]
    cap = 300 if view == "transfer-writer" else 900
    if ttl_s > cap:
        with pytest.raises(ConfigError):
            issue_bearer(grant(view=view, **fields), key=KEY, space=SPACE, now=NOW, ttl_s=ttl_s)
        return
    token, exp = issue_bearer(grant(view=view, **fields), key=KEY, space=SPACE, now=NOW, ttl_s=ttl_s)
    assert validate_bearer(token, keys=KEYS, space=SPACE, now=NOW).view == view
