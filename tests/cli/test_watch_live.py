"""Issue 7 item 2: ``cotal watch`` against a running stack, and its rendered view.

* ``cotal watch --json`` (a real process) prints each event as one JSON line, the hello first,
  then the callout event of a connect the test makes; SIGINT ends it with exit code 0. Against
  ``cotal up`` (the ``stack`` fixture) and against a real ``cotal auth-service --spaces``
  process hosting spaces ``a``, ``b`` and ``c`` (issue 7: "Works against cotal up and against
  cotal auth-service hosts").
* :func:`run_watch` in the test's own trio run renders the live numbers, and shows a space
  nothing serves as ``disconnected``.
* :func:`render_view` turns :class:`SpaceView` lines into exact text, and the merge keeps the
  events of a process restarted under the same pid.

Every wait is on the thing itself (a line read, a datagram, a rendered view) under
``trio.fail_after``; processes the test starts are stopped by their pid.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from cotal_trio.cli.watch import WatchConfig, _Link, _merge, _Message, render_view, run_watch
from cotal_trio.core.events import SpaceView, WatchModel
from cotal_trio.core.identity import derive_owner
from cotal_trio.state import load_owner_secret
from tests.support.stack import SPACE, client, stack  # noqa: F401 - stack is a fixture
from tests.support.process_lines import Lines
from tests.support.service import SPACES, start_mesh, write_manifest
from tests.support.notify import start_service, stop

CEILING_S = 30


@pytest.mark.broker
async def test_watch_json_prints_the_events_of_a_running_stack(stack, nursery):  # noqa: F811
    stack.grant("alice", "cli")
    command = [sys.executable, "-m", "cotal_trio", "watch", "--json", "--root", str(stack.paths.root)]
    start = functools.partial(trio.run_process, command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    with trio.fail_after(CEILING_S):
        process = await nursery.start(start)
        lines = Lines(process.stdout)
        hello = json.loads(await lines.next())
        bearer = await stack.bearer("alice", "cli")
        async with client(stack, bearer):
            pass
        printed = [json.loads(await lines.next()) for _ in range(2)]  # the exchange, then the callout
        process.send_signal(signal.SIGINT)
        code = await process.wait()
        err = (await process.stderr.receive_some()).decode()
    assert hello == {"seq": hello["seq"], "at": hello["at"], "type": "hello", "space": SPACE,
                     "lanes": {SPACE: {"state": "serving", "reason": None}}}
    exchange, callout = printed
    assert {k: exchange[k] for k in ("type", "space", "arm", "face", "status")} == {
        "type": "exchange", "space": SPACE, "arm": "human", "face": "loopback", "status": 200}
    assert {k: callout[k] for k in ("type", "space", "outcome", "owner", "actor", "limited")} == {
        "type": "callout", "space": SPACE, "outcome": "minted", "owner": stack.owner("alice"), "actor": "cli",
        "limited": False}
    assert hello["seq"] < exchange["seq"] < callout["seq"]
    assert abs(callout["at"] - time.time()) < CEILING_S
    assert code == 0
    assert "SIGINT - stopping" in err


async def start_watch(nursery: trio.Nursery, root: Path, log: Path) -> trio.Process:
    """``cotal watch --json --root <root>`` as a child process: stdout piped, stderr to ``log``."""
    command = [sys.executable, "-m", "cotal_trio", "watch", "--json", "--root", str(root)]
    with log.open("wb") as err:  # the child holds its own copy
        start = functools.partial(trio.run_process, command, stdout=subprocess.PIPE, stderr=err, check=False)
        return await nursery.start(start)


@pytest.mark.broker
async def test_watch_json_against_an_auth_service_host(nursery, tmp_path, nats_server_bin, systemd):  # noqa: F811
    """``cotal auth-service --spaces`` (a real process on a real nats-server, READY awaited on
    its notify socket): ``cotal watch --json`` on its root gets the hello of every space's face,
    then the callout event of a connect the test makes, each shared event once."""
    address, inbox = systemd
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    manifest = tmp_path / "host" / "spaces.json"
    manifest.parent.mkdir()
    write_manifest(manifest, *SPACES)
    service = await start_service(nursery, mesh, tmp_path, address, "--spaces", str(manifest))
    with trio.fail_after(CEILING_S):
        await inbox.until("READY=1")  # every lane serves: every space's auth-service.json is written
        watch = await start_watch(nursery, mesh.paths.root, tmp_path / "watch.log")
        lines, hellos, printed = Lines(watch.stdout), {}, []
        while len(hellos) < len(SPACES):  # one per face; another face's events may come between
            event = json.loads(await lines.next())
            if event["type"] == "hello":
                hellos[event["space"]] = event
            else:
                printed.append(event)
        mesh.grant("b", "alice", "cli")
        await mesh.admitted("b", await mesh.bearer("b", "alice", "cli"))
        while not printed or printed[-1]["type"] != "callout":
            printed.append(json.loads(await lines.next()))
        watch.send_signal(signal.SIGINT)
        code = await watch.wait()
    lanes = dict.fromkeys(SPACES, {"state": "serving", "reason": None})
    assert hellos == {space: {"seq": hellos[space]["seq"], "at": hellos[space]["at"], "type": "hello", "space": space,
                              "lanes": lanes} for space in SPACES}
    callout = printed[-1]
    owner = derive_owner(load_owner_secret(mesh.paths.space("b").owner_secret_json), mesh.idp.issuer, "alice")
    assert {k: callout[k] for k in ("type", "space", "outcome", "owner", "actor", "limited")} == {
        "type": "callout", "space": "b", "outcome": "minted", "owner": owner, "actor": "cli", "limited": False}
    assert [(e["type"], e["space"]) for e in printed if e["type"] in ("exchange", "callout")] == [
        ("exchange", "b"), ("callout", "b")]
    seqs = [event["seq"] for event in printed]
    assert len(seqs) == len(set(seqs))  # a shared event reaches three faces and is printed once
    assert code == 0
    assert "SIGINT - stopping" in (tmp_path / "watch.log").read_text()
    assert await stop(service) == 0, (tmp_path / "service.log").read_text()


@pytest.mark.broker
async def test_run_watch_renders_live_numbers_and_a_disconnected_space(stack, nursery):  # noqa: F811
    stack.grant("alice", "cli")
    shown: list[str] = []
    counted = trio.Event()

    def emit(text: str) -> None:
        if "minted 0.3" in text and not counted.is_set():  # 3 mints in the last 10 s
            shown.append(text)
            counted.set()

    config = WatchConfig(paths=stack.paths, spaces=(SPACE, "ghost"))
    nursery.start_soon(functools.partial(run_watch, config, emit=emit))
    with trio.fail_after(CEILING_S):
        bearer = await stack.bearer("alice", "cli")
        for _ in range(3):
            async with client(stack, bearer):
                pass
        await counted.wait()
    alpha, ghost = shown[0].split("\n\n")
    lines = alpha.splitlines()
    assert lines[0] == f"{SPACE}  serving"
    assert lines[1] == "  connects/s (10 s)  minted 0.3  denied 0.0  timeout 0.0  shed 0.0"
    assert lines[2].startswith("  callout (60 s)     p50 ") and lines[2].endswith(" ms")
    assert lines[3] == "  limit denials      0"
    assert ghost.splitlines()[0] == "ghost  disconnected (last: unknown)"


async def test_merge_keeps_the_events_of_a_process_restarted_under_the_same_pid():
    """A service in a container is pid 1 on every start: after a restart its seqs 1..N are new
    events, not repeats of the old process's (issue 7 review: 0 of 100 were kept)."""
    send, receive = trio.open_memory_channel(0)
    printed: list[dict] = []

    async def feed() -> None:
        async with send:
            for _ in range(2):  # the process, then the same pid restarted
                await send.send(_Link(SPACE, True, pid=1))
                await send.send(_Message(SPACE, 1, json.dumps({"seq": 0, "type": "hello", "space": SPACE})))
                for seq in range(1, 101):
                    await send.send(_Message(SPACE, 1, json.dumps({"seq": seq, "type": "lane", "space": SPACE})))
                await send.send(_Link(SPACE, False, "closed 1006: ABNORMAL_CLOSURE"))

    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed)
            await _merge(receive, WatchModel(), lambda text: printed.append(json.loads(text)))
    assert [(event["type"], event["seq"]) for event in printed] == 2 * [("hello", 0), *(("lane", seq) for seq in range(1, 101))]


def test_render_view_exact_text():
    views = [
        SpaceView(space="alpha", connected=True, state="serving", reason=None,
                  rates={"minted": 12.3, "denied": 0.4, "timeout": 0.0, "shed": 0.0}, p50_ms=3, p99_ms=41,
                  limit_denials=2, denials=("RATE_LIMITED retry-after 3s actor=cli", "no token - exchange first")),
        SpaceView(space="beta", connected=False, state="retrying", reason="the broker is gone",
                  rates={"minted": 0.0, "denied": 0.0, "timeout": 0.0, "shed": 0.0}, p50_ms=None, p99_ms=None,
                  limit_denials=0, denials=()),
    ]
    assert render_view(views) == (
        "alpha  serving\n"
        "  connects/s (10 s)  minted 12.3  denied 0.4  timeout 0.0  shed 0.0\n"
        "  callout (60 s)     p50 3 ms  p99 41 ms\n"
        "  limit denials      2\n"
        "  last denials       RATE_LIMITED retry-after 3s actor=cli\n"
        "                     no token - exchange first\n"
        "\n"
        "beta  disconnected (last: retrying - the broker is gone)\n"
        "  connects/s (10 s)  minted 0.0  denied 0.0  timeout 0.0  shed 0.0\n"
        "  callout (60 s)     -\n"
        "  limit denials      0"
    )
    assert render_view([]) == "no space serves a face yet - start `cotal up`, or pass --space"


def test_a_root_that_does_not_exist_is_refused_at_once(tmp_path, capsys):
    """Found by the fresh-user check: `cotal watch --root /nonexistent` repeated its empty view
    forever."""
    from cotal_trio.cli import main

    assert main(["watch", "--root", str(tmp_path / "nowhere")]) == 1
    assert capsys.readouterr().err == (
        f"cotal: there is no root at {tmp_path / 'nowhere'} - pass the --root of one (`cotal up` makes one)\n"
    )
