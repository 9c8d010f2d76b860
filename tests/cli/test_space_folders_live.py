"""Issue 18 item 3 through the CLI, with ``cotal up`` running a real nats-server.

A mistyped ``--space`` under a running ``cotal up`` is named as such (once it answered with an
internal path: ``spaces/space.6e6f73756368/callout.json is missing - run cotal up``), and a root
an earlier version wrote (``spaces/space.<hex>/``) has its space folders renamed to the space
names at its next start. Each test stops only the processes it started, by pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cotal_trio.broker.process import free_port
from cotal_trio.state.space_folders import legacy_dir_name

from tests.support.up_process import _start, _stop, _wait_ready

pytestmark = pytest.mark.broker


def _cotal(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cotal_trio", *argv, "--root", str(root)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"},
    )


def test_a_mistyped_space_under_a_running_up_is_named(tmp_path):
    root = tmp_path / "root"
    proc = _start(root, "--port", str(free_port()))
    try:
        _wait_ready(proc)
        for argv in (["actor", "list"], ["connect-info"], ["check"], ["auth", "mint", "--label", "bot"]):
            done = _cotal(root, *argv, "--space", "nosuch")
            assert (done.returncode, done.stderr) == (
                1, f"cotal: space nosuch is not in the root {root} - see `cotal space list`\n"), argv
        listed = _cotal(root, "space", "list")
        assert listed.stdout == "default\tuser-auth\thosted\n"
        assert sorted(p.name for p in (root / "spaces").iterdir()) == ["default"]  # an `ls` reads as typed
    finally:
        code, err = _stop(proc)
    assert code == 0, err


def test_an_earlier_root_gets_its_folders_renamed_at_the_next_start(tmp_path):
    root, port = tmp_path / "root", free_port()
    first = _start(root, "--port", str(port))
    _wait_ready(first)
    assert _stop(first, signal.SIGINT)[0] == 0
    assert _cotal(root, "actor", "grant", "cli", "--sub", "alice", "--full").returncode == 0
    # What an earlier version left: the same files under spaces/space.<hex>/.
    os.rename(root / "spaces" / "default", root / "spaces" / legacy_dir_name("default"))
    before = _cotal(root, "actor", "list")
    assert (before.returncode, before.stderr) == (1, (
        f"cotal: space default is in the root {root} under its earlier folder name space.64656661756c74 - "
        "start `cotal up` (or `cotal auth-service`) on the root once: it renames the folder\n"))

    second = _start(root)
    try:
        _wait_ready(second)
        assert sorted(p.name for p in (root / "spaces").iterdir()) == ["default", legacy_dir_name("default")]
        old = root / "spaces" / legacy_dir_name("default")
        assert os.path.samefile(old / "sentinel.creds", root / "spaces" / "default" / "sentinel.creds")
        listed = _cotal(root, "actor", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert '"cli"' in listed.stdout  # the ledger row came along with its folder
    finally:
        code, err = _stop(second)
    assert code == 0, err
    assert (f"up: space folders renamed to their names in {root / 'spaces'} (default: sentinelCreds "
            f"{root / 'spaces' / 'default' / 'sentinel.creds'}; the old space.<hex> paths still resolve)") in err

    third = _start(root)  # nothing left to rename: no line
    _wait_ready(third)
    code, err = _stop(third)
    assert code == 0 and "renamed" not in err


def test_auth_service_renames_an_earlier_root_at_its_start(tmp_path, capsys):
    """`cotal auth-service` takes no lock for its life: it takes the root lock for the rename only.
    Nothing listens at --server, so the lane then fails to start (exit 1), after the rename."""
    from cotal_trio.cli import main

    from tests.support.cli_root import provision

    root = provision(tmp_path / "root").paths.root
    os.rename(root / "spaces" / "default", root / "spaces" / legacy_dir_name("default"))
    capsys.readouterr()
    code = main(["auth-service", "--space", "default", "--server", f"nats://127.0.0.1:{free_port()}", "--root", str(root)])
    out, err = capsys.readouterr()
    assert code == 1 and err.startswith("cotal: "), err
    assert out.splitlines()[0] == (
        f"space folders renamed to their names in {root / 'spaces'} (default: sentinelCreds "
        f"{root / 'spaces' / 'default' / 'sentinel.creds'}; the old space.<hex> paths still resolve)")
    assert sorted(p.name for p in (root / "spaces").iterdir()) == ["default", legacy_dir_name("default")]
    from cotal_trio.state import hold_root

    with hold_root(root):  # the lock was released after the rename (a later `cotal up` may start)
        pass
