"""The public face (cotal_trio/http/public.py; DESIGN 7; spec "Listener policy", "Proxy attribution").

Route logic runs through quart's test client with the same real core objects as the loopback
tests (``tests/support/loopback.py``): a real issuer key, real dev-IdP tokens, an in-memory
ledger. The socket peer is set per request through the ASGI ``client`` of the scope, as
hypercorn sets it. One test serves the app over TCP with hypercorn.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import replace

import pytest
import trio

from cotal_trio.core.bearer import validate_bearer
from cotal_trio.core.errors import ConfigError
from cotal_trio.core.jose import BearerKeySet
from cotal_trio.core.ledger import AGENT_EXCHANGE_REFUSAL
from cotal_trio.http import AUTH_PROVIDER, serve_app
from cotal_trio.http.errors import INTERNAL_ERROR
from cotal_trio.http.public import peer_key
from tests.support.loopback import (
    AGENT_SECRET,
    DEV_IDP,
    ISSUER_KEY,
    NOW,
    OWNER,
    SPACE,
    FixedClock,
    _context,
    _http,
    _human_body,
    ceiling,
)
from tests.support.public_face import (
    GHOST_BODY,
    IDP_URL,
    JSON_ONLY,
    PEER,
    PUBLIC_URL,
    SENTINEL,
    SERVER,
    SERVER_URL,
    _app,
    _post,
)

UNKNOWN = {
    "error": "unknown path - /health, /jwks, /exchange, /manager-instances, /chat-session/open, /chat-session/bearer, "
    "/chat-session/retire, /manager-service-authority, /.well-known/cotal-mesh"
}
TOO_MANY = {"error": "too many refused exchanges - wait a minute and retry"}
AGENT_BODY = {"owner": OWNER, "actor": "worker", "actorToken": AGENT_SECRET}


async def _refuse(client, times, **kwargs) -> list[int]:
    return [(await _post(client, GHOST_BODY, **kwargs))[0] for _ in range(times)]


@pytest.fixture
def client():
    return _app().test_client()


# --- routes -----------------------------------------------------------------------------------


@ceiling
async def test_health_and_jwks_answer_as_on_the_loopback_face(client):
    health = await client.get("/health")
    assert (health.status_code, await health.get_json()) == (200, {"ok": True, "issuer": "urn:cotal:auth:alpha"})
    jwks = await client.get("/jwks")
    assert jwks.status_code == 200 and jwks.headers["Cache-Control"] == "max-age=300"
    assert [key["kid"] for key in (await jwks.get_json())["keys"]] == [ISSUER_KEY.kid]


NOT_SERVED_HERE = [
    # served only by a space whose auth service hosts service endpoints (not this face)
    "/service-endpoint-authority", "/service-endpoint-host",
    # the loopback face's host-only doors (spec "Host-only routes")
    "/managed-lifecycle/activate", "/interactive-lifecycle/retire", "/managed-lifecycle/retire",
    "/manager-service-authority/verify-enrollment", "/tool-result-human-proof/verify", "/tool-result-consent/issue",
    # near misses of the served paths
    "/", "/nope", "/exchange/", "//exchange", "/EXCHANGE", "/.well-known", "/.well-known/",
    "/.well-known/cotal-mesh/", "/.well-known/openid-configuration", "/health/",
]  # fmt: skip


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("path", NOT_SERVED_HERE)
@ceiling
async def test_every_other_path_is_a_json_404(client, path, method):
    response = await client.open(path, method=method, headers=JSON_ONLY, data=b"{}")
    assert (response.status_code, await response.get_json()) == (404, UNKNOWN)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("GET", "/exchange", "POST"), ("POST", "/health", "GET"), ("POST", "/.well-known/cotal-mesh", "GET")],
)
@ceiling
async def test_wrong_method_is_a_json_405_naming_the_right_one(client, method, path, allow):
    response = await client.open(path, method=method)
    assert (response.status_code, response.headers["Allow"]) == (405, allow)
    assert await response.get_json() == {"error": f"{method} is not served on {path} - use {allow} {path}"}


# --- the bootstrap document -------------------------------------------------------------------


@ceiling
async def test_the_well_known_document_has_the_exact_shape(client):
    response = await client.get("/.well-known/cotal-mesh")
    assert response.status_code == 200
    assert await response.get_json() == {
        "space": SPACE,
        "server": SERVER,
        "tlsRequired": True,
        "userAuth": {
            "provider": "cotal",
            "idp": {"url": IDP_URL, "issuer": DEV_IDP.issuer, "audience": DEV_IDP.audience},
            "endpoints": {"url": PUBLIC_URL, "managerAuthorityUrl": f"{PUBLIC_URL}/manager-service-authority"},
        },
        "sentinelCreds": SENTINEL,
    }
    assert AUTH_PROVIDER == "cotal"


@ceiling
async def test_without_an_advertised_server_the_document_names_the_broker_url():
    client = _app(advertised_server=None, public_url=PUBLIC_URL + "/").test_client()
    document = await (await client.get("/.well-known/cotal-mesh")).get_json()
    assert document["server"] == SERVER_URL
    assert document["userAuth"]["endpoints"]["url"] == PUBLIC_URL  # no trailing slash


@pytest.mark.parametrize(
    "overrides",
    [
        {"public_url": "auth.example"},
        {"public_url": "ftp://auth.example"},
        {"public_url": "https://"},
        {"public_url": "https://[::1"},
        {"idp_url": ""},
        {"sentinel_creds": "/root/.cotal/spaces/alpha/sentinel.creds"},  # the path, not the text
        {"advertised_server": None, "server_url": ""},
        {"trusted_proxy": "false"},
    ],
)
def test_bad_inputs_fail_the_build_not_a_request(overrides):
    with pytest.raises(ConfigError):
        _app(**overrides)


# --- no capability: the credential is the proof -----------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer " + "d" * 64, "Basic nope"])
@ceiling
async def test_the_human_arm_mints_without_any_capability(client, authorization):
    headers = JSON_ONLY if authorization is None else {**JSON_ONLY, "Authorization": authorization}
    status, body, response = await _post(client, _human_body(), headers=headers)
    assert status == 200, body
    assert response.headers["Cache-Control"] == "no-store"
    bearer = validate_bearer(body["token"], keys=BearerKeySet.from_keys([ISSUER_KEY]), space=SPACE, now=NOW)
    assert (bearer.owner, bearer.actor, bearer.scope) == (OWNER, "cli", ("spawn", "admin"))


@ceiling
async def test_the_agent_arm_mints_without_any_capability(client):
    status, body, _ = await _post(client, AGENT_BODY)
    assert status == 200, body
    bearer = validate_bearer(body["token"], keys=BearerKeySet.from_keys([ISSUER_KEY]), space=SPACE, now=NOW)
    assert (bearer.actor, bearer.parent, bearer.exp) == ("worker", f"{OWNER}.cli", NOW + 300)


@ceiling
async def test_a_refusal_keeps_its_reason_and_the_log_names_the_peer(client, caplog):
    with caplog.at_level(logging.WARNING, logger="cotal.http"):
        status, body, _ = await _post(client, GHOST_BODY)
    assert (status, body) == (401, {"error": AGENT_EXCHANGE_REFUSAL})
    assert f"auth-service: refused an agent exchange from {PEER}: {AGENT_EXCHANGE_REFUSAL}" in caplog.messages


# --- request hygiene (shared with the loopback face) ------------------------------------------


@pytest.mark.parametrize(
    ("headers", "raw", "status", "error"),
    [
        ({**JSON_ONLY, "Origin": "https://evil.example"}, None, 403, "browser-origin requests are not served here"),
        ({"Content-Type": "text/plain"}, None, 415, "send the exchange body as JSON with Content-Type: application/json"),
        (JSON_ONLY, b"[" + b" " * (70 * 1024) + b"]", 413, "request body too large (maximum 65536 bytes)"),
        ({**JSON_ONLY, "Content-Length": str(70 * 1024)}, b"{}", 413, "request body too large (maximum 65536 bytes)"),
        (JSON_ONLY, b"{", 400, "request body is not valid JSON"),
        (JSON_ONLY, b"[NaN]", 400, "request body is not valid JSON"),
    ],
)
@ceiling
async def test_hygiene_codes(client, headers, raw, status, error):
    body = raw if raw is not None else json.dumps(_human_body()).encode()
    answer = await _post(client, body, headers=headers)
    assert answer[:2] == (status, {"error": error})


@pytest.mark.parametrize("body", [None, [1], "token", 7])
@ceiling
async def test_a_body_that_is_not_an_object_is_a_named_400(client, body):
    status, answer, _ = await _post(client, body)
    assert status == 400 and answer["error"].startswith("the exchange body must be a JSON object")


@ceiling
async def test_an_unexpected_failure_is_a_generic_500_logged_never_echoed(caplog):
    def unreadable_keys():
        raise OSError("pinned JWKS cache /secret/path is unreadable")

    caplog.set_level(logging.ERROR, logger="cotal.http")
    client = _app(replace(_context(), idp_keys=unreadable_keys)).test_client()
    answer = await _post(client, _human_body())
    assert answer[:2] == (500, {"error": INTERNAL_ERROR})
    assert b"/secret/path" not in await answer[2].get_data()
    [logged] = [record for record in caplog.records if record.exc_info]
    assert isinstance(logged.exc_info[1], OSError)


@ceiling
async def test_no_answer_carries_a_cors_header(client):
    browser = {"Origin": "https://evil.example"}
    responses = [
        await client.get("/health", headers=browser),
        await client.get("/jwks", headers=browser),
        await client.get("/.well-known/cotal-mesh", headers=browser),
        await client.open("/exchange", method="OPTIONS", headers={**browser, "Access-Control-Request-Method": "POST"}),
        await client.get("/nope", headers=browser),
        (await _post(client, _human_body(), headers={**JSON_ONLY, **browser}))[2],
        (await _post(client, _human_body()))[2],
        (await _post(client, GHOST_BODY))[2],
    ]
    assert [r.status_code for r in responses] == [200, 200, 200, 405, 404, 403, 200, 401]
    for response in responses:
        assert not [name for name, _ in response.headers.items() if name.lower().startswith("access-control-")]


# --- per-peer refusal budgets -----------------------------------------------------------------


@ceiling
async def test_the_31st_refusal_from_a_peer_is_429_but_its_valid_credentials_still_mint(client):
    statuses = await _refuse(client, 29)
    statuses.append((await _post(client, [1]))[0])  # a non-object body counts too
    assert statuses == [401] * 29 + [400]
    assert (await _post(client, GHOST_BODY))[:2] == (429, TOO_MANY)
    assert (await _post(client, [1]))[:2] == (429, TOO_MANY)
    assert (await _post(client, _human_body()))[0] == 200
    assert (await _post(client, AGENT_BODY))[0] == 200
    assert (await _post(client, GHOST_BODY, peer="198.51.100.1"))[0] == 401  # another peer is untouched


@ceiling
async def test_malformed_json_does_not_spend_the_peer_budget(client):
    for _ in range(40):
        assert (await _post(client, b"{"))[0] == 400
    assert (await _post(client, GHOST_BODY))[0] == 401


@ceiling
async def test_the_bucket_is_the_host_not_the_connection(client):
    statuses = [(await _post(client, GHOST_BODY, port=40000 + n))[0] for n in range(31)]
    assert statuses == [401] * 30 + [429]


@ceiling
async def test_a_peer_bucket_reopens_sixty_seconds_after_its_first_refusal():
    clock = FixedClock(NOW)
    client = _app(replace(_context(), clock=clock)).test_client()
    assert await _refuse(client, 31) == [401] * 30 + [429]
    clock.now = NOW + 59.999
    assert await _refuse(client, 1) == [429]
    clock.now = NOW + 60
    assert await _refuse(client, 1) == [401]


@ceiling
async def test_a_spoofed_forwarded_header_does_not_escape_the_bucket_without_the_flag(client):
    statuses = [
        (await _post(client, GHOST_BODY, headers={**JSON_ONLY, "X-Forwarded-For": f"10.0.0.{n}"}))[0]
        for n in range(31)
    ]
    assert statuses == [401] * 30 + [429]


@ceiling
async def test_with_a_trusted_proxy_the_last_forwarded_hop_is_the_peer():
    client = _app(trusted_proxy=True).test_client()

    def via_proxy(chain: str) -> dict[str, str]:
        return {**JSON_ONLY, "X-Forwarded-For": chain}

    # one client behind the proxy, whatever it claims before the proxy's own hop
    spoofs = [(await _post(client, GHOST_BODY, headers=via_proxy(f"10.0.0.{n}, 192.0.2.9")))[0] for n in range(31)]
    assert spoofs == [401] * 30 + [429]
    # another last hop through the same proxy socket is another peer
    assert (await _post(client, GHOST_BODY, headers=via_proxy("192.0.2.10")))[0] == 401
    # no forwarded header: the socket address is the peer (not throttled by 192.0.2.9)
    assert (await _post(client, GHOST_BODY))[0] == 401


@pytest.mark.parametrize(
    ("client", "forwarded", "trusted", "peer"),
    [
        (("203.0.113.7", 1), [], False, "203.0.113.7"),
        (("203.0.113.7", 1), ["10.0.0.1"], False, "203.0.113.7"),
        (("203.0.113.7", 1), ["10.0.0.1, 192.0.2.9"], True, "192.0.2.9"),
        (("203.0.113.7", 1), ["10.0.0.1", "192.0.2.9 "], True, "192.0.2.9"),  # two headers read as one list
        (("203.0.113.7", 1), ["10.0.0.1,"], True, "203.0.113.7"),  # an empty last hop: the socket
        (("203.0.113.7", 1), [], True, "203.0.113.7"),
        (None, [], False, "unknown"),
    ],
)
def test_peer_key(client, forwarded, trusted, peer):
    assert peer_key(client, forwarded, trusted_proxy=trusted) == peer


# --- over TCP ---------------------------------------------------------------------------------


async def test_served_over_tcp_the_socket_host_keys_the_bucket(nursery):
    with trio.fail_after(10):
        port = await nursery.start(functools.partial(serve_app, _app()))
        status, _, body = await _http(port, b"GET /.well-known/cotal-mesh HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200 and json.loads(body)["sentinelCreds"] == SENTINEL
        exchange = json.dumps(GHOST_BODY).encode()
        request = (
            b"POST /exchange HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"X-Forwarded-For: 10.0.0.1\r\nContent-Length: {len(exchange)}\r\n\r\n".encode()
            + exchange
        )
        statuses = [(await _http(port, request))[0] for _ in range(31)]
        assert statuses == [401] * 30 + [429]
