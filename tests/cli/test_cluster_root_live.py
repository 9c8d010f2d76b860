"""Root commands on a root without ``policy.json`` (issue 17 item 6).

The root is made as docs/deploy.md makes a cluster root: ``cotal space add`` with no broker
(``broker.json``, the space, the development IdP; no ``policy.json``, which only ``cotal up``
writes), a nats-server started from the root's trust, ``cotal space add --server`` to push the
space, and ``cotal auth-service --server`` (its lane, in-process) serving it. ``connect-info``,
``check`` and ``status`` then take ``--server`` (one URL or several, comma-separated), and
without it say in one sentence what is missing.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import trio

from cotal_trio.broker.config import write_config
from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.cli import main
from cotal_trio.service.hosting import ServiceConfig, run_service
from cotal_trio.state import RootPaths, load_broker
from tests.support.cli_root import cotal

pytestmark = pytest.mark.broker

SPACE = "alpha"
CEILING_S = 40


@pytest.fixture
async def cluster_root(nursery, tmp_path, capsys, nats_server_bin) -> tuple[RootPaths, str]:
    """A root served by `cotal auth-service --server URL`, with no policy.json; (paths, URL)."""
    paths = RootPaths(tmp_path / "root")
    with trio.fail_after(CEILING_S):
        code, _, err = await cotal(capsys, "space", "add", SPACE, "--root", str(paths.root), "--new-root")
        assert (code, err) == (0, ""), err
        port = free_port()
        conf = write_config(paths, load_broker(paths.broker_json), port=port, auth_timeout_s=None)
        start = functools.partial(run_nats_server, conf, executable=nats_server_bin, log_path=paths.broker_log, port=port)
        await nursery.start(start)
        url = f"nats://127.0.0.1:{port}"
        code, out, err = await cotal(capsys, "space", "add", SPACE, "--root", str(paths.root), "--server", url)
        assert code == 0 and "accounts pushed" in out, err
        await nursery.start(run_service, ServiceConfig(root=paths, server_url=url, space=SPACE))
    assert not paths.policy_json.exists()
    return paths, url


def missing_server(paths: RootPaths) -> str:
    return (
        f"cotal: no broker address for root {paths.root}: --server is not given, no node is recorded in"
        f" {paths.broker_dir}/seeds.json (`cotal broker config` records them) and {paths.policy_json} is"
        " missing (only `cotal up` writes it) - pass --server nats://host:port (a cluster: every node's URL,"
        " comma-separated)\n"
    )


async def test_connect_info_takes_server_and_prints_every_seed(cluster_root, capsys):
    paths, url = cluster_root
    dead = f"nats://127.0.0.1:{free_port()}"
    where = ("--root", str(paths.root), "--space", SPACE)
    code, out, err = await cotal(capsys, "connect-info", "--json", "--server", f"{url}, {dead}", *where)
    assert (code, err) == (0, "")
    details = json.loads(out)
    # `server` is one URL (nats-py would read a comma-joined string as a single URL); `servers` has them all
    assert (details["server"], details["servers"]) == (url, [url, dead])
    assert details["sentinelCreds"] == str(paths.space(SPACE).sentinel_creds)
    code, out, _ = await cotal(capsys, "connect-info", "--server", url, *where)
    assert code == 0 and f"server: {url}" in out.splitlines()


async def test_connect_info_without_server_or_policy_names_both(cluster_root, capsys):
    paths, _ = cluster_root
    code, out, err = await cotal(capsys, "connect-info", "--root", str(paths.root), "--space", SPACE)
    assert (code, out, err) == (1, "", missing_server(paths))


async def test_check_passes_through_the_server_given(cluster_root, capsys):
    paths, url = cluster_root
    dead = f"nats://127.0.0.1:{free_port()}"  # the first seed is down: the next one is used
    code, out, err = await cotal(capsys, "check", "--server", f"{dead},{url}", "--root", str(paths.root), "--space", SPACE)
    assert code == 0 and "✗" not in err, err  # stderr carries the in-process lane's callout lines
    assert out.splitlines()[-1] == "check passed"
    assert "✓ a tampered bearer is refused" in out


async def test_check_with_every_seed_down_names_the_connect_step(cluster_root, capsys):
    paths, _ = cluster_root
    dead = [f"nats://127.0.0.1:{free_port()}" for _ in range(2)]
    code, _, err = await cotal(capsys, "check", "--server", ",".join(dead), "--root", str(paths.root), "--space", SPACE)
    assert code == 1
    assert err.startswith("✗ connect with the sentinel creds and the bearer: ")
    assert all(seed in err for seed in dead)


async def test_check_without_server_or_policy_names_both(cluster_root, capsys):
    paths, _ = cluster_root
    code, out, err = await cotal(capsys, "check", "--root", str(paths.root), "--space", SPACE)
    assert (code, out, err) == (1, "", missing_server(paths))


async def test_status_takes_server_and_checks_each_seed(cluster_root, capsys):
    """``status --server`` contacts each seed (a bounded TCP connect and the broker's INFO line)
    and says per seed whether it is reachable; it used to print the list back unchecked."""
    paths, url = cluster_root
    dead = f"nats://127.0.0.1:{free_port()}"
    code, out, err = await cotal(capsys, "status", "--server", f"{url},{dead}", "--root", str(paths.root))
    assert (code, err) == (0, ""), err
    lines = out.splitlines()
    assert lines[:2] == [f"server {url}  reachable  cotal", f"server {dead}  unreachable  (connection refused)"]
    assert lines[2].startswith(f"{SPACE}  serving  pid ")
    code, out, _ = await cotal(capsys, "status", "--json", "--server", f"{url},{dead}", "--root", str(paths.root))
    assert code == 0 and json.loads(out)["servers"] == [
        {"url": url, "reachable": True, "serverName": "cotal", "reason": None},
        {"url": dead, "reachable": False, "serverName": None, "reason": "connection refused"},
    ]
    code, out, err = await cotal(capsys, "status", "--server", dead, "--root", str(paths.root))
    assert code == 1 and err == f"cotal status: no seed of --server is reachable ({dead}) - check the nodes and the URLs\n"
    code, out, err = await cotal(capsys, "status", "--root", str(paths.root))  # status never needed policy.json
    assert (code, err) == (0, "") and out.startswith(f"{SPACE}  serving  pid ")


@pytest.mark.parametrize("command", ["connect-info", "check", "status"])
def test_a_bad_server_is_one_sentence(tmp_path: Path, capsys, command):
    capsys.readouterr()
    code = main([command, "--server", "http://h:1", "--root", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out, err) == (1, "", "cotal: --server http://h:1 is not a broker address - pass nats://host:port\n")
