"""Ledger rows and lookups for the pure ledger and delegation tests."""

from __future__ import annotations

import hashlib

from cotal_trio.core.ledger import LedgerKind, LedgerRow

OWNER = "u_rbxbyevw4etgpbzfupdhu2zxwe"
OTHER_OWNER = "u_" + "b" * 26
UID = "0" * 20 + "abcdef"


TOKEN = "secret-token-of-alpha"
TOKEN_HASH = hashlib.sha256(TOKEN.encode()).hexdigest()
GRANTED_AT = "2026-11-29T10:00:00.000Z"


def row(kind=LedgerKind.INTERACTIVE, **overrides) -> LedgerRow:
    fields = {
        "kind": kind, "owner": OWNER, "actor": "cli", "scope": ("spawn", "role:default"),
        "allow_subscribe": (">",), "allow_publish": (">",), "lifecycle_uid": UID, "granted_at": GRANTED_AT,
    }  # fmt: skip
    if kind is LedgerKind.MANAGED:
        fields["token_hash"] = TOKEN_HASH
    return LedgerRow(**{**fields, **overrides})


def managed(actor="alpha", **overrides) -> LedgerRow:
    return row(LedgerKind.MANAGED, actor=actor, **overrides)


def lookup_of(*known: LedgerRow):
    table = {(r.owner, r.actor): r for r in known}
    return lambda owner, actor: table.get((owner, actor))
