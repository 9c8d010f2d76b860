"""Scripts can tell outcomes apart (issue 18 item 7): exit statuses and closed pipes.

A usage error exits :data:`ExitCode.USAGE` (64), never the "retry later" 2 of spec "Connect
limits"; docs/cli.md's exit-status table is rendered from :data:`EXIT_TABLE`; a reader that goes
away (``cotal ... | head -1``) ends every command quietly with :data:`ExitCode.CLOSED_PIPE`.
The pipe tests run the venv's real ``cotal`` with a stdout whose reader is already closed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cotal_trio.cli import app, main
from cotal_trio.cli.exits import EXIT_TABLE, ExitCode
from cotal_trio.cli.reference import render

from tests.support.cli_commands import _commands

from tests.support.cli_root import Root
from tests.support.up_process import COTAL, run_into_closed_pipe


def exit_of(argv: list[str]) -> int:
    """``main(argv)``'s status, also when something inside calls ``sys.exit``."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 1


@pytest.mark.parametrize("argv", [
    ["exchange", "--bogus"],
    ["nosuch"],
    ["exchange", "--actor", "cli", "--idp-token", "x", "--ttl", "abc"],
    ["dev-idp", "token"],
])
def test_a_usage_error_exits_64_not_the_retry_later_2(argv, capsys):
    assert exit_of(argv) == ExitCode.USAGE == 64
    assert capsys.readouterr().err  # cyclopts' panel names what is wrong


@pytest.mark.parametrize(("argv", "subcommand"), [
    (["doctor"], "auth"),
    (["space"], "add"),
    (["auth"], "mint"),
    (["service"], "run"),
    (["service", "run"], "auth-service"),
])
def test_a_command_group_without_its_subcommand_is_a_usage_error(argv, subcommand, capsys):
    """``cotal doctor`` alone checked nothing: it prints its usage (the subcommands) where usage
    errors go, stderr, and exits 64 as an unknown command does, never 0 ("checked, all well")."""
    assert exit_of(argv) == ExitCode.USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert f"Usage: cotal {' '.join(argv)} COMMAND" in err and subcommand in err


def test_cotal_alone_still_prints_its_help_and_exits_0(capsys):
    assert exit_of([]) == ExitCode.OK
    assert "Usage: cotal COMMAND" in capsys.readouterr().out


def test_a_refusal_still_exits_1(root: Root, capsys):
    code, out, err = root.run(capsys, "exchange", "--actor", "cli", "--idp-token", "x")
    assert (code, out) == (ExitCode.FAILED, "") and err.startswith("cotal: ")


def test_the_exit_table_lists_every_code_once_with_its_commands():
    assert sorted(row.code for row in EXIT_TABLE) == sorted(ExitCode)
    text = render()
    table = text[text.index("## Exit status"):]
    for row in EXIT_TABLE:
        who = ", ".join(f"`{c}`" for c in row.commands) or "every command"
        assert f"| {int(row.code)} | `{row.code.name}` | {who} |" in table
    assert "| 2 | `DEPENDENCY_UNAVAILABLE` | `cotal exchange`, `cotal agent-bearer` |" in table
    assert "| 64 | `USAGE` | every command |" in table


def test_the_commands_the_table_names_are_commands_of_the_app():
    named = {command for row in EXIT_TABLE for command in row.commands}
    assert named and named <= {" ".join(path) for path in _commands(app)}


@pytest.mark.parametrize("argv", [
    ("dev-idp", "token", "--sub", "alice"),
    ("dev-idp", "token", "--sub", "alice", "--json"),
    ("connect-info",),
    ("connect-info", "--json"),
    ("space", "list"),
    ("doctor", "auth"),
])
def test_a_closed_pipe_ends_every_command_quietly(root: Root, argv):
    done = run_into_closed_pipe(*argv, "--root", str(root.paths.root))
    assert (done.returncode, done.stderr) == (ExitCode.CLOSED_PIPE, "")


def test_a_closed_pipe_ends_help_quietly():
    done = run_into_closed_pipe("--help")
    assert (done.returncode, done.stderr) == (ExitCode.CLOSED_PIPE, "")


def test_an_open_pipe_is_unchanged(root: Root):
    done = subprocess.run([COTAL, "dev-idp", "token", "--sub", "alice", "--json", "--root", str(root.paths.root)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert set(json.loads(done.stdout)) == {"token", "sub", "issuer", "audience", "exp"}


def test_a_broken_socket_is_not_a_closed_pipe(root: Root, capsys, monkeypatch):
    """A BrokenPipeError from the auth service's socket is a failure with its sentence, not 141."""
    def broken(*_args, **_kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("cotal_trio.cli.client.run_exchange", broken)
    read_end, write_end = os.pipe()  # stdout is a pipe whose reader is still there
    with os.fdopen(read_end) as reader, os.fdopen(write_end, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        code = main(["exchange", "--actor", "cli", "--idp-token", "x", "--root", str(root.paths.root)])
        monkeypatch.undo()
        stdout.close()
        assert reader.read() == ""
    assert (code, capsys.readouterr().err) == (ExitCode.FAILED, "cotal: [Errno 32] Broken pipe\n")


def test_a_ctrl_c_while_the_command_is_imported_ends_with_130_and_runs_nothing(monkeypatch, capsys, tmp_path):
    """A SIGINT during the command's imports is noted, not raised into the import system (where
    Python can drop it: tests/cli/test_up_interrupt.py under load), and the run ends with 130
    before the command starts (issue 15 item 9)."""
    import signal
    import weakref

    import cotal_trio.cli as cli

    real = cli._bare_group

    def interrupted_while_importing(app, argv):
        # The signal's handler runs inside a weakref callback, as inside the import system's
        # _get_module_lock one: a KeyboardInterrupt raised there is printed and dropped.
        lock = type("ModuleLock", (), {})()
        ref = weakref.ref(lock, lambda _ref: signal.raise_signal(signal.SIGINT))
        del lock
        assert ref() is None
        return real(app, argv)

    monkeypatch.setattr(cli, "_bare_group", interrupted_while_importing)
    root = tmp_path / "root"
    assert cli.main(["space", "list", "--root", str(root)]) == 130
    out, err = capsys.readouterr()
    assert (out, err) == ("", "")  # nothing printed: no "Exception ignored", no command output
    assert not root.exists()  # the command never ran
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # trio's to take over
