"""Issue 18 item 8 on a real nats-server: one operator face per process, on a port that does not move.

``cotal up`` (``run_up``) hosting two spaces serves one loopback operator face on ``--ops-port``:
``/metrics`` with every space's series under its ``space`` label (a connect in one space counts
in that space only), ``cotal_lane_state``, ``cotal_build_info`` and the counters' ``_created``;
the same port and capability after a space's lane is removed and added again; the status page
and ``/events`` carry both spaces, refused without the capability or cookie exactly as a
space's own loopback face refuses; ``cotal status`` names it. A callout-only ``cotal
auth-service`` host serves one too; a busy ``--ops-port`` is one sentence naming the flag (the
CLI's, and ``cotal up``'s recorded port). ``cotal up --ops-port`` as a process prints it.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from cotal_trio import __version__
from cotal_trio.broker.process import free_port, nats_server_version
from cotal_trio.broker.spaces import add_space, remove_space
from cotal_trio.core.errors import ConfigError, leaves
from cotal_trio.http.ops import OPS_BAD_CAPABILITY, OPS_UNAUTHORIZED_PAGE
from cotal_trio.http.status_page import PAGE, UNAUTHORIZED_PAGE, session_cookie_name, session_token
from cotal_trio.lane.metrics import CONTENT_TYPE
from cotal_trio.service.hosting import ServiceConfig, run_service
from cotal_trio.service.pins import choose_pin
from cotal_trio.state import load_policy, read_json

from tests.support.cli_root import cotal, restore_cotal_logger  # noqa: F401  autouse: main() configures logging
from tests.support.events_socket import events_socket, refused
from tests.support.stack import SPACE, Stack, client, start_stack
from tests.support.up_hosts import Other, until_applied
from tests.support.up_process import _start, _stop, _wait_ready

pytestmark = pytest.mark.broker

CEILING_S = 60
OTHER = "beta"
Samples = dict[tuple[str, frozenset], float]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a 303 is the answer under test, not followed
        return None


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, Message]:
    """Blocking ``GET url``: (status, body text, headers), redirects not followed."""
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return response.status, response.read().decode(), response.headers
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(), exc.headers


async def _scrape(url: str) -> tuple[str, Samples]:
    """``GET <url>/metrics`` with no credential: (Content-Type, {(name, labels): value})."""
    status, body, headers = await trio.to_thread.run_sync(_get, f"{url}/metrics")
    assert status == 200, body
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body) for s in family.samples
    }
    return headers["Content-Type"], samples


def _of(samples: Samples, name: str, **labels: str) -> dict[frozenset, float]:
    """The samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return {key: value for (n, key), value in samples.items() if n == name and wanted <= key}


def _one(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def _states(samples: Samples) -> dict[str, dict[str, float]]:
    """``cotal_lane_state`` as ``{space: {state: value}}``."""
    states: dict[str, dict[str, float]] = {}
    for key, value in _of(samples, "cotal_lane_state").items():
        labels = dict(key)
        states.setdefault(labels["space"], {})[labels["state"]] = value
    return states


ALL_STATES = ("starting", "serving", "retrying", "fenced", "stopping")


def _serving() -> dict[str, float]:
    return {state: 1.0 if state == "serving" else 0.0 for state in ALL_STATES}


async def _add_other(stack: Stack) -> Other:
    pin = await choose_pin(stack.paths, OTHER, idp_url=None)  # as `cotal space add` does
    await add_space(stack.paths, OTHER, now=time.time(), idp_pin=pin)
    await until_applied(stack.paths, lambda s: s.get(OTHER) == {"state": "serving"})
    return Other(stack, OTHER)


@pytest.fixture
async def two(nursery, tmp_path, nats_server_bin) -> tuple[Stack, Other, int]:
    """``run_up`` with ``--ops-port`` a fixed free port, hosting alpha and beta (both serving)."""
    port = free_port()
    stack = await start_stack(nursery, tmp_path, nats_server_bin, ops_port=port)
    with trio.fail_after(CEILING_S):
        other = await _add_other(stack)
    return stack, other, port


async def test_the_operator_face_listens_on_its_port_and_is_recorded(two, capsys) -> None:
    stack, other, port = two
    url = f"http://127.0.0.1:{port}"
    assert stack.info.ops_url == url
    record = stack.paths.ops_json(port)
    assert read_json(record) == {"ver": 1, "url": url, "pid": os.getpid(), "cap": read_json(record)["cap"]}
    assert len(read_json(record)["cap"]) == 64
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert load_policy(stack.paths.policy_json).ops_port == port  # recorded like --port
    for space in (stack.space_paths, other.paths):  # every full lane names it
        assert read_json(space.auth_service_json)["opsUrl"] == url
    status, body, _ = await trio.to_thread.run_sync(_get, f"{url}/health")
    assert status == 200
    assert json.loads(body) == {"ok": True, "pid": os.getpid(), "lanes": {
        SPACE: {"state": "serving", "reason": None}, OTHER: {"state": "serving", "reason": None}}}
    code, out, _ = await cotal(capsys, "status", "--root", str(stack.paths.root))
    assert code == 0
    assert out.splitlines()[-1] == f"operator face {url}  pid {os.getpid()}  (capability in {record})"


async def test_metrics_label_every_space_and_count_each_ones_own(two, nats_server_bin) -> None:
    stack, other, port = two
    url = f"http://127.0.0.1:{port}"
    stack.grant("alice", "cli")
    with trio.fail_after(CEILING_S):
        _, before = await _scrape(url)
        async with client(stack, await stack.bearer("alice", "cli")):
            pass  # one connect minted in alpha
        content_type, samples = await _scrape(url)
    assert content_type == CONTENT_TYPE
    minted = {space: _one(samples, "cotal_callout_answers_total", space=space, outcome="minted") for space in (SPACE, OTHER)}
    assert minted == {SPACE: 1, OTHER: 0}
    assert _one(samples, "cotal_callout_duration_seconds_count", space=SPACE) == 1
    assert _one(samples, "cotal_callout_duration_seconds_count", space=OTHER) == 0
    assert _one(samples, "cotal_exchange_answers_total", space=SPACE, arm="human", status="200") == 1
    assert not _of(samples, "cotal_exchange_answers_total", space=OTHER)
    # the counters' _created: one per series, of each space, unchanged by the connect
    for space in (SPACE, OTHER):
        created = _of(samples, "cotal_callout_answers_created", space=space)
        assert len(created) == 4 and all(value > 1_600_000_000 for value in created.values())
        assert created == _of(before, "cotal_callout_answers_created", space=space)
        assert _of(samples, "cotal_callout_dropped_created", space=space)
    assert _states(samples) == {SPACE: _serving(), OTHER: _serving()}
    [build] = _of(samples, "cotal_build_info")
    assert dict(build) == {
        "version": __version__, "python": platform.python_version(),
        "nats_server": nats_server_version(nats_server_bin).removeprefix("v"),
    }
    assert samples[("cotal_build_info", build)] == 1


async def test_the_port_and_capability_stay_when_a_lane_restarts(two) -> None:
    stack, other, port = two
    url = f"http://127.0.0.1:{port}"
    cap = read_json(stack.paths.ops_json(port))["cap"]
    with trio.fail_after(CEILING_S):
        _, before = await _scrape(url)
        await remove_space(stack.paths, OTHER, now=time.time(), lane_wait_s=10)
        await until_applied(stack.paths, lambda s: OTHER not in s)
        _, gone = await _scrape(url)
        assert _states(gone) == {SPACE: _serving()}  # a stopped lane has no series
        assert not _of(gone, "cotal_callout_answers_total", space=OTHER)
        await _add_other(stack)
        _, back = await _scrape(url)
    assert read_json(stack.paths.ops_json(port)) == {"ver": 1, "url": url, "pid": os.getpid(), "cap": cap}
    assert read_json(other.paths.auth_service_json)["opsUrl"] == url
    assert _states(back) == {SPACE: _serving(), OTHER: _serving()}
    # the restarted lane counts from zero again, with a new _created
    old = _of(before, "cotal_callout_answers_created", space=OTHER)
    new = _of(back, "cotal_callout_answers_created", space=OTHER)
    assert old.keys() == new.keys() and all(new[key] > old[key] for key in old)


async def test_the_status_page_follows_the_loopback_faces_rules(two) -> None:
    stack, _, port = two
    ops = f"http://127.0.0.1:{port}"
    cap = read_json(stack.paths.ops_json(port))["cap"]
    lane = read_json(stack.space_paths.auth_service_json)
    lane_port = int(lane["url"].rsplit(":", 1)[1])

    def answers(url: str, cap: str, port: int) -> list[tuple[int, str]]:
        cookie = f"{session_cookie_name(port)}={session_token(cap)}"
        got = [_get(f"{url}/"), _get(f"{url}/?cap={'0' * 64}"), _get(f"{url}/", {"Cookie": f"{session_cookie_name(port)}={'0' * 64}"}),
               _get(f"{url}/?cap={cap}"), _get(f"{url}/", {"Cookie": cookie})]
        assert got[3][2]["Set-Cookie"] == f"{cookie}; HttpOnly; SameSite=Strict; Path=/"
        return [(status, body) for status, body, _ in got]

    ours = await trio.to_thread.run_sync(answers, ops, cap, port)
    theirs = await trio.to_thread.run_sync(answers, lane["url"], lane["cap"], lane_port)
    assert [status for status, _ in ours] == [status for status, _ in theirs] == [401, 401, 401, 303, 200]
    assert [body for _, body in ours] == [OPS_UNAUTHORIZED_PAGE, OPS_UNAUTHORIZED_PAGE, OPS_UNAUTHORIZED_PAGE, "", PAGE]
    assert [body for _, body in theirs] == [UNAUTHORIZED_PAGE, UNAUTHORIZED_PAGE, UNAUTHORIZED_PAGE, "", PAGE]
    # a space's session cookie is no session of the operator face (nor its capability)
    foreign = f"{session_cookie_name(port)}={session_token(lane['cap'])}"
    assert (await trio.to_thread.run_sync(_get, f"{ops}/", {"Cookie": foreign}))[0] == 401


def _bearer(cap: str) -> list[tuple[bytes, bytes]]:
    return [(b"Authorization", f"Bearer {cap}".encode())]


async def test_events_carry_every_space_behind_the_same_rules(two) -> None:
    stack, other, port = two
    cap = read_json(stack.paths.ops_json(port))["cap"]
    stack.grant("alice", "cli")
    other.grant("alice", "cli")
    own = f"http://127.0.0.1:{port}".encode()
    with trio.fail_after(CEILING_S):
        assert await refused(port, []) == (401, {"error": OPS_BAD_CAPABILITY})
        assert (await refused(port, _bearer("0" * 64)))[0] == 401
        lane_cap = read_json(stack.space_paths.auth_service_json)["cap"]
        assert (await refused(port, _bearer(lane_cap)))[0] == 401  # a space's capability is not this face's
        assert (await refused(port, [*_bearer(cap), (b"Origin", b"http://evil.example")]))[0] == 403
        cookie = (b"Cookie", f"{session_cookie_name(port)}={session_token(cap)}".encode())
        async with events_socket(port, [cookie, (b"Origin", own)]) as ws:
            hello = json.loads(await ws.get_message())
            async with client(stack, await stack.bearer("alice", "cli")):
                pass
            assert await other.connects(await other.bearer("alice", "cli"))
            seen: dict[str, dict] = {}
            while len(seen) < 2:
                event = json.loads(await ws.get_message())
                if event["type"] == "callout":
                    seen[event["space"]] = event
    assert hello["type"] == "hello" and hello["space"] is None
    assert set(hello["lanes"]) == {SPACE, OTHER}
    assert {space: event["outcome"] for space, event in seen.items()} == {SPACE: "minted", OTHER: "minted"}
    status, body, _ = await trio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/events")
    assert status == 426 and "websocket" in json.loads(body)["error"]


def _replica_manifest(stack: Stack) -> Path:
    """A replica host's own manifest listing the root's spaces (one host per manifest, as
    docs/deploy.md sets replicas up: each ``.applied`` is one host's account)."""
    manifest = stack.paths.root.parent / "replica.json"
    manifest.write_bytes(stack.paths.spaces_manifest.read_bytes())
    return manifest


async def test_a_callout_only_host_serves_one_too(two, nursery) -> None:
    stack, _, _ = two
    port = free_port()
    config = ServiceConfig(
        root=stack.paths, server_url=stack.info.server_url, manifest=_replica_manifest(stack),
        callout_only=True, ops_port=port,
    )
    url = f"http://127.0.0.1:{port}"
    with trio.fail_after(CEILING_S):
        info = await nursery.start(run_service, config)
        samples: Samples = {}
        while _states(samples) != {SPACE: _serving(), OTHER: _serving()}:
            _, samples = await _scrape(url)
            await trio.sleep(0.05)
    assert info.ops_url == url
    assert read_json(stack.paths.ops_json(port))["pid"] == os.getpid()
    assert _one(samples, "cotal_callout_answers_total", space=SPACE, outcome="minted") == 0


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cotal_trio", *argv], capture_output=True, text=True, timeout=60)


async def test_a_busy_ops_port_is_one_sentence_naming_the_flag(two) -> None:
    stack, _, port = two
    done = await trio.to_thread.run_sync(functools.partial(
        _run, "service", "run", "callout-replica", "--spaces", str(_replica_manifest(stack)),
        "--root", str(stack.paths.root), "--server", stack.info.server_url, "--ops-port", str(port),
    ))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"cotal: --ops-port {port}: the operator face's port {port} on 127.0.0.1 is busy - stop whatever holds it,"
        " or pass --ops-port with another port (0 picks a free one)"
    ]
    assert read_json(stack.paths.ops_json(port))["pid"] == os.getpid()  # the refused one touched nothing


async def test_up_keeps_the_port_it_recorded_and_names_it_when_busy(tmp_path, nats_server_bin) -> None:
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            first = await start_stack(nursery, tmp_path, nats_server_bin)  # no --ops-port: a free one
            nursery.cancel_scope.cancel()
        port = int(first.info.ops_url.rsplit(":", 1)[1])
        assert load_policy(first.paths.policy_json).ops_port == port
        assert not first.paths.ops_json(port).exists()  # a stopped face's file is gone
        async with trio.open_nursery() as nursery:
            again = await start_stack(nursery, tmp_path, nats_server_bin)
            nursery.cancel_scope.cancel()
        assert again.info.ops_url == first.info.ops_url
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", port))
            holder.listen()
            with pytest.RaisesGroup(ConfigError, allow_unwrapped=True, flatten_subgroups=True) as busy:
                async with trio.open_nursery() as nursery:
                    await start_stack(nursery, tmp_path, nats_server_bin)
    [error] = leaves(busy.value)
    assert str(error) == (
        f"--ops-port {port} (recorded in {first.paths.policy_json}): the operator face's port {port} on 127.0.0.1"
        " is busy - stop whatever holds it, or pass --ops-port with another port (0 picks a free one)"
    )


def test_cotal_up_names_its_operator_face_and_serves_it(tmp_path) -> None:
    """``cotal up --ops-port N`` as an operator runs it: the banner names the face and its
    capability file, ``/metrics`` answers there, and a stop removes the file."""
    root, port = tmp_path / "root", free_port()
    proc = _start(root, "--port", str(free_port()), "--ops-port", str(port))
    try:
        _wait_ready(proc)
        line = next(line for line in iter(proc.stdout.readline, "") if line.startswith("  operator face:"))
        status, body, _ = _get(f"http://127.0.0.1:{port}/metrics")
    finally:
        code, err = _stop(proc)
    assert line == (
        f"  operator face: http://127.0.0.1:{port} (/metrics, status page, /events; capability in {root}/ops/{port}.json)\n"
    )
    assert status == 200 and 'cotal_lane_state{space="default",state="serving"} 1.0' in body.splitlines()
    assert code == 0, err
    assert not (root / "ops" / f"{port}.json").exists()
