"""``cotal doctor auth`` checks what start-up checks (issue 18 item 9), with ``cotal up`` running a
real nats-server: a revocation recorded while no broker ran is a finding (it once said
``healthy``) until it is pushed, read from the broker's own account (``CLAIMS.LOOKUP``) or, with
the broker stopped, from the account it stored; each finding's fix is named once.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cotal_trio.broker.process import free_port
from cotal_trio.state import RootPaths

from tests.support.up_process import _start, _stop, _wait_ready

pytestmark = pytest.mark.broker


def _cotal(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cotal_trio", *argv, "--root", str(root)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"},
    )


def _doctor(root: Path) -> tuple[int, dict]:
    done = _cotal(root, "doctor", "auth", "--json")
    return done.returncode, json.loads(done.stdout)


def test_a_revocation_never_pushed_is_a_finding_until_it_is(tmp_path):
    root, port = tmp_path / "root", free_port()
    up = _start(root, "--port", str(port))
    _wait_ready(up)
    try:
        assert _cotal(root, "space", "add", "st", "--static").returncode == 0
        minted = _cotal(root, "auth", "mint", "--space", "st", "--label", "bot", "--json")
        assert minted.returncode == 0, minted.stderr
        key = json.loads(minted.stdout)["userKey"]
    finally:
        assert _stop(up, signal.SIGINT)[0] == 0
    revoked = _cotal(root, "auth", "revoke-credential", "bot", "--space", "st")
    assert revoked.returncode == 0 and "no broker running" in revoked.stdout

    fix = f"cotal auth revoke-credential bot --space st --root {root}"
    account = json.loads(RootPaths(root).space("st").accounts_json.read_text())["data"]["account"]
    stored = root / "broker" / "resolver" / f"{account}.jwt"
    code, report = _doctor(root)
    assert (code, report["healthy"], report["next"]) == (1, False, fix)
    assert [(f["subject"], f["problem"]) for f in report["findings"]] == [
        ("space st", f"the account the broker stored ({stored}) does not carry the revocation of {key} "
                     "(credential bot): the broker admits it"),
    ]

    up = _start(root)  # a static space is not pushed at start: the broker still admits the key
    _wait_ready(up)
    try:
        code, report = _doctor(root)
        assert (code, report["next"]) == (1, fix)
        assert [(f["subject"], f["problem"], f["next"]) for f in report["findings"]] == [
            ("space st", f"the broker at nats://127.0.0.1:{port} does not carry the revocation of {key} "
                         "(credential bot): the broker admits it", fix),
        ]  # one finding, one fix: not a second one for the account JWTs that differ
        pushed = _cotal(root, *shlex.split(fix)[1:-2])  # the named command (its --root is _cotal's)
        assert pushed.returncode == 0 and f"pushed to nats://127.0.0.1:{port}" in pushed.stdout, pushed.stderr
        code, report = _doctor(root)
        assert (code, report["healthy"], report["findings"]) == (0, True, [])
    finally:
        assert _stop(up, signal.SIGINT)[0] == 0
    code, report = _doctor(root)  # stopped again: the stored account carries it now
    assert (code, report["healthy"], report["findings"]) == (0, True, [])
