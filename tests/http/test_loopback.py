"""The loopback face (cotal_trio/http/loopback.py; DESIGN 7; upstream-notes 3.5 and 4.1).

Route logic runs through quart's test client with real core objects: a real issuer key, real
dev-IdP tokens, and an in-memory ledger dict behind ``read_ledger``. One test serves the app
over TCP with hypercorn (``serve_app``) and speaks raw HTTP/1.1 to it.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import replace

import pytest
import trio

from cotal_trio.core.bearer import validate_bearer
from cotal_trio.core.errors import CodecError, ConfigError
from cotal_trio.core.jose import BearerKeySet
from cotal_trio.core.ledger import AGENT_EXCHANGE_REFUSAL
from cotal_trio.devidp import create_dev_idp, mint_dev_token
from cotal_trio.http import build_loopback_app, serve_app
from tests.support.loopback import (
    AGENT_SECRET,
    CAP,
    CEILING_S,
    DEV_IDP,
    FixedClock,
    HEADERS,
    ISSUER_KEY,
    LIFECYCLE,
    NOW,
    OWNER,
    SPACE,
    SUB,
    _context,
    _http,
    _human_body,
    _post,
    ceiling,
)


@pytest.fixture
def client():
    return build_loopback_app(_context()).test_client()


# --- routes -----------------------------------------------------------------------------------


@ceiling
async def test_health_names_the_space_issuer(client):
    response = await client.get("/health")
    assert response.status_code == 200
    assert await response.get_json() == {"ok": True, "issuer": "urn:cotal:auth:alpha"}


@ceiling
async def test_jwks_publishes_the_issuer_key_with_a_cache_header(client):
    response = await client.get("/jwks")
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "max-age=300"
    body = await response.get_json()
    assert [key["kid"] for key in body["keys"]] == [ISSUER_KEY.kid]
    assert "d" not in body["keys"][0]
    assert "Access-Control-Allow-Origin" not in response.headers


@pytest.mark.parametrize("path", ["/nope", "/health/", "//health", "/jwks/x", "/EXCHANGE"])  # "/": the status page
@ceiling
async def test_unknown_path_is_a_json_404(client, path):
    response = await client.get(path)
    assert response.status_code == 404
    assert await response.get_json() == {
        "error": "unknown path - /health, /jwks, /exchange, /metrics, /manager-service-authority, /events, "
        "/ (the status page), and the host-only doors (docs/host-doors.md)"
    }


@pytest.mark.parametrize(("method", "path"), [("GET", "/exchange"), ("POST", "/health"), ("OPTIONS", "/jwks")])
@ceiling
async def test_wrong_method_is_a_json_405(client, method, path):
    response = await client.open(path, method=method)
    assert response.status_code == 405
    assert set(await response.get_json()) == {"error"}


# --- pre-checks -------------------------------------------------------------------------------


@ceiling
async def test_any_origin_header_is_refused_first(client):
    status, body, response = await _post(client, _human_body(), {**HEADERS, "Origin": "http://localhost"})
    assert (status, body) == (403, {"error": "browser-origin requests are not served here"})
    assert "Access-Control-Allow-Origin" not in response.headers


@ceiling
async def test_non_json_media_type_is_415(client):
    status, body, _ = await _post(client, _human_body(), {**HEADERS, "Content-Type": "text/plain"})
    assert status == 415 and "application/json" in body["error"]


@pytest.mark.parametrize("authorization", [None, "Bearer " + "d" * 64, "Basic " + CAP, "Bearer", CAP, "Bearer é"])
@ceiling
async def test_missing_or_wrong_capability_is_401(client, authorization):
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    status, body, _ = await _post(client, _human_body(), headers)
    assert (status, body) == (
        401,
        {"error": "missing/invalid exchange capability - read it from the space's auth-service.json"},
    )


@ceiling
async def test_thirty_bad_capabilities_then_429_while_the_right_one_still_passes(client):
    bad = {**HEADERS, "Authorization": "Bearer wrong"}
    statuses = [(await _post(client, _human_body(), bad))[0] for _ in range(30)]
    assert statuses == [401] * 30
    status, body, _ = await _post(client, _human_body(), bad)
    assert (status, body) == (429, {"error": "too many invalid-capability attempts - wait a minute and retry"})
    assert (await _post(client, _human_body()))[0] == 200


@ceiling
async def test_capability_window_reopens_after_a_minute():
    clock = FixedClock(NOW)
    client = build_loopback_app(_context(clock=clock)).test_client()
    bad = {**HEADERS, "Authorization": "Bearer wrong"}
    for _ in range(31):
        status, _, _ = await _post(client, _human_body(), bad)
    assert status == 429
    clock.now = NOW + 60
    assert (await _post(client, _human_body(), bad))[0] == 401


@ceiling
async def test_a_70_kib_body_is_413(client):
    status, body, _ = await _post(client, b"[" + b" " * (70 * 1024) + b"]")
    assert (status, body) == (413, {"error": "request body too large (maximum 65536 bytes)"})


@ceiling
async def test_a_declared_length_over_the_limit_is_413_before_reading(client):
    headers = {**HEADERS, "Content-Length": str(70 * 1024)}
    status, body, _ = await _post(client, b"{}", headers)
    assert (status, body) == (413, {"error": "request body too large (maximum 65536 bytes)"})


@pytest.mark.parametrize("raw", [b"{", b"", b"\xff\xfe", b"[" * 5000 + b"]" * 5000, b"NaN", b"[Infinity]"])
@ceiling
async def test_invalid_json_is_400(client, raw):
    status, body, _ = await _post(client, raw)
    assert (status, body) == (400, {"error": "request body is not valid JSON"})


@ceiling
async def test_a_json_array_body_is_a_named_400(client):
    status, body, _ = await _post(client, [1, 2])
    assert status == 400
    assert body["error"].startswith("the exchange body must be a JSON object")


# --- the human arm ----------------------------------------------------------------------------


@ceiling
async def test_human_exchange_mints_a_bearer_from_the_row(client):
    idp_token = mint_dev_token(DEV_IDP, sub=SUB, now=NOW - 10, ttl_s=600)
    status, body, response = await _post(client, {"idpToken": idp_token, "actor": "cli"})
    assert status == 200, body
    assert set(body) == {"token", "owner", "exp"} and body["owner"] == OWNER
    assert response.headers["Cache-Control"] == "no-store"
    bearer = validate_bearer(body["token"], keys=BearerKeySet.from_keys([ISSUER_KEY]), space=SPACE, now=NOW)
    assert (bearer.owner, bearer.actor, bearer.lifecycle_uid) == (OWNER, "cli", LIFECYCLE)
    assert bearer.scope == ("spawn", "admin")
    assert bearer.exp == body["exp"] <= NOW - 10 + 600  # never outlives the IdP proof


@ceiling
async def test_human_ttl_request_is_honoured_below_the_cap(client):
    status, body, _ = await _post(client, _human_body(ttlSec=60))
    assert status == 200 and body["exp"] == NOW + 60


@ceiling
async def test_an_ungranted_actor_gets_the_grant_sentence(client, caplog):
    with caplog.at_level(logging.WARNING, logger="cotal.http"):
        status, body, _ = await _post(client, _human_body(actor="ghost"))
    assert status == 401
    assert body["error"] == (
        f'actor "ghost" is not granted for this user - the mesh operator lets them in with '
        f"`cotal actor grant ghost --owner {OWNER}` (or --sub <their IdP subject>)"
    )
    assert f"auth-service: refused an exchange: {body['error']}" in caplog.messages


@ceiling
async def test_a_token_from_another_idp_key_is_401(client):
    stranger = create_dev_idp(lambda n: b"\x99" * n)
    token = mint_dev_token(replace(stranger, issuer=DEV_IDP.issuer), sub=SUB, now=NOW, ttl_s=600)
    status, body, _ = await _post(client, {"idpToken": token, "actor": "cli"})
    assert status == 401 and "pinned JWKS" in body["error"]


@ceiling
async def test_an_expired_idp_token_is_401(client):
    token = mint_dev_token(DEV_IDP, sub=SUB, now=NOW - 700, ttl_s=600)
    status, body, _ = await _post(client, {"idpToken": token, "actor": "cli"})
    assert status == 401 and "expired" in body["error"]


# --- the agent arm ----------------------------------------------------------------------------


@ceiling
async def test_agent_exchange_mints_a_300_second_bearer(client):
    status, body, _ = await _post(client, {"owner": OWNER, "actor": "worker", "actorToken": AGENT_SECRET})
    assert status == 200, body
    bearer = validate_bearer(body["token"], keys=BearerKeySet.from_keys([ISSUER_KEY]), space=SPACE, now=NOW)
    assert (bearer.actor, bearer.parent, bearer.exp) == ("worker", f"{OWNER}.cli", NOW + 300)


@pytest.mark.parametrize(("actor", "secret"), [("worker", "wrong-secret"), ("nobody", AGENT_SECRET), ("cli", "x")])
@ceiling
async def test_agent_refusals_share_one_sentence(client, caplog, actor, secret):
    with caplog.at_level(logging.WARNING, logger="cotal.http"):
        status, body, _ = await _post(client, {"owner": OWNER, "actor": actor, "actorToken": secret})
    assert (status, body) == (401, {"error": AGENT_EXCHANGE_REFUSAL})
    assert f"auth-service: refused an agent exchange: {AGENT_EXCHANGE_REFUSAL}" in caplog.messages


# --- the refused-exchange budget --------------------------------------------------------------


@ceiling
async def test_the_31st_refusal_is_429_but_a_valid_credential_still_mints(client):
    refusals = [(await _post(client, _human_body(actor="ghost")))[0] for _ in range(29)]
    refusals.append((await _post(client, [1]))[0])  # a non-object body counts too
    assert refusals == [401] * 29 + [400]
    status, body, _ = await _post(client, {"owner": OWNER, "actor": "worker", "actorToken": "wrong"})
    assert (status, body) == (429, {"error": "too many refused exchanges - wait a minute and retry"})
    assert (await _post(client, [1]))[0] == 429
    assert (await _post(client, _human_body()))[0] == 200
    agent = {"owner": OWNER, "actor": "worker", "actorToken": AGENT_SECRET}
    assert (await _post(client, agent))[0] == 200


@ceiling
async def test_malformed_json_does_not_spend_the_refusal_budget(client):
    for _ in range(40):
        assert (await _post(client, b"{"))[0] == 400
    assert (await _post(client, _human_body(actor="ghost")))[0] == 401


# --- unexpected failures ----------------------------------------------------------------------


@ceiling
async def test_a_failing_port_is_a_generic_500_and_logged(caplog):
    def broken_ledger(owner: str, actor: str):
        raise RuntimeError("disk on fire at /secret/path")

    ctx = replace(_context(), read_ledger=broken_ledger)
    client = build_loopback_app(ctx).test_client()
    with caplog.at_level(logging.ERROR, logger="cotal.http"):
        status, body, response = await _post(client, _human_body())
    assert (status, body) == (500, {"error": "internal error - see the auth service log"})
    assert b"disk on fire" not in await response.get_data()
    assert any(record.exc_info and "disk on fire" in str(record.exc_info[1]) for record in caplog.records)


@ceiling
@pytest.mark.parametrize("arm", ["human", "agent"])
async def test_a_corrupt_ledger_row_is_a_refusal_not_a_500(arm):
    def corrupt_ledger(owner: str, actor: str):
        raise CodecError(f"ledger row {owner}.{actor} is corrupt (not JSON) - re-grant it with `cotal actor grant`")

    client = build_loopback_app(replace(_context(), read_ledger=corrupt_ledger)).test_client()
    body = _human_body() if arm == "human" else {"owner": OWNER, "actor": "bot", "actorToken": AGENT_SECRET}
    status, answer, _ = await _post(client, body)
    assert status == 401
    if arm == "human":
        assert answer["error"].startswith(f"ledger row {OWNER}.cli is corrupt")
    else:  # the agent arm says the same sentence for every failure (no existence oracle)
        assert answer["error"] == AGENT_EXCHANGE_REFUSAL


@ceiling
async def test_outcomes_reach_the_metrics_hook():
    answers: list[tuple[str, int]] = []
    client = build_loopback_app(replace(_context(), metrics=lambda *answer: answers.append(answer))).test_client()
    await _post(client, _human_body())
    await _post(client, _human_body(actor="ghost"))
    await _post(client, _human_body(), {**HEADERS, "Authorization": "Bearer nope"})
    await _post(client, {"owner": OWNER, "actor": "bot", "actorToken": "wrong"})
    await _post(client, ["not", "an", "object"])
    assert answers == [("human", 200), ("human", 401), ("none", 401), ("agent", 401), ("none", 400)]


def test_the_context_refuses_a_malformed_capability():
    with pytest.raises(ConfigError):
        replace(_context(), capability="short")


# --- over TCP ---------------------------------------------------------------------------------


async def test_serve_app_answers_over_tcp(nursery):
    with trio.fail_after(CEILING_S):
        port = await nursery.start(functools.partial(serve_app, build_loopback_app(_context())))
        status, headers, body = await _http(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (status, json.loads(body)) == (200, {"ok": True, "issuer": "urn:cotal:auth:alpha"})
        assert "server" not in headers
        exchange = json.dumps(_human_body()).encode()
        request = (
            b"POST /exchange HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {CAP}\r\nContent-Length: {len(exchange)}\r\n\r\n".encode()
            + exchange
        )
        status, _, body = await _http(port, request)
        assert status == 200 and json.loads(body)["owner"] == OWNER


async def test_a_huge_declared_body_is_refused_without_waiting_for_it(nursery):
    with trio.fail_after(CEILING_S):
        port = await nursery.start(functools.partial(serve_app, build_loopback_app(_context())))
        request = (
            b"POST /exchange HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {CAP}\r\nContent-Length: 100000000\r\n\r\n".encode()
        )
        status, _, body = await _http(port, request)
    assert (status, json.loads(body)) == (413, {"error": "request body too large (maximum 65536 bytes)"})


async def test_cancelling_serve_app_closes_the_listener():
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as server:
            port = await server.start(functools.partial(serve_app, build_loopback_app(_context())))
            status, _, _ = await _http(port, b"GET /jwks HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200
            server.cancel_scope.cancel()
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)


async def test_a_busy_port_is_a_config_error(nursery):
    with trio.fail_after(CEILING_S):
        holder = trio.socket.socket()
        with holder:
            await holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is busy"):
                await nursery.start(functools.partial(serve_app, build_loopback_app(_context()), port=port))


async def test_a_shutdown_trigger_stops_serve_app_gracefully():
    stop = trio.Event()
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as server:
            start = functools.partial(serve_app, build_loopback_app(_context()), shutdown_trigger=stop.wait)
            port = await server.start(start)
            assert (await _http(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 200
            stop.set()
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)


@ceiling
async def test_the_credential_hook_binds_both_arms_bearers():
    # spec "Bridge contract": mint_connect_credential names the incarnation's root credential;
    # upstream-notes 3.5: the agent arm ensures it too.
    asked = []

    def mint(request):
        asked.append((request.owner, request.actor, request.lifecycle_uid))
        return f"root.{request.actor}"

    app = build_loopback_app(replace(_context(), mint_connect_credential=mint))
    client = app.test_client()
    human = await client.post("/exchange", json=_human_body(), headers=HEADERS)
    agent = await client.post(
        "/exchange", json={"owner": OWNER, "actor": "worker", "actorToken": AGENT_SECRET}, headers=HEADERS
    )
    keys = BearerKeySet.from_keys([ISSUER_KEY])
    tokens = [(await response.get_json())["token"] for response in (human, agent)]
    bound = [validate_bearer(token, keys=keys, space=SPACE, now=NOW).credential_id for token in tokens]
    assert bound == ["root.cli", "root.worker"]
    assert asked == [(OWNER, "cli", LIFECYCLE), (OWNER, "worker", LIFECYCLE)]
