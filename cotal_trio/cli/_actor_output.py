"""How ``cotal actor`` prints: the grant sentence or JSON, listed rows, ledger problems."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.ledger import LedgerRow
from ..state import SpacePaths

__all__ = ["ledger_problems", "print_granted", "row_line", "row_object"]


def print_granted(row: LedgerRow, token: str | None, as_json: bool) -> None:
    """Print the grant: a sentence (and the token once) or the JSON object."""
    if as_json:
        obj: dict[str, Any] = {
            "owner": row.owner, "actor": row.actor, "kind": row.kind.value,
            "lifecycleUid": row.lifecycle_uid, "scope": list(row.scope),
            "allowSubscribe": list(row.allow_subscribe), "allowPublish": list(row.allow_publish),
        }  # fmt: skip
        if token is not None:
            obj["actorToken"] = token
        print(json.dumps(obj, indent=2))
        return
    print(f"granted {row.actor} to owner {row.owner} ({row.kind.value}, lifecycle {row.lifecycle_uid})")
    if token is not None:
        print("actor token (shown once, only its hash is kept - save it to a 0600 file now):")
        print(token)


def row_object(row: LedgerRow) -> dict[str, Any]:
    """The listed form of a row (no token hash)."""
    return {
        "owner": row.owner, "actor": row.actor, "kind": row.kind.value, "scope": list(row.scope),
        "allowSubscribe": list(row.allow_subscribe), "allowPublish": list(row.allow_publish),
        "role": row.role, "parent": row.parent, "label": row.label,
        "lifecycleUid": row.lifecycle_uid, "grantedAt": row.granted_at,
    }  # fmt: skip


def row_line(row: LedgerRow) -> str:
    """One plain-text line per row: kind, principal, then ``key=value`` fields."""
    fields = [
        f"scope={','.join(row.scope) or '-'}",
        f"subscribe={','.join(row.allow_subscribe) or '-'}",
        f"publish={','.join(row.allow_publish) or '-'}",
    ]
    fields += [f"{name}={value}" for name, value in (("role", row.role), ("parent", row.parent)) if value]
    if row.label:
        fields.append(f"label={json.dumps(row.label, ensure_ascii=False)}")
    fields += [f"lifecycle={row.lifecycle_uid}", f"granted={row.granted_at}"]
    return f"{row.kind.value} {row.principal} " + " ".join(fields)


def ledger_problems(
    space_paths: SpacePaths, rows: list[LedgerRow], bad: list[tuple[Path, str]]
) -> list[str]:
    """Sentences for corrupt row files and for principals present in both folders."""
    problems = [f"{path}: {reason}" for path, reason in bad]
    kinds: dict[str, int] = {}
    for row in rows:
        kinds[row.principal] = kinds.get(row.principal, 0) + 1
    problems += [
        f"{name} has both an interactive and a managed row in space {space_paths.space}, which is a "
        f"broken ledger - revoke it with `cotal actor revoke` and grant it again"
        for name, count in sorted(kinds.items()) if count > 1
    ]  # fmt: skip
    return problems
