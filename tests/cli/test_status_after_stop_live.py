"""Issue 15 item 11 end to end: after ``cotal up`` stops, nothing says it still serves.

A real ``python -m cotal_trio up`` (its own nats-server) on a fresh root: once stopped cleanly
(SIGTERM) its ``spaces.json.applied`` lists no lane; once killed (SIGKILL, nothing rewrites
anything) the files it left still name it, and the readers check that its pid is gone:
``cotal status`` says ``stopped`` and the client lookup (``cotal connect-info``-style, through
``read_service``) says the service is not running. ``.applied`` names its writer's pid, so
``cotal status`` says no host runs (that pid is gone) and ``cotal space remove`` does not wait on
it (issue 15 item 11).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cotal_trio.broker.process import free_port
from cotal_trio.cli.space import LANE_WAIT_S
from cotal_trio.core.errors import ConfigError
from cotal_trio.http.client import read_service
from cotal_trio.state import RootPaths

from tests.support.up_process import _space_dir, _start, _stop, _wait_gone, _wait_ready

pytestmark = pytest.mark.broker


def _applied(root: Path) -> dict:
    return json.loads((root / "spaces.json.applied").read_text())


def _until_serving(root: Path, ceiling_s: float = 20) -> None:
    """The banner may come just before the host's `.applied` write that says so."""
    deadline = time.monotonic() + ceiling_s
    while _applied(root)["spaces"] != {"default": {"state": "serving"}}:
        assert time.monotonic() < deadline, _applied(root)
        time.sleep(0.05)


def _status(root: Path) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "cotal_trio", "status", "--json", "--root", str(root)],
        capture_output=True, text=True, timeout=30,
    )
    return done.returncode, json.loads(done.stdout)


def test_a_cleanly_stopped_up_leaves_applied_naming_no_lane(tmp_path):
    root = tmp_path / "root"
    proc = _start(root, "--port", str(free_port()))
    _wait_ready(proc)
    _until_serving(root)
    code, err = _stop(proc, signal.SIGTERM)
    assert code == 0, err
    assert _applied(root)["spaces"] == {}


def test_after_sigkill_the_readers_see_the_writer_is_gone(tmp_path):
    root = tmp_path / "root"
    proc = _start(root, "--port", str(free_port()))
    _wait_ready(proc)
    _until_serving(root)
    broker_pid = int((root / "broker" / "nats-server.pid").read_text())
    proc.kill()
    proc.communicate(timeout=10)
    assert _wait_gone(broker_pid)
    # What the killed process left: files that still name it as serving.
    assert _applied(root)["spaces"] == {"default": {"state": "serving"}}
    assert json.loads((_space_dir(root) / "auth-service.json").read_text())["pid"] == proc.pid
    assert _applied(root)["pid"] == proc.pid  # the writer, so readers can tell it is gone
    code, status = _status(root)
    assert code == 1
    gone = f"no host running (the last host, pid {proc.pid}, is gone)"
    assert [(s["space"], s["state"], s["reason"]) for s in status["spaces"]] == [("default", "stopped", gone)], status
    with pytest.raises(ConfigError, match="the auth service for space default is not running"):
        read_service(RootPaths(root).space("default"))
    # `cotal space remove` does not wait on a dead host's `.applied` for its LANE_WAIT_S.
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cotal_trio", "space", "remove", "default", "--root", str(root)],
        capture_output=True, text=True, timeout=60,
    )
    took_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == [f"  lane: {gone}"], done.stdout
    assert took_s < LANE_WAIT_S, took_s  # it waited out the limit before: ~10 s more
