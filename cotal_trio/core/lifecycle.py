"""Lifecycle records and the host doors that retire or activate a lifecycle (spec "Host-only routes").

A principal's ledger row carries a lifecycle UID: the incarnation its bearers are bound to. The
loopback face's lifecycle doors end one (``/interactive-lifecycle/retire``,
``/managed-lifecycle/retire``) or activate a managed one (``/managed-lifecycle/activate``), and
record what they did in the space's records store, key ``lifecycle.<lifecycleUid>``::

    {"ver": 1, "lifecycleUid": "<[a-z0-9]{26,32}>", "owner": "u_…", "actor": "cli",
     "kind": "interactive" | "managed", "state": "active" | "retired", "at": <unix s>}

A retired record lives ``RETIRED_TTL_S`` (960 s: the longest bearer, 900 s, plus 60 s), so it
outlasts every bearer of that lifecycle; an active record has no TTL.

The retire doors have a barrier: the retired record is written first, and only then is the row
file removed and the lifecycle's issuance rows withdrawn. Every refusal made before the barrier
carries ``"outcome": "not-executed"`` (:data:`NOT_EXECUTED`): the caller knows nothing changed.
An answer without it may follow a barrier that had begun (``cotal actor grant``/``revoke``
report it as unknown).

Pure and synchronous: the I/O is :mod:`cotal_trio.stores.lifecycle`, the HTTP edge
:mod:`cotal_trio.http.lifecycle_doors`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .errors import CodecError, RefusalCode, Refused
from .identity import check_actor, check_lifecycle_uid, check_owner, is_actor, is_lifecycle_uid, is_owner
from .issuance import IssuanceRow
from .ledger import LedgerKind, LedgerRow
from .nkeys import Prefix, is_public_key
from .rowcodec import decode_row, encode_row

__all__ = [
    "LIFECYCLE_KEY_PREFIX",
    "NOT_EXECUTED",
    "RECORD_VERSION",
    "RETIRED_TTL_S",
    "LifecycleRecord",
    "LifecycleState",
    "LifecycleTarget",
    "activated_answer",
    "check_activation",
    "check_retirable",
    "corrupt_row_refusal",
    "holds_lifecycle",
    "lifecycle_key",
    "parse_activate_body",
    "parse_record",
    "parse_retire_body",
    "record_ttl_s",
    "render_record",
    "retired_answer",
]

RECORD_VERSION = 1
LIFECYCLE_KEY_PREFIX = "lifecycle."
# The longest bearer (900 s) plus 60 s: a retired record outlives every bearer of its lifecycle.
RETIRED_TTL_S = 960
NOT_EXECUTED: Mapping[str, str] = MappingProxyType({"outcome": "not-executed"})

_RECORD_KEYS = ("ver", "lifecycleUid", "owner", "actor", "kind", "state", "at")
_RETIRE_FIELDS = ("owner", "actor", "lifecycleUid")
_ACTIVATE_FIELDS = ("owner", "actor", "lifecycleUid", "accountPublicKey")


class LifecycleState(enum.StrEnum):
    """Where a recorded lifecycle stands."""

    ACTIVE = "active"
    RETIRED = "retired"


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise CodecError(f"lifecycle record: {problem}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleTarget:
    """The lifecycle a door acts on: one principal's one incarnation.

    Raises:
        Refused: BAD_REQUEST (with :data:`NOT_EXECUTED`) for a malformed owner, actor or UID.
    """

    owner: str
    actor: str
    lifecycle_uid: str

    def __post_init__(self) -> None:
        for check, value in ((check_owner, self.owner), (check_actor, self.actor), (check_lifecycle_uid, self.lifecycle_uid)):
            try:
                check(value)
            except Refused as refusal:
                raise _not_executed(RefusalCode.BAD_REQUEST, refusal.detail) from None

    @property
    def principal(self) -> str:
        """``<owner>.<actor>``."""
        return f"{self.owner}.{self.actor}"

    def answer(self, outcome: str) -> dict[str, object]:
        """``{"outcome", "owner", "actor", "lifecycleUid"}``: the 200 body's common part."""
        return {"outcome": outcome, "owner": self.owner, "actor": self.actor, "lifecycleUid": self.lifecycle_uid}


@dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleRecord:
    """One lifecycle record (the key, ``lifecycle.<lifecycleUid>``, is derived from it).

    Attributes:
        lifecycle_uid, owner, actor: the lifecycle and its principal.
        kind: the ledger kind whose row carried the lifecycle.
        state: active or retired.
        at: when it entered ``state``, whole unix seconds.

    Raises:
        CodecError: a field breaks its grammar; the message names it.
    """

    lifecycle_uid: str
    owner: str
    actor: str
    kind: LedgerKind
    state: LifecycleState
    at: int

    def __post_init__(self) -> None:
        _require(is_lifecycle_uid(self.lifecycle_uid), "lifecycleUid is malformed")
        _require(is_owner(self.owner), "owner is not a derived owner")
        _require(is_actor(self.actor), "actor is not an actor name")
        _require(isinstance(self.kind, LedgerKind), "kind is not interactive or managed")
        _require(isinstance(self.state, LifecycleState), "state is not active or retired")
        _require(type(self.at) is int and self.at >= 0, "at must be whole unix seconds")

    @classmethod
    def of(cls, target: LifecycleTarget, kind: LedgerKind, state: LifecycleState, *, now: float) -> LifecycleRecord:
        """The record of ``target`` entering ``state`` at ``now`` (unix seconds, floored)."""
        return cls(
            lifecycle_uid=target.lifecycle_uid, owner=target.owner, actor=target.actor, kind=kind, state=state,
            at=int(now),
        )


def lifecycle_key(lifecycle_uid: str) -> str:
    """``lifecycle.<lifecycleUid>``: the record's key in the records store."""
    return LIFECYCLE_KEY_PREFIX + lifecycle_uid


def render_record(record: LifecycleRecord) -> bytes:
    """Compact JSON, keys in the documented order; ``parse_record(render_record(r)) == r``."""
    obj = {
        "ver": RECORD_VERSION, "lifecycleUid": record.lifecycle_uid, "owner": record.owner, "actor": record.actor,
        "kind": record.kind.value, "state": record.state.value, "at": record.at,
    }
    return encode_row(obj)


def parse_record(data: bytes) -> LifecycleRecord:
    """Decode a stored record.

    Raises:
        CodecError: not UTF-8 JSON, not exactly the version-1 keys, or a field breaking its grammar.
    """
    obj = decode_row(data, what="lifecycle record", keys=_RECORD_KEYS, version=RECORD_VERSION)
    kinds = {kind.value: kind for kind in LedgerKind}
    states = {state.value: state for state in LifecycleState}
    _require(isinstance(obj["kind"], str) and obj["kind"] in kinds, "kind is not interactive or managed")
    _require(isinstance(obj["state"], str) and obj["state"] in states, "state is not active or retired")
    return LifecycleRecord(
        lifecycle_uid=obj["lifecycleUid"], owner=obj["owner"], actor=obj["actor"], kind=kinds[obj["kind"]],
        state=states[obj["state"]], at=obj["at"],
    )


def record_ttl_s(record: LifecycleRecord) -> int | None:
    """The record's per-message TTL: :data:`RETIRED_TTL_S` once retired, none while active."""
    return RETIRED_TTL_S if record.state is LifecycleState.RETIRED else None


# --- bodies -----------------------------------------------------------------------------------


def _not_executed(code: RefusalCode, sentence: str) -> Refused:
    return Refused(code, sentence, fields=NOT_EXECUTED)


def _closed_body(body: object, names: tuple[str, ...]) -> dict[str, Any]:
    shape = "{" + ", ".join(names) + "}"
    if not isinstance(body, dict):
        raise _not_executed(RefusalCode.BAD_REQUEST, f"the body must be a JSON object {shape}")
    extra = sorted(set(body) - set(names))
    if extra:
        raise _not_executed(RefusalCode.BAD_REQUEST, f"unknown field {extra[0]!r} - the body is exactly {shape}")
    for name in names:
        if not isinstance(body.get(name), str) or not body[name]:
            raise _not_executed(RefusalCode.BAD_REQUEST, f"{name} must be a non-empty string - the body is exactly {shape}")
    return body


def parse_retire_body(body: object) -> LifecycleTarget:
    """The target of a retire door's body, exactly ``{owner, actor, lifecycleUid}``.

    Raises:
        Refused: BAD_REQUEST with :data:`NOT_EXECUTED`, naming the field that is missing,
            extra, not a non-empty string, or malformed.
    """
    fields = _closed_body(body, _RETIRE_FIELDS)
    return LifecycleTarget(owner=fields["owner"], actor=fields["actor"], lifecycle_uid=fields["lifecycleUid"])


def parse_activate_body(body: object) -> tuple[LifecycleTarget, str]:
    """``(target, accountPublicKey)`` of an activate body, exactly
    ``{owner, actor, lifecycleUid, accountPublicKey}``.

    Raises:
        Refused: BAD_REQUEST with :data:`NOT_EXECUTED` as :func:`parse_retire_body`, or an
            ``accountPublicKey`` that is no account public key (``A…``).
    """
    fields = _closed_body(body, _ACTIVATE_FIELDS)
    target = LifecycleTarget(owner=fields["owner"], actor=fields["actor"], lifecycle_uid=fields["lifecycleUid"])
    account = fields["accountPublicKey"]
    if not is_public_key(account, Prefix.ACCOUNT):
        raise _not_executed(
            RefusalCode.BAD_REQUEST, "accountPublicKey is not an account public key - send the space's data account (A...)"
        )
    return target, account


# --- decisions before the barrier ---------------------------------------------------------------


def corrupt_row_refusal(error: CodecError) -> Refused:
    """A corrupt ledger row is no lifecycle to decide on: CONFLICT with the codec's sentence
    (it names the row and the fix) and :data:`NOT_EXECUTED`."""
    return _not_executed(RefusalCode.CONFLICT, str(error))


def _check_row_holds(target: LifecycleTarget, row: LedgerRow | None, *, kind: LedgerKind, missing: str) -> None:
    if row is None:
        raise _not_executed(RefusalCode.NOT_FOUND, missing)
    if row.lifecycle_uid != target.lifecycle_uid:
        moved_on = "the agent was respawned since" if kind is LedgerKind.MANAGED else "it was re-granted since"
        raise _not_executed(
            RefusalCode.CONFLICT,
            f"the {kind.value} ledger row of {target.principal} holds lifecycle {row.lifecycle_uid}, not"
            f" {target.lifecycle_uid} - {moved_on}; read its current lifecycle with `cotal actor list`",
        )


def check_retirable(target: LifecycleTarget, row: LedgerRow | None, *, kind: LedgerKind, space: str) -> None:
    """Refuse a retirement before its barrier unless ``row`` (the fresh ledger row of ``kind``)
    holds the target's lifecycle.

    Raises:
        Refused: with :data:`NOT_EXECUTED`: NOT_FOUND when there is no row of ``kind``,
            CONFLICT when the row holds another lifecycle UID.
    """
    missing = (
        f"{target.principal} has no {kind.value} ledger row in space {space} - nothing to retire;"
        " check the principal with `cotal actor list`"
    )
    _check_row_holds(target, row, kind=kind, missing=missing)


def check_activation(
    target: LifecycleTarget, account: str, *, data_account: str, space: str, row: LedgerRow | None,
    record: LifecycleRecord | None,
) -> bool:  # fmt: skip
    """Decide ``/managed-lifecycle/activate`` before anything is written.

    Args:
        target, account: the parsed body.
        data_account: the space's assigned data account (``A…``).
        row: the principal's fresh managed ledger row, or None.
        record: the lifecycle's record in the store, or None.

    Returns:
        True when the active record must be written; False when it is already active (the door
        is idempotent and writes nothing).

    Raises:
        Refused: with :data:`NOT_EXECUTED`: FORBIDDEN when ``account`` is not ``data_account``
            (naming both); NOT_FOUND without a managed row; CONFLICT when the row holds another
            lifecycle, the record is retired, or the record names another principal.
    """
    if account != data_account:
        raise _not_executed(
            RefusalCode.FORBIDDEN,
            f"accountPublicKey {account} is not the data account of space {space} ({data_account})"
            f" - ask the authority assigned to account {account}, or send {data_account}",
        )
    missing = (
        f"{target.principal} has no managed ledger row in space {space} - grant the agent first"
        f" (`cotal actor grant {target.actor} --owner {target.owner} --managed`)"
    )
    _check_row_holds(target, row, kind=LedgerKind.MANAGED, missing=missing)
    if record is None:
        return True
    if (record.owner, record.actor) != (target.owner, target.actor):
        raise _not_executed(
            RefusalCode.CONFLICT,
            f"lifecycle {target.lifecycle_uid} is recorded for {record.owner}.{record.actor}, not"
            f" {target.principal} - respawn the agent for a fresh lifecycle",
        )
    if record.state is LifecycleState.RETIRED:
        raise _not_executed(
            RefusalCode.CONFLICT,
            f"lifecycle {target.lifecycle_uid} of {target.principal} is retired and cannot be activated again"
            " - respawn the agent for a fresh lifecycle",
        )
    return False


def holds_lifecycle(row: IssuanceRow, target: LifecycleTarget) -> bool:
    """True when the issuance row was minted for ``target``'s lifecycle (and principal)."""
    return (row.lifecycle_uid, row.owner, row.actor) == (target.lifecycle_uid, target.owner, target.actor)


def retired_answer(target: LifecycleTarget, *, withdrawn: int) -> dict[str, object]:
    """The retire doors' 200 body ``{"outcome": "retired", owner, actor, lifecycleUid, withdrawn}``."""
    return {**target.answer("retired"), "withdrawn": withdrawn}


def activated_answer(target: LifecycleTarget) -> dict[str, object]:
    """The activate door's 200 body ``{"outcome": "activated", owner, actor, lifecycleUid}``."""
    return target.answer("activated")
