"""``cotal actor grant|revoke|list`` (cotal_trio/cli/actor.py; upstream-notes 1.3 and 8)."""

from __future__ import annotations

import json
import os

import pytest

from cotal_trio.core.identity import is_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, hash_actor_token
from cotal_trio.state import read_principal, row_path

from tests.support.cli_root import Root

SUB = "alice"


def _grant(root: Root, capsys, *argv: str) -> tuple[int, dict, str]:
    code, out, err = root.run(capsys, "actor", "grant", *argv, "--json")
    return code, (json.loads(out) if code == 0 else {}), err


def _one_sentence(err: str) -> str:
    """stderr of a refused command: one ``cotal: <sentence>`` line and no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cotal: "), err
    return lines[0].removeprefix("cotal: ")


def _files_under(folder) -> list:
    return sorted(path for path in folder.rglob("*") if path.is_file()) if folder.exists() else []


# --- grant ----------------------------------------------------------------------------------


def test_grant_by_sub_and_by_owner_name_the_same_derived_owner(root, capsys):
    owner = root.owner_of(SUB)
    code, by_sub, _ = _grant(root, capsys, "cli", "--sub", SUB, "--scope", "spawn")
    assert code == 0 and by_sub["owner"] == owner
    code, by_owner, _ = _grant(root, capsys, "web", "--owner", owner, "--scope", "spawn")
    assert code == 0 and by_owner["owner"] == owner
    interactive, managed = read_principal(root.space, owner, "cli")
    assert managed is None and interactive.lifecycle_uid == by_sub["lifecycleUid"]


def test_grant_prints_a_sentence_and_writes_an_interactive_row(root, capsys):
    code, out, _ = root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full", "--label", "david laptop")
    owner = root.owner_of(SUB)
    row, _ = read_principal(root.space, owner, "cli")
    assert code == 0
    assert out == f"granted cli to owner {owner} (interactive, lifecycle {row.lifecycle_uid})\n"
    assert row.kind is LedgerKind.INTERACTIVE and row.label == "david laptop" and row.token_hash is None
    assert row.granted_at.endswith("Z") and is_lifecycle_uid(row.lifecycle_uid)
    assert oct(row_path(root.space, row.kind, owner, "cli").stat().st_mode & 0o777) == "0o600"


def test_full_grants_spawn_and_role_default_and_everything_both_ways(root, capsys):
    code, body, _ = _grant(root, capsys, "cli", "--sub", SUB, "--full")
    assert code == 0
    assert body == {
        "owner": root.owner_of(SUB), "actor": "cli", "kind": "interactive",
        "lifecycleUid": body["lifecycleUid"], "scope": ["spawn", "role:default"],
        "allowSubscribe": [">"], "allowPublish": [">"],
    }  # fmt: skip


def test_lists_are_comma_separated_and_trimmed(root, capsys):
    code, body, _ = _grant(
        root, capsys, "cli", "--sub", SUB, "--scope", "spawn, run,spawn",
        "--allow-subscribe", "team.*,ops.>", "--allow-publish", "", "--role", "ops",
    )  # fmt: skip
    assert code == 0
    assert (body["scope"], body["allowSubscribe"], body["allowPublish"]) == (["spawn", "run"], ["team.*", "ops.>"], [])
    row, _ = read_principal(root.space, root.owner_of(SUB), "cli")
    assert row.role == "ops"


def test_regrant_replaces_the_row_with_a_fresh_lifecycle(root, capsys):
    _, first, _ = _grant(root, capsys, "cli", "--sub", SUB, "--full")
    _, second, _ = _grant(root, capsys, "cli", "--sub", SUB, "--scope", "run")
    assert first["lifecycleUid"] != second["lifecycleUid"]
    row, _ = read_principal(root.space, root.owner_of(SUB), "cli")
    assert (row.scope, row.lifecycle_uid) == (("run",), second["lifecycleUid"])


@pytest.mark.parametrize(
    ("argv", "sentence"),
    [
        (["cli"], "name the owner with exactly one of --sub <IdP subject> or --owner <u_...>"),
        (["cli", "--sub", SUB, "--owner", "u_" + "a" * 26], "name the owner with exactly one of --sub"),
        (["bad.name", "--sub", SUB], "an actor name is 1 to 64 letters, digits and _ (no dots, dashes or spaces)"),
        (["cli", "--owner", "u_short"], "an owner is u_ followed by 26 characters a-z and 2-7"),
        (["cli", "--sub", SUB, "--full", "--scope", "run"], "--full grants scope spawn,role:default"),
        (["cli", "--sub", SUB, "--scope", "spawn,bad scope"], "a scope token uses only letters"),
        (["cli", "--sub", SUB, "--allow-publish", "a..b"], "a channel pattern is dot-separated segments"),
        (["cli", "--sub", SUB, "--role", "a.b"], "a role name uses only letters, digits, _ and -"),
        (["cli", "--sub", SUB, "--label", "two\nlines"], "--label is printable text on one line"),
        (["cli", "--sub", SUB, "--parent", "boss"], "--parent names the spawner of a managed agent - add --managed"),
    ],
)
def test_bad_grants_exit_1_with_one_sentence_and_write_nothing(root, capsys, argv, sentence):
    code, out, err = root.run(capsys, "actor", "grant", *argv)
    assert (code, out) == (1, "")
    assert _one_sentence(err).startswith(sentence)
    assert _files_under(root.space.actors_dir) == [] and _files_under(root.space.managed_dir) == []


def test_grant_into_a_space_the_root_does_not_hold_names_it(root, capsys):
    code, _, err = root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--space", "nowhere")
    assert code == 1 and _one_sentence(err) == f"space nowhere is not in the root {root.paths.root} - see `cotal space list`"


def test_grant_by_sub_needs_the_idp_pin(root, capsys):
    root.space.idp_json.unlink()
    code, _, err = root.run(capsys, "actor", "grant", "cli", "--sub", SUB)
    space_dir = root.space.idp_json.parent  # <root>/spaces/<space>: the fix provisions that space again
    assert code == 1 and _one_sentence(err) == (
        f"{root.space.idp_json} is missing - run `cotal space add {space_dir.name} --root {space_dir.parent.parent}`"
        " to provision the space again"
    )


# --- managed grants -------------------------------------------------------------------------


def test_a_managed_grant_prints_the_token_once_and_stores_only_its_hash(root, capsys):
    code, out, _ = root.run(capsys, "actor", "grant", "worker", "--sub", SUB, "--managed", "--scope", "run")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"granted worker to owner {root.owner_of(SUB)} (managed, lifecycle ")
    assert "shown once" in lines[1]
    token = lines[2]
    _, row = read_principal(root.space, root.owner_of(SUB), "worker")
    assert row.token_hash == hash_actor_token(token)
    for path in _files_under(root.paths.root):
        assert token.encode() not in path.read_bytes(), path


def test_a_managed_grant_in_json_carries_the_actor_token(root, capsys):
    code, body, _ = _grant(root, capsys, "worker", "--sub", SUB, "--managed", "--full")
    _, row = read_principal(root.space, root.owner_of(SUB), "worker")
    assert code == 0 and body["kind"] == "managed"
    assert hash_actor_token(body["actorToken"]) == row.token_hash


def test_a_managed_grant_inside_its_spawner_names_the_parent(root, capsys):
    _grant(root, capsys, "boss", "--sub", SUB, "--scope", "spawn,run", "--allow-subscribe", "team.>")
    code, body, _ = _grant(
        root, capsys, "worker", "--sub", SUB, "--managed", "--parent", "boss",
        "--scope", "run", "--allow-subscribe", "team.a",
    )  # fmt: skip
    _, row = read_principal(root.space, root.owner_of(SUB), "worker")
    assert code == 0 and row.parent == f"{root.owner_of(SUB)}.boss"


def test_a_managed_grant_wider_than_its_spawner_is_refused(root, capsys):
    _grant(root, capsys, "boss", "--sub", SUB, "--scope", "run", "--allow-subscribe", "team.>")
    code, _, err = root.run(
        capsys, "actor", "grant", "worker", "--sub", SUB, "--managed", "--parent", "boss",
        "--scope", "run,spawn",
    )  # fmt: skip
    owner = root.owner_of(SUB)
    assert code == 1
    assert _one_sentence(err) == (
        f"{owner}.worker holds scope spawn its spawner lacks - narrow the grant of {owner}.worker "
        f"or widen its spawner {owner}.boss"
    )
    assert read_principal(root.space, owner, "worker") == (None, None)


def test_a_managed_grant_under_a_missing_spawner_is_refused(root, capsys):
    code, _, err = root.run(capsys, "actor", "grant", "worker", "--sub", SUB, "--managed", "--parent", "boss")
    assert code == 1
    assert _one_sentence(err) == f"spawner {root.owner_of(SUB)}.boss has no ledger row - grant it first"
    assert _files_under(root.space.managed_dir) == []


def test_one_principal_cannot_hold_both_kinds(root, capsys):
    _grant(root, capsys, "cli", "--sub", SUB, "--full")
    code, _, err = root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--managed")
    assert code == 1 and "is already granted as interactive - revoke it first" in _one_sentence(err)


# --- revoke ---------------------------------------------------------------------------------


def test_revoke_removes_the_row_and_says_so(root, capsys):
    _grant(root, capsys, "cli", "--sub", SUB, "--full")
    owner = root.owner_of(SUB)
    code, out, _ = root.run(capsys, "actor", "revoke", "cli", "--owner", owner)
    assert (code, out) == (0, f"revoked cli of owner {owner}\n")
    assert read_principal(root.space, owner, "cli") == (None, None)


def test_revoking_a_principal_without_a_row_is_not_an_error(root, capsys):
    code, out, _ = root.run(capsys, "actor", "revoke", "cli", "--sub", SUB)
    assert code == 0 and out.startswith("nothing to revoke: cli of owner ")
    code, out, _ = root.run(capsys, "actor", "revoke", "cli", "--sub", SUB, "--json")
    assert code == 0 and json.loads(out) == {"owner": root.owner_of(SUB), "actor": "cli", "removed": False}


def test_revoke_removes_a_managed_row_too(root, capsys):
    _grant(root, capsys, "worker", "--sub", SUB, "--managed")
    code, out, _ = root.run(capsys, "actor", "revoke", "worker", "--sub", SUB, "--json")
    assert code == 0 and json.loads(out)["removed"] is True
    assert _files_under(root.space.managed_dir) == []


def test_revoke_needs_exactly_one_owner_flag(root, capsys):
    code, _, err = root.run(capsys, "actor", "revoke", "cli")
    assert code == 1 and "exactly one of --sub" in _one_sentence(err)


# --- list -----------------------------------------------------------------------------------


def test_list_json_shows_every_row(root, capsys):
    _, cli, _ = _grant(root, capsys, "cli", "--sub", SUB, "--full", "--label", "laptop")
    _, worker, _ = _grant(root, capsys, "worker", "--sub", SUB, "--managed", "--parent", "cli", "--scope", "spawn")
    code, out, err = root.run(capsys, "actor", "list", "--json")
    owner = root.owner_of(SUB)
    assert (code, err) == (0, "")
    rows = json.loads(out)
    assert [(r["kind"], r["actor"]) for r in rows] == [("interactive", "cli"), ("managed", "worker")]
    assert rows[0] == {
        "owner": owner, "actor": "cli", "kind": "interactive", "scope": ["spawn", "role:default"],
        "allowSubscribe": [">"], "allowPublish": [">"], "role": None, "parent": None,
        "label": "laptop", "lifecycleUid": cli["lifecycleUid"], "grantedAt": rows[0]["grantedAt"],
    }  # fmt: skip
    assert rows[1]["parent"] == f"{owner}.cli" and rows[1]["lifecycleUid"] == worker["lifecycleUid"]
    assert "tokenHash" not in rows[1]


def test_list_plain_prints_one_line_per_row(root, capsys):
    assert root.run(capsys, "actor", "list") == (0, "no actors are granted in space default\n", "")
    _grant(root, capsys, "cli", "--sub", SUB, "--full")
    code, out, _ = root.run(capsys, "actor", "list")
    assert code == 0 and out.startswith(f"interactive {root.owner_of(SUB)}.cli scope=spawn,role:default ")


def test_a_corrupt_row_is_reported_after_the_good_ones_and_exits_1(root, capsys):
    _grant(root, capsys, "cli", "--sub", SUB, "--full")
    owner = root.owner_of(SUB)
    broken = root.space.actors_dir / f"{owner}.web.json"
    broken.write_text("{not json")
    stray = root.space.managed_dir / "notes.txt"
    os.makedirs(stray.parent, exist_ok=True)
    stray.write_text("hello")
    code, out, err = root.run(capsys, "actor", "list", "--json")
    assert code == 1
    assert [row["actor"] for row in json.loads(out)] == ["cli"]
    lines = err.splitlines()
    assert lines[0] == f"cotal: {broken}: ledger row {owner}.web is corrupt: it is not UTF-8 JSON - re-grant it with `cotal actor grant`"
    assert lines[1] == f"cotal: {stray}: the file name is not <owner>.<actor>.json"


def test_a_principal_in_both_folders_is_reported_as_a_broken_ledger(root, capsys):
    _grant(root, capsys, "cli", "--sub", SUB, "--full")
    owner = root.owner_of(SUB)
    _grant(root, capsys, "other", "--sub", SUB, "--managed")
    # A broken ledger the CLI itself never writes: the managed row rewritten as cli's.
    managed = root.space.managed_dir / f"{owner}.other.json"
    doc = json.loads(managed.read_text())
    (root.space.managed_dir / f"{owner}.cli.json").write_text(json.dumps({**doc, "actor": "cli"}))
    managed.unlink()
    code, _, err = root.run(capsys, "actor", "list")
    assert code == 1 and "has both an interactive and a managed row" in err


# --- input that is not text -------------------------------------------------------------------

# What Python makes of the argv bytes b"al\xe9x" (Latin-1, not UTF-8): a lone surrogate per bad byte.
NOT_UTF8 = os.fsdecode(b"al\xe9x")
NOT_UTF8_SENTENCE = (
    "--sub holds bytes that are not UTF-8 (the shell's locale is not UTF-8?) - pass the subject as UTF-8 text,"
    " exactly as the IdP's token carries it"
)


@pytest.mark.parametrize("command", ["grant", "revoke"])
def test_a_sub_from_non_utf8_argv_is_refused_not_derived(root, capsys, command):
    """Issue 17 review item 5: ``--sub`` from non-UTF-8 argv bytes reaches Python as ``\\udcXX``
    surrogates and derived an owner no IdP will ever send; it is refused in one sentence."""
    assert NOT_UTF8 == "al\udce9x"
    code, out, err = root.run(capsys, "actor", command, "cli", "--sub", NOT_UTF8)
    assert (code, out) == (1, "") and _one_sentence(err) == NOT_UTF8_SENTENCE
    assert _files_under(root.space.actors_dir) == []


def test_a_dev_idp_token_for_a_non_utf8_sub_is_refused(root, capsys):
    code, out, err = root.run(capsys, "dev-idp", "token", "--sub", NOT_UTF8)
    assert (code, out) == (1, "") and _one_sentence(err) == NOT_UTF8_SENTENCE
