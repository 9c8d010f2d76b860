"""A hung broker is noticed (issue 15 item 5; spec "Callout replicas").

"A replica that loses a store connection or the broker stops answering and exits non-zero": a
broker that keeps its sockets open but answers nothing (here: SIGSTOPped) must be noticed in
seconds, not after nats-py's default pings (two minutes apart). Every connection a lane opens
PINGs its broker (natsio ``KEEPALIVE_S``) and counts it lost when no PONG comes back within
``PONG_TIMEOUT_S``.

The broker and the replica are started by the test and stopped by pid; the broker is resumed
(SIGCONT) in a ``finally``.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.manifest import SpaceEntry
from cotal_trio.devidp import jwks
from cotal_trio.service.host import HostConfig, run_host
from cotal_trio.lane.run import run_lane
from cotal_trio.lane.spec import FullLane, LaneCommon
from cotal_trio.natsio._conn import KEEPALIVE_S, PONG_TIMEOUT_S
from tests.support.service import AUTH_TIMEOUT_S, start_mesh, write_manifest, until_state

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

SPACE = "a"
READY = "✓ auth-service up"
# Loop bounds only (the measured time is printed): banner, and the exit after the SIGSTOP.
READY_CEILING_S = 30.0
EXIT_CEILING_S = 30.0


async def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], ceiling_s: float) -> None:
    deadline = time.monotonic() + ceiling_s
    while text not in path.read_text() and proc.poll() is None and time.monotonic() < deadline:
        await trio.sleep(0.05)
    assert text in path.read_text(), f"no {text!r} (exit {proc.poll()}): {path.read_text()}"


async def test_a_replica_whose_broker_hangs_exits_non_zero(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str):
    mesh, broker_pid = await start_mesh(nursery, tmp_path, nats_server_bin)
    out, err = tmp_path / "replica.out", tmp_path / "replica.err"
    with out.open("wb") as out_f, err.open("wb") as err_f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cotal_trio", "auth-service", "--space", SPACE, "--callout-only",
             "--server", mesh.server_url, "--root", str(mesh.paths.root), "--auth-timeout", str(AUTH_TIMEOUT_S)],
            stdout=out_f, stderr=err_f,
        )
    try:
        await _wait_for(out, READY, proc, READY_CEILING_S)
        os.kill(broker_pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            while proc.poll() is None and time.monotonic() - stopped < EXIT_CEILING_S:
                await trio.sleep(0.05)
            took = time.monotonic() - stopped
        finally:
            os.kill(broker_pid, signal.SIGCONT)
        print(f"replica exited {proc.poll()} {took:.1f} s after its broker stopped answering "
              f"(PING every {KEEPALIVE_S:g} s, PONG within {PONG_TIMEOUT_S:g} s)")
        assert proc.poll() == 1, err.read_text()
        last = err.read_text().strip().splitlines()[-1]
        assert last.startswith(f"cotal: space {SPACE}: ") and "no PING answered within" in last, last
        assert "Traceback" not in err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_full_lane_in_a_host_notices_a_hung_broker_and_serves_again(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str
):
    """DESIGN.md section 5: a lane that loses its broker ends alone and the host retries it. With
    the production plane lease (no fence for 30 s) it is the keepalive that ends it; once the
    broker answers again the retry takes its own claim back and serves."""
    mesh, broker_pid = await start_mesh(nursery, tmp_path, nats_server_bin)
    keys, holder = parse_jwks(jwks(mesh.idp)), f"{socket.gethostname()}:{os.getpid()}:4b1d0000"

    def start_lane(entry: SpaceEntry) -> Callable[..., object]:
        return functools.partial(run_lane, FullLane(
            space=entry.space, paths=mesh.paths.space(entry.space),
            common=LaneCommon(server_url=mesh.server_url, limits=CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S)),
            idp_keys=lambda: keys, holder=holder,
        ))

    manifest = tmp_path / "host" / "spaces.json"
    manifest.parent.mkdir()
    write_manifest(manifest, SPACE)
    with trio.fail_after(60):
        host = await nursery.start(run_host, HostConfig(
            manifest=manifest, start_lane=start_lane, retry_s=0.5, backstop_s=600,
        ))
        await until_state(host, manifest, "serving")
        mesh.grant(SPACE, "alice", "cli")
        bearer = await mesh.bearer(SPACE, "alice", "cli")
        os.kill(broker_pid, signal.SIGSTOP)
        try:
            stopped = trio.current_time()
            status = await until_state(host, manifest, "retrying", f"space {SPACE}: ")
            took = trio.current_time() - stopped
        finally:
            os.kill(broker_pid, signal.SIGCONT)
        print(f"the lane noticed {took:.1f} s after its broker stopped answering: {status['reason']}")
        assert "no PING answered within" in status["reason"], status
        await until_state(host, manifest, "serving")
        await mesh.admitted(SPACE, bearer)
