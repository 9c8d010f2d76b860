"""``cotal manager`` refusals that need no broker (cotal_trio/cli/manager.py): each is one
sentence naming the fix, exit 1, and nothing is connected to."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest

from cotal_trio.broker.process import free_port
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow, hash_actor_token
from cotal_trio.state import BrokerPolicy, save_policy, write_row

from tests.support.cli_root import SPACE, Root

SUB = "alice"


def grant(root: Root, actor: str, scope: tuple[str, ...], *, managed: bool = False) -> str:
    owner = root.owner_of(SUB)
    write_row(root.space, LedgerRow(
        kind=LedgerKind.MANAGED if managed else LedgerKind.INTERACTIVE, owner=owner, actor=actor, scope=scope,
        allow_subscribe=(), allow_publish=(), token_hash=hash_actor_token("t" * 43) if managed else None,
        lifecycle_uid=mint_lifecycle_uid(os.urandom(20)), granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    ))  # fmt: skip
    return owner


def refused(root: Root, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = root.run(capsys, "manager", *argv)
    lines = err.strip().splitlines()
    assert (code, out) == (1, ""), (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("cotal: "), err
    return lines[0].removeprefix("cotal: ")


def test_register_without_a_ledger_row_names_the_grant(root, capsys):
    owner = root.owner_of(SUB)
    assert refused(root, capsys, "register", "--actor", "mgr", "--sub", SUB) == (
        f"manager actor mgr of owner {owner} has no ledger row in space {SPACE} - grant it first:"
        f" `cotal actor grant mgr --owner {owner} --scope supervise`"
    )


def test_register_without_supervise_names_the_regrant_with_the_scope_added(root, capsys):
    owner = grant(root, "mgr", ("spawn", "role:default"))
    assert refused(root, capsys, "register", "--actor", "mgr", "--owner", owner) == (
        f"manager actor mgr of owner {owner} lacks ledger scope supervise in space {SPACE} - grant it again with"
        f" `cotal actor grant mgr --owner {owner} --scope spawn,role:default,supervise` (and its --allow-* lists)"
    )


def test_a_managed_row_without_supervise_names_managed(root, capsys):
    owner = grant(root, "bot", ("run",), managed=True)
    sentence = refused(root, capsys, "register", "--actor", "bot", "--sub", SUB)
    assert f"`cotal actor grant bot --owner {owner} --managed --scope run,supervise`" in sentence


def test_register_with_supervise_and_no_broker_names_cotal_up(root, capsys):
    grant(root, "mgr", ("supervise",))
    save_policy(root.paths.policy_json, BrokerPolicy(port=free_port()))  # nothing listens there
    assert refused(root, capsys, "register", "--actor", "mgr", "--sub", SUB) == (
        f"no broker answers for the root {root.paths.root} - start it with `cotal up`, or pass --server nats://host:port"
    )


@pytest.mark.parametrize(
    ("argv", "sentence"),
    [
        (("register", "--actor", "a.b", "--sub", SUB), "an actor name is 1 to 64 letters, digits and _ (no dots, dashes or spaces)"),
        (("register", "--actor", "mgr"), "name the owner with exactly one of --sub <IdP subject> or --owner <u_...>"),
        (("register", "--actor", "mgr", "--sub", SUB, "--owner", "u_" + "a" * 26), "name the owner with exactly one of"),
        (("register", "--actor", "mgr", "--sub", SUB, "--label", "x" * 129), "--label has 129 characters - keep it to 128"),
        (("register", "--actor", "mgr", "--sub", SUB, "--label", "a\tb"), "--label is printable text on one line"),
        (("retire", "NOT-AN-ID", "--sub", SUB), "'NOT-AN-ID' is not a manager instance id (26 to 32 of a-z and 0-9) - copy it from `cotal manager list`"),
        (("retire", "a" * 26), "name the owner with exactly one of"),
    ],
)
def test_flag_refusals(root, capsys, argv, sentence):
    assert sentence in refused(root, capsys, *argv)


def test_an_unprovisioned_space_is_refused(root, capsys):
    sentence = refused(root, capsys, "list", "--space", "nothere")
    assert sentence == f"space nothere is not in the root {root.paths.root} - see `cotal space list`"
