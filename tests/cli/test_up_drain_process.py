"""Issue 15 item 8 on a real ``cotal up`` process: SIGTERM drains the lanes, then the broker stops.

``python -m cotal_trio up --auth-timeout 4`` on a fresh root. ``HELD`` actors each have their
ledger row replaced by a FIFO (tests/support/issuance.py's ``stall``): a callout's read
of it blocks in ``open()`` for real, as on a hung disk, and the test sees each blocked read as a
thread of the process waiting in the kernel's ``wait_for_partner``. With every connect held
there, the test sends SIGTERM (or SIGINT, a Ctrl-C), waits until the stop is under way (``auth-service.json`` is
gone, the first thing a lane's drain does) and only then answers the reads: every held connect
must be admitted, and the process must exit 0 with its broker gone.

The broker outlives the drain because ``run_up`` stops it only once the lane host has returned
(service/embedded.py ``_run_broker``, shielded from the cancel once started). Checked: with that
shield off, the held connects are refused (the broker went with the cancel).
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.devidp import DevIdpMaterial, mint_dev_token
from cotal_trio.natsio import open_connection, open_loop
from cotal_trio.state import RootPaths, load_idp_pin, load_owner_secret, read_json, write_row
from tests.support.up_process import _start, _wait_gone, _wait_ready
from tests.support.stack import _post
from tests.support.issuance import release, stall

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

HELD = 4
CEILING_S = 60


def _blocked_in_fifo_open(pid: int) -> int:
    """Threads of ``pid`` waiting in ``open()`` of a FIFO for a writer."""
    count = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            count += (task / "wchan").read_text() == "wait_for_partner"
        except OSError:
            continue
    return count


def _grant(paths: RootPaths, sub: str, actor: str) -> Path:
    """Write ``actor``'s interactive row for ``sub`` in the default space; its path."""
    space = paths.space("default")
    owner = derive_owner(load_owner_secret(space.owner_secret_json), load_idp_pin(space.idp_json).issuer, sub)
    return write_row(space, LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=owner, actor=actor, scope=("spawn",),
        allow_subscribe=("team.>",), allow_publish=("team.>",), role=None, parent=None,
        label=None, token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
        granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    ))


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_stop_of_up_admits_the_connects_in_flight_then_stops_the_broker(tmp_path, stop):
    root = tmp_path / "root"
    proc = _start(root, "--port", str(free_port()), "--auth-timeout", "4")
    try:
        banner = "".join(await trio.to_thread.run_sync(_wait_ready, proc))
        server_url = banner.split("callout on ", 1)[1].split(",", 1)[0]
        paths = RootPaths(root)
        space = paths.space("default")
        broker_pid = int(paths.broker_pid.read_text())
        service = read_json(space.auth_service_json)
        sentinel = space.sentinel_creds.read_text()
        idp = DevIdpMaterial.from_json(paths.devidp_json.read_bytes())
        held: list[tuple[Path, bytes, str]] = []
        for n in range(HELD):
            path = _grant(paths, "alice", f"cli{n}")
            token = mint_dev_token(idp, sub="alice", now=int(time.time()))
            status, body = await trio.to_thread.run_sync(
                _post, service["url"] + "/exchange", service["cap"], {"idpToken": token, "actor": f"cli{n}"},
            )
            assert status == 200, body
            held.append((path, stall(path), body["token"]))
        results: list[str] = []

        async def connect(bearer: str, n: int) -> None:
            try:
                async with open_loop(), open_connection(
                    server_url, creds=sentinel, token=bearer, name=f"ibxheld{n}",
                    inbox_prefix=f"_INBOX_ibxheld{n}", reconnect=False,
                ) as conn:
                    await conn.flush()
            except Exception as exc:  # noqa: BLE001 - the test reports what the client saw
                results.append(f"refused: {exc!r}")
            else:
                results.append("admitted")

        with trio.fail_after(CEILING_S):
            async with trio.open_nursery() as clients:
                for n, (_, _, bearer) in enumerate(held):
                    clients.start_soon(connect, bearer, n)
                while _blocked_in_fifo_open(proc.pid) < HELD:
                    await trio.sleep(0.01)
                proc.send_signal(stop)
                while space.auth_service_json.exists():  # the stop is under way
                    await trio.sleep(0.01)
                for path, data, _ in held:
                    release(path, data)
            code = await trio.to_thread.run_sync(proc.wait)
        err = proc.stderr.read()
        assert results == ["admitted"] * HELD, err
        assert code == 0, err
        assert await trio.to_thread.run_sync(_wait_gone, broker_pid)
        assert not paths.broker_pid.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
