"""Ctrl-C always stops ``cotal up`` (issue 15 item 9).

SIGINT at any moment of the start (before trio runs, while the broker starts, while the lane
starts, once it serves) ends the process and the nats-server it started within a few seconds,
with no traceback. Each run has its own root and port; the test stops only what it started, by
pid.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cotal_trio.broker.process import free_port

pytestmark = pytest.mark.broker

# SIGINT is sent this many seconds after the spawn, one run each: from the interpreter's
# imports through the broker's and the lane's start to serving (a start takes ~1-3 s here).
DELAYS_S = [0.125 * i for i in range(25)]  # 0.0 .. 3.0
# How long the process (and its broker) may take to end after the SIGINT: the bound.
STOP_BOUND_S = 5.0
# How a run may end: 0 (stopped in order once trio runs), 130 (Ctrl-C caught before it, cli
# main), or killed by SIGINT itself (the interpreter's first milliseconds, before any Python
# handler: the shell's usual Ctrl-C, no traceback).
ENDINGS = (0, 130, -signal.SIGINT)
# The loop bound of each wait; a process still running then is killed and the run fails.
CEILING_S = 20.0


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _broker_pids(root: Path, seen: set[int]) -> set[int]:
    """The broker pid the root records, collected while the run goes (the file goes with it)."""
    try:
        seen.add(int((root / "broker" / "nats-server.pid").read_text()))
    except (OSError, ValueError):
        pass
    return seen


def _children(pid: int) -> set[int]:
    """Pids whose parent is ``pid`` (the nats-server child, even before the pid file exists)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


def _traceback_of_ours(err: str) -> bool:
    """A traceback with a frame in a cotal_trio subpackage (the command's code). One from the
    interpreter's own start (site, runpy, the package's bare ``__init__``/``__main__``) is
    outside any program's reach, so it is not counted (possible only in the first ~0.1 s)."""
    return "Traceback" in err and re.search(r'File ".*/cotal_trio/[a-z_]+/', err) is not None


def _one_run(tmp_path: Path, delay_s: float) -> tuple[float, int, str, set[int]]:
    """Start ``cotal up``, SIGINT it after ``delay_s``; (seconds to exit, code, stderr, brokers)."""
    root = tmp_path / f"root-{delay_s}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cotal_trio", "up", "--root", str(root), "--port", str(free_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    brokers: set[int] = set()
    try:
        deadline = time.monotonic() + delay_s
        while time.monotonic() < deadline:
            brokers |= _children(proc.pid)
            _broker_pids(root, brokers)
            time.sleep(0.01)
        brokers |= _children(proc.pid)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            _, err = proc.communicate(timeout=CEILING_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            return CEILING_S, -1, err, brokers
        # The broker goes with the process: the last one is gone by the time it exits, or soon.
        while any(_alive(pid) for pid in brokers) and time.monotonic() - sent < CEILING_S:
            time.sleep(0.02)
        return time.monotonic() - sent, proc.returncode, err, brokers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in brokers:  # only the broker this run started
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigint_at_any_moment_of_the_start_stops_up_and_its_broker(tmp_path):
    failures, measured = [], []
    for delay in DELAYS_S:
        took, code, err, brokers = _one_run(tmp_path, delay)
        measured.append((delay, round(took, 2), code))
        left = [pid for pid in brokers if _alive(pid)]
        # Interrupted in the interpreter's own start (site, runpy): Python prints its own error
        # and picks the code (1 for "init_import_site"), before any line of the command runs.
        in_interpreter = "KeyboardInterrupt" in err and not _traceback_of_ours(err)
        if took > STOP_BOUND_S or (code not in ENDINGS and not in_interpreter) or _traceback_of_ours(err) or left:
            failures.append((delay, round(took, 2), code, left, err[-600:]))
    print("delay s, seconds from SIGINT to process and broker gone, exit code:", measured)
    assert failures == []


# A serving command whose stop hangs (a shielded sleep after the first signal), on the CLI's
# own signal handling (cli/common.py serve_until_signal).
_HANGING_STOP = """
import trio
from cotal_trio.cli.common import serve_until_signal

async def main():
    async with serve_until_signal("hanging") as nursery:
        print("ready", flush=True)
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                print("stopping", flush=True)
                await trio.sleep(60)

trio.run(main)
"""


def _read_line(proc: subprocess.Popen[str], ceiling_s: float = CEILING_S) -> str:
    deadline = time.monotonic() + ceiling_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            return proc.stdout.readline().strip()
    return ""


def test_a_second_sigint_ends_a_stop_that_hangs_at_once():
    proc = subprocess.Popen([sys.executable, "-c", _HANGING_STOP], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _read_line(proc) == "ready"
        proc.send_signal(signal.SIGINT)
        assert _read_line(proc) == "stopping"  # the first one stopped it in order: it hangs there
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=CEILING_S)
        print(f"exited {proc.returncode} {time.monotonic() - sent:.2f} s after the second SIGINT")
        assert proc.returncode == 130
        assert err.splitlines() == ["hanging: SIGINT - stopping", "hanging: second SIGINT - exiting now"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_two_quick_sigints_on_a_serving_up_leave_no_broker(tmp_path):
    root = tmp_path / "root"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cotal_trio", "up", "--root", str(root), "--port", str(free_port())],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _read_line(proc).startswith("✓ auth service up") and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
        broker = int((root / "broker" / "nats-server.pid").read_text())
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=CEILING_S)
        while _alive(broker) and time.monotonic() - sent < CEILING_S:
            time.sleep(0.02)
        print(f"exited {proc.returncode}; process and broker gone {time.monotonic() - sent:.2f} s after")
        assert proc.returncode in ENDINGS and not _alive(broker), err  # -2: the second came as it exited
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_ctrl_c_wrapped_by_an_import_is_still_a_quiet_130(monkeypatch, capsys):
    """Found by the issue 15 fresh-user check (1 run in 65): a SIGINT landing inside a dataclass's
    ``__set_name__`` during an import reaches main as ``RuntimeError: Error calling __set_name__``
    caused by the KeyboardInterrupt; it is a Ctrl-C all the same: exit 130, nothing printed."""
    import cotal_trio.cli as cli

    def interrupted_import() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance 'seen' in '_Source'") from interrupt

    monkeypatch.setattr(cli, "_app", interrupted_import)
    assert cli.main(["status"]) == 130
    assert capsys.readouterr() == ("", "")
    monkeypatch.setattr(cli, "_app", lambda: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["status"])
