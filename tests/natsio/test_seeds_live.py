"""Several seed URLs for one connection (issue 17 item 3), against real nats-servers on 127.0.0.1.

``open_connection`` takes a comma-separated list (a ``--server`` value) or a sequence: the
first connect tries each seed in order and uses the first that answers; a list with an empty
item or a non-broker URL is one sentence. On a 3-node cluster, the reconnect line after the
node a connection was on is SIGTERMed names the node it reached, not the seed it started with.
"""

from __future__ import annotations

import logging
import os
import signal

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.natsio import open_connection, open_loop
from tests.support.cluster import start_cluster

pytestmark = pytest.mark.broker

CEILING_S = 30


@pytest.mark.parametrize("bad, sentence", [
    ("nats://127.0.0.1:1,,nats://127.0.0.1:2", "--server nats://127.0.0.1:1,,nats://127.0.0.1:2 has an empty item"
     " - pass nats://host:port (a cluster: every node's URL, comma-separated), with no empty item between commas"),
    ("nats://127.0.0.1:1,", "--server nats://127.0.0.1:1, has an empty item - pass nats://host:port (a cluster:"
     " every node's URL, comma-separated), with no empty item between commas"),
    ("nats://127.0.0.1:1,http://127.0.0.1:2", "--server http://127.0.0.1:2 is not a broker address - pass nats://host:port"),
    (" , ", "--server is empty - pass nats://host:port (a cluster: every node's URL, comma-separated)"),
])  # fmt: skip
async def test_a_malformed_list_is_one_sentence(bad, sentence):
    async with open_loop():
        with pytest.raises(ConfigError) as refused:
            async with open_connection(bad):
                pass
    assert str(refused.value) == sentence


async def test_a_dead_first_seed_is_passed_over(plain_broker):
    dead = f"nats://127.0.0.1:{free_port()}"
    with trio.fail_after(CEILING_S):
        async with open_loop():
            for seeds in (f"{dead}, {plain_broker}", [dead, plain_broker]):
                async with open_connection(seeds, reconnect=False) as conn:
                    await conn.flush()
                    assert conn.servers == (dead, plain_broker)
                    assert conn.connected_url == plain_broker


async def test_every_seed_down_is_unavailable_naming_them_all():
    dead = [f"nats://127.0.0.1:{free_port()}" for _ in range(3)]
    with trio.fail_after(CEILING_S):
        async with open_loop():
            with pytest.raises(Unavailable) as down:
                async with open_connection(",".join(dead)):
                    pass
    assert str(down.value).startswith(f"connect {','.join(dead)}: ")


@pytest.mark.parametrize("seeds", ["n1", "all"])
async def test_the_reconnect_line_names_the_node_reached(nursery, tmp_path, caplog, seeds):
    """Connected through n1 (the only seed given, or the first of all three), n1 SIGTERMed: the
    disconnect line names n1 and the reconnect line n2 or n3, never the seeds it started with."""
    caplog.set_level(logging.INFO, logger="cotal.natsio")
    urls, pids = await start_cluster(nursery, tmp_path, 3)
    with trio.fail_after(CEILING_S):
        async with open_loop(), open_connection(urls[0] if seeds == "n1" else ",".join(urls)) as conn:
            while len(conn._nc.servers) < 3:  # the cluster's INFO names the other nodes (bounded)
                await trio.sleep(0.1)
                await conn.flush()
            assert conn.connected_url == urls[0]
            os.kill(pids[0], signal.SIGTERM)
            reconnected = [f"nats {url}: reconnected" for url in urls[1:]]
            while not any(r.getMessage() in reconnected for r in caplog.records):  # bounded by CEILING_S
                await trio.sleep(0.1)
            assert conn.connected_url in urls[1:]
            assert f"nats {conn.connected_url}: reconnected" in [r.getMessage() for r in caplog.records]
            lines = [r.getMessage() for r in caplog.records]
            assert f"nats {urls[0]}: reconnected" not in lines and f"nats {','.join(urls)}: reconnected" not in lines
            assert f"nats {urls[0]}: disconnected" in lines
