"""``--server`` of the root commands (cotal_trio/cli/_servers.py; issue 17 items 3 and 6)."""

from __future__ import annotations

import pytest

from cotal_trio.cli._servers import parse_servers, resolve_servers
from cotal_trio.cli import main
from cotal_trio.cli.broker import client_url
from cotal_trio.core.errors import ConfigError
from cotal_trio.state import BrokerPolicy, RootPaths, save_policy
from cotal_trio.state.seeds import load_seeds, record_seed


def test_a_list_keeps_its_order_and_drops_blanks_and_repeats():
    assert parse_servers(" tls://a:1, nats://b:2 ,tls://a:1 ") == ("tls://a:1", "nats://b:2")
    assert parse_servers("nats://h") == ("nats://h",)  # nats-py's default port


@pytest.mark.parametrize("bad", ["http://h:1", "nats://h:x", "nats://:4222", "h:4222"])
def test_a_bad_url_is_named(bad):
    with pytest.raises(ConfigError, match=f"^--server {bad} is not a broker address - pass nats://host:port$"):
        parse_servers(f"nats://ok:1,{bad}")


@pytest.mark.parametrize("holed", ["nats://a:1,,nats://b:2", "nats://a:1,", ",nats://a:1"])
def test_an_empty_item_is_refused_not_skipped(holed):
    """A hole in the list is a typo (a lost node URL), so it is named, not read past."""
    with pytest.raises(ConfigError, match=f"^--server {holed} has an empty item - pass nats://host:port"):
        parse_servers(holed)


def test_an_empty_list_is_refused():
    with pytest.raises(ConfigError, match="^--server is empty"):
        parse_servers(" , ")


def test_server_wins_over_policy_and_policy_is_the_fallback(tmp_path):
    paths = RootPaths(tmp_path)
    save_policy(paths.policy_json, BrokerPolicy(port=4999))
    assert resolve_servers(paths, "nats://n1:4222,nats://n2:4222") == ("nats://n1:4222", "nats://n2:4222")
    assert resolve_servers(paths, None) == ("nats://127.0.0.1:4999",)


def test_neither_names_both_and_the_fix(tmp_path):
    with pytest.raises(ConfigError) as missing:
        resolve_servers(RootPaths(tmp_path), None)
    assert str(missing.value) == (
        f"no broker address for root {tmp_path}: --server is not given, no node is recorded in"
        f" {tmp_path}/broker/seeds.json (`cotal broker config` records them) and {tmp_path}/policy.json is missing"
        " (only `cotal up` writes it) - pass --server nats://host:port (a cluster: every node's URL, comma-separated)"
    )


def test_the_recorded_nodes_are_the_default_and_win_over_policy(tmp_path):
    """``cotal broker config`` records each rendered node's client URL (state/seeds.py); with no
    --server they are the seeds, in the order first rendered, a re-render replacing its entry."""
    paths = RootPaths(tmp_path)
    save_policy(paths.policy_json, BrokerPolicy(port=4999))
    for node, url in [("n1", "nats://10.0.0.1:4222"), ("n2", "nats://10.0.0.2:4222"), ("n1", "nats://10.0.0.9:4222")]:
        record_seed(paths, node, url)
    assert load_seeds(paths) == ("nats://10.0.0.9:4222", "nats://10.0.0.2:4222")
    assert resolve_servers(paths, None) == ("nats://10.0.0.9:4222", "nats://10.0.0.2:4222")
    assert resolve_servers(paths, "nats://x:1") == ("nats://x:1",)  # --server still wins
    assert (paths.broker_dir / "seeds.json").stat().st_mode & 0o777 == 0o600


def test_a_corrupt_record_is_named(tmp_path):
    paths = RootPaths(tmp_path)
    paths.broker_dir.mkdir()
    (paths.broker_dir / "seeds.json").write_text('{"ver": 1, "nodes": {"n1": "http://h:1"}}')
    with pytest.raises(ConfigError, match=f"^{tmp_path}/broker/seeds.json.*nodes.n1 http://h:1 is not a broker address"):
        resolve_servers(paths, None)


@pytest.mark.parametrize("host, url", [
    ("127.0.0.1", "nats://127.0.0.1:4222"), ("n1.internal", "nats://n1.internal:4222"), ("::1", "nats://[::1]:4222"),
    ("0.0.0.0", None), ("::", None),
])  # fmt: skip
def test_a_rendered_node_is_recorded_by_its_client_url_unless_it_listens_everywhere(host, url):
    assert client_url(host, 4222) == url


@pytest.mark.parametrize("argv", [["auth-service", "--space", "alpha"], ["check", "--space", "alpha"],
                                  ["connect-info", "--space", "alpha"], ["service", "render", "auth-service", "--space", "alpha"]])
def test_a_holed_list_is_one_sentence_for_every_command(tmp_path, capsys, argv):
    capsys.readouterr()
    code = main([*argv, "--server", "nats://127.0.0.1:4222,,nats://127.0.0.1:4223", "--root", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err == (
        "cotal: --server nats://127.0.0.1:4222,,nats://127.0.0.1:4223 has an empty item - pass nats://host:port"
        " (a cluster: every node's URL, comma-separated), with no empty item between commas\n"
    )
