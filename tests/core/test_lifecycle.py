"""Lifecycle records and the lifecycle doors' decisions (core/lifecycle.py; spec "Host-only routes")."""

from __future__ import annotations

import json

import pytest

from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.issuance import IssuanceRow
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.lifecycle import (
    NOT_EXECUTED,
    RETIRED_TTL_S,
    LifecycleRecord,
    LifecycleState,
    LifecycleTarget,
    activated_answer,
    check_activation,
    check_retirable,
    holds_lifecycle,
    lifecycle_key,
    parse_activate_body,
    parse_record,
    parse_retire_body,
    record_ttl_s,
    render_record,
    retired_answer,
)
from cotal_trio.core.nkeys import KeyPair, Prefix

SPACE = "alpha"
OWNER = derive_owner(bytes(range(32)), "https://idp.example", "alice")
OTHER_OWNER = derive_owner(bytes(range(32)), "https://idp.example", "bob")
UID = "a" * 26
NEW_UID = "b" * 26
NOW = 1_800_000_000
DATA_ACCOUNT = KeyPair.from_raw(Prefix.ACCOUNT, bytes(range(32))).public_key
OTHER_ACCOUNT = KeyPair.from_raw(Prefix.ACCOUNT, bytes(range(1, 33))).public_key
TARGET = LifecycleTarget(owner=OWNER, actor="cli", lifecycle_uid=UID)
RETIRE_BODY = {"owner": OWNER, "actor": "cli", "lifecycleUid": UID}
ACTIVATE_BODY = {**RETIRE_BODY, "accountPublicKey": DATA_ACCOUNT}


def _row(kind: LedgerKind, uid: str = UID) -> LedgerRow:
    return LedgerRow(
        kind=kind, owner=OWNER, actor="cli", scope=("spawn",), allow_subscribe=(">",), allow_publish=(">",),
        token_hash="0" * 64 if kind is LedgerKind.MANAGED else None, lifecycle_uid=uid,
        granted_at="2026-11-29T10:00:00.000Z",
    )  # fmt: skip


def _record(state: LifecycleState, *, owner: str = OWNER) -> LifecycleRecord:
    return LifecycleRecord(lifecycle_uid=UID, owner=owner, actor="cli", kind=LedgerKind.MANAGED, state=state, at=NOW)


def _refusal(call) -> Refused:
    with pytest.raises(Refused) as caught:
        call()
    return caught.value


# --- the record -------------------------------------------------------------------------------


def test_the_record_is_stored_as_compact_json_in_the_documented_order():
    record = LifecycleRecord.of(TARGET, LedgerKind.INTERACTIVE, LifecycleState.RETIRED, now=NOW + 0.9)
    stored = (
        '{"ver":1,"lifecycleUid":"%s","owner":"%s","actor":"cli","kind":"interactive","state":"retired","at":%d}'
        % (UID, OWNER, NOW)
    ).encode()
    assert render_record(record) == stored
    assert parse_record(stored) == record
    assert lifecycle_key(UID) == f"lifecycle.{UID}"


def test_a_retired_record_lives_960_seconds_and_an_active_one_has_no_ttl():
    assert RETIRED_TTL_S == 960
    assert record_ttl_s(_record(LifecycleState.RETIRED)) == 960
    assert record_ttl_s(_record(LifecycleState.ACTIVE)) is None


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"ver": 2}, "ver 2 is not understood"),
        ({"state": "gone"}, "state is not active or retired"),
        ({"kind": "robot"}, "kind is not interactive or managed"),
        ({"at": 1.5}, "at must be whole unix seconds"),
        ({"at": True}, "at must be whole unix seconds"),
        ({"owner": "bob"}, "owner is not a derived owner"),
        ({"lifecycleUid": "X" * 26}, "lifecycleUid is malformed"),
        ({"extra": 1}, "keys must be exactly"),
    ],
)
def test_a_bad_record_is_a_codec_error_naming_the_field(change, words):
    obj = json.loads(render_record(_record(LifecycleState.ACTIVE)))
    with pytest.raises(CodecError, match=words):
        parse_record(json.dumps({**obj, **change}).encode())


def test_a_record_that_is_not_json_is_a_codec_error():
    with pytest.raises(CodecError, match="lifecycle record: it is not UTF-8 JSON"):
        parse_record(b"\xff{")


# --- bodies -------------------------------------------------------------------------------------


def test_a_retire_body_names_its_target():
    assert parse_retire_body(RETIRE_BODY) == TARGET


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        ([], "the body must be a JSON object {owner, actor, lifecycleUid}"),
        ({**RETIRE_BODY, "scope": "x"}, "unknown field 'scope' - the body is exactly {owner, actor, lifecycleUid}"),
        ({"owner": OWNER, "actor": "cli"}, "lifecycleUid must be a non-empty string - the body is exactly {owner, actor, lifecycleUid}"),
        ({**RETIRE_BODY, "actor": 3}, "actor must be a non-empty string - the body is exactly {owner, actor, lifecycleUid}"),
        ({**RETIRE_BODY, "owner": "bob"}, "an owner is u_ followed by 26 characters a-z and 2-7 - "
         "copy it from the `cotal actor grant` output or `cotal actor list`"),
        ({**RETIRE_BODY, "actor": "a.b"}, "an actor name is 1 to 64 letters, digits and _ (no dots, dashes or spaces)"),
        ({**RETIRE_BODY, "lifecycleUid": "short"}, "a lifecycle UID is 26 to 32 characters of a-z and 0-9"),
    ],
)
def test_a_bad_retire_body_is_a_400_not_executed(body, sentence):
    refusal = _refusal(lambda: parse_retire_body(body))
    assert (refusal.code, refusal.detail, refusal.fields) == (RefusalCode.BAD_REQUEST, sentence, {"outcome": "not-executed"})


def test_an_activate_body_carries_the_account():
    assert parse_activate_body(ACTIVATE_BODY) == (TARGET, DATA_ACCOUNT)


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        (RETIRE_BODY, "accountPublicKey must be a non-empty string - the body is exactly "
         "{owner, actor, lifecycleUid, accountPublicKey}"),
        ({**ACTIVATE_BODY, "accountPublicKey": "U" + DATA_ACCOUNT[1:]},
         "accountPublicKey is not an account public key - send the space's data account (A...)"),
    ],
)
def test_a_bad_activate_body_is_a_400_not_executed(body, sentence):
    refusal = _refusal(lambda: parse_activate_body(body))
    assert (refusal.code, refusal.detail, refusal.fields) == (RefusalCode.BAD_REQUEST, sentence, NOT_EXECUTED)


# --- decisions before the barrier -----------------------------------------------------------------


@pytest.mark.parametrize("kind", list(LedgerKind))
def test_a_row_holding_the_lifecycle_is_retirable(kind):
    assert check_retirable(TARGET, _row(kind), kind=kind, space=SPACE) is None


@pytest.mark.parametrize(
    ("kind", "row", "code", "sentence"),
    [
        (LedgerKind.INTERACTIVE, None, RefusalCode.NOT_FOUND,
         f"{OWNER}.cli has no interactive ledger row in space alpha - nothing to retire;"
         " check the principal with `cotal actor list`"),
        (LedgerKind.MANAGED, None, RefusalCode.NOT_FOUND,
         f"{OWNER}.cli has no managed ledger row in space alpha - nothing to retire;"
         " check the principal with `cotal actor list`"),
        (LedgerKind.INTERACTIVE, _row(LedgerKind.INTERACTIVE, NEW_UID), RefusalCode.CONFLICT,
         f"the interactive ledger row of {OWNER}.cli holds lifecycle {NEW_UID}, not {UID} - it was re-granted"
         " since; read its current lifecycle with `cotal actor list`"),
        (LedgerKind.MANAGED, _row(LedgerKind.MANAGED, NEW_UID), RefusalCode.CONFLICT,
         f"the managed ledger row of {OWNER}.cli holds lifecycle {NEW_UID}, not {UID} - the agent was respawned"
         " since; read its current lifecycle with `cotal actor list`"),
    ],
)
def test_a_missing_or_moved_on_row_refuses_the_retirement(kind, row, code, sentence):
    refusal = _refusal(lambda: check_retirable(TARGET, row, kind=kind, space=SPACE))
    assert (refusal.code, refusal.detail, refusal.fields) == (code, sentence, {"outcome": "not-executed"})


def _activation(account: str = DATA_ACCOUNT, row: LedgerRow | None = None, record: LifecycleRecord | None = None) -> bool:
    row = _row(LedgerKind.MANAGED) if row is None else row
    return check_activation(TARGET, account, data_account=DATA_ACCOUNT, space=SPACE, row=row, record=record)


def test_an_unrecorded_lifecycle_is_written_and_an_active_one_is_not_rewritten():
    assert _activation() is True
    assert _activation(record=_record(LifecycleState.ACTIVE)) is False


def test_activation_for_another_account_is_403_naming_both():
    refusal = _refusal(lambda: _activation(OTHER_ACCOUNT))
    assert refusal.code is RefusalCode.FORBIDDEN and refusal.fields == NOT_EXECUTED
    assert refusal.detail == (
        f"accountPublicKey {OTHER_ACCOUNT} is not the data account of space alpha ({DATA_ACCOUNT})"
        f" - ask the authority assigned to account {OTHER_ACCOUNT}, or send {DATA_ACCOUNT}"
    )


def test_activation_without_a_managed_row_is_404_naming_the_grant():
    refusal = _refusal(lambda: check_activation(
        TARGET, DATA_ACCOUNT, data_account=DATA_ACCOUNT, space=SPACE, row=None, record=None,
    ))  # fmt: skip
    assert (refusal.code, refusal.detail) == (
        RefusalCode.NOT_FOUND,
        f"{OWNER}.cli has no managed ledger row in space alpha - grant the agent first"
        f" (`cotal actor grant cli --owner {OWNER} --managed`)",
    )


def test_a_retired_lifecycle_cannot_be_activated():
    refusal = _refusal(lambda: _activation(record=_record(LifecycleState.RETIRED)))
    assert (refusal.code, refusal.fields) == (RefusalCode.CONFLICT, NOT_EXECUTED)
    assert refusal.detail == (
        f"lifecycle {UID} of {OWNER}.cli is retired and cannot be activated again - respawn the agent for a fresh lifecycle"
    )


def test_activation_refuses_a_row_of_another_lifecycle_and_a_record_of_another_principal():
    moved = _refusal(lambda: _activation(row=_row(LedgerKind.MANAGED, NEW_UID)))
    assert moved.code is RefusalCode.CONFLICT and f"holds lifecycle {NEW_UID}, not {UID}" in moved.detail
    other = _refusal(lambda: _activation(record=_record(LifecycleState.ACTIVE, owner=OTHER_OWNER)))
    assert other.code is RefusalCode.CONFLICT
    assert other.detail.startswith(f"lifecycle {UID} is recorded for {OTHER_OWNER}.cli, not {OWNER}.cli")


def test_an_issuance_row_belongs_to_the_lifecycle_only_with_its_principal():
    row = IssuanceRow(space=SPACE, owner=OWNER, actor="cli", lifecycle_uid=UID, credential_id=None, view=None, iat=NOW, exp=NOW + 60)
    assert holds_lifecycle(row, TARGET)
    assert not holds_lifecycle(IssuanceRow(**{**_fields(row), "lifecycle_uid": NEW_UID}), TARGET)
    assert not holds_lifecycle(IssuanceRow(**{**_fields(row), "actor": "web"}), TARGET)
    assert not holds_lifecycle(IssuanceRow(**{**_fields(row), "owner": OTHER_OWNER}), TARGET)


def _fields(row: IssuanceRow) -> dict:
    return {name: getattr(row, name) for name in row.__slots__}


def test_the_answers():
    assert retired_answer(TARGET, withdrawn=2) == {
        "outcome": "retired", "owner": OWNER, "actor": "cli", "lifecycleUid": UID, "withdrawn": 2,
    }  # fmt: skip
    assert activated_answer(TARGET) == {"outcome": "activated", "owner": OWNER, "actor": "cli", "lifecycleUid": UID}
