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


# Every port flag of the serving commands and their units, each in the command it belongs to.
_SERVER = ("--server", "nats://127.0.0.1:4222")
_UP = ("up",)
_AUTH_SERVICE = ("auth-service", "--space", "a")
_RUN_FULL = ("service", "run", "auth-service", "--space", "a")
_RUN_REPLICA = ("service", "run", "callout-replica", "--space", "a")
_RENDER_FULL = ("service", "render", "auth-service", "--space", "a", *_SERVER)
_RENDER_REPLICA = ("service", "render", "callout-replica", "--space", "a", *_SERVER)
_NODE_CONFIG = ("broker", "config", "--node", "n1", "--cluster-routes", "nats-route://127.0.0.1:6222")
_LEAF_CONFIG = ("broker", "leaf-config", "--node", "leaf1", "--hub", "nats-leaf://127.0.0.1:7422")
_ONE_TO = "A port is 1 to 65535 - pass one in that range."
_OR_FREE = "A port is 1 to 65535 - pass one in that range, or 0 for any free one."
OUT_OF_RANGE_PORTS = [
    (_UP, "--port", "0", _ONE_TO),
    (_UP, "--port", "70000", _ONE_TO),
    (_UP, "--port", "-1", _ONE_TO),
    (_UP, "--http-port", "65536", _OR_FREE),
    (_UP, "--http-port", "-1", _OR_FREE),
    (_UP, "--ops-port", "70000", _OR_FREE),
    (_UP, "--ops-port", "-1", _OR_FREE),
    (_UP, "--exchange-public-port", "0", _ONE_TO),
    (_UP, "--exchange-public-port", "70000", _ONE_TO),
    (_AUTH_SERVICE, "--ops-port", "70000", _OR_FREE),
    (_AUTH_SERVICE, "--exchange-public-port", "70000", _ONE_TO),
    (_RUN_FULL, "--ops-port", "70000", _OR_FREE),
    (_RUN_FULL, "--exchange-public-port", "0", _ONE_TO),
    (_RUN_REPLICA, "--ops-port", "-1", _OR_FREE),
    (_RENDER_FULL, "--ops-port", "70000", _OR_FREE),
    (_RENDER_FULL, "--exchange-public-port", "65536", _ONE_TO),
    (_RENDER_REPLICA, "--ops-port", "65536", _OR_FREE),
    (_NODE_CONFIG, "--port", "70000", _ONE_TO),
    (_NODE_CONFIG, "--cluster-port", "0", _ONE_TO),
    (_NODE_CONFIG, "--http-port", "65536", _ONE_TO),
    (_NODE_CONFIG, "--leafnodes", "70000", _ONE_TO),
    (_LEAF_CONFIG, "--port", "0", _ONE_TO),
    (_LEAF_CONFIG, "--http-port", "-1", _ONE_TO),
]


@pytest.mark.parametrize(("command", "flag", "value", "fix"), OUT_OF_RANGE_PORTS)
def test_an_out_of_range_port_is_a_usage_error_before_anything_starts(tmp_path, capsys, command, flag, value, fix):
    """A port outside 1-65535 (0 where a flag takes it for "any free one") is a malformed value:
    exit 64 with cyclopts' panel naming the flag, the range and the fix, where it used to be the
    refusal's 1 (and, for the serving presets, only after the broker address was looked up). The
    command never runs: no root is made, no broker starts."""
    root = tmp_path / "root"
    assert exit_of([*command, "--root", str(root), flag, value]) == ExitCode.USAGE
    out, err = capsys.readouterr()
    panel = " ".join(err.replace("│", " ").split())  # the panel's text, its wrapping undone
    assert out == "" and f'Invalid value "{value}" for {flag}. {fix}' in panel, err
    assert not root.exists()


@pytest.mark.parametrize(("flags", "tail"), [
    (("--ops-port", "0", "--exchange-public-port", "1"), " --exchange-public-port 1"),
    (("--ops-port", "65535", "--exchange-public-port", "65534"), " --ops-port 65535 --exchange-public-port 65534"),
])
def test_the_edges_of_the_port_range_are_ports(tmp_path, capsys, flags, tail):
    assert main([*_RENDER_FULL, "--root", str(tmp_path), *flags]) == ExitCode.OK
    [exec_start] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ExecStart=")]
    assert exec_start.endswith(tail)


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
