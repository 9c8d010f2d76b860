"""Issue 4 item 7 on a real nats-server: ``GET /metrics`` and ``cotal status`` of a running root.

One admitted and one denied connect, one minted and one refused exchange; then the loopback
face's scrape (no capability) and ``cotal status --json`` both show exactly those counts.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from cotal_trio.cli import main
from cotal_trio.lane.metrics import CONTENT_TYPE
from cotal_trio.stores.replicas import space_stream_names
from cotal_trio.state import read_json

from tests.support.stack import SPACE, client
from tests.support.callout_live import refused
from tests.support.cli_root import restore_cotal_logger  # noqa: F401  autouse: main() configures logging

pytestmark = pytest.mark.broker

CEILING_S = 20


def _scrape(url: str) -> tuple[str, dict[tuple[str, frozenset], float]]:
    """``GET <url>/metrics`` with no Authorization header: (Content-Type, samples)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        content_type, body = response.headers["Content-Type"], response.read().decode()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    return content_type, samples


def _series(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset({"space": SPACE, **labels}.items())


async def _status(stack, capsys) -> tuple[int, dict, str]:
    """``cotal status --json --root <root>`` in a worker thread: (exit code, JSON, stderr)."""
    capsys.readouterr()
    code = await trio.to_thread.run_sync(main, ["status", "--json", "--root", str(stack.paths.root)])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


async def test_metrics_and_status_count_what_happened(stack, capsys):
    stack.grant("alice", "cli")
    with trio.fail_after(CEILING_S):
        bearer = await stack.bearer("alice", "cli")  # exchange: human 200
        status, _ = await stack.exchange({"idpToken": stack.idp_token("alice"), "actor": "ghost"})
        assert status == 401  # exchange: human 401
        async with client(stack, bearer):
            pass  # callout: minted
        with refused():
            async with client(stack, None):
                pass  # callout: denied (no bearer)
        url = read_json(stack.space_paths.auth_service_json)["url"]
        content_type, samples = await trio.to_thread.run_sync(_scrape, url)
        code, report, err = await _status(stack, capsys)
    assert content_type == CONTENT_TYPE
    assert {outcome: samples[_series("cotal_callout_answers_total", outcome=outcome)]
            for outcome in ("minted", "denied", "timeout", "shed")} == {"minted": 1, "denied": 1, "timeout": 0, "shed": 0}
    assert samples[_series("cotal_callout_duration_seconds_count")] == 2
    assert samples[_series("cotal_callout_duration_seconds_bucket", le="+Inf")] == 2
    assert 0 < samples[_series("cotal_callout_duration_seconds_sum")] < 2
    exchanges = {k: v for k, v in samples.items() if k[0] == "cotal_exchange_answers_total"}
    assert exchanges == {
        _series("cotal_exchange_answers_total", arm="human", status="200"): 1,
        _series("cotal_exchange_answers_total", arm="human", status="401"): 1,
    }
    # the lane's connect limits: one principal charged (admitted), one host charged (no bearer)
    assert {bucket: (samples[_series("cotal_connect_limit_buckets", bucket=bucket)],
                     samples[_series("cotal_connect_limit_denials_total", bucket=bucket)])
            for bucket in ("actor", "owner", "host")} == {"actor": (1, 0), "owner": (1, 0), "host": (1, 0)}
    assert samples[_series("cotal_callout_in_flight")] == 0
    assert samples[_series("cotal_callout_queue_depth")] == 0
    assert (code, err) == (0, "")
    service = read_json(stack.space_paths.auth_service_json)
    assert report == {
        "root": str(stack.paths.root),
        "running": True,
        "spaces": [{
            "space": SPACE, "state": "serving", "reason": None, "pid": service["pid"], "url": service["url"],
            "callouts": {"minted": 1, "denied": 1, "timeout": 0, "shed": 0}, "inFlight": 0, "queueDepth": 0,
            # each store's count and leader (issue 17 item 1): `cotal up`'s one node, named cotal
            "stores": {"wanted": 1, "error": None, "stores": [
                {"stream": stream, "replicas": 1, "leader": "cotal", "current": 0} for stream in space_stream_names(SPACE)
            ]},
        }],
        # the process's operator face (issue 18 item 8)
        "opsFaces": [{"url": stack.info.ops_url, "pid": service["pid"],
                      "file": str(stack.paths.ops_json(int(stack.info.ops_url.rsplit(":", 1)[1])))}],
    }  # fmt: skip
