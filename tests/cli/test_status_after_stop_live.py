"""Issue 15 item 11 end to end: after ``cotal up`` stops, nothing says it still serves.

A real ``python -m cotal_trio up`` (its own nats-server) on a fresh root: once stopped cleanly
(SIGTERM) its ``spaces.json.applied`` lists no lane; once killed (SIGKILL, nothing rewrites
anything) the files it left still name it, and the readers check that its pid is gone:
``cotal status`` says ``stopped`` and the client lookup (``cotal connect-info``-style, through
``read_service``) says the service is not running.
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
from cotal_trio.core.errors import ConfigError
from cotal_trio.http.client import read_service
from cotal_trio.state import RootPaths

from .test_up_process import _space_dir, _start, _stop, _wait_gone, _wait_ready

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
    code, status = _status(root)
    assert code == 1
    assert [(s["space"], s["state"]) for s in status["spaces"]] == [("default", "stopped")], status
    with pytest.raises(ConfigError, match="the auth service for space default is not running"):
        read_service(RootPaths(root).space("default"))
