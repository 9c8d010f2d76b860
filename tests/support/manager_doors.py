"""The manager doors under test: an instance, its consent, in-memory records and the doors over them."""

from __future__ import annotations

import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.jose import IssuerKey, sign_ed25519_jws
from cotal_trio.core.ledger import LedgerKind, hash_actor_token
from cotal_trio.core.managers import ManagerInstance
from cotal_trio.devidp import jwks
from cotal_trio.http.manager_doors import ManagerDoors
from cotal_trio.natsio import KeyExists
from tests.support.loopback import DEV_IDP, ISSUER_KEY, NOW, OWNER, OWNER_SECRET, SPACE, SUB, FixedClock, _row

INSTANCE = "k" * 26
SHA = "ab" * 32
RANDOM = bytes(range(16))


class MemoryRecords:
    """The records store's door-facing half, in memory: ``{key: (value, ttl_s)}``."""

    def __init__(self, *instances: ManagerInstance, unavailable: bool = False) -> None:
        self.managers = {(i.owner, i.instance_id): i for i in instances}
        self.records: dict[str, tuple[bytes, int | None]] = {}
        self.unavailable = unavailable

    async def get_manager(self, owner: str, instance_id: str) -> ManagerInstance | None:
        await trio.lowlevel.checkpoint()
        if self.unavailable:
            raise Unavailable("records store down")
        return self.managers.get((owner, instance_id))

    async def create_record(self, key: str, value: bytes, *, ttl_s: int | None = None) -> int:
        await trio.lowlevel.checkpoint()
        if self.unavailable:
            raise Unavailable("records store down")
        if key in self.records:
            raise KeyExists(key)
        self.records[key] = (value, ttl_s)
        return len(self.records)


def _ledger() -> dict:
    rows = [
        _row(LedgerKind.INTERACTIVE, "mgr", scope=("supervise",)),
        _row(LedgerKind.MANAGED, "remote_mgr", scope=("supervise", "spawn"), token_hash=hash_actor_token("s")),
        _row(LedgerKind.INTERACTIVE, "plain", scope=("spawn", "admin")),
        _row(LedgerKind.INTERACTIVE, "cli"),
        _row(LedgerKind.MANAGED, "worker", token_hash=hash_actor_token("s")),
    ]
    return {(row.kind, row.owner, row.actor): row for row in rows}


def _instance(actor: str = "mgr", serve_epoch: int = 2) -> ManagerInstance:
    return ManagerInstance(instance_id=INSTANCE, owner=OWNER, actor=actor, serve_epoch=serve_epoch, registered_at=NOW - 600)


def _doors(records=None, *, consent: bool = True, **overrides) -> ManagerDoors:
    rows = _ledger()

    def read_ledger(owner: str, actor: str):
        return rows.get((LedgerKind.INTERACTIVE, owner, actor)), rows.get((LedgerKind.MANAGED, owner, actor))

    fields = dict(
        space=SPACE, read_ledger=read_ledger, records=records if records is not None else MemoryRecords(_instance()),
        issuer_key=ISSUER_KEY, idp_pin=DEV_IDP.pin(), idp_keys=lambda: parse_jwks(jwks(DEV_IDP)),
        owner_secret=OWNER_SECRET, clock=FixedClock(NOW), tool_result_consent=consent, random_bytes=lambda n: RANDOM[:n],
    )  # fmt: skip
    return ManagerDoors(**{**fields, **overrides})


def _token(key: IssuerKey = DEV_IDP.key, **claims) -> str:
    body = {"iss": DEV_IDP.issuer, "aud": DEV_IDP.audience, "sub": SUB, "iat": NOW - 10, "exp": NOW + 300,
            "auth_time": NOW - 60, "amr": ["pwd"], **claims}  # fmt: skip
    return sign_ed25519_jws({"alg": "EdDSA", "kid": key.kid, "typ": "JWT"}, body, key)


def _consent(actor: str = "cli", **fields) -> dict:
    return {"idpToken": _token(), "subject": SUB, "actor": actor, "toolCallId": "call_42", "resultSha256": SHA, **fields}
