"""``cotal check --json`` and the development IdP's JWKS in ``cotal connect-info`` against a
running ``cotal up`` (issue 18 items 5 and 7).

Each test starts the venv's ``cotal up`` on a fresh root and a random port (a real nats-server,
the bundled one), runs the venv's ``cotal`` against it, and stops only the process it started.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cotal_trio.broker.process import free_port
from cotal_trio.cli.exits import ExitCode
from cotal_trio.devidp import DevIdpMaterial
from cotal_trio.devidp.idp import jwks
from cotal_trio.state import RootPaths, list_rows

from tests.support.up_process import COTAL, run_into_closed_pipe, _start, _stop, _wait_ready

pytestmark = pytest.mark.broker

STEPS = [
    "the auth service is running",
    "IdP token from the development IdP",
    "exchange the IdP token for a bearer",
    "connect with the sentinel creds and the bearer",
    "publish and receive within the grant",
    "a publish outside the grant is refused",
    "a tampered bearer is refused",
]


def cotal(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COTAL, *argv, "--root", str(root)], capture_output=True, text=True, timeout=90)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Path]:
    """A running `cotal up` with the development IdP; its root."""
    root = tmp_path / "root"
    proc = _start(root, "--port", str(free_port()))
    try:
        _wait_ready(proc)
        yield root
    finally:
        _stop(proc)


def test_connect_info_names_the_jwks_cotal_up_serves(up: Path):
    done = cotal(up, "connect-info", "--json")
    assert (done.returncode, done.stderr) == (0, "")
    idp = json.loads(done.stdout)["idp"]
    assert idp["kind"] == "dev" and idp["jwksUri"].startswith("http://127.0.0.1:") and idp["jwksUri"].endswith("/jwks")
    with urllib.request.urlopen(idp["jwksUri"], timeout=10) as answer:
        served = json.loads(answer.read())
    assert served == jwks(DevIdpMaterial.from_json((up / "devidp.json").read_bytes()))
    plain = cotal(up, "connect-info")
    assert f"idp.jwksUri: {idp['jwksUri']}" in plain.stdout.splitlines()


def test_check_json_lists_the_steps_and_exits_0(up: Path):
    done = cotal(up, "check", "--json")
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == {"space": "default", "passed": True, "steps": STEPS, "failed": None}


def test_check_json_names_the_failing_step_and_exits_1(up: Path):
    done = cotal(up, "check", "--json", "--actor", "cli", "--idp-token", "not-a-jwt")
    assert done.returncode == ExitCode.FAILED, done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["passed"], outcome["steps"]) == (False, ["the auth service is running"])
    assert outcome["failed"]["step"] == "exchange the IdP token for a bearer" and outcome["failed"]["reason"]


def test_check_json_without_a_running_service_is_one_object(tmp_path: Path):
    root = tmp_path / "root"
    proc = _start(root, "--port", str(free_port()))
    _wait_ready(proc)
    _stop(proc)
    done = cotal(root, "check", "--json")
    outcome = json.loads(done.stdout)
    assert (done.returncode, outcome["passed"], outcome["steps"]) == (ExitCode.FAILED, False, [])
    assert outcome["failed"]["step"] == "" and "is not running" in outcome["failed"]["reason"]
    info = json.loads(cotal(root, "connect-info", "--json").stdout)
    assert info["idp"]["jwksUri"] == ""  # nothing serves the development IdP now


@pytest.mark.parametrize("argv", [("watch",), ("watch", "--json"), ("status",), ("check",)])
def test_a_closed_pipe_ends_a_command_on_a_running_root_quietly(up: Path, argv):
    done = run_into_closed_pipe(*argv, "--root", str(up))
    assert (done.returncode, done.stderr) == (ExitCode.CLOSED_PIPE, "")
    rows, corrupt = list_rows(RootPaths(up).space("default"))
    assert (rows, corrupt) == ([], [])  # check's temporary actor was revoked on the way out
