"""``cotal status`` (cotal_trio/cli/status.py) against a provisioned root, without a broker.

A "running lane" here is the real loopback face (hypercorn on port 0 in pytest-trio's
``nursery``) serving a :class:`LaneMetrics`, published through an ``auth-service.json`` the test
writes the way a lane does; ``.applied`` and ``up.lock`` are written as the host and ``cotal up``
write them. ``main`` blocks, so it runs in a worker thread. The live version (a real broker and
lane) is ``tests/lane/test_metrics_live.py``.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import subprocess
import time

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.cli import main
from cotal_trio.core.callout_log import CalloutRecord, Outcome
from cotal_trio.core.manifest import LaneStatus, render_applied
from cotal_trio.http import build_loopback_app, serve_app
from cotal_trio.lane.callout.responder import CalloutStatistics
from cotal_trio.lane.metrics import LaneMetrics
from cotal_trio.state import atomic_write, write_json

from tests.support.cli_root import SPACE, Root
from tests.support.cli_client import _context

CEILING_S = 10
RETRY_REASON = "space beta: the broker closed the callout connection (no reason given)"
NOT_RUNNING = "cotal status: no auth service is running for root {root} - start it with `cotal up`\n"


async def _status(root: Root, capsys, *flags: str) -> tuple[int, str, str]:
    """``cotal status <flags> --root <root>`` in a worker thread: (exit code, stdout, stderr)."""
    capsys.readouterr()
    with trio.fail_after(CEILING_S):
        code = await trio.to_thread.run_sync(main, ["status", *flags, "--root", str(root.paths.root)])
    out, err = capsys.readouterr()
    return code, out, err


def _applied(root: Root, *, pid: int, **states: LaneStatus) -> None:
    """``.applied`` as a host of pid ``pid`` writes it."""
    data = render_applied(
        manifest_sha256="0" * 64, applied_at="2026-11-29T10:00:00Z", spaces=states, refused=None, pid=pid,
    )
    atomic_write(root.paths.spaces_manifest.with_name("spaces.json.applied"), data, mode=0o644)


def _gone_pid() -> int:
    """The pid of a process that has exited (a child of ours, reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _readiness(root: Root, url: str) -> None:
    write_json(root.space.auth_service_json, {"ver": 1, "url": url, "pid": os.getpid(), "cap": secrets.token_hex(32)})


@pytest.fixture
async def face(root: Root, nursery: trio.Nursery) -> str:
    """A live lane of ``default``: its loopback face with metrics (2 minted, 1 shed, 1 in flight)."""
    metrics = LaneMetrics(SPACE)
    for outcome in (Outcome.MINTED, Outcome.MINTED, Outcome.SHED):
        metrics.callout_answered(CalloutRecord(space=SPACE, req="U", cid=1, outcome=outcome))
    metrics.watch(lambda: CalloutStatistics(answered={}, dropped=0, waiting=0, in_flight=1))
    app = build_loopback_app(_context(root, secrets.token_hex(32)), metrics=metrics.exposition)
    port = await nursery.start(functools.partial(serve_app, app))
    url = f"http://127.0.0.1:{port}"
    _readiness(root, url)
    return url


async def test_no_running_service_is_said_and_exits_1(root, capsys):
    code, out, err = await _status(root, capsys)
    assert (code, out, err) == (1, "", NOT_RUNNING.format(root=root.paths.root))


async def test_a_stale_applied_file_reads_stopped(root, capsys):
    pid = _gone_pid()
    _applied(root, pid=pid, default=LaneStatus(state="serving"))  # the host that wrote it is gone
    # and so is the process whose operator face's file is left (issue 18 item 8): not listed
    write_json(root.paths.ops_json(9464), {"ver": 1, "url": "http://127.0.0.1:9464", "pid": pid, "cap": "c" * 64})
    code, out, err = await _status(root, capsys, "--json")
    assert code == 1 and err == NOT_RUNNING.format(root=root.paths.root)
    assert json.loads(out) == {
        "root": str(root.paths.root), "running": False,
        "spaces": [{"space": SPACE, "state": "stopped", "reason": f"no host running (the last host, pid {pid}, is gone)",
                    "pid": None, "url": None, "callouts": None, "inFlight": None, "queueDepth": None}],
        "opsFaces": [],
    }  # fmt: skip


async def test_applied_naming_a_pid_reused_since_reads_stopped(root, capsys):
    """Issue 15 item 11: the pid ``.applied`` names is alive (ours) but started after the file
    was written, so it is not the host that wrote it (a reboot, pid 1 in a container)."""
    (root.paths.root / "up.lock").write_text(f"{os.getpid()}\n")  # even while cotal up runs
    _applied(root, pid=os.getpid(), default=LaneStatus(state="serving"))
    path = root.paths.spaces_manifest.with_name("spaces.json.applied")
    os.utime(path, (time.time() - 3600 * 24 * 365 * 30,) * 2)  # written long before we started
    code, out, _ = await _status(root, capsys, "--json")
    assert code == 1
    assert [(s["state"], s["reason"]) for s in json.loads(out)["spaces"]] == [
        ("stopped", f"no host running (the last host, pid {os.getpid()}, is gone)"),
    ]


async def test_applied_that_names_no_writer_stands_while_cotal_up_runs(root, capsys):
    """A file an older host wrote (no ``pid``) is judged by ``up.lock``, as before."""
    path = root.paths.spaces_manifest.with_name("spaces.json.applied")
    doc = {"version": 1, "manifestSha256": None, "appliedAt": "2026-11-29T10:00:00Z", "refused": None,
           "spaces": {SPACE: {"state": "retrying", "reason": RETRY_REASON}}}  # fmt: skip
    path.write_text(json.dumps(doc))
    code, out, _ = await _status(root, capsys, "--json")
    assert [(s["state"], s["reason"]) for s in json.loads(out)["spaces"]] == [("stopped", "no auth service serves it")]
    (root.paths.root / "up.lock").write_text(f"{os.getpid()}\n")
    code, out, _ = await _status(root, capsys, "--json")
    assert [(s["state"], s["reason"]) for s in json.loads(out)["spaces"]] == [("retrying", RETRY_REASON)]


async def test_a_serving_space_prints_its_counts_and_exits_0(root, face, capsys):
    _applied(root, pid=os.getpid(), default=LaneStatus(state="serving"))
    code, out, err = await _status(root, capsys)
    assert (code, err) == (0, "")
    assert out == f"{SPACE}  serving  pid {os.getpid()}  {face}  minted 2 denied 0 timeout 0 shed 1  in-flight 1  queued 0\n"
    code, out, _ = await _status(root, capsys, "--json")
    assert code == 0 and json.loads(out)["spaces"] == [{
        "space": SPACE, "state": "serving", "reason": None, "pid": os.getpid(), "url": face,
        "callouts": {"minted": 2, "denied": 0, "timeout": 0, "shed": 1}, "inFlight": 1, "queueDepth": 0,
    }]  # fmt: skip


async def test_a_retrying_space_beside_a_serving_one_exits_1_with_its_reason(root, face, capsys):
    (root.paths.root / "up.lock").write_text(f"{os.getpid()}\n")  # cotal up, which wrote .applied, runs
    _applied(root, pid=os.getpid(), default=LaneStatus(state="serving"), beta=LaneStatus(state="retrying", reason=RETRY_REASON))
    code, out, err = await _status(root, capsys)
    assert (code, err) == (1, "")
    assert out.splitlines()[0] == f"beta  retrying  ({RETRY_REASON})"
    assert out.splitlines()[1].startswith(f"{SPACE}  serving  pid {os.getpid()}  {face}  minted 2 ")


async def test_applied_left_by_a_gone_cotal_up_is_stale_even_while_another_host_serves(root, face, capsys):
    """A bug found by a fresh user: with `cotal up` gone and another process serving one space,
    the spaces only `.applied` named were reported `serving` (exit 0) though nothing served them."""
    pid = _gone_pid()
    _applied(root, pid=pid, default=LaneStatus(state="serving"), beta=LaneStatus(state="serving"))  # no up.lock
    code, out, err = await _status(root, capsys, "--json")
    assert (code, err) == (1, "")
    spaces = {s["space"]: (s["state"], s["reason"]) for s in json.loads(out)["spaces"]}
    assert spaces == {"beta": ("stopped", f"no host running (the last host, pid {pid}, is gone)"), SPACE: ("serving", None)}


async def test_a_running_up_with_its_only_lane_retrying(root, capsys):
    (root.paths.root / "up.lock").write_text(f"{os.getpid()}\n")  # cotal up holds the root
    _applied(root, pid=os.getpid(), default=LaneStatus(state="retrying", reason=RETRY_REASON))
    code, out, err = await _status(root, capsys, "--json")
    assert (code, err) == (1, "")
    assert json.loads(out)["running"] is True
    assert [(s["state"], s["reason"]) for s in json.loads(out)["spaces"]] == [("retrying", RETRY_REASON)]


async def test_a_face_that_does_not_answer_is_unreachable(root, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    _readiness(root, url)  # a live pid (ours), but nothing listens there
    code, out, err = await _status(root, capsys)
    assert (code, err) == (1, "")
    assert out.startswith(f"{SPACE}  unreachable  pid {os.getpid()}  {url}  (its face at {url} did not answer (")
    assert out.endswith(") - check the auth service log)\n")


async def test_a_corrupt_applied_file_is_one_sentence(root, capsys):
    path = root.paths.spaces_manifest.with_name("spaces.json.applied")
    path.write_text('{"spaces": ["default"]}')
    code, out, err = await _status(root, capsys)
    assert (code, out) == (1, "")
    assert err == f"cotal: {path} is not a lane host's .applied file - delete it; the host rewrites it\n"


async def test_a_lane_whose_health_says_it_cannot_answer_is_not_serving(root, nursery, capsys):
    """Issue 15 item 11: a live face whose ``/health`` answers 503 with the lane's reason (its
    self-probe failed) is shown ``unhealthy`` with that reason, not ``serving`` or a bare HTTP
    status."""
    from types import SimpleNamespace

    from cotal_trio.lane.faces import answer_health

    app = build_loopback_app(_context(root, secrets.token_hex(32)), metrics=LaneMetrics(SPACE).exposition)
    answer_health(app, SimpleNamespace(reason="a ledger read did not answer within 1.75 s"), SPACE)  # type: ignore[arg-type]
    port = await nursery.start(functools.partial(serve_app, app))
    url = f"http://127.0.0.1:{port}"
    _readiness(root, url)
    code, out, _ = await _status(root, capsys)
    assert code == 1
    assert out == (
        f"{SPACE}  unhealthy  pid {os.getpid()}  {url}  (the lane cannot answer connects:"
        " a ledger read did not answer within 1.75 s)\n"
    )
