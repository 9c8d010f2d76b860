"""A SIGKILLed cluster node under connect load, live (issue 17 item 7).

Three nats-servers on 127.0.0.1, their configs rendered by ``cotal broker config`` from a root
made as docs/deploy.md makes one (``cotal space add --new-root``, then ``--server ... --replicas
3``), so the space's stores are R3. The full auth service runs with seeds ``n1,n2,n3`` (so its
connections sit on n1), and a callout replica per node with its own node first. Every stream of
the space is led by n1 (moved there by ``STREAM.LEADER.STEPDOWN`` with n1 preferred, bounded).

Several actors connect through n2 and n3 in a loop (one connect a second each, under the
60-a-minute actor limit); n1 is SIGKILLed by pid, restarted after a while, and the loop goes on
until n1 has rejoined plus a settle time. The failed connects and the longest window of failures
are printed (``pytest -n0 -s``) and put in the assertion messages; the test asserts only that every
connect of the last seconds is admitted, and that every issuance row written before the kill
(``natkey.<owner>.<actor>.<user nkey>`` in ``cotal_auth_<space>``) is still there after.
No timing is asserted. Only the nats-servers the test starts are stopped, by pid.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import time

import pytest
import trio

from cotal_trio.core import wire
from cotal_trio.core.errors import Unavailable
from cotal_trio.devidp import DevIdpMaterial
from cotal_trio.natsio import JetStreamError, js_api, kv_entries, open_loop
from cotal_trio.service.hosting import ServiceConfig, run_service
from cotal_trio.state import RootPaths
from cotal_trio.stores.replicas import read_store_replicas, space_stream_names
from tests.support.cli_root import cotal
from tests.support.cluster import js_admin, start_root_cluster
from tests.support.service import Mesh

pytestmark = pytest.mark.broker

SPACE = "alpha"
NODES = ("n1", "n2", "n3")
ACTORS = 6
CEILING_S = 240  # the whole test, on a loaded 2-core machine
CONNECT_S = 5  # one client connect's bound
PACE_S = 1.0  # one connect a second per actor (the actor limit is 60 a minute)
DOWN_S = 8  # how long n1 stays killed
SETTLE_S = 10  # the loop goes on this long after n1 rejoined
LAST_S = 3  # every connect started in the loop's last LAST_S seconds must be admitted


@dataclasses.dataclass(frozen=True)
class Attempt:
    started: float
    ended: float
    admitted: bool
    via: str


def failure_windows(attempts: list[Attempt]) -> list[tuple[float, float]]:
    """Runs of failed connects in start order with no admitted one between: (first start, last end)."""
    windows: list[tuple[float, float]] = []
    run: list[Attempt] = []
    for a in [*sorted(attempts, key=lambda a: a.started), None]:
        if a is not None and not a.admitted:
            run.append(a)
            continue
        if run:
            windows.append((run[0].started, max(r.ended for r in run)))
            run = []
    return windows


async def until_logged(log, text: str, after: int = 0) -> None:
    while text not in log.read_text()[after:]:
        await trio.sleep(0.2)  # bounded by the caller's CEILING_S


async def lead_from(paths: RootPaths, url: str, leader: str) -> dict[str, str | None]:
    """Step down every stream of SPACE not led by ``leader``, preferring it, until each is (bounded
    by the caller); the leaders then."""
    async with open_loop(), js_admin(paths, SPACE, url) as conn:
        while True:
            stores = await read_store_replicas(conn, SPACE)
            elsewhere = [s.stream for s in stores if s.leader != leader]
            if not elsewhere:
                return {s.stream: s.leader for s in stores}
            for stream in elsewhere:
                try:
                    await js_api(conn, f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", {"placement": {"preferred": leader}})
                except (JetStreamError, Unavailable):
                    pass  # mid-election: the next round asks again
            await trio.sleep(1)


async def issuance_rows(paths: RootPaths, url: str) -> dict[str, bytes]:
    async with open_loop(), js_admin(paths, SPACE, url) as conn:
        return {e.key: e.value for e in await kv_entries(conn, wire.auth_bucket(SPACE), "natkey.>")}


async def test_a_sigkilled_leader_node_loses_no_row_and_connects_are_admitted_after_the_window(
    nursery, tmp_path, capsys
):
    attempts: list[Attempt] = []
    with trio.fail_after(CEILING_S):
        cluster = await start_root_cluster(nursery, tmp_path, capsys, SPACE, NODES)
        paths, urls, logs, pids = cluster.paths, cluster.urls, cluster.logs, cluster.pids
        for log in logs.values():
            await until_logged(log, "metadata leader")
        code, out, err = await cotal(
            capsys, "space", "add", SPACE, "--root", str(paths.root), "--server", urls["n1"], "--replicas", "3"
        )
        assert code == 0 and "accounts pushed" in out, err
        seeds = ",".join(urls[name] for name in NODES)
        await nursery.start(run_service, ServiceConfig(root=paths, server_url=seeds, manifest=paths.spaces_manifest))
        for name in NODES:  # a replica per node, its own node first; its own copy of the manifest
            own = ",".join(urls[n] for n in (name, *(n for n in NODES if n != name)))
            manifest = tmp_path / f"replica-{name}" / "spaces.json"
            manifest.parent.mkdir()
            shutil.copy(paths.spaces_manifest, manifest)
            await nursery.start(run_service, ServiceConfig(root=paths, server_url=own, manifest=manifest, callout_only=True))
        while (await cotal(capsys, "check", "--server", urls["n2"], "--root", str(paths.root), "--space", SPACE))[0] != 0:
            await trio.sleep(0.5)  # until the full lane serves (bounded by CEILING_S)
        leaders = await lead_from(paths, urls["n2"], "n1")
        assert set(leaders) == set(space_stream_names(SPACE))

        base = Mesh(paths=paths, idp=DevIdpMaterial.from_json(paths.devidp_json.read_bytes()), server_url=urls["n2"])
        clients = []
        for i in range(ACTORS):
            sub, actor = f"load-{i}", f"load_{i}"
            base.grant(SPACE, sub, actor)
            via = "n2" if i % 2 == 0 else "n3"
            clients.append((dataclasses.replace(base, server_url=urls[via]), await base.bearer(SPACE, sub, actor), via))

        async def connect_loop(mesh: Mesh, bearer: str, via: str, stop: trio.Event) -> None:
            while not stop.is_set():
                started = time.monotonic()
                admitted = False
                try:
                    with trio.fail_after(CONNECT_S):
                        await mesh.admitted(SPACE, bearer)
                    admitted = True
                except* (Exception, trio.TooSlowError):  # noqa: BLE001 - a failed connect is what is counted
                    pass
                attempts.append(Attempt(started, time.monotonic(), admitted, via))
                await trio.sleep(max(0.0, PACE_S - (time.monotonic() - started)))

        stop = trio.Event()
        async with trio.open_nursery() as load:
            for mesh, bearer, via in clients:
                load.start_soon(connect_loop, mesh, bearer, via, stop)
            await trio.sleep(5)  # a few connects each before the kill
            before = await issuance_rows(paths, urls["n2"])
            killed = time.monotonic()
            os.kill(pids["n1"], signal.SIGKILL)
            await trio.sleep(DOWN_S)
            size = logs["n1"].stat().st_size
            await cluster.start(nursery, "n1")
            await until_logged(logs["n1"], "metadata leader", after=size)
            await trio.sleep(SETTLE_S)
            stop.set()
        ended = time.monotonic()
        after = await issuance_rows(paths, urls["n2"])

    failed = [a for a in attempts if not a.admitted]
    windows = failure_windows(attempts)
    longest = max((end - start for start, end in windows), default=0.0)
    numbers = (
        f"failed connects: {len(failed)} of {len(attempts)}, longest window: {longest:.1f} s"
        f" (windows from the kill: {[(round(s - killed, 1), round(e - killed, 1)) for s, e in windows]})"
    )
    with capsys.disabled():  # the CLI steps capture stdout; the numbers go to `pytest -n0 -s`
        print(f"\n{numbers}")
    tail = [a for a in attempts if a.started >= ended - LAST_S - PACE_S]
    assert len(tail) >= ACTORS and all(a.admitted for a in tail), numbers
    assert before, numbers  # the connects before the kill wrote rows
    lost = sorted(k for k in before if after.get(k) != before[k])
    assert lost == [], f"{numbers}; rows lost or changed after the kill: {lost}"
