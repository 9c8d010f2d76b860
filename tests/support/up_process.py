"""`cotal` as a process: its exit codes, and `cotal up` started, waited on and stopped."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

COTAL = str(Path(sys.executable).parent / "cotal")


def run_into_closed_pipe(*argv: str) -> subprocess.CompletedProcess[str]:
    """The venv's ``cotal argv`` with a stdout whose reader is gone (``| head -0``, at once)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([COTAL, *argv], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)


READY = "✓ auth service up"


def _start(root: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cotal_trio", "up", "--root", str(root), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_ready(proc: subprocess.Popen[str], ceiling_s: float = 30) -> list[str]:
    lines, deadline = [], time.monotonic() + ceiling_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith(READY):
                return lines
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"cotal up did not become ready: {lines} {proc.stderr.read()}")


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[int, str]:
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def _wait_gone(pid: int, ceiling_s: float = 10) -> bool:
    deadline = time.monotonic() + ceiling_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _space_dir(root: Path) -> Path:
    return root / "spaces" / "default"
