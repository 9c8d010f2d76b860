"""The loopback face under test: its context (ledger, clock, IdP), request bodies and the HTTP client."""

from __future__ import annotations

import functools
import json

import trio

from cotal_trio.core.identity import derive_owner
from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.jose import IssuerKey
from cotal_trio.core.ledger import LedgerKind, LedgerRow, hash_actor_token
from cotal_trio.devidp import create_dev_idp, jwks, mint_dev_token
from cotal_trio.http import ExchangeContext

SPACE = "alpha"
CAP = "c" * 64
NOW = 1_800_000_000
OWNER_SECRET = bytes(range(32, 64))
SUB = "dev-user-1"
LIFECYCLE = "a" * 26
AGENT_SECRET = "agent-secret-token"
CEILING_S = 10


DEV_IDP = create_dev_idp(lambda n: bytes(range(100, 100 + n)))
ISSUER_KEY = IssuerKey.generate(bytes(range(32)))
OWNER = derive_owner(OWNER_SECRET, DEV_IDP.issuer, SUB)


class FixedClock:
    """A wall clock that stands still until a test moves it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _row(kind: LedgerKind, actor: str, **fields) -> LedgerRow:
    defaults = {
        "owner": OWNER, "actor": actor, "scope": ("spawn",), "allow_subscribe": (">",),
        "allow_publish": (">",), "lifecycle_uid": LIFECYCLE, "granted_at": "2026-11-29T10:00:00.000Z",
    }  # fmt: skip
    return LedgerRow(kind=kind, **{**defaults, **fields})


def _ledger() -> dict[tuple[LedgerKind, str, str], LedgerRow]:
    rows = [
        _row(LedgerKind.INTERACTIVE, "cli", scope=("spawn", "admin"), parent=None),
        _row(LedgerKind.MANAGED, "worker", parent=f"{OWNER}.cli", token_hash=hash_actor_token(AGENT_SECRET)),
    ]
    return {(row.kind, row.owner, row.actor): row for row in rows}


def _context(ledger=None, clock=None) -> ExchangeContext:
    rows = _ledger() if ledger is None else ledger

    def read_ledger(owner: str, actor: str):
        return rows.get((LedgerKind.INTERACTIVE, owner, actor)), rows.get((LedgerKind.MANAGED, owner, actor))

    return ExchangeContext(
        space=SPACE, capability=CAP, issuer_key=ISSUER_KEY, owner_secret=OWNER_SECRET,
        idp_pin=DEV_IDP.pin(), idp_keys=lambda: parse_jwks(jwks(DEV_IDP)), read_ledger=read_ledger,
        clock=clock or FixedClock(NOW),
    )  # fmt: skip


def ceiling(test):
    """Give an async test an absolute ceiling (STYLE practice 24)."""

    @functools.wraps(test)
    async def bounded(*args, **kwargs):
        with trio.fail_after(CEILING_S):
            return await test(*args, **kwargs)

    return bounded


HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {CAP}"}


def _human_body(actor: str = "cli", **extra) -> dict:
    return {"idpToken": mint_dev_token(DEV_IDP, sub=SUB, now=NOW - 10, ttl_s=600), "actor": actor, **extra}


async def _post(client, body, headers=HEADERS):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await client.post("/exchange", data=data, headers=headers)
    return response.status_code, await response.get_json(), response


async def _http(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one raw request; read the answer by Content-Length (hypercorn keeps the socket)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some()
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        headers = {name.lower(): value for name, value in headers.items()}
        while len(body) < int(headers["content-length"]):
            body += await stream.receive_some()
        return int(lines[0].split(" ")[1]), headers, body


def _request(path: str, body: dict, *, capability: bool) -> bytes:
    """A raw ``POST`` of ``body`` as JSON, with the capability when ``capability``: for a served face
    (``Connection: close``, so the server ends the exchange)."""
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    if capability:
        head += f"Authorization: Bearer {CAP}\r\n"
    return (head + "Connection: close\r\n\r\n").encode() + data
