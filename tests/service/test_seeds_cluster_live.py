"""A lane started with several seed URLs while the first is down (issue 17 item 3).

A real 3-node cluster on 127.0.0.1, its configs rendered by ``cotal broker config`` from a root
made as docs/deploy.md makes one (``cotal space add --new-root``, then ``--server`` to push the
space). Node 1 is SIGTERMed by pid; the full auth service (a host of the root's manifest) is then started
with ``--server n1,n2,n3``: every connection of its lane opens through n2 (the first seed that
answers), it serves, and a connect through node 2 is admitted (``cotal check``). Before the seed
list, the lane's first connect to n1 failed and the service could not start at all. The nodes
``cotal broker config`` rendered are the default ``--server`` of ``auth-service``, ``check`` and
``connect-info`` (``<root>/broker/seeds.json``). Then n1 comes back and n2, the node the lane is
on, is SIGTERMed: the lane's reconnect lines name n1 or n3, not the seed list nor n2.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.cli.auth_service import _check_server
from cotal_trio.lane.service_users import IssuerSession
from cotal_trio.natsio import open_loop
from cotal_trio.service.hosting import ServiceConfig, run_service
from cotal_trio.state import load_space
from tests.support.cluster import start_root_cluster
from tests.support.service import start_mesh
from tests.support.cli_root import cotal

pytestmark = pytest.mark.broker

SPACE = "alpha"
CEILING_S = 30
NODES = ("n1", "n2", "n3")


async def test_a_lane_starts_through_the_second_seed_when_the_first_is_down(nursery, tmp_path, capsys, caplog):
    with trio.fail_after(CEILING_S):
        cluster = await start_root_cluster(nursery, tmp_path, capsys, SPACE, NODES)
        paths, urls, pids = cluster.paths, cluster.urls, cluster.pids
        code, out, err = await cotal(capsys, "space", "add", SPACE, "--root", str(paths.root), "--server", urls["n1"])
        assert code == 0 and "accounts pushed" in out, err
        logs = [cluster.logs[name] for name in NODES]
        while not all("metadata leader" in log.read_text() for log in logs):
            await trio.sleep(0.2)  # the three have met (bounded by CEILING_S)
        os.kill(pids["n1"], signal.SIGTERM)
        while "Server Exiting" not in logs[0].read_text():
            await trio.sleep(0.1)
        seeds = ",".join(urls[name] for name in NODES)
        # `cotal broker config` recorded each node: `auth-service` without --server takes them all
        assert _check_server(paths, None) == seeds
        # a host of the root's manifest (as docs/deploy.md runs it): its lanes ride out a node loss
        config = ServiceConfig(root=paths, server_url=seeds, manifest=paths.spaces_manifest)
        await nursery.start(run_service, config)
        while (code := (await cotal(capsys, "check", "--server", urls["n2"], "--root", str(paths.root), "--space", SPACE))[0]) != 0:
            await trio.sleep(0.2)  # until the lane serves (bounded by CEILING_S)
        code, out, err = await cotal(capsys, "check", "--server", urls["n2"], "--root", str(paths.root), "--space", SPACE)
        assert code == 0 and out.splitlines()[-1] == "check passed", out + err
        assert "✓ connect with the sentinel creds and the bearer" in out
        # no --server: the recorded nodes; n1 is down, the check goes through n2
        code, out, err = await cotal(capsys, "check", "--root", str(paths.root), "--space", SPACE)
        assert code == 0 and out.splitlines()[-1] == "check passed", out + err
        code, out, err = await cotal(capsys, "connect-info", "--json", "--root", str(paths.root), "--space", SPACE)
        assert (code, err) == (0, "") and json.loads(out)["servers"] == [urls[name] for name in NODES]
        # and `space add` without --server pushes to the recorded nodes too (n1 still down); it
        # pushed nothing before: the root has no policy.json, the only default it read
        code, out, err = await cotal(capsys, "space", "add", "beta", "--root", str(paths.root))
        assert code == 0 and "accounts pushed" in out, out + err
        # n1 back, then n2 (where the lane is) SIGTERMed: the lane's reconnect lines name the node
        # each connection reached (n1 or n3), not the seed list it started with nor n2
        before = logs[0].stat().st_size
        await cluster.start(nursery, "n1")
        while "new metadata leader" not in logs[0].read_text()[before:]:
            await trio.sleep(0.1)  # n1 rejoined (bounded by CEILING_S)
        caplog.set_level(logging.INFO, logger="cotal.natsio")  # an in-process `cotal` raised it to ERROR
        os.kill(pids["n2"], signal.SIGTERM)
        reached = {f"nats {urls['n1']}: reconnected", f"nats {urls['n3']}: reconnected"}
        while not reached & {r.getMessage() for r in caplog.records}:
            await trio.sleep(0.1)
    lines = {r.getMessage() for r in caplog.records}
    assert f"nats {seeds}: reconnected" not in lines and f"nats {urls['n2']}: reconnected" not in lines
    assert f"nats {urls['n2']}: disconnected" in lines


async def test_the_issuer_session_renews_through_the_seed_that_answers(nursery, tmp_path, nats_server_bin):
    """The issuer session's renewals open with the whole seed list too: its first seed is down,
    and each new session comes up through the second (lane/service_users.py)."""
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    dead = f"nats://127.0.0.1:{free_port()}"
    session = IssuerSession(
        load_space(mesh.paths.space("a").callout_json, "a"), f"{dead},{mesh.server_url}", lifetime_s=3,
        clock=time.time, reconnect=False,
    )
    with trio.fail_after(CEILING_S):
        async with open_loop(), trio.open_nursery() as inner:
            await inner.start(session.run)
            while session.renewals < 2:  # one every 2 s (2/3 of the lifetime); bounded by CEILING_S
                await trio.sleep(0.1)
            inner.cancel_scope.cancel()
    assert session.trouble is None
