#!/usr/bin/env python3
"""Benchmark: ``POST /exchange`` against ``GET /health`` on one keep-alive connection, in one run.

Usage::

    python bench/exchange.py [--n 300] [--warmup 30] [--no-agent]

What it does (issue 5, "Tests": one keep-alive client, 300 sequential exchanges, p50 and p99,
ratio against ``GET /health`` on the same connection; target p50 < 5 ms):

1. Starts the real service the way ``bench/callout.py`` does (its :func:`open_stack`: ``cotal
   up`` in a subprocess with its own nats-server on 127.0.0.1, a temporary root, a bounded wait
   for ``auth-service.json``) with one granted interactive actor, and reads the loopback face's
   ``url`` and ``cap``.
2. Mints one development IdP token for that actor's subject in-process (``mint_dev_token`` with
   the root's ``devidp.json``), and, unless ``--no-agent``, grants a managed actor under it (a
   row with a fresh actor token's hash, its ``parent`` the interactive actor).
3. Opens one HTTP/1.1 connection (``http.client``, keep-alive) and sends ``--warmup`` untimed
   rounds, then ``--n`` timed rounds. A round is one request of each arm, the arms' order
   rotating from round to round: ``GET /health``, ``POST /exchange`` human arm
   ``{idpToken, actor}``, and agent arm ``{owner, actor, actorToken}``. A sample is request
   written to response body read. Every answer's status is counted, and so is every connection
   used (``http.client`` reconnects on its own; hypercorn closes one after 1000 requests).
4. CPU: the service's, the broker's, this process's and everyone else's ("other") over the
   timed rounds; then one block of ``--n`` requests per arm back to back, each metered alone,
   which gives the service's CPU per request of each route. One clock tick is 10 ms, so a
   300-request block resolves 0.03 ms per request.

It measures and prints; it asserts nothing about timing. Only 127.0.0.1 is used. The service
is stopped with SIGINT by pid (it stops its own nats-server) and the temporary folder is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import http.client
import json
import os
import platform
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from _host import code_version, nats_server_version, proc_cpu_s
from callout import ACTOR, Cpu, CpuMeter, Stack, open_stack, pct

import cotal_trio
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow, hash_actor_token
from cotal_trio.devidp import mint_dev_token
from cotal_trio.state import write_row

AGENT = "bench_agent"
TARGET_P50_MS = 5.0  # issue 5: p50 of the exchange under 5 ms
IDLE_S = 2.0  # service CPU measured while idle, as a control
HTTP_S = 10.0  # socket timeout per request

Request = tuple[str, str, bytes | None, dict[str, str]]  # method, path, body, headers


@dataclass
class Arm:
    """One kind of request and what it got back."""

    name: str
    request: Request
    latencies: list[float] = field(default_factory=list)  # seconds, timed rounds only
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)

    def ms(self, q: float) -> float:
        return 1000 * pct(self.latencies, q)


class Client:
    """One keep-alive HTTP/1.1 connection; :meth:`send` times one request to its body's end."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.hostname not in ("127.0.0.1", "localhost"):
            raise SystemExit(f"the loopback face is not on 127.0.0.1: {url}")
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=HTTP_S)
        self.ports: list[int] = []  # the local port of each request's connection
        self.closes: list[int] = []  # the numbers (from 1) of the answers that closed the connection
        self.timed = slice(0, 0)  # the requests of the timed rounds

    def send(self, request: Request) -> tuple[float, int, bytes]:
        method, path, body, headers = request
        start = time.perf_counter()
        self.conn.request(method, path, body=body, headers=headers)
        self.ports.append(self.conn.sock.getsockname()[1])
        response = self.conn.getresponse()
        data = response.read()
        elapsed = time.perf_counter() - start
        if response.will_close:  # hypercorn closes after keep_alive_max_requests (1000) answers
            self.closes.append(len(self.ports))
        return elapsed, response.status, data


def post(cap: str, body: dict[str, str]) -> Request:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {cap}"}
    return "POST", "/exchange", json.dumps(body).encode(), headers


def grant_agent(stack: Stack, owner: str) -> str:
    """A managed actor spawned by the interactive one; returns its actor token."""
    token = secrets.token_urlsafe(32)
    row = LedgerRow(
        kind=LedgerKind.MANAGED, owner=owner, actor=AGENT, scope=("spawn",),
        allow_subscribe=("bench.>",), allow_publish=("bench.>",), role=None, parent=f"{owner}.{ACTOR}",
        label="benchmark agent", token_hash=hash_actor_token(token),
        lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
        granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )  # fmt: skip
    write_row(stack.space_paths, row)
    return token


def make_arms(stack: Stack, client: Client, agent: bool) -> list[Arm]:
    """The health arm, the human arm and (with ``agent``) the agent arm, each checked once."""
    id_token = mint_dev_token(stack.material, sub=stack.subs[0], now=int(time.time()))
    human = Arm(
        "exchange human",
        post(stack.exchange_cap, {"idpToken": id_token, "actor": ACTOR}),
    )
    arms = [Arm("health", ("GET", "/health", None, {})), human]
    _, status, data = client.send(human.request)
    if status != 200:
        raise SystemExit(f"the human exchange answered {status}: {data[:300]!r}")
    if agent:
        owner = json.loads(data)["owner"]
        body = {"owner": owner, "actor": AGENT, "actorToken": grant_agent(stack, owner)}
        arms.append(Arm("exchange agent", post(stack.exchange_cap, body)))
    for arm in arms:
        _, status, data = client.send(arm.request)
        if status != 200:
            raise SystemExit(f"{arm.name} answered {status}: {data[:300]!r}")
    return arms


def rounds(client: Client, arms: list[Arm], n: int, *, record: bool) -> None:
    """``n`` rounds of one request per arm, the order rotating each round."""
    for i in range(n):
        k = i % len(arms)
        for arm in arms[k:] + arms[:k]:
            elapsed, status, _ = client.send(arm.request)
            if record:
                arm.latencies.append(elapsed)
                arm.statuses[status] += 1


def block_cpu(stack: Stack, client: Client, arm: Arm, n: int) -> Cpu:
    """``n`` requests of one arm back to back, metered; their statuses are counted too."""
    with CpuMeter(stack) as meter:
        for _ in range(n):
            arm.statuses[client.send(arm.request)[1]] += 1
    return meter.cpu


def idle_ms_per_s(pid: int) -> float:
    time.sleep(1.0)  # past the start-up work
    idle0 = proc_cpu_s(pid)
    time.sleep(IDLE_S)
    return (proc_cpu_s(pid) - idle0) / IDLE_S * 1000


def report(arms: list[Arm], n: int, timed: Cpu, blocks: dict[str, Cpu], idle: float, client: Client) -> None:
    print(f"\nconnections: the timed rounds ran on {len(set(client.ports[client.timed]))}, the whole run on "
          f"{len(set(client.ports))}; answers that closed one: {', '.join(map(str, client.closes)) or 'none'} "
          f"(request numbers; timed: {client.timed.start + 1}-{client.timed.stop})")
    print(f"{n} timed rounds in {timed.wall_s:.2f} s; cores: service {timed.cores(timed.service_s):.2f}, "
          f"this client {timed.cores(timed.loadgen_s):.2f}, other load {timed.cores(timed.other_s):.2f}")
    print(f"  {'route':18} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}   statuses (timed rounds and CPU block)")
    for arm in arms:
        codes = " ".join(f"{code}={count}" for code, count in sorted(arm.statuses.items()))
        print(f"  {arm.name:18} {arm.ms(0.5):8.2f} {arm.ms(0.99):8.2f} {arm.ms(1.0):8.2f}   {codes}")
    print(f"service CPU per request, blocks of {n} back to back (idle control {idle:.1f} ms/s):")
    for arm in arms:
        cpu = blocks[arm.name]
        print(f"  {arm.name:18} {1000 * cpu.service_s / n:6.2f} ms   (block {cpu.wall_s:.2f} s, "
              f"other load {cpu.cores(cpu.other_s):.2f} cores)")
    print()
    for arm in arms[1:]:
        verdict_lines(arm, arms[0], n, blocks)


def verdict_lines(arm: Arm, health: Arm, n: int, blocks: dict[str, Cpu]) -> None:
    """One exchange arm's headline: the ratios to ``/health``, its CPU, non-200s, the target."""
    cpu_ms = 1000 * blocks[arm.name].service_s / n
    above_ms = cpu_ms - 1000 * blocks[health.name].service_s / n
    refused = sum(count for code, count in arm.statuses.items() if code != 200)
    verdict = "met" if arm.ms(0.5) < TARGET_P50_MS else "MISSED"
    print(f"{arm.name}: ratio to /health p50 {arm.ms(0.5) / health.ms(0.5):.2f}, "
          f"p99 {arm.ms(0.99) / health.ms(0.99):.2f}; service CPU per exchange {cpu_ms:.2f} ms "
          f"({above_ms:.2f} above /health); non-200 answers {refused}")
    print(f"  target p50 < {TARGET_P50_MS:g} ms: {verdict} (p50 {arm.ms(0.5):.2f} ms)")


async def run(args: argparse.Namespace, tmp: Path) -> None:
    async with open_stack(argparse.Namespace(actors=1, keep_log=None), tmp) as stack:
        print(
            f"service pid {stack.proc.pid}, nats-server pid {stack.broker_pid}, loopback face {stack.exchange_url}",
            flush=True,
        )
        idle = idle_ms_per_s(stack.proc.pid)
        client = Client(stack.exchange_url)
        arms = make_arms(stack, client, args.agent)
        rounds(client, arms, args.warmup, record=False)
        first = len(client.ports)
        with CpuMeter(stack) as meter:
            rounds(client, arms, args.n, record=True)
        client.timed = slice(first, len(client.ports))
        blocks = {arm.name: block_cpu(stack, client, arm, args.n) for arm in arms}
        client.conn.close()
        report(arms, args.n, meter.cpu, blocks, idle, client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n",
        type=int,
        default=300,
        help="timed rounds, and each CPU block's size (default 300)",
    )
    parser.add_argument("--warmup", type=int, default=30, help="untimed rounds first (default 30)")
    parser.add_argument("--no-agent", dest="agent", action="store_false", help="leave out the agent arm")
    args = parser.parse_args()
    if args.n < 1 or args.warmup < 0:
        parser.error("--n must be at least 1 and --warmup at least 0")
    print("cotal-trio exchange benchmark")
    print(
        f"machine: nproc={os.cpu_count()} ({len(os.sched_getaffinity(0))} usable), "
        f"{platform.platform()}, Python {platform.python_version()}, {nats_server_version()}"
    )
    print(f"code: {Path(cotal_trio.__file__).parent} ({code_version()})")
    print(
        f"command: python bench/exchange.py --n {args.n} --warmup {args.warmup}"
        + ("" if args.agent else " --no-agent"),
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="cotal-bench-", ignore_cleanup_errors=True) as tmp:
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
