"""The public face under test: its app over a loopback context, and the bodies it refuses."""

from __future__ import annotations

import json

from cotal_trio.core.creds import format_creds
from cotal_trio.http import build_public_app
from tests.support.loopback import OWNER, _context

PUBLIC_URL = "https://auth.example"
SERVER = "wss://nats.example"
SERVER_URL = "nats://127.0.0.1:4222"
IDP_URL = "https://idp.example/api/auth"
SENTINEL = format_creds("eyJhbGciOiJlZDI1NTE5In0.sentinel.jwt", "SUAFAKESENTINELSEED")
JSON_ONLY = {"Content-Type": "application/json"}
PEER = "203.0.113.7"


GHOST_BODY = {"owner": OWNER, "actor": "worker", "actorToken": "wrong"}


def _app(ctx=None, **overrides):
    options = {
        "public_url": PUBLIC_URL, "advertised_server": SERVER, "server_url": SERVER_URL, "idp_url": IDP_URL,
        "sentinel_creds": SENTINEL, "trusted_proxy": False, **overrides,
    }  # fmt: skip
    return build_public_app(ctx or _context(), **options)


async def _post(client, body, *, peer=PEER, port=40000, headers=JSON_ONLY):
    """POST /exchange from socket ``peer:port``; returns ``(status, json, response)``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    scope = {"client": (peer, port)}
    response = await client.post("/exchange", data=data, headers=headers, scope_base=scope)
    return response.status_code, await response.get_json(), response
