"""The actor ledger: row model, file codec and the authorization decisions (upstream-notes 1.3).

A ledger row grants one principal ``<owner>.<actor>`` into a space. Rows are files, one per
principal, in one of two directories; the directory is the row's kind, never a field:

* ``actors/<owner>.<actor>.json``: **interactive** rows, written by ``cotal actor grant`` and
  exchanged with an IdP proof (the human arm);
* ``managed-actors/<owner>.<actor>.json``: **managed** rows, written by the spawn path and
  exchanged with the agent's secret actor token, of which only the SHA-256 is stored.

Row file (``ver: 1``, closed)::

    {"ver": 1, "owner": "u_…", "actor": "cli", "scope": ["spawn", "role:default"],
     "allowSubscribe": [">"], "allowPublish": [">"], "role": "default", "parent": "u_….spawner",
     "label": "david laptop", "tokenHash": "<sha256 hex; managed only>",
     "lifecycleUid": "<[a-z0-9]{26,32}>", "grantedAt": "2026-11-29T10:00:00.000Z"}

There is no allow-by-default: a missing row refuses, a corrupt row refuses with a sentence, and
a principal present in both directories is a broken ledger and refuses. Reads are fresh per
exchange and per connect (the shell's job); this module decides on the rows it is given.

Pure and synchronous: file I/O lives in ``state/``; randomness comes in as bytes.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.delegation import check_within_spawner_grant
from cotal_trio.core.errors import CodecError, ConfigError, RefusalCode, Refused
from cotal_trio.core.identity import (
    is_actor,
    is_channel_pattern,
    is_lifecycle_uid,
    is_owner,
    is_principal,
    is_role,
    is_scope_token,
    principal,
)

__all__ = [
    "AGENT_EXCHANGE_REFUSAL",
    "LEDGER_ROW_VER",
    "LedgerKind",
    "LedgerRow",
    "ReadRows",
    "RowLookup",
    "authorize_agent_exchange",
    "authorize_connect",
    "authorize_human_exchange",
    "hash_actor_token",
    "new_actor_token",
    "parse_row",
    "render_row",
]

LEDGER_ROW_VER = 1
ACTOR_TOKEN_RANDOM_BYTES = 32
# Every agent-exchange failure reads the same, so a caller cannot probe which agents exist.
AGENT_EXCHANGE_REFUSAL = (
    "agent exchange refused: unknown agent or wrong secret - "
    "check the actor token file and that the agent is still granted"
)

_TOKEN_HASH = re.compile(r"[0-9a-f]{64}")
_UTC_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|\+00:00)")
# Compared against when no row exists, so a miss costs the same as a wrong secret.
_ABSENT_HASH = "0" * 64

RowLookup = Callable[[str, str], "LedgerRow | None"]
"""``lookup(owner, actor)``: the fresh ledger row of a principal (either kind), or ``None``."""

ReadRows = Callable[[str, str], "tuple[LedgerRow | None, LedgerRow | None]"]
"""``read_rows(owner, actor) -> (interactive row, managed row)``: a fresh read, ``None`` if absent.

The ledger port of the exchange and the callout (``state.read_principal`` bound to a space, or a
``state.LedgerReader``)."""


class LedgerKind(enum.Enum):
    """The kind of a ledger row, which is the directory it lives in."""

    INTERACTIVE = "interactive"
    MANAGED = "managed"

    @property
    def directory(self) -> str:
        """The row directory: ``actors`` or ``managed-actors``."""
        return "actors" if self is LedgerKind.INTERACTIVE else "managed-actors"


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise CodecError(problem)


def _check_tokens(values: object, valid: Callable[[object], bool], name: str) -> None:
    _require(isinstance(values, tuple) and all(valid(v) for v in values), f"{name} has a malformed entry")


def _check_granted_at(value: object) -> None:
    ok = isinstance(value, str) and _UTC_TIME.fullmatch(value) is not None
    try:
        ok = ok and datetime.fromisoformat(value).utcoffset() == timedelta(0)  # type: ignore[arg-type]
    except ValueError:
        ok = False
    _require(ok, "grantedAt is not an ISO-8601 UTC time such as 2026-11-29T10:00:00.000Z")


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerRow:
    """One ledger row (upstream-notes 1.3).

    Attributes:
        kind: interactive or managed (the directory).
        owner: derived owner ``u_…``.
        actor: actor token.
        scope: scope tokens (``spawn``, ``run``, ``admin``, ``supervise``, ``role:<r>`` …).
        allow_subscribe: channel patterns the actor may read.
        allow_publish: channel patterns the actor may post to (empty: none).
        role: role name or ``None``.
        parent: ``<owner>.<actor>`` of the spawner or ``None``.
        label: free text for operators, or ``None``.
        token_hash: SHA-256 hex of the actor token; required for managed, forbidden for
            interactive rows.
        lifecycle_uid: the incarnation bearers are bound to.
        granted_at: ISO-8601 UTC time of the grant.

    Raises:
        CodecError: a field breaks its rule; the message names the field.
    """

    kind: LedgerKind
    owner: str
    actor: str
    scope: tuple[str, ...]
    allow_subscribe: tuple[str, ...]
    allow_publish: tuple[str, ...]
    role: str | None = None
    parent: str | None = None
    label: str | None = None
    token_hash: str | None = None
    lifecycle_uid: str
    granted_at: str

    def __post_init__(self) -> None:
        _require(isinstance(self.kind, LedgerKind), "kind must be a LedgerKind")
        _require(is_owner(self.owner), "owner is not a derived owner (u_ + 26 base32 chars)")
        _require(is_actor(self.actor), "actor is not an actor name")
        _check_tokens(self.scope, is_scope_token, "scope")
        _check_tokens(self.allow_subscribe, is_channel_pattern, "allowSubscribe")
        _check_tokens(self.allow_publish, is_channel_pattern, "allowPublish")
        _require(self.role is None or is_role(self.role), "role is not a role name")
        _require(self.parent is None or is_principal(self.parent), "parent is not <owner>.<actor>")
        _require(self.label is None or (isinstance(self.label, str) and self.label.isprintable()), "label is not printable text")
        _check_token_hash(self.kind, self.token_hash)
        _require(is_lifecycle_uid(self.lifecycle_uid), "lifecycleUid is missing or malformed")
        _check_granted_at(self.granted_at)

    @property
    def principal(self) -> str:
        """``<owner>.<actor>``."""
        return principal(self.owner, self.actor)


def _check_token_hash(kind: LedgerKind, token_hash: object) -> None:
    if kind is LedgerKind.MANAGED:
        ok = isinstance(token_hash, str) and _TOKEN_HASH.fullmatch(token_hash) is not None
        _require(ok, "tokenHash must be 64 lowercase hex characters in a managed row")
    else:
        _require(token_hash is None, "tokenHash must not appear in an interactive row")


# --- file codec -----------------------------------------------------------------------------

_TEXT_FIELDS = {"owner": "owner", "actor": "actor", "lifecycleUid": "lifecycle_uid", "grantedAt": "granted_at"}
_OPTIONAL_FIELDS = {"role": "role", "parent": "parent", "label": "label", "tokenHash": "token_hash"}
_LIST_FIELDS = {"scope": "scope", "allowSubscribe": "allow_subscribe", "allowPublish": "allow_publish"}
_ALLOWED_KEYS = frozenset({"ver", *_TEXT_FIELDS, *_OPTIONAL_FIELDS, *_LIST_FIELDS})


def _load_json(data: bytes) -> object:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CodecError("it is not UTF-8 JSON") from None


def _row_fields(obj: object) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise CodecError("it is not a JSON object")
    unknown = sorted(set(obj) - _ALLOWED_KEYS)
    _require(not unknown, f"unknown keys {', '.join(unknown)}")
    ver = obj.get("ver")
    _require(type(ver) is int and ver == LEDGER_ROW_VER, f"ver {ver!r} is not understood (ver 1 only)")
    fields: dict[str, Any] = {}
    missing = [key for key in (*_TEXT_FIELDS, *_LIST_FIELDS) if key not in obj]
    _require(not missing, f"{', '.join(missing)} missing")
    for key, name in _LIST_FIELDS.items():
        _require(isinstance(obj[key], list), f"{key} is not a list")
        fields[name] = tuple(obj[key])
    fields.update({name: obj[key] for key, name in _TEXT_FIELDS.items()})
    fields.update({name: obj.get(key) for key, name in _OPTIONAL_FIELDS.items()})
    return fields


def _fix_for(kind: LedgerKind) -> str:
    if kind is LedgerKind.MANAGED:
        return "respawn the agent so its managed grant is rewritten"
    return "re-grant it with `cotal actor grant`"


def parse_row(data: bytes, *, kind: LedgerKind, owner: str, actor: str) -> LedgerRow:
    """Decode a row file's bytes (upstream-notes 1.3 file shape).

    Args:
        data: the file's bytes (UTF-8 JSON).
        kind: the directory the file was read from.
        owner, actor: the principal named by the file name; the row must name the same.

    Returns:
        The validated :class:`LedgerRow`.

    Raises:
        CodecError: ``ledger row <owner>.<actor> is corrupt: <what> - <fix>`` for bad JSON,
            an unknown ``ver``, missing, unknown or mistyped keys, a field breaking its
            grammar, or owner/actor differing from the file name.
    """
    try:
        row = LedgerRow(kind=kind, **_row_fields(_load_json(data)))
        _require(row.owner == owner and row.actor == actor, "it names another principal than its file")
    except CodecError as exc:
        raise CodecError(f"ledger row {owner}.{actor} is corrupt: {exc} - {_fix_for(kind)}") from None
    return row


def render_row(row: LedgerRow) -> bytes:
    """The canonical file bytes of ``row``: sorted keys, 2-space indent, trailing newline.

    ``parse_row(render_row(row), kind=row.kind, owner=row.owner, actor=row.actor) == row``.
    Optional fields that are ``None`` are omitted.
    """
    obj: dict[str, Any] = {"ver": LEDGER_ROW_VER}
    obj.update({key: getattr(row, name) for key, name in _TEXT_FIELDS.items()})
    obj.update({key: list(getattr(row, name)) for key, name in _LIST_FIELDS.items()})
    for key, name in _OPTIONAL_FIELDS.items():
        if getattr(row, name) is not None:
            obj[key] = getattr(row, name)
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def new_actor_token(random32: bytes) -> str:
    """An agent's secret actor token: unpadded base64url of 32 random bytes (43 characters).

    Raises:
        ConfigError: ``random32`` is not exactly 32 bytes (a caller bug).
    """
    if not isinstance(random32, bytes) or len(random32) != ACTOR_TOKEN_RANDOM_BYTES:
        raise ConfigError("new_actor_token needs exactly 32 random bytes")
    return base64.urlsafe_b64encode(random32).rstrip(b"=").decode("ascii")


def hash_actor_token(token: str) -> str:
    """The ledger's ``tokenHash`` of an actor token: SHA-256 hex of its UTF-8 bytes."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


# --- decisions ------------------------------------------------------------------------------


def _not_granted(sentence: str) -> Refused:
    return Refused(RefusalCode.NOT_GRANTED, sentence)


def authorize_connect(
    bearer: ValidatedBearer, interactive: LedgerRow | None, managed: LedgerRow | None
) -> LedgerRow:
    """Decide the ledger step of a connect (DESIGN 6 step 5; upstream ``ledgerAuthorizeConnect``).

    Args:
        bearer: the validated bearer.
        interactive, managed: the principal's fresh rows from each directory, or ``None``.

    Returns:
        The row the connect is authorized by.

    Raises:
        Refused: NOT_GRANTED when both rows exist (broken ledger), neither exists, the row names
            another principal, its lifecycle UID differs from the bearer's (re-granted or
            revoked since), or the bearer's scope is not a subset of the row's.
    """
    name = bearer.principal
    if interactive is not None and managed is not None:
        raise _not_granted(
            f"actor {name} has both an interactive and a managed ledger row, which is a broken "
            f"ledger - revoke one of them with `cotal actor revoke`"
        )
    row = interactive if interactive is not None else managed
    if row is None or row.principal != name:
        raise _not_granted(
            f'actor "{bearer.actor}" is not granted in this space for owner {bearer.owner} - '
            f"the mesh operator lets it in with `cotal actor grant {bearer.actor} --owner {bearer.owner}`"
        )
    if row.lifecycle_uid != bearer.lifecycle_uid:
        raise _not_granted(
            "the actor was re-granted or revoked since this bearer was issued - exchange a fresh bearer"
        )
    wider = sorted(set(bearer.scope) - set(row.scope))
    if wider:
        raise _not_granted(
            f"bearer scope {', '.join(wider)} is no longer granted to {name} - exchange a fresh bearer"
        )
    return row


def authorize_human_exchange(
    owner: str, actor: str, interactive_row: LedgerRow | None, *, managed_row: LedgerRow | None = None
) -> LedgerRow:
    """Decide the ledger step of a human (IdP) exchange (upstream ``ledgerAuthorizeGrant``).

    Args:
        owner: the owner derived from the verified IdP token.
        actor: the requested actor.
        interactive_row: the principal's fresh interactive row, or ``None``.
        managed_row: the principal's managed row, or ``None``; only the refusal's sentence reads
            it (a person never takes a managed agent's bearer).

    Returns:
        The interactive row (source of the bearer's scope, parent and lifecycle UID).

    Raises:
        Refused: NOT_GRANTED when no interactive row for exactly this principal exists: for a
            managed agent of this owner, a sentence naming the agent's own actor token (a
            ``cotal actor grant`` of it is refused as "already granted as managed"); otherwise
            the upstream sentence naming ``cotal actor grant``.
    """
    row = interactive_row
    if row is None and managed_row is not None and managed_row.kind is LedgerKind.MANAGED \
            and managed_row.principal == principal(owner, actor):
        raise _not_granted(
            f'actor "{actor}" is a managed agent of this user, not an interactive actor - it takes its '
            f"bearers with its own actor token (owner, actor and actorToken; `cotal agent-bearer --owner "
            f"{owner} --actor {actor} --token-file <its token file>`)"
        )
    if row is None or row.kind is not LedgerKind.INTERACTIVE or row.principal != principal(owner, actor):
        raise _not_granted(
            f'actor "{actor}" is not granted for this user - the mesh operator lets them in with '
            f"`cotal actor grant {actor} --owner {owner}` (or --sub <their IdP subject>)"
        )
    return row


def authorize_agent_exchange(
    owner: str, actor: str, actor_token: str, managed_row: LedgerRow | None, lookup: RowLookup
) -> LedgerRow:
    """Decide the ledger step of an agent (actor-token) exchange (``ledgerAuthorizeAgentExchange``).

    The token's hash is compared in constant time, also when no row exists; then the delegation
    envelope is walked (:func:`cotal_trio.core.delegation.check_within_spawner_grant`).

    Args:
        owner, actor: the principal the agent claims.
        actor_token: the presented secret.
        managed_row: the principal's fresh managed row, or ``None``.
        lookup: fresh row of any principal, for the envelope walk.

    Returns:
        The managed row.

    Raises:
        Refused: NOT_GRANTED with :data:`AGENT_EXCHANGE_REFUSAL` on every failure (no row, a
            row of another kind or principal, a wrong secret, a broken envelope).
    """
    row = managed_row
    expected = row.token_hash if row is not None and row.token_hash is not None else _ABSENT_HASH
    presented = hash_actor_token(actor_token) if isinstance(actor_token, str) else ""
    secret_ok = hmac.compare_digest(presented, expected)
    if not secret_ok or row is None or row.kind is not LedgerKind.MANAGED or row.principal != principal(owner, actor):
        raise _not_granted(AGENT_EXCHANGE_REFUSAL)
    try:
        check_within_spawner_grant(row, lookup)
    except Refused:
        raise _not_granted(AGENT_EXCHANGE_REFUSAL) from None
    return row
