"""A connect authority's inputs: a space, an owner, its row and bearers, as the core and lane tests build them."""

from __future__ import annotations

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.profiles import agent_permissions

NOW = 1_800_000_000
EXP = NOW + 600
SPACE = "alpha"
OWNER = derive_owner(bytes(32) + b"x", "https://idp.example", "alice")
UID = "a" * 26
NONCE = "ibx0123456789"
INSTANCE = "b" * 26


def _bearer(view=None, scope=("spawn",)) -> ValidatedBearer:
    return ValidatedBearer(
        owner=OWNER, actor="cli", scope=scope, lifecycle_uid=UID, parent=None, view=view, credential_id=None,
        iat=NOW, exp=EXP, manager_instance_id=INSTANCE if view == "manager-caller" else None,
    )


def _row(kind=LedgerKind.INTERACTIVE, scope=("spawn",), *, actor="cli", owner=OWNER, parent=None) -> LedgerRow:
    return LedgerRow(
        kind=kind, owner=owner, actor=actor, scope=scope, allow_subscribe=("team.>",), allow_publish=("team.news",),
        token_hash="c" * 64 if kind is LedgerKind.MANAGED else None, lifecycle_uid=UID, granted_at="2026-11-29T10:00:00Z",
        parent=parent,
    )


def _agent():
    return agent_permissions(
        space=SPACE, owner=OWNER, actor="cli", allow_publish=("team.news",), allow_subscribe=("team.>",), inbox_nonce=NONCE
    )
