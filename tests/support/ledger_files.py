"""Ledger rows as the state/ ledger files hold them."""

from __future__ import annotations

from cotal_trio.core.ledger import LedgerKind, LedgerRow

OWNER = "u_" + "a" * 26


UID = "0" * 26
GRANTED = "2026-11-29T10:00:00.000Z"


def row(kind: LedgerKind, owner: str = OWNER, actor: str = "cli", **extra) -> LedgerRow:
    fields = {
        "kind": kind, "owner": owner, "actor": actor, "scope": ("spawn", "role:default"),
        "allow_subscribe": (">",), "allow_publish": ("team.*",), "lifecycle_uid": UID,
        "granted_at": GRANTED,
    }
    if kind is LedgerKind.MANAGED:
        fields["token_hash"] = "f" * 64
    return LedgerRow(**{**fields, **extra})
