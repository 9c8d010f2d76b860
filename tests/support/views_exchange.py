"""The views exchange under test: managers, agents, humans and peers of one mesh face."""

from __future__ import annotations

import json
from dataclasses import replace

import trio

from cotal_trio.core.bearer import BearerVerifier
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.jose import BearerKeySet
from cotal_trio.core.ledger import AGENT_EXCHANGE_REFUSAL, LedgerKind, LedgerRow, hash_actor_token
from cotal_trio.core.managers import ManagerInstance
from cotal_trio.core.sessions import ChatSession, session_row_ttl_s
from cotal_trio.devidp import mint_dev_token
from cotal_trio.http import build_loopback_app
from tests.support.loopback import (
    AGENT_SECRET,
    DEV_IDP,
    HEADERS,
    ISSUER_KEY,
    NOW,
    OWNER,
    OWNER_SECRET,
    SPACE,
    SUB,
    FixedClock,
    _context,
    _row,
)
from tests.support.public_face import JSON_ONLY, _app

PEER = "198.51.100.9"
SUB2 = "dev-user-2"
OWNER2 = derive_owner(OWNER_SECRET, DEV_IDP.issuer, SUB2)
# manager instance ids (lifecycle-token grammar), sorted A < B < C
MGR_A = "mgra" + "0" * 22
MGR_B = "mgrb" + "0" * 22
MGR_C = "mgrc" + "0" * 22
MGR_OTHER = "mgrz" + "0" * 22  # OWNER2's


TOO_MANY = {"error": "too many refused exchanges - wait a minute and retry"}
GHOST_401 = {"error": AGENT_EXCHANGE_REFUSAL}


class FakeRecords:
    """An in-memory ``faces.RecordsPort`` (``stores.records.RecordsStore`` semantics: a present
    manager row is live; ``list_managers(owner)`` answers that owner's rows sorted by key; a
    session row is written with ``session_row_ttl_s``). Each method is a trio checkpoint."""

    def __init__(self, *instances: ManagerInstance) -> None:
        self.managers: dict[tuple[str, str], ManagerInstance] = {}
        self.sessions: dict[str, ChatSession] = {}
        self.session_ttls: dict[str, int] = {}
        self.revision = 0
        for instance in instances:
            self.managers[(instance.owner, instance.instance_id)] = instance

    def _next(self) -> int:
        self.revision += 1
        return self.revision

    async def get_manager(self, owner: str, instance_id: str) -> ManagerInstance | None:
        await trio.lowlevel.checkpoint()
        return self.managers.get((owner, instance_id))

    async def list_managers(self, owner: str | None = None) -> list[ManagerInstance]:
        await trio.lowlevel.checkpoint()
        rows = [i for i in self.managers.values() if owner is None or i.owner == owner]
        return sorted(rows, key=lambda i: i.key)

    async def register_manager(self, instance: ManagerInstance) -> int:
        await trio.lowlevel.checkpoint()
        self.managers[(instance.owner, instance.instance_id)] = instance
        return self._next()

    async def retire_manager(self, owner: str, instance_id: str) -> bool:
        await trio.lowlevel.checkpoint()
        return self.managers.pop((owner, instance_id), None) is not None

    async def open_session(self, row: ChatSession, *, now: float) -> int:
        await trio.lowlevel.checkpoint()
        self.sessions[row.session_id] = row
        self.session_ttls[row.session_id] = session_row_ttl_s(row, now=now)
        return self._next()

    async def get_session(self, session_id: str) -> ChatSession | None:
        await trio.lowlevel.checkpoint()
        return self.sessions.get(session_id)

    async def retire_session(self, session_id: str) -> bool:
        await trio.lowlevel.checkpoint()
        self.session_ttls.pop(session_id, None)
        return self.sessions.pop(session_id, None) is not None


def manager(instance_id: str, *, owner: str = OWNER, actor: str = "mgr", registered_at: int = NOW - 100, label=None):
    return ManagerInstance(
        instance_id=instance_id, owner=owner, actor=actor, serve_epoch=1, registered_at=registered_at, label=label
    )


def ledger() -> dict[tuple[LedgerKind, str, str], LedgerRow]:
    """``cli`` (spawn, admin, supervise), ``plain`` (spawn), ``mgr`` (supervise) of OWNER; the managed
    ``worker`` of OWNER under ``cli``; ``cli`` (spawn) of OWNER2."""
    rows = [
        _row(LedgerKind.INTERACTIVE, "cli", scope=("spawn", "admin", "supervise"), parent=None),
        _row(LedgerKind.INTERACTIVE, "plain", scope=("spawn",), parent=None),
        _row(LedgerKind.INTERACTIVE, "mgr", scope=("supervise",), parent=None),
        _row(LedgerKind.MANAGED, "worker", parent=f"{OWNER}.cli", token_hash=hash_actor_token(AGENT_SECRET)),
        _row(LedgerKind.INTERACTIVE, "cli", owner=OWNER2, scope=("spawn",), parent=None),
    ]
    return {(row.kind, row.owner, row.actor): row for row in rows}


def context(records: FakeRecords | None, *, clock: FixedClock | None = None, rows=None):
    return replace(_context(ledger() if rows is None else rows, clock=clock), records=records)


def human(actor: str = "cli", *, sub: str = SUB, **extra) -> dict:
    return {"idpToken": mint_dev_token(DEV_IDP, sub=sub, now=NOW - 10, ttl_s=600), "actor": actor, **extra}


def agent(**extra) -> dict:
    return {"owner": OWNER, "actor": "worker", "actorToken": AGENT_SECRET, **extra}


class Face:
    """One face's test client and how to POST /exchange to it."""

    def __init__(self, name: str, ctx) -> None:
        self.name = name
        self.ctx = ctx
        app = _app(ctx) if name == "public" else build_loopback_app(ctx)
        self.client = app.test_client()

    async def post(self, body, *, peer: str = PEER, path: str = "/exchange") -> tuple[int, dict]:
        data = json.dumps(body).encode()
        if self.name == "public":
            response = await self.client.post(path, data=data, headers=JSON_ONLY, scope_base={"client": (peer, 40000)})
        else:
            response = await self.client.post(path, data=data, headers=HEADERS)
        return response.status_code, await response.get_json()


def face(name: str, records: FakeRecords | None = None, **kwargs) -> Face:
    return Face(name, context(FakeRecords() if records is None else records, **kwargs))


VERIFIER = BearerVerifier(BearerKeySet.from_keys([ISSUER_KEY]))


def decode(token: str, *, now: float = NOW):
    """The validated bearer and its raw ``act`` claim."""
    return VERIFIER.validate(token, space=SPACE, now=now), VERIFIER.verify(token)["act"]


HUMAN_EXP = NOW - 10 + 600  # the dev IdP token's exp bounds every human bearer
