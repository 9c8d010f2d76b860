"""``cotal auth-service`` is a deprecated entry (spec "Callout replicas", issue 19 item 7).

It says so once on stderr, naming the service presets that replace it (``cotal service install
auth-service|callout-replica``), and never again while it runs: not when a lane fails and is
restarted, not when SIGHUP rereads the manifest. The presets' entry, ``cotal service run
auth-service|callout-replica`` (what their units' ``ExecStart`` runs), and ``cotal up`` never
print it. The hosts serve a manifest listing a space the root does not hold, so its lane fails
and is retried every 5 s with no broker needed; ``cotal up`` runs its own real nats-server.
"""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cotal_trio.broker.process import free_port
from cotal_trio.cli import main
from cotal_trio.cli.auth_service import DEPRECATED

from tests.support.up_process import _start, _stop, _wait_ready

GHOST_MANIFEST = '{"version": 2, "spaces": [{"space": "ghost"}]}\n'
FAILED = "space ghost: lane failed, retrying in 5 s"
CEILING_S = 30


def _host(tmp_path: Path, *entry: str) -> subprocess.Popen[str]:
    """``cotal <entry> --spaces <a manifest of one unprovisioned space>`` on an empty root."""
    (tmp_path / "root").mkdir()
    manifest = tmp_path / "spaces.json"
    manifest.write_text(GHOST_MANIFEST)
    argv = [sys.executable, "-m", "cotal_trio", *entry, "--spaces", str(manifest), "--root", str(tmp_path / "root"),
            "--server", f"nats://127.0.0.1:{free_port()}"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stderr_until(proc: subprocess.Popen[str], wanted: str, count: int) -> list[str]:
    """stderr's lines until ``count`` of them hold ``wanted`` (the process still runs)."""
    lines: list[str] = []
    deadline = time.monotonic() + CEILING_S
    while sum(wanted in line for line in lines) < count:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError(f"no {count} x {wanted!r} on stderr: {lines} {proc.stderr.read()}")
        if select.select([proc.stderr], [], [], 0.5)[0]:
            line = proc.stderr.readline()
            if line:
                lines.append(line.rstrip("\n"))
    return lines


def _stop_host(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=CEILING_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    return err


def test_the_note_names_the_presets():
    assert DEPRECATED == (
        "cotal: `cotal auth-service` is a deprecated entry, kept for existing units and scripts - new setups use"
        " the service presets `cotal service install auth-service` (the full service) and `cotal service install"
        " callout-replica` (a replica), whose units run `cotal service run auth-service|callout-replica`"
        " with the same flags"
    )


@pytest.mark.parametrize("entry", [("auth-service",), ("auth-service", "--callout-only")])
def test_auth_service_says_it_once_across_lane_restarts_and_a_reload(tmp_path, entry):
    proc = _host(tmp_path, *entry)
    lines = _stderr_until(proc, FAILED, 1)
    proc.send_signal(signal.SIGHUP)  # the host rereads its manifest
    lines += _stderr_until(proc, FAILED, 1)  # the lane restarted once more after the reload
    err = "\n".join(lines) + "\n" + _stop_host(proc)
    assert err.splitlines()[0] == DEPRECATED  # before anything the host logs
    assert err.count("deprecated") == 1
    assert sum(FAILED in line for line in err.splitlines()) >= 2


def _exec_start(capsys, preset: str, *flags: str) -> list[str]:
    """The words of the ``ExecStart`` line ``cotal service render <preset> <flags>`` prints."""
    capsys.readouterr()
    assert main(["service", "render", preset, *flags]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()  # tmp_path holds no blank: no quoted word


@pytest.mark.parametrize("preset", ["auth-service", "callout-replica"])
def test_the_presets_unit_command_never_says_it(tmp_path, capsys, preset):
    """The unit's own ExecStart, run as systemd would run it, serves and prints no note."""
    (tmp_path / "root").mkdir()
    manifest = tmp_path / "spaces.json"
    manifest.write_text(GHOST_MANIFEST)
    argv = _exec_start(capsys, preset, "--spaces", str(manifest), "--root", str(tmp_path / "root"),
                       "--server", f"nats://127.0.0.1:{free_port()}")
    assert argv[1:4] == ["service", "run", preset] and "--callout-only" not in argv
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = _stderr_until(proc, FAILED, 2)  # started, failed, restarted, failed
    err = "\n".join(lines) + "\n" + _stop_host(proc)
    assert "deprecated" not in err
    assert "cotal auth-service" not in err


def test_a_refused_start_is_its_one_error_line(tmp_path):
    """A start refused for its flags says only why: the note comes once serving starts."""
    done = subprocess.run(
        [sys.executable, "-m", "cotal_trio", "auth-service", "--spaces", str(tmp_path / "none.json"),
         "--root", str(tmp_path), "--server", f"nats://127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"cotal: --spaces {tmp_path / 'none.json'}: {tmp_path / 'none.json'} does not exist - write the manifest"
        ' there (an empty one is {"version": 2, "spaces": []}), or pass the path of an existing one'
    ]


def test_cotal_up_never_says_it(tmp_path):
    """`cotal up` hosts its space through the service layer, not the deprecated entry."""
    proc = _start(tmp_path / "root", "--port", str(free_port()))
    out = "".join(_wait_ready(proc))
    code, err = _stop(proc)
    assert code == 0, err
    assert "deprecated" not in out + err
    assert "service install" not in out + err
