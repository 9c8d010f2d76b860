"""A mistyped --space or --root is named as such, by every command (issue 18 item 3).

Every command taking ``--space`` finds the space through one helper
(:func:`cotal_trio.state.space_folders.require_space`, via ``Where.provisioned``), so each says
``space S is not in the root R - see `cotal space list``` for a space the root does not hold, and
``there is no root at R`` for a ``--root`` that holds no root; none names an internal path.
``cotal space add`` refuses a missing root unless ``--new-root`` is given.
"""

from __future__ import annotations

import pytest

from cotal_trio.cli import main

from tests.support.cli_root import Root

OWNER = "u_" + "a" * 26

# (argv without --root), one per command that takes --space.
COMMANDS = [
    ["actor", "list", "--space", "nosuch"],
    ["actor", "grant", "cli", "--sub", "alice", "--full", "--space", "nosuch"],
    ["actor", "revoke", "cli", "--sub", "alice", "--space", "nosuch"],
    ["exchange", "--actor", "cli", "--idp-token", "x.y.z", "--space", "nosuch"],
    ["agent-bearer", "--owner", OWNER, "--actor", "bot", "--token-file", "TOKEN", "--space", "nosuch"],
    ["connect-info", "--space", "nosuch"],
    ["check", "--space", "nosuch"],
    ["auth", "mint", "--label", "bot", "--space", "nosuch"],
    ["auth", "revoke-credential", "bot", "--space", "nosuch"],
    ["manager", "list", "--space", "nosuch"],
    ["dev-idp", "token", "--sub", "alice", "--space", "nosuch"],
    ["watch", "--space", "nosuch"],
    ["doctor", "auth", "--space", "nosuch"],
    ["space", "remove", "nosuch"],
    ["space", "deprovision", "nosuch", "--dry-run"],
    ["auth-service", "--space", "nosuch", "--server", "nats://127.0.0.1:4222"],
]


def _argv(argv: list[str], tmp_path) -> list[str]:
    token = tmp_path / "token"
    token.write_text("cotal-actor-token\n")
    token.chmod(0o600)
    return [str(token) if a == "TOKEN" else a for a in argv]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv[:2]))
def test_a_space_the_root_does_not_hold_is_named(root: Root, capsys, tmp_path, argv):
    code, out, err = root.run(capsys, *_argv(argv, tmp_path))
    assert (code, err) == (1, f"cotal: space nosuch is not in the root {root.paths.root} - see `cotal space list`\n"), out
    assert not (root.paths.spaces_dir / "nosuch").exists()


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv[:2]))
def test_a_root_that_does_not_exist_is_named(tmp_path, capsys, argv):
    typo = tmp_path / "typo"
    capsys.readouterr()
    assert main([*_argv(argv, tmp_path), "--root", str(typo)]) == 1
    assert capsys.readouterr().err == f"cotal: there is no root at {typo} - pass the --root of one (`cotal up` makes one)\n"
    assert not typo.exists()


def test_space_add_refuses_a_root_that_does_not_exist(tmp_path, capsys):
    typo = tmp_path / "typo"
    assert main(["space", "add", "beta", "--root", str(typo)]) == 1
    assert capsys.readouterr().err == (
        f"cotal: there is no root at {typo} - pass the --root of an existing one, or add --new-root to "
        "create one there (new operator keys)\n"
    )
    assert not typo.exists()  # no operator keys, no development IdP


def test_space_add_new_root_says_it_created_one(tmp_path, capsys):
    fresh = tmp_path / "fresh"
    assert main(["space", "add", "beta", "--root", str(fresh), "--new-root"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"created a new root at {fresh} (new operator keys)"
    assert out[1] == "added space beta (no broker running: accounts not pushed)"
    assert sorted(p.name for p in (fresh / "spaces").iterdir()) == ["beta"]  # the folder is the name
    # An existing root: no such line, and no flag needed.
    assert main(["space", "add", "gamma", "--root", str(fresh)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "added space gamma (no broker running: accounts not pushed)"
    assert sorted(p.name for p in (fresh / "spaces").iterdir()) == ["beta", "gamma"]


def test_space_add_refuses_a_name_that_casefolds_to_an_existing_one(tmp_path, capsys):
    """On a case-insensitive file system (macOS, Windows shares) spaces/Beta is spaces/beta."""
    fresh = tmp_path / "fresh"
    assert main(["space", "add", "beta", "--root", str(fresh), "--new-root"]) == 0
    capsys.readouterr()
    assert main(["space", "add", "Beta", "--root", str(fresh)]) == 1
    assert capsys.readouterr().err == (
        f"cotal: space Beta differs from the root's space beta only in letter case, and would share its "
        "folder on a case-insensitive file system - pick another name\n"
    )
    assert sorted(p.name for p in (fresh / "spaces").iterdir()) == ["beta"]
    assert main(["space", "add", "beta", "--root", str(fresh)]) == 0  # the same name re-adds


# Root-wide commands (no --space): a mistyped --root is named the same way, never an empty listing.
ROOT_COMMANDS = [["space", "list"], ["space", "list", "--json"], ["status"], ["status", "--json"]]


@pytest.mark.parametrize("argv", ROOT_COMMANDS, ids=" ".join)
def test_a_root_wide_command_names_a_root_that_does_not_exist(tmp_path, capsys, argv):
    typo = tmp_path / "typo"
    capsys.readouterr()
    assert main([*argv, "--root", str(typo)]) == 1
    assert capsys.readouterr() == ("", f"cotal: there is no root at {typo} - pass the --root of one (`cotal up` makes one)\n")
    assert not typo.exists()


def test_space_add_against_a_stopped_broker_names_the_fix(tmp_path, capsys):
    """``--server`` at a closed loopback port (a real refused TCP connect): the one line says the
    broker did not answer and names the fix, not only ``[Errno 111] Connect call failed``; a
    second ``cotal space add`` with the broker up pushes the accounts the first one kept."""
    from cotal_trio.broker.process import free_port

    root = str(tmp_path / "root")
    url = f"nats://127.0.0.1:{free_port()}"
    assert main(["space", "add", "s", "--root", root, "--new-root", "--server", url]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"cotal: the broker at {url} did not answer (connection refused) - start it (`cotal up --root {root}`, "
        "or the broker's unit) or pass the right --server, then run `cotal space add s` again: the space is "
        "provisioned, its accounts are not pushed"
    ]
