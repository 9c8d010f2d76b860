"""``cotal up``'s start banner names the spaces it hosts that are retrying, each with its reason.

The banner used to say ``hosting space default and 2 more (beta, ghost)`` while beta's lane had
failed its start (its issuer key was gone) and ghost's space was not in the root at all, both
retried every 5 s (DESIGN.md 5): only ``<root>/spaces.json.applied`` said so. It now waits for
every lane's first outcome, as ``cotal auth-service``'s banner does
(tests/cli/test_auth_service_banner_live.py), and names each lane retrying then in a line of its
own with the reason ``.applied`` records; a banner whose lanes all serve names none. Each start is
``python -m cotal_trio up`` on a real bundled nats-server at a free port.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path

import pytest

from cotal_trio.broker.process import free_port
from tests.support.up_process import COTAL, _start, _stop

pytestmark = pytest.mark.broker

LAST_LINE = "Stop with Ctrl-C."


def _banner(proc: subprocess.Popen[str], ceiling_s: float = 45) -> list[str]:
    """The banner's lines (stdout up to its last line); the process is killed if it never comes.

    Read from the descriptor, not the text file: its buffer would hold lines select() never sees.
    """
    out, deadline = b"", time.monotonic() + ceiling_s
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        out += os.read(proc.stdout.fileno(), 65536) if ready else b""
        lines = out.decode().split("\n")
        if LAST_LINE in lines:
            return lines[:lines.index(LAST_LINE) + 1]
    proc.kill()
    raise AssertionError(f"cotal up printed no whole banner: {out.decode()} {proc.communicate(timeout=10)}")


def _settled(applied: Path, ceiling_s: float = 10) -> dict:
    """``.applied``'s lanes once none is ``starting``: the host writes it just after a lane's
    outcome, so a reader at the banner can see the write before."""
    deadline = time.monotonic() + ceiling_s
    while True:
        spaces = json.loads(applied.read_text())["spaces"]
        if all(lane["state"] != "starting" for lane in spaces.values()) or time.monotonic() > deadline:
            return spaces
        time.sleep(0.05)


def _served(root: Path, *args: str) -> tuple[list[str], dict]:
    """Start ``cotal up`` on ``root``; its banner and ``.applied``'s lanes then; stop it (SIGTERM, exit 0)."""
    proc = _start(root, *args)
    try:
        lines = _banner(proc)
        applied = _settled(root / "spaces.json.applied")
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    return lines, applied


def test_the_banner_names_each_retrying_space_and_its_reason_and_only_those(tmp_path):
    root = tmp_path / "root"
    lines, _ = _served(root, "--port", str(free_port()))
    assert not [line for line in lines if "retrying" in line]  # its one space serves

    proc = _start(root)
    try:
        _banner(proc)
        added = subprocess.run([COTAL, "space", "add", "beta", "--root", str(root)], capture_output=True, text=True, timeout=60)
        assert added.returncode == 0, added.stderr
    finally:
        assert _stop(proc)[0] == 0
    lines, applied = _served(root)
    assert applied == {"beta": {"state": "serving"}, "default": {"state": "serving"}}
    assert "  hosting space default and 1 more (beta) from" in "\n".join(lines)
    assert not [line for line in lines if "retrying" in line]  # beta serves too: nothing to name

    # beta's material goes missing, and a hand-edited spaces.json lists a space the root lacks.
    (root / "spaces" / "beta" / "issuer.json").unlink()
    manifest = json.loads((root / "spaces.json").read_text())
    (root / "spaces.json").write_text(json.dumps({**manifest, "spaces": [*manifest["spaces"], {"space": "ghost"}]}))
    lines, applied = _served(root)
    # the fix for another space's file is `cotal space add`: a restarted `cotal up` makes only its own space's
    beta = f"{root}/spaces/beta/issuer.json is missing - run `cotal space add beta --root {root}` to provision the space again"
    ghost = f"space ghost is not in the root {root} - see `cotal space list`"
    assert applied == {
        "beta": {"state": "retrying", "reason": beta},
        "default": {"state": "serving"},
        "ghost": {"state": "retrying", "reason": ghost},
    }
    assert [line for line in lines if "retrying" in line] == [
        f"  retrying space beta every 5 s: {beta}",
        f"  retrying space ghost every 5 s: {ghost}",
    ]
    assert lines[0].startswith("✓ auth service up (space default)")  # its own space serves
