"""``cotal up`` as an operator runs it: a process with a bundled nats-server (issue 2 items 4-5).

Each test starts ``python -m cotal_trio up`` on a fresh root and a random port, and stops only
the processes it started, by pid.
"""

from __future__ import annotations

import signal
import socket

import pytest

from cotal_trio.broker.process import free_port
from tests.support.up_process import _alive, _space_dir, _start, _stop, _wait_gone, _wait_ready

pytestmark = pytest.mark.broker


def test_up_serves_and_stops_its_broker_on_sigterm(tmp_path):
    root, port = tmp_path / "root", free_port()
    proc = _start(root, "--port", str(port))
    banner = "".join(_wait_ready(proc))
    assert f"callout on nats://127.0.0.1:{port}" in banner
    broker_pid = int((root / "broker" / "nats-server.pid").read_text())
    assert _alive(broker_pid)
    assert (_space_dir(root) / "auth-service.json").stat().st_mode & 0o777 == 0o600
    code, err = _stop(proc)
    assert code == 0, err
    assert _wait_gone(broker_pid)
    assert not (_space_dir(root) / "auth-service.json").exists()
    assert not (root / "broker" / "nats-server.pid").exists()


def test_second_up_reuses_the_root(tmp_path):
    root, port = tmp_path / "root", free_port()
    first = _start(root, "--port", str(port))
    _wait_ready(first)
    _stop(first, signal.SIGINT)
    before = {p: p.read_bytes() for p in root.rglob("*.json") if p.name != "auth-service.json"}
    second = _start(root)  # the recorded port is used again
    assert f"nats://127.0.0.1:{port}" in "".join(_wait_ready(second))
    code, _ = _stop(second, signal.SIGINT)
    assert code == 0
    after = {p: p.read_bytes() for p in before}
    assert after == before
    assert (root / "broker.json").stat().st_mode & 0o777 == 0o600
    assert root.stat().st_mode & 0o777 == 0o700


def test_busy_port_is_one_sentence_and_leaves_the_root_intact(tmp_path):
    root, port = tmp_path / "root", free_port()
    first = _start(root, "--port", str(port))
    _wait_ready(first)
    _stop(first)
    before = {p: p.read_bytes() for p in root.rglob("*.json")}
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        proc = _start(root)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert err.strip().splitlines() == [f"cotal: port {port} on 127.0.0.1 is busy - stop whatever listens there or pass --port"]
    assert {p: p.read_bytes() for p in root.rglob("*.json")} == before


def test_corrupt_root_file_names_the_file(tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    (root / "broker.json").write_text("{not json")
    proc = _start(root, "--port", str(free_port()))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert err.startswith(f"cotal: {root / 'broker.json'} is corrupt") and "Traceback" not in err
    assert (root / "broker.json").read_text() == "{not json"


def test_missing_nats_server_names_the_fix(tmp_path):
    proc = _start(tmp_path / "root", "--port", str(free_port()), "--nats-server", str(tmp_path / "nope"))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "Traceback" not in err
    assert err.startswith("cotal: ") and "--nats-server" in err


def test_killed_up_leaves_no_broker_behind(tmp_path):
    root = tmp_path / "root"
    proc = _start(root, "--port", str(free_port()))
    _wait_ready(proc)
    broker_pid = int((root / "broker" / "nats-server.pid").read_text())
    proc.kill()
    proc.communicate(timeout=10)
    assert _wait_gone(broker_pid)


def test_a_second_up_on_a_running_root_is_refused_and_changes_nothing(tmp_path):
    root, port = tmp_path / "root", free_port()
    first = _start(root, "--port", str(port))
    _wait_ready(first)
    ready = (_space_dir(root) / "auth-service.json").read_bytes()
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.suffix in (".json", ".conf")}
    second = _start(root, "--port", str(free_port()))
    _, err = second.communicate(timeout=30)
    assert second.returncode == 1
    assert err.strip() == f"cotal: root {root} is already served by `cotal up` (pid {first.pid}) - stop it first, or pass another --root"
    after = {p: p.read_bytes() for p in before}
    assert after == before and (_space_dir(root) / "auth-service.json").read_bytes() == ready
    code, _ = _stop(first)
    assert code == 0


def test_a_busy_port_is_not_recorded(tmp_path):
    root, port = tmp_path / "root", free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        proc = _start(root, "--port", str(port))
        proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert not (root / "policy.json").exists()


def test_an_idp_whose_jwks_cannot_be_read_is_not_pinned(tmp_path):
    root, dead = tmp_path / "root", free_port()  # nothing listens there
    proc = _start(root, "--port", str(free_port()), "--idp", f"http://127.0.0.1:{dead}")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "Traceback" not in err
    assert f"could not read the IdP JWKS at http://127.0.0.1:{dead}/jwks" in err
    assert not (_space_dir(root) / "idp.json").exists()
    plain_http = _start(root, "--port", str(free_port()), "--idp", "http://idp.example")
    _, err = plain_http.communicate(timeout=30)
    assert plain_http.returncode == 1
    assert err.strip() == "cotal: the IdP JWKS URI http://idp.example/jwks must be https:// (or http:// on loopback) - fix --idp"


def test_a_damaged_sentinel_file_is_restored_at_start(tmp_path):
    root = tmp_path / "root"
    first = _start(root, "--port", str(free_port()))
    _wait_ready(first)
    _stop(first)
    sentinel = _space_dir(root) / "sentinel.creds"
    good = sentinel.read_text()
    sentinel.write_text("garbage")
    second = _start(root)
    _wait_ready(second)
    _, err = _stop(second)
    assert sentinel.read_text() == good
    assert f"{sentinel} did not match the space's callout.json - rewrote it" in err


def test_secrets_open_to_others_are_named_at_start(tmp_path):
    root = tmp_path / "root"
    first = _start(root, "--port", str(free_port()))
    _wait_ready(first)
    _stop(first)
    (root / "broker.json").chmod(0o644)
    second = _start(root)
    _wait_ready(second)
    _, err = _stop(second)
    assert f"{root / 'broker.json'} is open to group or others (mode 0644) - chmod 600 {root / 'broker.json'}" in err
    assert "callout.json is open" not in err


def test_after_sigkill_a_new_up_takes_over_the_claim(tmp_path):
    # The killed process still holds the space's plane claim; the new one waits for its lease
    # to lapse (DESIGN.md section 8) and comes up within two leases, as generation 2.
    root = tmp_path / "root"
    first = _start(root, "--port", str(free_port()))
    _wait_ready(first)
    broker_pid = int((root / "broker" / "nats-server.pid").read_text())
    first.kill()
    first.communicate(timeout=10)
    assert _wait_gone(broker_pid)
    second = _start(root)
    _wait_ready(second, ceiling_s=45)
    code, err = _stop(second)
    assert code == 0
    assert "plane claim generation 2 held by" in err


def test_user_auth_is_the_mode_and_no_user_auth_is_refused(tmp_path):
    root = tmp_path / "root"
    static = _start(root, "--no-user-auth", "--port", str(free_port()))
    _, err = static.communicate(timeout=30)
    assert static.returncode == 1
    assert err.strip() == (
        "cotal: cotal up serves user-auth spaces only - drop --no-user-auth; a static space is "
        "provisioned with `cotal space add NAME --static` and needs no auth service"
    )
    assert not root.exists()


def test_user_auth_refuses_to_change_the_idp_pin(tmp_path):
    # spec "Bridge contract" step 2: the pinned issuer keys every owner id.
    root = tmp_path / "root"
    first = _start(root, "--user-auth", "--port", str(free_port()))
    _wait_ready(first)
    _stop(first)
    pin = (_space_dir(root) / "idp.json").read_bytes()
    second = _start(root, "--user-auth", "--idp", "https://idp.example")
    _, err = second.communicate(timeout=30)
    assert second.returncode == 1 and "Traceback" not in err
    assert "cotal: space default is pinned to IdP urn:cotal:dev-idp:" in err
    assert "changing the pin re-keys every owner - keep the pinned IdP, or use a new space (--space)" in err
    assert (_space_dir(root) / "idp.json").read_bytes() == pin
