"""Both HTTP faces under arbitrary requests (issue 5 "Tests"; spec "Listener policy").

Hypothesis drives the public and the loopback face (``cotal_trio/http/public.py``,
``loopback.py``) through quart's test client with arbitrary methods, paths, headers and
bodies: raw bytes, JSON of any shape, exchange objects whose fields hold arbitrary values or
crafted JWS (some signed by the pinned dev IdP, so the claim checks run), and bodies around
the 64 KiB limit. Each example builds fresh apps (the refusal budgets start empty) and may
spend them first, so 429 answers are fuzzed too. Every answer must be:

* below 500: these ports are in memory and never fail, so a 5xx can only come from client input;
* a status the route table and the ordered ``POST /exchange`` pre-checks allow (:func:`_expected`:
  404, 405, Origin 403, media type 415, capability 401, size 413, malformed JSON 400, ...);
* ``application/json`` that parses, an object with a non-empty ``error`` string from 400 on;
* free of a traceback, a ``File "`` line or an exception class name the request did not send;
* without any ``Access-Control-*`` header;
* reported to the metrics hook at most once, with the status answered (always once for
  ``POST /exchange``).

The loopback face is built without ``/metrics`` (its Prometheus text is not JSON); there that
path is one more 404.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cotal_trio.core.jose import b64url_encode
from cotal_trio.http import build_loopback_app
from cotal_trio.http.mesh_routes import MESH_PATHS
from cotal_trio.http.public import MESH_DOCUMENT_PATH
from tests.support.loopback import AGENT_SECRET, CAP, DEV_IDP, NOW, OWNER, SUB, _context, _human_body, ceiling
from tests.support.public_face import GHOST_BODY, _app as _public_app

EXAMPLES = 300
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
JSON_TYPE = "application/json"
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
COMMON_PATHS = ["/exchange", "/health", "/jwks", "/", "/exchange/", "//exchange", "/EXCHANGE", "/exchange?x=1"]
FACE_PATHS = {
    "public": [
        *COMMON_PATHS, MESH_DOCUMENT_PATH, MESH_DOCUMENT_PATH + "/", "/manager-service-authority", "/manager-instances",
        "/chat-session/bearer", "/interactive-lifecycle/retire",
    ],  # fmt: skip
    "loopback": [*COMMON_PATHS, "/metrics", MESH_DOCUMENT_PATH, "/manager-service-authority", "/chat-session/open"],
}
# Each face's closed route table: path -> the one method it serves (HEAD is served as GET).
ROUTES = {
    "public": {
        "/health": "GET", "/jwks": "GET", "/exchange": "POST", MESH_DOCUMENT_PATH: "GET",
        **{path: "POST" for path in MESH_PATHS},
    },  # fmt: skip
    "loopback": {"/health": "GET", "/jwks": "GET", "/exchange": "POST", "/manager-service-authority": "POST", "/": "GET"},
}
# The loopback face's status page (issue 7 item 3) is HTML by design: a GET without its
# ``?cap=`` or cookie (the fuzz never has them) is its 401 page.
STATUS_PAGE = ("loopback", "/")
MAX_BODY_BYTES = 65536
# What a leaked traceback or exception text looks like in a body.
LEAKS = re.compile(r"Traceback|File \"|<class '|object at 0x|\b[A-Z]\w*(?:Error|Exception|Warning)\b")
FIELDS = ["idpToken", "actor", "owner", "actorToken", "ttlSec", "view"]

# --- strategies -------------------------------------------------------------------------------

# Header text: visible latin-1 (a header value the test client can carry).
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40)
# JSON strings include lone surrogates: json.dumps escapes them, json.loads gives them back. Not
# st.text(a | b): text() merges a union of character strategies and drops the surrogates (issue
# 15 item 6 slipped through that way), so the characters are drawn one by one and joined.
json_text = st.lists(st.characters(codec=None) | st.characters(categories=["Cs"]), max_size=20).map("".join)


def _json_of(text: st.SearchStrategy[str]) -> st.SearchStrategy[object]:
    """Any JSON value (no NaN or Infinity) whose strings and keys come from ``text``."""
    numbers = st.integers() | st.integers(-(10**30), 10**30) | st.floats(allow_nan=False, allow_infinity=False)
    scalars = st.none() | st.booleans() | numbers | text

    def nested(inner: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
        return st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4)

    return st.recursive(scalars, nested, max_leaves=12)


json_values = _json_of(json_text)
# What a signed JWS can carry: its JSON may escape a lone surrogate ("\\ud800"), which decodes to
# a str no UTF-8 encoder takes (issue 15 item 6), so the tokens are signed by _sign_escaped.
jws_text = json_text
jws_values = _json_of(jws_text)


def _sign_escaped(header: dict, claims: dict) -> str:
    """A compact JWS like ``sign_ed25519_jws``'s, its JSON ASCII-escaped so any str travels."""
    parts = [b64url_encode(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)]
    signing_input = ".".join(parts)
    return f"{signing_input}.{b64url_encode(DEV_IDP.key.sign(signing_input.encode('ascii')))}"


def _mutated(base: dict, values: st.SearchStrategy[object], text=json_text) -> st.SearchStrategy[dict]:
    """``base`` with a few members replaced by ``values``, a few dropped, maybe one added.

    Starting from a valid shape keeps most examples past the early checks, so the later ones
    (signature, claims, ledger, minting) see arbitrary input too.
    """
    names = st.sampled_from(sorted(base)) | text
    return st.builds(
        lambda changed, dropped: {k: v for k, v in {**base, **changed}.items() if k not in dropped},
        st.dictionaries(names, values, max_size=2), st.sets(st.sampled_from(sorted(base)), max_size=2),
    )  # fmt: skip


times = st.integers(NOW - 10**6, NOW + 10**6) | st.sampled_from([NOW - 1, NOW, NOW + 5, NOW + 6])
VALID_HEADER = {"alg": "EdDSA", "kid": DEV_IDP.kid, "typ": "JWT"}
VALID_CLAIMS = {
    "iss": DEV_IDP.issuer, "aud": DEV_IDP.audience, "sub": SUB, "iat": NOW - 10, "exp": NOW + 600,
    "auth_time": NOW - 10, "amr": ["pwd"],
}  # fmt: skip
# Signed by the pinned dev IdP key: the header and claim checks run after the signature verifies.
signed_tokens = st.builds(
    _sign_escaped,
    _mutated(VALID_HEADER, st.sampled_from(["EdDSA", "Ed25519", "none", "RS256", [], {}]) | jws_values, jws_text),
    _mutated(VALID_CLAIMS, times | st.sampled_from([[DEV_IDP.audience], "x"]) | jws_values, jws_text),
)  # fmt: skip
# A valid token but for one header member, which holds any JSON value.
header_tokens = st.builds(
    lambda name, value: _sign_escaped({**VALID_HEADER, name: value}, VALID_CLAIMS),
    st.sampled_from(["alg", "kid", "typ", "crit", "jwk"]), jws_values,
)  # fmt: skip
# A valid token but for its subject, any non-empty str (lone surrogates too: issue 15 item 6).
subject_tokens = st.builds(lambda sub: _sign_escaped(VALID_HEADER, {**VALID_CLAIMS, "sub": sub}), json_text.filter(bool))
tampered_tokens = st.builds(
    lambda token, tail: token[: -len(tail)] + tail, signed_tokens, st.sampled_from(["A", "AA", "x.y", "="])
)
malformed_tokens = st.sampled_from(["", ".", "..", "a.b.c", "e30.e30.", "e30.e30.AA"])
tokens = signed_tokens | header_tokens | subject_tokens | tampered_tokens | malformed_tokens
field_values = (
    st.sampled_from([OWNER, "cli", "worker", "ghost", AGENT_SECRET, "", 1, 300, 10**20, 0, -1, 1.5, True, None])
    | tokens | json_values
)  # fmt: skip
HUMAN = {"idpToken": _human_body()["idpToken"], "actor": "cli"}
AGENT = {"owner": OWNER, "actor": "worker", "actorToken": AGENT_SECRET}
exchange_objects = st.one_of(
    st.builds(lambda token: {**HUMAN, "idpToken": token}, tokens),
    _mutated(HUMAN, field_values),
    _mutated(AGENT, field_values),
    st.dictionaries(st.sampled_from(FIELDS) | json_text, field_values, max_size=6),
)


def _padded(size: int, shape: str) -> bytes:
    """A body of ``size`` bytes near the 64 KiB limit: raw filler or a JSON exchange object."""
    if shape == "raw":
        return b"x" * size
    head = json.dumps({"owner": OWNER, "actor": "worker", "actorToken": ""})[:-2].encode()
    return head + b"a" * max(0, size - len(head) - 2) + b'"}'


JUNK_TAILS = [b"x", b"}", b"\xff", b" NaN"]
# Half the bodies are exchange objects (most still well-formed JSON objects), half anything else.
bodies = exchange_objects.map(lambda value: json.dumps(value).encode()) | st.one_of(
    st.just(b""),
    st.binary(max_size=300),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.builds(lambda value, junk: json.dumps(value).encode() + junk, exchange_objects, st.sampled_from(JUNK_TAILS)),
    st.sampled_from([b"NaN", b"-Infinity", b'{"ttlSec": NaN}', b"\xef\xbb\xbf{}", b'{"a":1,"a":2}']),
    st.integers(1, 5000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.builds(_padded, st.integers(65536 - 16, 65536 + 16) | st.integers(60_000, 72_000), st.sampled_from(["raw", "json"])),
)  # fmt: skip
content_types = st.none() | st.sampled_from(
    [JSON_TYPE, "application/json; charset=utf-8", "APPLICATION/JSON ;x=y", " application/json", "application/jsonx",
     "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "*/*"]
) | header_text  # fmt: skip
extra_headers = st.dictionaries(
    st.from_regex(r"X-[A-Za-z0-9-]{1,12}", fullmatch=True)
    | st.sampled_from(["X-Forwarded-For", "Forwarded", "X-Real-IP", "Access-Control-Request-Method", "Accept", "Cookie"]),
    st.just("203.0.113.9, , junk,,") | header_text,
    max_size=3,
)  # fmt: skip
random_paths = st.text(st.characters(codec="utf-8", exclude_characters="?#"), max_size=30).map(lambda s: "/" + s)
WRONG_CAPABILITIES = [
    None, "Bearer " + "d" * 64, "Bearer " + CAP.upper(), "Bearer " + CAP[:-1], "Basic " + CAP, CAP, "Bearer",
]  # fmt: skip
VALID_CAPABILITIES = ["Bearer " + CAP, "bearer " + CAP, "BEARER   " + CAP + "  "]
PUBLIC_AUTHORIZATIONS = st.none() | st.sampled_from(VALID_CAPABILITIES) | header_text  # the public face ignores it
JSON_TYPES = [JSON_TYPE, JSON_TYPE + "; charset=utf-8"]


@dataclass(frozen=True, slots=True)
class Call:
    """One request to a face."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def text(self) -> str:
        """Everything the caller sent, so an echo of its own words is not taken for a leak."""
        return " ".join([self.path, *self.headers.values(), self.body.decode("utf-8", "replace")])


def _headers(
    content_type: str | None, origin: str | None, authorization: str | None, extra: dict[str, str]
) -> dict[str, str]:
    named = {"Content-Type": content_type, "Origin": origin, "Authorization": authorization}
    return {**extra, **{name: value for name, value in named.items() if value is not None}}


def _calls(paths: list[str], authorizations: st.SearchStrategy[str | None]) -> st.SearchStrategy[Call]:
    """``POST /exchange`` with a JSON media type and a fuzzed body, the same with fuzzed
    transport headers (Origin, media type), and arbitrary requests to any path."""
    anything = st.builds(
        Call, st.sampled_from(METHODS), st.sampled_from(paths) | random_paths,
        st.builds(_headers, content_types, st.none() | header_text, authorizations, extra_headers), bodies,
    )  # fmt: skip
    transport = st.builds(
        Call, st.just("POST"), st.just("/exchange"),
        st.builds(_headers, content_types, st.none() | st.sampled_from(["null", "https://evil.example"]) | header_text,
                  authorizations, extra_headers),
        bodies,
    )  # fmt: skip
    exchange = st.builds(
        Call, st.just("POST"), st.just("/exchange"),
        st.builds(_headers, st.sampled_from(JSON_TYPES), st.none(), authorizations, extra_headers),
        bodies,
    )  # fmt: skip
    return exchange | transport | anything


# --- the checks -------------------------------------------------------------------------------


def _strict_json(body: bytes) -> tuple[bool, object]:
    """``(True, value)`` when ``body`` is RFC 8259 JSON in UTF-8 (no NaN or Infinity), else ``(False, None)``."""

    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        return True, json.loads(body.decode("utf-8"), parse_constant=refuse)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False, None


def _expected(face_kind: str, call: Call) -> set[int] | None:
    """The statuses the listener policy allows for ``call``; ``None`` when the path is not plain.

    ``POST /exchange`` pre-checks, in order: any Origin 403; a media type that is not
    ``application/json`` 415; on the loopback face a wrong capability 401 (429 once its window
    is full); a body over 64 KiB 413; malformed JSON 400 (never throttled); a body that is not
    a JSON object 400 (429 once the refusal budget is full). Past that, any exchange outcome.
    """
    path = call.path.split("?", 1)[0]
    if "%" in path:
        return None
    served = ROUTES[face_kind].get(path)
    if served is None:
        return {404}
    if served != ("GET" if call.method == "HEAD" else call.method):
        return {405}
    if served == "GET":
        return {200}
    headers = {name.lower(): value for name, value in call.headers.items()}
    if "origin" in headers:
        return {403}
    if not headers.get("content-type", "").strip().lower().startswith(JSON_TYPE):
        return {415}
    if face_kind == "loopback" and headers.get("authorization") not in VALID_CAPABILITIES:
        return {401, 429}
    if len(call.body) > MAX_BODY_BYTES:
        return {413}
    is_json, value = _strict_json(call.body)
    if not is_json:
        return {400}
    return {400, 429} if not isinstance(value, dict) else {200, 400, 401, 403, 404, 429}


async def _check(face, face_kind: str, call: Call, reports: list[tuple[str, int]]) -> int:
    """Send ``call``; assert the listener-policy invariants on the answer; return its status."""
    before = len(reports)
    response = await face.open(call.path, method=call.method, headers=call.headers, data=call.body)
    raw = await response.get_data()
    status = response.status_code
    if (face_kind, call.path.split("?", 1)[0]) == STATUS_PAGE and call.method in ("GET", "HEAD"):
        assert status == 401 and response.mimetype == "text/html", (status, raw[:200])
        assert LEAKS.search(raw.decode("utf-8")) is None and reports[before:] == [], raw[:200]
        return status
    assert response.mimetype == JSON_TYPE, (status, raw[:200])
    body = json.loads(raw)
    if status >= 400:
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], raw[:200]
    leaked = {match.group(0) for match in LEAKS.finditer(raw.decode("utf-8"))}
    assert all(word in call.text() for word in leaked), (leaked, raw[:200])
    assert not [name for name, _ in response.headers.items() if name.lower().startswith("access-control-")]
    new = reports[before:]
    assert len(new) <= 1 and all(answered == status and arm in ("human", "agent", "none") for arm, answered in new)
    if (call.method, call.path) == ("POST", "/exchange"):
        assert len(new) == 1
    assert 200 <= status < 500, (status, raw[:200])
    expected = _expected(face_kind, call)
    assert expected is None or status in expected, (status, expected, raw[:200])
    return status


def _counted():
    reports: list[tuple[str, int]] = []
    return replace(_context(), metrics=lambda arm, status: reports.append((arm, status))), reports


async def _spend(face, face_kind: str, headers: dict[str, str], reports) -> None:
    """Fill one of the face's refusal windows (30 per minute): the 31st refusal is a 429."""
    for _ in range(31):
        await _check(face, face_kind, Call("POST", "/exchange", headers, json.dumps(GHOST_BODY).encode()), reports)


# --- the properties ---------------------------------------------------------------------------


@FUZZ
@given(
    calls=st.lists(_calls(FACE_PATHS["public"], PUBLIC_AUTHORIZATIONS), min_size=1, max_size=4),
    trusted_proxy=st.booleans(),
    spent=st.booleans(),
)  # fmt: skip
@ceiling
async def test_the_public_face_answers_any_request_with_a_json_4xx_at_worst(calls, trusted_proxy, spent):
    ctx, reports = _counted()
    face = _public_app(ctx, trusted_proxy=trusted_proxy).test_client()
    if spent:
        await _spend(face, "public", {"Content-Type": JSON_TYPE}, reports)
    for call in calls:
        await _check(face, "public", call, reports)


LOOPBACK_CAPABILITIES = {
    "valid": st.sampled_from(VALID_CAPABILITIES),
    "missing-or-wrong": st.sampled_from(WRONG_CAPABILITIES) | header_text.map(lambda text: "Bearer " + text),
}


@pytest.mark.parametrize("capability", sorted(LOOPBACK_CAPABILITIES))
@FUZZ
@given(data=st.data(), spent=st.booleans())
@ceiling
async def test_the_loopback_face_answers_any_request_with_a_json_4xx_at_worst(capability, data, spent):
    calls = data.draw(st.lists(_calls(FACE_PATHS["loopback"], LOOPBACK_CAPABILITIES[capability]), min_size=1, max_size=4))
    ctx, reports = _counted()
    face = build_loopback_app(ctx).test_client()
    if spent:  # both windows: refused exchanges and invalid capabilities
        await _spend(face, "loopback", {"Content-Type": JSON_TYPE, "Authorization": "Bearer " + CAP}, reports)
        await _spend(face, "loopback", {"Content-Type": JSON_TYPE, "Authorization": "Bearer " + "d" * 64}, reports)
    for call in calls:
        await _check(face, "loopback", call, reports)


# --- found by the properties above ------------------------------------------------------------


def _bare_token(header: dict) -> str:
    segment = base64.urlsafe_b64encode(json.dumps(header).encode()).rstrip(b"=").decode()
    return f"{segment}.e30.AA"


@pytest.mark.parametrize("alg", [[], ["EdDSA"], {}, {"EdDSA": 1}])
@pytest.mark.parametrize("face_name", ["public", "loopback"])
@ceiling
async def test_a_list_or_object_alg_is_a_401_not_a_500(face_name, alg):
    """Found by the fuzz: ``header.get("alg") not in EDDSA_ALGS`` raised TypeError (a list is
    unhashable) and the exchange answered 500; fixed in core/jose.py (``_is_eddsa``)."""
    ctx, _ = _counted()
    face = (_public_app(ctx) if face_name == "public" else build_loopback_app(ctx)).test_client()
    body = json.dumps({"idpToken": _bare_token({"alg": alg, "kid": DEV_IDP.kid}), "actor": "cli"}).encode()
    headers = {"Content-Type": JSON_TYPE, "Authorization": "Bearer " + CAP}
    response = await face.post("/exchange", data=body, headers=headers)
    assert response.status_code == 401
