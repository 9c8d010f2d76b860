"""``cotal auth-service`` at start: a host that would serve nothing is not up (issue 18 item 6).

A missing ``--spaces`` manifest is refused before the service starts (no ``READY=1`` under
systemd), an empty one is served and says so, and ``--space`` on a static space names its mode.
None of these reaches a broker: the ``--server`` port is free and nothing listens there.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cotal_trio.broker.process import free_port
from cotal_trio.cli import main

EMPTY_MANIFEST = '{"version": 2, "spaces": []}\n'


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "cotal_trio", "auth-service", "--server", f"nats://127.0.0.1:{free_port()}", *args]


def _notify_socket(tmp_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.setblocking(False)
    return sock


def _datagrams(sock: socket.socket) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(sock.recv(4096))
        except BlockingIOError:
            return got


def test_a_missing_manifest_is_refused_at_start_and_never_ready(tmp_path):
    (tmp_path / "root").mkdir()
    with _notify_socket(tmp_path) as sock:
        done = subprocess.run(
            _argv("--root", str(tmp_path / "root"), "--spaces", "missing.json"), cwd=tmp_path,
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock")},
        )
        sent = _datagrams(sock)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.strip().splitlines() == [
        f"cotal: --spaces missing.json: {tmp_path / 'missing.json'} does not exist - write the manifest there"
        ' (an empty one is {"version": 2, "spaces": []}), or pass the path of an existing one'
    ]
    assert not any(b"READY=1" in datagram for datagram in sent)
    assert not (tmp_path / "missing.json.applied").exists()


def test_an_empty_manifest_is_served_and_says_it_lists_none(tmp_path):
    (tmp_path / "root").mkdir()
    manifest = tmp_path / "spaces.json"
    manifest.write_text(EMPTY_MANIFEST)
    proc = subprocess.Popen(
        _argv("--root", str(tmp_path / "root"), "--spaces", str(manifest)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        fd, data, deadline = proc.stdout.fileno(), b"", time.monotonic() + 30
        while b"\n" not in data and time.monotonic() < deadline and proc.poll() is None:
            if select.select([fd], [], [], 0.5)[0]:
                data += os.read(fd, 4096)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert data.decode().splitlines()[0] == (
        f"✓ auth-service up - serving 0 spaces - the manifest lists none (from {manifest}, "
        f".applied at {manifest}.applied)"
    )
    assert proc.returncode == 0


def test_a_static_space_names_its_mode(tmp_path, capsys):
    root = str(tmp_path / "root")
    assert main(["space", "add", "st", "--static", "--root", root, "--new-root"]) == 0
    capsys.readouterr()
    code = main(["auth-service", "--space", "st", "--root", root, "--server", f"nats://127.0.0.1:{free_port()}"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err == (
        "cotal: space st is a static space: it has no auth callout - its clients connect with minted "
        "credentials (cotal auth mint)\n"
    )


@pytest.mark.parametrize("entry", [["auth-service"], ["service", "run", "auth-service"]])
def test_a_broker_that_refuses_the_connect_is_named_with_the_fix(tmp_path, capsys, entry):
    """``--server`` at a closed loopback port: the one line says the broker there did not answer
    and names the fix (start it, or pass the right --server), not only the socket's errno."""
    root = str(tmp_path / "root")
    assert main(["space", "add", "s", "--root", root, "--new-root"]) == 0
    capsys.readouterr()
    url = f"nats://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "cotal_trio", *entry, "--space", "s", "--root", root, "--server", url],
        capture_output=True, text=True, timeout=60,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.strip().splitlines()[-1] == (
        f"cotal: the broker at {url} did not answer (connection refused) - start it (`cotal up --root {root}`, "
        "or the broker's unit), or pass the right --server"
    )
