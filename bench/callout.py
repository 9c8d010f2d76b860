#!/usr/bin/env python3
"""Benchmark: connects through the auth callout versus connects as a static user, in one run.

Usage::

    python bench/callout.py [--n 500] [--concurrency 32] [--rounds 3] [--actors 100]

What it does (DESIGN.md section 10; the method of reference/stack-prototype.md section 6):

1. Creates a temporary root and starts ``python -m cotal_trio up --root <tmp> --port <free>``
   as a subprocess: the auth service, with its own nats-server. Waits (bounded) for the
   space's ``auth-service.json``.
2. Grants ``--actors`` interactive actors (one IdP subject each, written with the state API),
   mints a development IdP token per subject and exchanges it on the loopback face for a bearer
   (``ttlSec`` 900, re-exchanged every round). The callout connects round-robin over these
   bearers, so a per-actor connect limit in the service does not turn into a throttle here.
3. Mints one static data-account user (``mint_service_user``, ``bench.>`` both ways, 1 h).
4. In this process (plain asyncio nats-py, never inside the service), per round and per mode:
   ``--n`` sequential connects, then ``--n`` connects by ``--concurrency`` workers, for each
   kind back to back, the kind that leads rotating across rounds (issue 14 item 5): ``static``
   (the data-account user, no callout), ``agent`` (ours: an agent connect, which carries a
   listing generation), ``view`` (ours: a ``deployer`` view, which carries none) and ``peer``
   (PyPI ``nats-callout`` 0.1.1 as an allow-all callout, bench/_peer_callout.py, on an auth
   account of our auth account's shape without xkey, pushed to the same broker; only when the
   ``bench`` extra is installed: ``pip install '.[bench]'``). A sample is ``Client.connect``
   (CONNECT answered by PONG, i.e. the callout has answered), ``is_connected`` checked, then
   ``close()``. Latency is the connect alone; the rate counts connect + close.
5. Reads the service's CPU (utime + stime of ``/proc/<pid>/stat``) before and after every
   batch; the nats-server's and this load generator's CPU too, for the split, and the CPU
   every other process on the machine used meanwhile ("other load", from ``/proc/stat``), so a
   noisy neighbour shows in the output instead of silently skewing the rates.
6. Prints every batch, a table of medians across rounds, every kind's rate as a ratio of the
   static user's, ours against the peer (rate, service CPU per connect), and each callout's
   CPU per connect (its process's utime + stime: ours for ``agent``/``view``, the peer's own).

Load mode (issue 4, "Benchmark")::

    python bench/callout.py --load [--rates 50,100,200,...] [--step-s 4] [--overload 2.5] [--actors 1000]

Steps 1-3 as above (1000 actors), then, from this process with a few lines of raw NATS protocol
instead of nats-py (:func:`raw_connect`; cheaper, and it reads the broker's client id):

a. closed loop, ``--concurrency`` workers for 3 s each: static connects, callout connects;
b. open loop, each rate of ``--rates`` in turn for ``--step-s``: connect ``i`` starts at
   ``t0 + i / rate`` whether or not earlier ones finished (each: fresh name nonce, the next
   bearer, close after the answer), so a service that falls behind shows as latency, shed and
   timeouts rather than as a slower generator. The ramp stops once the admitted rate has not
   grown for FLAT_STEPS rates in a row;
c. one overload probe at ``--overload`` times the most admitted in a step, for the deadlines;
d. the static closed loop again.

Each connect is joined by the broker's client id (INFO ``client_id``, the line's ``cid=``) to
the service's callout log line on its stderr: outcome, step times and ``total_ms``. The report
gives per rate the admitted rate, outcomes, callout and client percentiles, the generator's
start lag and everyone's CPU; then the knee (the highest rate admitted within KNEE_SHORTFALL of
offered), p50/p99 callout time at and below it, the shares shed and timed out above it, the
static rate, and the deadline check: lines over the budget, and mints the client never got.

Offered multiples (issue 14 item 5), the default of ``--load``::

    python bench/callout.py --load [--multiples 0.5,0.8,1,1.5,2,3] [--step-s 60] [--pin]

Instead of the ramp (b, c), each multiple of the closed-loop callout rate measured in (a) is
offered in turn for ``--step-s``, all of them (no early stop), and a goodput table follows:
clients admitted a second (and as a share of the closed-loop rate), answers after the deadline
(callout lines over the budget), answers after the broker's timeout (mints whose client was
refused anyway, denials whose client waited the broker's whole timeout), p99 of the callout's
``total_ms`` and of the admitted clients, then the service's RSS before and after and one quiet
connect's time once the offer stopped. ``--rates`` instead runs the ramp of absolute rates.
``--pin`` puts every thread of the service on the last usable CPU and the broker and this load
generator on the others (``sched_setaffinity``, what ``taskset -p`` does; threads the service
starts later inherit it), so the service's own queueing can be read apart from CPU contention.

Connect limits (60/min per actor, 600/min per owner) are avoided by spreading: 1000 actors, one
owner each, used in turn, so no actor draws more than its bucket holds in a run (the report
prints the most any actor drew and the RATE_LIMITED denials). ``cotal up`` runs the defaults.

It measures and prints; it asserts nothing about timing. Only 127.0.0.1 is used. The service
is stopped with SIGINT (it stops its own nats-server) and the temporary folder is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import concurrent.futures
import contextlib
import importlib.util
import json
import math
import os
import platform
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import nats.aio.client
import trio
from _host import CLK_TCK, code_version, machine_busy_s, nats_server_version, proc_cpu_s

import cotal_trio
from cotal_trio.broker.accounts import open_system_connection, push_accounts
from cotal_trio.broker.process import free_port
from cotal_trio.broker.provision import mint_service_user
from cotal_trio.core import natsjwt
from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.creds import format_creds, parse_creds
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.devidp import DevIdpMaterial, mint_dev_token
from cotal_trio.natsio import open_loop
from cotal_trio.state import (
    RootPaths,
    load_broker,
    load_idp_pin,
    load_owner_secret,
    load_space,
    read_json,
    write_row,
)

SPACE = "bench"
ACTOR = "bench"
READY_S = 30.0  # auth-service.json must appear within this
STOP_S = 15.0  # the service must exit this long after SIGINT (then SIGTERM, then SIGKILL)
CONNECT_S = 5.0  # nats-py connect_timeout per sample
CLOSE_S = 5.0
IDLE_S = 2.0  # service CPU measured while idle, as a control
WARMUP = 20  # untimed sequential connects before each batch
BEARER_TTL_S = 900
# --load
LOAD_RATES = (50, 100, 200, 300, 400, 500, 600, 700, 800, 1000, 1200, 1500, 2000)  # offered connects/s
LOAD_ACTORS = 1000  # bearers in turn: at most ~40 connects each in a run, under the 60/min actor bucket
LOAD_STEP_S = 4.0  # seconds each rate is offered
CLOSED_S = 3.0  # each closed-loop batch (static before and after the ramp, callout once)
PAUSE_S = 1.0  # between rates, after every connect of the last one has finished
GROWTH = 0.05  # the admitted rate "grows" when it beats the best so far by this share
FLAT_STEPS = 2  # the ramp ends after this many rates in a row without growth
KNEE_SHORTFALL = 0.05  # the knee: the highest rate admitted within this share of offered
OVERLOAD = 2.5  # the overload probe offers this multiple of the most admitted in a step
TARGET_P99_MS = 50  # issue 4: p99 callout time under 50 ms below the knee
# --load (issue 14 item 5): offered multiples of the measured closed-loop callout rate
LOAD_MULTIPLES = (0.5, 0.8, 1.0, 1.5, 2.0, 3.0)
EXCHANGE_THREADS = 4


# -- processes and CPU -------------------------------------------------------------------------






def broker_pid(paths: RootPaths, service_pid: int) -> int | None:
    """The nats-server the service started: its pid file, else the service's child by name."""
    try:
        pid = int(paths.broker_pid.read_text().strip())
        if Path(f"/proc/{pid}").exists():
            return pid
    except (OSError, ValueError):
        pass
    for children in Path(f"/proc/{service_pid}/task").glob("*/children"):
        for child in children.read_text().split():
            try:
                if Path(f"/proc/{child}/comm").read_text().strip().startswith("nats-server"):
                    return int(child)
            except OSError:
                continue
    return None


def stop_service(proc: subprocess.Popen[bytes]) -> str:
    """SIGINT the service by pid and wait (bounded); escalate to SIGTERM, then SIGKILL."""
    for sig, wait_s in ((signal.SIGINT, STOP_S), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return f"stopped with {sig.name}, exit code {proc.returncode}"
        except subprocess.TimeoutExpired:
            continue
    return f"exit code {proc.returncode}"




# -- setup through the root's state API and the loopback face ----------------------------------


def grant(space_paths, owner: str) -> None:
    row = LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=owner, actor=ACTOR, scope=("spawn",),
        allow_subscribe=("bench.>",), allow_publish=("bench.>",), role=None, parent=None,
        label="benchmark", token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
        granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )  # fmt: skip
    write_row(space_paths, row)


def exchange(url: str, cap: str, idp_token: str, view: str | None = None) -> str:
    fields = {"idpToken": idp_token, "actor": ACTOR, "ttlSec": BEARER_TTL_S} | ({"view": view} if view else {})
    body = json.dumps(fields).encode()
    request = urllib.request.Request(
        url + "/exchange", data=body, method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {cap}"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["token"]
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"exchange refused: {exc.code} {exc.read()[:300]!r}") from None


def creds_callbacks(creds: str) -> dict[str, Any]:
    jwt, seed = parse_creds(creds)
    key, jwt_bytes = KeyPair.from_seed(seed), jwt.encode()
    return {
        "user_jwt_cb": lambda: jwt_bytes,
        "signature_cb": lambda nonce: base64.b64encode(key.sign(nonce.encode())),
    }


# -- the load generator ------------------------------------------------------------------------


class _ConnectFailed(Exception):
    pass


async def connect_once(url: str, options: dict[str, Any]) -> float | None:
    """One sample: connect, check, close. Seconds to connected, or None when it failed."""
    nc = nats.aio.client.Client()
    connecting = True

    async def error_cb(exc: Exception) -> None:
        if connecting:  # stop nats-py's own retry loop at the first failure
            raise _ConnectFailed(str(exc))

    elapsed: float | None = None
    start = time.perf_counter()
    try:
        await nc.connect(
            servers=[url], error_cb=error_cb, allow_reconnect=False, max_reconnect_attempts=0,
            connect_timeout=CONNECT_S, **options,
        )  # fmt: skip
        if nc.is_connected:  # connect can return without raising while not connected
            elapsed = time.perf_counter() - start
    except Exception:
        elapsed = None
    finally:
        connecting = False
        try:
            await asyncio.wait_for(nc.close(), CLOSE_S)
        except Exception:
            pass
    return elapsed


@dataclass
class Batch:
    kind: str  # "static" | "callout"
    mode: str  # "seq" | "conc"
    round: int
    n: int
    wall_s: float
    latencies: list[float]
    service_cpu_s: float
    broker_cpu_s: float
    loadgen_cpu_s: float
    other_cpu_s: float  # every other process on the machine during the batch (noise)

    @property
    def ok(self) -> int:
        return len(self.latencies)

    @property
    def rate(self) -> float:
        return self.ok / self.wall_s

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")

    @property
    def total_cpu_s(self) -> float:
        """Service + broker + load generator: what the connects cost the machine."""
        return self.service_cpu_s + self.broker_cpu_s + self.loadgen_cpu_s

    def per_connect_ms(self, cpu_s: float) -> float:
        return cpu_s / self.n * 1000


@dataclass
class Bench:
    """Batches of connects per kind: ``options[kind]()`` gives one connect's nats-py options,
    ``service_pids[kind]`` the process whose CPU is that kind's "service" (ours or the peer)."""

    url: str
    broker_pid: int | None
    options: dict[str, Callable[[], dict[str, Any]]]
    service_pids: dict[str, int | None]
    batches: list[Batch] = field(default_factory=list)

    async def batch(self, kind: str, mode: str, rnd: int, n: int, concurrency: int) -> Batch:
        make, service_pid = self.options[kind], self.service_pids.get(kind)
        for _ in range(min(WARMUP, n)):
            await connect_once(self.url, make())
        latencies: list[float] = []
        todo = iter(range(n))

        async def worker() -> None:
            for _ in todo:
                result = await connect_once(self.url, make())
                if result is not None:
                    latencies.append(result)

        workers = 1 if mode == "seq" else concurrency
        svc0, brk0, gen0 = proc_cpu_s(service_pid), proc_cpu_s(self.broker_pid), time.process_time()
        all0 = machine_busy_s()
        t0 = time.perf_counter()
        try:
            bound = 60 + n * (CONNECT_S + CLOSE_S) / workers
            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(workers))), bound)
        except TimeoutError:
            print(f"  ! {kind} {mode} batch hit its {bound:.0f} s bound", flush=True)
        wall = time.perf_counter() - t0
        svc1, brk1, gen1 = proc_cpu_s(service_pid), proc_cpu_s(self.broker_pid), time.process_time()
        ours = (svc1 - svc0) + (brk1 - brk0) + (gen1 - gen0)
        other = max(0.0, machine_busy_s() - all0 - ours)
        b = Batch(kind, mode, rnd, n, wall, latencies, svc1 - svc0, brk1 - brk0, gen1 - gen0, other)
        self.batches.append(b)
        print(
            f"  round {rnd} {mode:4} {kind:7} ok {b.ok:4}/{n}  {b.rate:7.0f} /s  "
            f"p50 {b.pct(0.5):6.2f} p99 {b.pct(0.99):6.2f} ms  CPU ms/connect: "
            f"service {b.per_connect_ms(b.service_cpu_s):5.2f} broker {b.per_connect_ms(b.broker_cpu_s):5.2f} "
            f"loadgen {b.per_connect_ms(b.loadgen_cpu_s):5.2f}  other load {b.other_cpu_s / b.wall_s:4.2f} cores",
            flush=True,
        )
        return b


# -- report ------------------------------------------------------------------------------------


def med(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


# The kinds of the side-by-side mode, in the report's column order (issue 14 item 5).
KIND_LABELS = {
    "static": "static user, no callout (the limit)",
    "agent": "ours, agent connect (listing generation)",
    "view": "ours, a view without a listing generation (deployer)",
    "peer": "PyPI nats-callout 0.1.1, allow-all, no xkey",
}


def report(bench: Bench, args: argparse.Namespace, idle_ms_per_s: float, log_counts: dict[str, int]) -> None:
    """Medians per kind, every kind's rate as a ratio of the static user's (median of the
    per-round ratios: the batches of one round ran back to back), and each of ours against the
    peer: rate and service CPU per connect."""
    kinds = [k for k in KIND_LABELS if any(b.kind == k for b in bench.batches)]

    def cell(kind: str, mode: str, f: Callable[[Batch], float]) -> float:
        return med([f(b) for b in bench.batches if b.kind == kind and b.mode == mode])

    def ratio(kind: str, base: str, mode: str, f: Callable[[Batch], float]) -> float:
        per_round = []
        for rnd in range(1, args.rounds + 1):
            k = [f(b) for b in bench.batches if b.round == rnd and b.mode == mode and b.kind == kind]
            s = [f(b) for b in bench.batches if b.round == rnd and b.mode == mode and b.kind == base]
            if k and s and s[0] > 0:
                per_round.append(k[0] / s[0])
        return med(per_round)

    conc = f"conc{args.concurrency}"
    service_ms = lambda b: b.per_connect_ms(b.service_cpu_s)  # noqa: E731
    rows = [
        ("seq rate (/s)", "seq", lambda b: b.rate, "{:.0f}"),
        ("seq p50 (ms)", "seq", lambda b: b.pct(0.5), "{:.2f}"),
        ("seq p99 (ms)", "seq", lambda b: b.pct(0.99), "{:.2f}"),
        (f"{conc} rate (/s)", "conc", lambda b: b.rate, "{:.0f}"),
        (f"{conc} p50 (ms)", "conc", lambda b: b.pct(0.5), "{:.2f}"),
        (f"{conc} p99 (ms)", "conc", lambda b: b.pct(0.99), "{:.2f}"),
        ("seq service CPU ms/connect", "seq", service_ms, "{:.3f}"),
        (f"{conc} service CPU ms/connect", "conc", service_ms, "{:.3f}"),
        ("seq broker CPU ms/connect", "seq", lambda b: b.per_connect_ms(b.broker_cpu_s), "{:.3f}"),
        (f"{conc} broker CPU ms/connect", "conc", lambda b: b.per_connect_ms(b.broker_cpu_s), "{:.3f}"),
        ("seq loadgen CPU ms/connect", "seq", lambda b: b.per_connect_ms(b.loadgen_cpu_s), "{:.3f}"),
        (f"{conc} loadgen CPU ms/connect", "conc", lambda b: b.per_connect_ms(b.loadgen_cpu_s), "{:.3f}"),
        ("seq total CPU ms/connect", "seq", lambda b: b.per_connect_ms(b.total_cpu_s), "{:.3f}"),
        (f"{conc} total CPU ms/connect", "conc", lambda b: b.per_connect_ms(b.total_cpu_s), "{:.3f}"),
        ("seq other load (cores)", "seq", lambda b: b.other_cpu_s / b.wall_s, "{:.2f}"),
        (f"{conc} other load (cores)", "conc", lambda b: b.other_cpu_s / b.wall_s, "{:.2f}"),
    ]
    print()
    print(f"medians over {args.rounds} rounds, {args.n} connects per batch")
    for kind in kinds:
        print(f"  {kind:7} {KIND_LABELS[kind]}")
    print(f"{'':32}" + "".join(f"{k:>10}" for k in kinds))
    for label, mode, f, fmt in rows:
        print(f"{label:32}" + "".join(f"{fmt.format(cell(k, mode, f)):>10}" for k in kinds))
    print(f"{'failed connects (all batches)':32}" + "".join(
        f"{sum(b.n - b.ok for b in bench.batches if b.kind == k):>10}" for k in kinds))
    print(f"service idle CPU: {idle_ms_per_s:.1f} ms per second (over {IDLE_S:.0f} s; one tick is {1000 / CLK_TCK:.0f} ms)")
    print("service log outcomes: " + " ".join(f"{k}={v}" for k, v in log_counts.items()))
    print()
    rate = lambda b: b.rate  # noqa: E731
    for mode, name in (("conc", f"concurrent {args.concurrency}"), ("seq", "sequential")):
        print(f"ratios, {name} (median of per-round ratios):")
        for kind in kinds:
            if kind != "static":
                print(f"  {kind}/static connects/s = {ratio(kind, 'static', mode, rate):.2f}")
        for kind in ("agent", "view"):
            if kind in kinds and "peer" in kinds:
                print(f"  {kind}/peer connects/s = {ratio(kind, 'peer', mode, rate):.2f}   "
                      f"{kind}/peer service CPU per connect = {ratio(kind, 'peer', mode, service_ms):.2f}")
    for kind in kinds:
        if kind != "static":
            print(f"callout CPU per connect, {kind} (median) = {cell(kind, 'conc', service_ms):.2f} ms"
                  f"   [concurrent {args.concurrency}; sequential {cell(kind, 'seq', service_ms):.2f} ms;"
                  f" seq p50 {cell(kind, 'seq', lambda b: b.pct(0.5)):.2f} ms]")


def count_outcomes(log_path: Path) -> dict[str, int]:
    counts = {k: 0 for k in ("minted", "denied", "timeout", "shed", "level=warn")}
    try:
        for line in log_path.read_text(errors="replace").splitlines():
            for k in counts:
                if (f"outcome={k}" if "=" not in k else k) in line:
                    counts[k] += 1
    except OSError:
        pass
    return counts


# -- the load mode: one raw NATS connect -------------------------------------------------------
#
# The load mode drives the broker with a few lines of protocol instead of nats-py: read INFO,
# send CONNECT (signed nonce, bearer, name) and PING, wait for PONG or -ERR, close. A connect
# costs the generator about 0.25-0.3 ms of CPU against nats-py's 0.4-0.5 ms, which leaves more
# of the 2 cores to the service and the broker; and INFO carries the broker's client id, which
# joins each connect to the service's log line (``cid=``).

_CONNECT_HEAD = {"verbose": False, "pedantic": False, "lang": "python3", "version": "bench",
                 "protocol": 1, "headers": True, "no_responders": True}  # fmt: skip


ConnectLine = Callable[[str], bytes]  # the server's nonce -> CONNECT + PING
NextLine = Callable[[], ConnectLine]  # the next connect's line (callout: the next bearer, a fresh name)


class Signer:
    """A user's creds, parsed once: :meth:`line` makes one connect's CONNECT + PING."""

    def __init__(self, creds: str) -> None:
        self._jwt, seed = parse_creds(creds)
        self._key = KeyPair.from_seed(seed)

    def line(self, **fields: str) -> ConnectLine:
        """CONNECT + PING given the server's nonce; ``fields`` go into CONNECT."""

        def line(nonce: str) -> bytes:
            sig = base64.b64encode(self._key.sign(nonce.encode())).decode()
            body = json.dumps({**_CONNECT_HEAD, "jwt": self._jwt, "sig": sig, **fields}, separators=(",", ":"))
            return b"CONNECT " + body.encode() + b"\r\nPING\r\n"

        return line


@dataclass(slots=True)
class Sample:
    """One connect as the client saw it."""

    start: float  # perf_counter when it started
    lag_s: float  # started this long after it was due (open loop; 0 in closed loop)
    elapsed_s: float  # start to the broker's answer (PONG or -ERR), or to the failure
    info_s: float  # start to the broker's INFO (TCP accept and INFO), nan if none came
    result: str  # "ok" (PONG) | "refused" (-ERR) | "closed" | "timeout" | "error"
    error: str  # the -ERR text ("Authorization Violation", "Authentication Timeout", ...)
    cid: int | None  # the broker's client id from INFO


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[str, str]:
    while True:
        line = await reader.readline()
        if line.startswith(b"PONG"):
            return "ok", ""
        if line.startswith(b"-ERR"):
            return "refused", line[4:].strip(b" \r\n'").decode(errors="replace")
        if not line:
            return "closed", ""
        if line.startswith(b"PING"):
            writer.write(b"PONG\r\n")


async def raw_connect(host: str, port: int, line: ConnectLine, due: float | None = None) -> Sample:
    """One connect, bounded by CONNECT_S; ``due`` is when it should have started (perf_counter)."""
    start, info_s = time.perf_counter(), math.nan
    cid, writer, result, error = None, None, "timeout", ""
    try:
        async with asyncio.timeout(CONNECT_S):
            reader, writer = await asyncio.open_connection(host, port)
            info = json.loads((await reader.readline()).partition(b" ")[2])
            info_s, cid = time.perf_counter() - start, info.get("client_id")
            writer.write(line(info["nonce"]))
            result, error = await _answer(reader, writer)
    except TimeoutError:
        pass
    except (OSError, ValueError, KeyError):
        result = "error"
    elapsed = time.perf_counter() - start
    if writer is not None:
        writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_S):
                await writer.wait_closed()
    lag_s = 0.0 if due is None else max(0.0, start - due)
    return Sample(start, lag_s, elapsed, info_s, result, error, cid)


# -- the load mode: the service's log lines ----------------------------------------------------

_LINE = re.compile(
    r"auth callout: level=\w+ outcome=(?P<outcome>\w+) .*? cid=(?P<cid>\d+) .*?"
    r"queue_ms=(?P<queue>\d+) verify_ms=(?P<verify>\d+) ledger_ms=(?P<ledger>\d+) "
    r"policy_ms=(?P<policy>\d+) sign_ms=(?P<sign>\d+) total_ms=(?P<total>\d+)(?P<rest>.*)"
)
STEPS_MS = ("queue", "verify", "ledger", "policy", "sign", "total")


@dataclass(frozen=True, slots=True)
class Line:
    """One callout log line: its outcome, step times (whole ms) and whether it was rate limited."""

    outcome: str
    ms: dict[str, int]
    rate_limited: bool
    at: str | None  # the step a timeout stopped in


class CalloutLog:
    """The service's stderr, read on from where the last read stopped; lines by broker cid."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.by_cid = path, 0, {}
        self.dropped = 0

    def read_new(self) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        data = data[: data.rfind(b"\n") + 1]  # complete lines only
        self.offset += len(data)
        for text in data.decode(errors="replace").splitlines():
            if "outcome=dropped" in text:
                self.dropped += 1
            elif m := _LINE.search(text):
                ms = {k: int(m[k]) for k in STEPS_MS}
                at = re.search(r" at=(\w+)", m["rest"])
                limited = 'reason="RATE_LIMITED' in m["rest"]
                self.by_cid[int(m["cid"])] = Line(m["outcome"], ms, limited, at[1] if at else None)


# -- the load mode: open-loop steps and closed-loop batches ---------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass(frozen=True, slots=True)
class Cpu:
    """CPU seconds over one measured interval, by process."""

    service_s: float
    broker_s: float
    loadgen_s: float
    other_s: float
    wall_s: float

    def cores(self, seconds: float) -> float:
        return seconds / self.wall_s


class CpuMeter:
    """Reads the service's, the broker's, this process's and everyone else's CPU at start and stop."""

    def __init__(self, stack: Stack) -> None:
        self._pids = (stack.proc.pid, stack.broker_pid)

    def __enter__(self) -> Self:
        self._t0, self._all0 = time.perf_counter(), machine_busy_s()
        self._ours0 = (*(proc_cpu_s(p) for p in self._pids), time.process_time())
        return self

    def __exit__(self, *exc_info: object) -> None:
        now = (*(proc_cpu_s(p) for p in self._pids), time.process_time())
        ours = [b - a for a, b in zip(self._ours0, now, strict=True)]
        other = max(0.0, machine_busy_s() - self._all0 - sum(ours))
        self.cpu = Cpu(*ours, other, time.perf_counter() - self._t0)


@dataclass
class LoadStep:
    """One open-loop step: ``rate`` connects a second offered for ``step_s``, then drained."""

    rate: float
    step_s: float
    samples: list[Sample]
    lines: list[Line | None]  # the callout's line for each sample, by cid (None: no line)
    cpu: Cpu

    def count(self, outcome: str) -> int:
        return sum(1 for ln in self.lines if ln is not None and ln.outcome == outcome)

    def share(self, outcome: str) -> float:
        return self.count(outcome) / len(self.samples)

    @property
    def admitted(self) -> int:
        return sum(1 for s in self.samples if s.result == "ok")

    @property
    def admitted_per_s(self) -> float:
        """Admitted connects over the span from the first start to the last admitted answer.

        A rate the lane keeps up with spans ``step_s`` plus one connect time; a backlog that
        drains after the last arrival stretches the span, so queueing lowers the rate even when
        every connect is admitted in the end.
        """
        ends = [s.start + s.elapsed_s for s in self.samples if s.result == "ok"]
        return len(ends) / (max(ends) - min(s.start for s in self.samples)) if ends else 0.0

    @property
    def sent_per_s(self) -> float:
        """The arrival rate the generator achieved: starts over the span of the starts."""
        starts = [s.start for s in self.samples]
        return (len(starts) - 1) / (max(starts) - min(starts)) if len(starts) > 1 else float("nan")

    def callout_ms(self, step: str = "total", outcome: str | None = "minted") -> list[float]:
        return [ln.ms[step] for ln in self.lines if ln is not None and outcome in (None, ln.outcome)]

    def client_ms(self) -> list[float]:
        return [s.elapsed_s * 1000 for s in self.samples if s.result == "ok"]

    def info_ms(self) -> list[float]:
        """Start to INFO per connect: the broker's accept and greeting."""
        return [s.info_s * 1000 for s in self.samples if not math.isnan(s.info_s)]

    def outside_ms(self) -> list[float]:
        """Per answered connect: CONNECT sent to the broker's answer, less the service's total_ms.

        The broker's CONNECT work, the request's way to the service's ``on_message`` (broker,
        socket, nats-py, the lane's asyncio loop), the reply's way back, and this client's own
        delay in reading the answer.
        """
        return [
            (x.elapsed_s - x.info_s) * 1000 - ln.ms["total"]
            for x, ln in zip(self.samples, self.lines, strict=True)
            if ln is not None and x.result in ("ok", "refused")
        ]


async def offer(stack: Stack, rate: float, step_s: float, line: NextLine) -> list[Sample]:
    """Start ``rate * step_s`` connects on a fixed schedule, whatever finished; wait for all."""
    host, port = _host_port(stack.url)
    n, t0 = round(rate * step_s), time.perf_counter() + 0.005
    tasks = []
    for i in range(n):
        due = t0 + i / rate
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(raw_connect(host, port, line(), due)))
    return list(await asyncio.gather(*tasks))


async def closed_loop(stack: Stack, workers: int, duration_s: float, line: NextLine) -> tuple[list[Sample], float]:
    """``workers`` connecting back to back for ``duration_s``; the samples and the wall time."""
    host, port = _host_port(stack.url)
    samples: list[Sample] = []
    stop = time.perf_counter() + duration_s

    async def worker() -> None:
        while time.perf_counter() < stop:
            samples.append(await raw_connect(host, port, line()))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return samples, time.perf_counter() - t0


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("nats://").rpartition(":")
    return host, int(port)


# -- the load mode: the run and its report ------------------------------------------------------


async def run_load(args: argparse.Namespace, stack: Stack) -> None:
    budget_ms = round(CalloutLimits().budget_s * 1000)  # `cotal up` runs the default 2 s timeout
    t0 = time.perf_counter()
    await asyncio.to_thread(stack.refresh_bearers, EXCHANGE_THREADS)
    print(f"service pid {stack.proc.pid}, nats-server pid {stack.broker_pid}, broker {stack.url}; "
          f"{args.actors} actors (one owner each) exchanged their bearers in {time.perf_counter() - t0:.1f} s; "
          f"callout budget {budget_ms} ms (auth timeout {CalloutLimits().auth_timeout_s:g} s less 250 ms)", flush=True)
    turn, per_actor = iter(range(1 << 62)), [0] * len(stack.bearers)
    static, sentinel = Signer(stack.static_creds).line(name="bench-static"), Signer(stack.sentinel_creds)

    def callout() -> ConnectLine:
        i = next(turn) % len(stack.bearers)
        per_actor[i] += 1
        return sentinel.line(auth_token=stack.bearers[i], name="ibx" + secrets.token_hex(8))

    log = CalloutLog(stack.log_path)
    if args.pin:
        print(pin(stack), flush=True)
    await closed_loop(stack, 4, 1.0, callout)  # warm: memo, ledger cache, KV bucket
    await closed_loop(stack, 4, 0.5, lambda: static)
    static_rates = [await _closed_batch(stack, "static", args, lambda: static)]
    callout_rate = await _closed_batch(stack, "callout", args, callout)
    if args.rates is None:
        await _offer_multiples(args, stack, callout, log, callout_rate, budget_ms)
        static_rates.append(await _closed_batch(stack, "static", args, lambda: static))
        print(f"static-user connect rate, closed loop: {med(static_rates):.0f} /s; callout closed loop: "
              f"{callout_rate:.0f} /s")
        return
    steps = await _ramp(stack, args, callout, log)
    probe = None
    if args.overload > 0:
        await asyncio.sleep(PAUSE_S)
        probe = await _step(stack, args.overload * max(s.admitted_per_s for s in steps), args, callout, log)
        print(_step_row(probe) + "  <- overload probe", flush=True)
    static_rates.append(await _closed_batch(stack, "static", args, lambda: static))
    await asyncio.sleep(0.3)
    log.read_new()
    load_report(args, steps, probe, static_rates, callout_rate, budget_ms, log, max(per_actor))


async def _closed_batch(stack: Stack, kind: str, args: argparse.Namespace, line: NextLine) -> float:
    with CpuMeter(stack) as meter:
        samples, wall = await closed_loop(stack, args.concurrency, CLOSED_S, line)
    ok = [s.elapsed_s * 1000 for s in samples if s.result == "ok"]
    c = meter.cpu
    print(f"  closed loop {kind:7} {args.concurrency} workers: {len(ok):5}/{len(samples)} ok  "
          f"{len(ok) / wall:6.0f} /s  p50 {pct(ok, 0.5):6.2f} p99 {pct(ok, 0.99):6.2f} ms  "
          f"cores: service {c.cores(c.service_s):.2f} broker {c.cores(c.broker_s):.2f} "
          f"loadgen {c.cores(c.loadgen_s):.2f} other {c.cores(c.other_s):.2f}", flush=True)
    return len(ok) / wall


async def _ramp(stack: Stack, args: argparse.Namespace, callout: NextLine, log: CalloutLog) -> list[LoadStep]:
    """Offer each rate in turn until the admitted rate stops growing (FLAT_STEPS steps in a row)."""
    print(_STEP_HEADER, flush=True)
    steps: list[LoadStep] = []
    best, flat = 0.0, 0
    for rate in args.rates:
        step = await _step(stack, rate, args, callout, log)
        steps.append(step)
        print(_step_row(step), flush=True)
        flat = 0 if step.admitted_per_s >= best * (1 + GROWTH) else flat + 1
        best = max(best, step.admitted_per_s)
        if flat >= FLAT_STEPS:
            break
        await asyncio.sleep(PAUSE_S)  # queues empty before the next rate
    return steps


async def _step(stack: Stack, rate: float, args: argparse.Namespace, callout: NextLine, log: CalloutLog) -> LoadStep:
    with CpuMeter(stack) as meter:
        samples = await offer(stack, rate, args.step_s, callout)
        await asyncio.sleep(0.2)  # the last lines land
    log.read_new()
    return LoadStep(rate, args.step_s, samples, [log.by_cid.get(s.cid) for s in samples], meter.cpu)


_STEP_HEADER = (
    "  offered    sent  admitted  minted denied  shed timeout noline | callout total_ms | client ms     | lag   |"
    " cores: svc  brk  gen other\n"
    "      /s      /s        /s                    %       %         |  p50  p99   max  | p50    p99    | p99   |"
)


def _step_row(s: LoadStep) -> str:
    total, client = s.callout_ms(), s.client_ms()
    every = s.callout_ms(outcome=None)
    noline = sum(1 for ln in s.lines if ln is None)
    c = s.cpu
    return (
        f"  {s.rate:7.0f} {s.sent_per_s:7.0f} {s.admitted_per_s:9.0f} {s.count('minted'):7} {s.count('denied'):6} "
        f"{100 * s.share('shed'):5.1f} {100 * s.share('timeout'):7.1f} {noline:6} | "
        f"{pct(total, 0.5):4.0f} {pct(total, 0.99):4.0f} {max(every, default=float('nan')):5.0f}  | "
        f"{pct(client, 0.5):6.1f} {pct(client, 0.99):6.1f} | {1000 * pct([x.lag_s for x in s.samples], 0.99):5.1f} |"
        f"      {c.cores(c.service_s):4.2f} {c.cores(c.broker_s):4.2f} {c.cores(c.loadgen_s):4.2f} "
        f"{c.cores(c.other_s):4.2f}"
    )


def knee_of(steps: list[LoadStep]) -> LoadStep | None:
    """The highest offered rate whose admitted rate is within KNEE_SHORTFALL of it."""
    fit = [s for s in steps if s.admitted_per_s >= (1 - KNEE_SHORTFALL) * s.rate]
    return max(fit, key=lambda s: s.rate, default=None)


def load_report(
    args: argparse.Namespace, steps: list[LoadStep], probe: LoadStep | None, static_rates: list[float],
    callout_rate: float, budget_ms: int, log: CalloutLog, most_per_actor: int,
) -> None:
    knee = knee_of(steps)
    print()
    _breakdown(steps if probe is None else [*steps, probe])
    static = med(static_rates)
    print(f"static-user connect rate, closed loop, {args.concurrency} workers, same client: "
          f"{static:.0f} /s (before the ramp {static_rates[0]:.0f}, after {static_rates[-1]:.0f}); "
          f"callout closed loop: {callout_rate:.0f} /s")
    if knee is None:
        print(f"knee: none - not even the lowest rate was admitted within {100 * KNEE_SHORTFALL:.0f}% of offered")
    else:
        _knee_lines(steps, knee, static)
    _late_lines(steps if probe is None else [*steps, probe], budget_ms, log)
    limited = sum(1 for s in steps for ln in s.lines if ln is not None and ln.rate_limited)
    print(f"connect limits: spread over {args.actors} actors, one owner each, in turn; most connects charged to "
          f"one actor {most_per_actor} (its bucket holds 60 and refills 1/s); RATE_LIMITED denials: {limited}")


def _knee_lines(steps: list[LoadStep], knee: LoadStep, static: float) -> None:
    below = [s for s in steps if s.rate <= knee.rate]
    above = [s for s in steps if s.rate > knee.rate]
    pooled = [ms for s in below for ms in s.callout_ms()]
    worst = max(below, key=lambda s: pct(s.callout_ms(), 0.99))
    worst_p99 = pct(worst.callout_ms(), 0.99)
    under = [s.rate for s in steps if pct(s.callout_ms(), 0.99) < TARGET_P99_MS]
    print(f"knee: {knee.rate:.0f} /s offered, {knee.admitted_per_s:.0f} /s admitted "
          f"(= {knee.admitted_per_s / static:.2f} of the static rate); "
          f"most admitted in a step: {max(s.admitted_per_s for s in steps):.0f} /s")
    print(f"at and below the knee ({len(below)} steps, {len(pooled)} minted): callout total_ms "
          f"p50 {pct(pooled, 0.5):.0f} p99 {pct(pooled, 0.99):.0f}; worst step p99 {worst_p99:.0f} ms at "
          f"{worst.rate:.0f} /s -> target p99 < {TARGET_P99_MS} ms: {'met' if worst_p99 < TARGET_P99_MS else 'MISSED'}")
    print(f"highest rate with p99 < {TARGET_P99_MS} ms: " + (f"{max(under):.0f} /s" if under else "none"))
    if above:
        n = sum(len(s.samples) for s in above)
        print(f"above the knee ({len(above)} steps, {n} offered): "
              f"shed {100 * sum(s.count('shed') for s in above) / n:.1f}%, "
              f"timeout {100 * sum(s.count('timeout') for s in above) / n:.1f}%, "
              f"admitted {100 * sum(s.admitted for s in above) / n:.1f}%")


def _late_lines(steps: list[LoadStep], budget_ms: int, log: CalloutLog) -> None:
    """The deadline check: answers after the budget, and mints that reached the broker too late."""
    lines = [ln for s in steps for ln in s.lines if ln is not None]
    late = [ln for ln in lines if ln.ms["total"] > budget_ms]
    at = collections.Counter(ln.at or ln.outcome for ln in late)
    pairs = [(x, ln) for s in steps for x, ln in zip(s.samples, s.lines, strict=True)]
    refused = collections.Counter(
        x.error or x.result for x, ln in pairs if ln is not None and ln.outcome == "minted" and x.result != "ok"
    )
    noline = collections.Counter(x.error or x.result for x, ln in pairs if ln is None)
    over_ms = max((ln.ms["total"] - budget_ms for ln in late), default=0)
    print(f"late answers: {len(late)}  (callout lines with total_ms over the {budget_ms} ms budget"
          + (f"; by step: {', '.join(f'at={k} {v}' for k, v in at.most_common())}; up to {over_ms} ms late)"
             if late else ")"))
    print(f"mints the client never got (the broker's timer ran out first): {sum(refused.values())}"
          + (f" ({', '.join(f'{k!r} {v}' for k, v in refused.most_common())})" if refused else "")
          + f"; connects with no callout line: {sum(noline.values())}"
          + (f" ({', '.join(f'{k!r} {v}' for k, v in noline.most_common())})" if noline else "")
          + f"; requests the service dropped unanswered: {log.dropped}")


def _breakdown(steps: list[LoadStep]) -> None:
    """Where a connect's time goes at each rate, ms p50/p99: the service's steps (minted lines,
    from the log), then the client's wait for INFO and the time outside the service."""
    names = (*STEPS_MS, "INFO", "outside")
    print("where the time goes, ms p50/p99    " + " ".join(f"{k:>9}" for k in names))
    print(f"{'':35}{'(service steps, minted)':^60}{'(client)':^20}")
    for s in steps:
        series = [*(s.callout_ms(k) for k in STEPS_MS), s.info_ms(), s.outside_ms()]
        print(f"  {s.rate:7.0f} /s {'':22}" + " ".join(f"{pct(v, 0.5):4.0f}/{pct(v, 0.99):<4.0f}" for v in series))
    print()


# -- the load mode: offered multiples of the closed-loop rate (issue 14 item 5) -------------------


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin(stack: Stack) -> str:
    """Every thread of the service on the last usable CPU; the broker's and ours on the rest."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return "--pin: not pinned, only one usable CPU"
    service_cpu, rest = cpus[-1], set(cpus[:-1])
    for tid in _tasks(stack.proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, {service_cpu})
    for tid in _tasks(stack.broker_pid) if stack.broker_pid else []:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, rest)
    os.sched_setaffinity(0, rest)
    return f"--pin: service on CPU {service_cpu}; broker and load generator on CPU {','.join(map(str, sorted(rest)))}"


def rss_kib(pid: int) -> int | None:
    """The process's resident set (VmRSS, KiB), or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return None
    m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    return int(m[1]) if m else None


async def _offer_multiples(
    args: argparse.Namespace, stack: Stack, callout: NextLine, log: CalloutLog, closed_rate: float, budget_ms: int
) -> None:
    """Offer each multiple of ``closed_rate`` for ``--step-s``, then print the goodput table."""
    rss0 = rss_kib(stack.proc.pid)
    print(_STEP_HEADER, flush=True)
    steps = []
    for multiple in args.multiples:
        await asyncio.sleep(PAUSE_S)
        step = await _step(stack, multiple * closed_rate, args, callout, log)
        steps.append((multiple, step))
        print(_step_row(step) + f"  <- {multiple:g}x", flush=True)
    await asyncio.sleep(PAUSE_S)
    quiet = await raw_connect(*_host_port(stack.url), callout())
    rss1 = rss_kib(stack.proc.pid)
    print()
    _goodput_table(steps, closed_rate, budget_ms, CalloutLimits().auth_timeout_s)
    print(f"service RSS: {rss0} KiB before the offer, {rss1} KiB after"
          + (f" ({(rss1 - rss0) / 1024:+.1f} MiB)" if rss0 is not None and rss1 is not None else ""))
    print(f"a quiet connect once the offer stopped: {quiet.result} in {quiet.elapsed_s * 1000:.1f} ms")


def _goodput_table(steps: list[tuple[float, LoadStep]], closed_rate: float, budget_ms: int, timeout_s: float) -> None:
    """Per multiple: goodput, answers after our deadline and after the broker's timeout, p99s."""
    print(f"goodput: clients admitted /s (closed-loop callout rate {closed_rate:.0f} /s); deadline = the "
          f"{budget_ms} ms budget; the broker's timeout = {timeout_s:g} s")
    print("  multiple offered/s  goodput/s  x closed | after deadline | after broker timeout: mints denials "
          "| no line | p99 ms: callout client")
    for multiple, s in steps:
        pairs = list(zip(s.samples, s.lines, strict=True))
        after_deadline = sum(1 for ln in s.lines if ln is not None and ln.ms["total"] > budget_ms)
        late_mints = sum(1 for x, ln in pairs if ln is not None and ln.outcome == "minted" and x.result != "ok")
        late_denials = sum(
            1 for x, ln in pairs
            if ln is not None and ln.outcome != "minted" and x.elapsed_s - x.info_s >= timeout_s
        )
        noline = sum(1 for ln in s.lines if ln is None)
        print(f"  {multiple:8g} {s.rate:10.0f} {s.admitted_per_s:10.0f} {s.admitted_per_s / closed_rate:9.2f} | "
              f"{after_deadline:14} | {late_mints:26} {late_denials:7} | {noline:7} | "
              f"{pct(s.callout_ms(outcome=None), 0.99):14.0f} {pct(s.client_ms(), 0.99):6.0f}")


# -- the running service and what the benchmark set up on it -----------------------------------


@dataclass
class Stack:
    """A running ``cotal up`` subprocess with granted actors, their bearers and a static user."""

    proc: subprocess.Popen[bytes]
    url: str
    broker_pid: int | None
    log_path: Path
    space_paths: Any
    subs: list[str]
    exchange_url: str
    exchange_cap: str
    material: DevIdpMaterial
    sentinel_creds: str
    static_creds: str
    bearers: list[str] = field(default_factory=list)

    def refresh_bearers(self, threads: int = 1) -> None:
        """Exchange a fresh IdP token per actor for its bearer (blocking; ``threads`` at once)."""
        now = int(time.time())

        def one(sub: str) -> str:
            return exchange(self.exchange_url, self.exchange_cap, mint_dev_token(self.material, sub=sub, now=now))

        if threads <= 1:
            self.bearers[:] = [one(s) for s in self.subs]
            return
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            self.bearers[:] = list(pool.map(one, self.subs))


@contextlib.asynccontextmanager
async def open_stack(args: argparse.Namespace, tmp: Path) -> AsyncIterator[Stack]:
    """Start the service (bounded wait for ``auth-service.json``), grant the actors, mint the
    static user; on exit stop the service by pid (SIGINT, then SIGTERM, then SIGKILL)."""
    paths = RootPaths(tmp / "root")
    space_paths = paths.space(SPACE)
    port = free_port()
    log_path = tmp / "service.log"
    cmd = [sys.executable, "-m", "cotal_trio", "up", "--root", str(paths.root), "--space", SPACE, "--port", str(port)]
    with open(tmp / "service.out", "wb") as out, open(log_path, "wb") as err:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=tmp, start_new_session=True
        )
    try:
        deadline = time.monotonic() + READY_S
        while not space_paths.auth_service_json.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the service did not become ready:\n{log_path.read_text(errors='replace')[-2000:]}")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # let it settle; auth-service.json is written last
        service = read_json(space_paths.auth_service_json)
        issuer = load_idp_pin(space_paths.idp_json).issuer
        secret = load_owner_secret(space_paths.owner_secret_json)
        subs = [f"bench-{i:04d}" for i in range(args.actors)]
        for sub in subs:
            grant(space_paths, derive_owner(secret, issuer, sub))
        now = int(time.time())
        static_creds = mint_service_user(
            load_space(space_paths.callout_json, SPACE), name="bench-static",
            permissions={"pub": {"allow": ["bench.>"]}, "sub": {"allow": ["bench.>", "_INBOX.>"]}},
            iat=now, exp=now + 3600,
        )  # fmt: skip
        yield Stack(
            proc=proc, url=f"nats://127.0.0.1:{port}", broker_pid=broker_pid(paths, proc.pid), log_path=log_path,
            space_paths=space_paths, subs=subs, exchange_url=service["url"], exchange_cap=service["cap"],
            material=DevIdpMaterial.from_json(paths.devidp_json.read_bytes()),
            sentinel_creds=space_paths.sentinel_creds.read_text(), static_creds=static_creds,
        )  # fmt: skip
    finally:
        print(f"service: {stop_service(proc)}", flush=True)
        if args.keep_log is not None:
            shutil.copyfile(log_path, args.keep_log)


# -- the side-by-side mode (default) -------------------------------------------------------------


async def run_compare(args: argparse.Namespace, stack: Stack, tmp: Path) -> None:
    """Issue 14 item 5: in one run, alternating batches of the static user, ours with a listing
    generation (an agent connect), ours without one (a ``deployer`` view) and the allow-all
    PyPI ``nats-callout`` peer (when the ``bench`` extra is installed), each sequential and
    concurrent, then every ratio and each one's callout CPU per connect."""
    async with open_peer(stack, tmp) as peer:
        await _compare(args, stack, peer)


async def _compare(args: argparse.Namespace, stack: Stack, peer: Peer | None) -> None:
    sentinel, static = creds_callbacks(stack.sentinel_creds), creds_callbacks(stack.static_creds)
    turn = iter(range(1 << 62))
    view_bearers: list[str] = []

    def ours(bearers: list[str]) -> Callable[[], dict[str, Any]]:
        def options() -> dict[str, Any]:
            nonce = "ibx" + secrets.token_hex(8)
            bearer = bearers[next(turn) % len(bearers)]
            return {**sentinel, "token": bearer, "name": nonce, "inbox_prefix": f"_INBOX_{nonce}"}

        return options

    def static_options() -> dict[str, Any]:
        return {**static, "name": "ibx" + secrets.token_hex(8)}

    options = {"static": static_options, "agent": ours(stack.bearers), "view": ours(view_bearers)}
    pids: dict[str, int | None] = {"static": stack.proc.pid, "agent": stack.proc.pid, "view": stack.proc.pid}
    if peer is not None:
        peer_creds = creds_callbacks(peer.sentinel_creds)
        options["peer"] = lambda: {**peer_creds, "name": "ibx" + secrets.token_hex(8)}
        pids["peer"] = peer.proc.pid
    bench = Bench(stack.url, stack.broker_pid, options, pids)

    await asyncio.sleep(1.0)  # past the start-up work
    idle0 = proc_cpu_s(stack.proc.pid)
    await asyncio.sleep(IDLE_S)
    idle_ms_per_s = (proc_cpu_s(stack.proc.pid) - idle0) / IDLE_S * 1000

    print(f"service pid {stack.proc.pid}, nats-server pid {stack.broker_pid}, broker {stack.url}, "
          f"{args.actors} actors, bearers round-robin"
          + (f", peer pid {peer.proc.pid}" if peer is not None else ", no peer (pip install '.[bench]')"))
    kinds = list(options)
    for rnd in range(1, args.rounds + 1):
        await asyncio.to_thread(stack.refresh_bearers)  # loopback exchanges, outside any batch
        view_bearers[:] = await asyncio.to_thread(_view_bearers, stack, "deployer")
        order = kinds[rnd % len(kinds):] + kinds[:rnd % len(kinds)]  # each kind leads a round in turn
        for mode in ("seq", "conc"):
            for kind in order:
                await bench.batch(kind, mode, rnd, args.n, args.concurrency)
    await asyncio.sleep(0.5)  # let the last log lines land
    report(bench, args, idle_ms_per_s, count_outcomes(stack.log_path))


def _view_bearers(stack: Stack, view: str) -> list[str]:
    """One ``view`` bearer per actor (blocking loopback exchanges)."""
    now = int(time.time())
    return [
        exchange(stack.exchange_url, stack.exchange_cap, mint_dev_token(stack.material, sub=sub, now=now), view)
        for sub in stack.subs
    ]


# -- the allow-all peer (issue 14 item 5) ---------------------------------------------------------


@dataclass
class Peer:
    """The PyPI ``nats-callout`` peer (bench/_peer_callout.py) answering its own auth account."""

    proc: subprocess.Popen[bytes]
    sentinel_creds: str


@contextlib.asynccontextmanager
async def open_peer(stack: Stack, tmp: Path) -> AsyncIterator[Peer | None]:
    """Push an auth account of our auth account's shape without xkey (one signing key,
    ``auth_users``: the peer's callout user) to the service's broker, start the peer on it and
    wait (bounded) for it to subscribe; None when ``nats-callout`` is not installed. The peer
    places its users in that account, allowed everything. Stopped by pid on exit."""
    if importlib.util.find_spec("nats_callout") is None:
        print("peer: nats-callout is not installed (pip install '.[bench]'); running without it", flush=True)
        yield None
        return
    paths = RootPaths(tmp / "root")
    broker = load_broker(paths.broker_json)
    account, signing = KeyPair.generate(Prefix.ACCOUNT), KeyPair.generate(Prefix.ACCOUNT)
    now = int(time.time())

    def user(name: str, permissions: dict[str, Any], **extra: Any) -> tuple[str, str]:
        key = KeyPair.generate(Prefix.USER)
        claims = natsjwt.user_claims(
            user=key.public_key, name=name, issuer_account=account.public_key, permissions=permissions, **extra
        )
        return key.public_key, format_creds(natsjwt.encode(claims, signing, iat=now), key.seed)

    callout_user, callout_creds = user(
        "peer-callout", {"pub": {"deny": [">"]}, "sub": {"allow": ["$SYS.REQ.USER.AUTH"]}}, resp_max=1
    )
    _, sentinel = user("peer-sentinel", {"pub": {"deny": [">"]}, "sub": {"deny": [">"]}}, bearer_token=True)
    auth_jwt = natsjwt.encode(natsjwt.account_claims(
        account=account.public_key, name="AUTH_peer", signing_keys=[signing.public_key],
        authorization={"auth_users": [callout_user], "allowed_accounts": [account.public_key]},
    ), broker.operator_signing, iat=now)  # fmt: skip
    await asyncio.to_thread(_push_account, stack.url, broker, auth_jwt)
    folder = tmp / "peer"
    folder.mkdir(mode=0o700)
    (folder / "callout.creds").write_text(callout_creds)
    (folder / "signing.seed").write_text(signing.seed if isinstance(signing.seed, str) else signing.seed.decode())
    script = Path(__file__).with_name("_peer_callout.py")
    cmd = [sys.executable, str(script), stack.url, str(folder / "callout.creds"), str(folder / "signing.seed"), account.public_key]
    with open(tmp / "peer.err", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), READY_S)
        if line.strip() != b"ready":
            raise SystemExit(f"the peer did not start:\n{(tmp / 'peer.err').read_text(errors='replace')[-2000:]}")
        yield Peer(proc=proc, sentinel_creds=sentinel)
    finally:
        print(f"peer: {stop_service(proc)}", flush=True)


def _push_account(url: str, broker: Any, jwt: str) -> None:
    """Push one account JWT as the root's system user (blocking: a trio run of its own)."""

    async def push() -> None:
        async with open_loop(), open_system_connection(url, broker) as conn:
            await push_accounts(conn, [jwt])

    trio.run(push)


# -- main --------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, tmp: Path) -> None:
    async with open_stack(args, tmp) as stack:
        await (run_load(args, stack) if args.load else run_compare(args, stack, tmp))


def _rates(text: str) -> tuple[float, ...]:
    rates = tuple(float(x) for x in text.split(","))
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError("rates are positive connects a second, comma separated")
    return tuple(sorted(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500, help="connects per batch (default 500)")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent connectors (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; static/callout order alternates (default 3)")
    parser.add_argument("--actors", type=int, default=None,
                        help=f"granted actors whose bearers rotate (default 100; {LOAD_ACTORS} with --load)")
    parser.add_argument("--load", action="store_true", help="open-loop connect arrivals at rising rates")
    parser.add_argument("--rates", type=_rates, default=None,
                        help="--load: a ramp of absolute offered connects/s instead of --multiples, comma separated "
                             f"(e.g. {','.join(map(str, LOAD_RATES))})")
    parser.add_argument("--multiples", type=_rates, default=LOAD_MULTIPLES,
                        help="--load: offer these multiples of the closed-loop callout rate, each for --step-s "
                             f"(default {','.join(f'{m:g}' for m in LOAD_MULTIPLES)})")
    parser.add_argument("--pin", action="store_true",
                        help="--load: the service on a CPU of its own, the broker and the generator on the others")
    parser.add_argument("--step-s", type=float, default=LOAD_STEP_S,
                        help=f"--load: seconds each rate is offered (default {LOAD_STEP_S:g})")
    parser.add_argument("--overload", type=float, default=OVERLOAD,
                        help=f"--load: after the ramp, one step at this multiple of the most admitted /s "
                             f"(default {OVERLOAD:g}; 0 skips it)")
    parser.add_argument("--keep-log", type=Path, default=None,
                        help="copy the service's stderr (its callout lines) to this file")
    args = parser.parse_args()
    if args.actors is None:
        args.actors = LOAD_ACTORS if args.load else 100
    if min(args.n, args.concurrency, args.rounds, args.actors) < 1 or args.step_s <= 0:
        parser.error("--n, --concurrency, --rounds and --actors must be at least 1, --step-s above 0")
    print("cotal-trio callout benchmark" + (" (load)" if args.load else ""))
    print(f"machine: nproc={os.cpu_count()} ({len(os.sched_getaffinity(0))} usable), "
          f"{platform.platform()}, Python {platform.python_version()}, "
          f"{nats_server_version()}, nats-py {nats.aio.client.__version__}")
    print(f"code: {Path(cotal_trio.__file__).parent} ({code_version()})")
    if args.load:
        offered = (f"--multiples {','.join(f'{m:g}' for m in args.multiples)}" if args.rates is None
                   else f"--rates {','.join(f'{r:g}' for r in args.rates)} --overload {args.overload:g}")
        print(f"command: python bench/callout.py --load {offered} --step-s {args.step_s:g} "
              f"--concurrency {args.concurrency} --actors {args.actors}" + (" --pin" if args.pin else ""), flush=True)
    else:
        print(f"command: python bench/callout.py --n {args.n} --concurrency {args.concurrency} "
              f"--rounds {args.rounds} --actors {args.actors}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="cotal-bench-"))
    try:
        asyncio.run(run(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
