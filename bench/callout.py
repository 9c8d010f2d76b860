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
   ``--n`` sequential connects, then ``--n`` connects by ``--concurrency`` workers, static and
   callout back to back, the order alternating across rounds. A sample is ``Client.connect``
   (CONNECT answered by PONG, i.e. the callout has answered), ``is_connected`` checked, then
   ``close()``. Latency is the connect alone; the rate counts connect + close.
5. Reads the service's CPU (utime + stime of ``/proc/<pid>/stat``) before and after every
   batch; the nats-server's and this load generator's CPU too, for the split, and the CPU
   every other process on the machine used meanwhile ("other load", from ``/proc/stat``), so a
   noisy neighbour shows in the output instead of silently skewing the rates.
6. Prints every batch, a table of medians across rounds, and the two headline figures.

It measures and prints; it asserts nothing about timing. Only 127.0.0.1 is used. The service
is stopped with SIGINT (it stops its own nats-server) and the temporary folder is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats.aio.client

import cotal_trio
from cotal_trio.broker.process import free_port
from cotal_trio.broker.provision import mint_service_user
from cotal_trio.core.creds import parse_creds
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.nkeys import KeyPair
from cotal_trio.devidp import DevIdpMaterial, mint_dev_token
from cotal_trio.state import RootPaths, load_idp_pin, load_owner_secret, load_space, read_json, write_row

SPACE = "bench"
ACTOR = "bench"
READY_S = 30.0  # auth-service.json must appear within this
STOP_S = 15.0  # the service must exit this long after SIGINT (then SIGTERM, then SIGKILL)
CONNECT_S = 5.0  # nats-py connect_timeout per sample
CLOSE_S = 5.0
IDLE_S = 2.0  # service CPU measured while idle, as a control
WARMUP = 20  # untimed sequential connects before each batch
BEARER_TTL_S = 900
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- processes and CPU -------------------------------------------------------------------------


def proc_cpu_s(pid: int | None) -> float:
    """utime + stime of ``pid`` in seconds (all its threads, live and exited); nan if gone."""
    if pid is None:
        return float("nan")
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat[stat.rindex(")") + 2 :].split()  # fields from 3 (state) on
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15


def machine_busy_s() -> float:
    """CPU seconds all processes spent busy so far (``/proc/stat``: user nice system irq softirq steal)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


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


def code_version() -> str:
    """``git describe`` of the imported cotal_trio's checkout, or a note that it has none."""
    where = Path(cotal_trio.__file__).parent
    try:
        out = subprocess.run(
            ["git", "-C", str(where), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        )
    except OSError:
        return "git not available"
    return f"git {out.stdout.strip()}" if out.returncode == 0 else "not a git checkout"


def nats_server_version() -> str:
    exe = shutil.which("nats-server")
    if exe is None:
        return "nats-server not on PATH"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    return (out.stdout or out.stderr).strip()


# -- setup through the root's state API and the loopback face ----------------------------------


def grant(space_paths, owner: str) -> None:
    row = LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=owner, actor=ACTOR, scope=("spawn",),
        allow_subscribe=("bench.>",), allow_publish=("bench.>",), role=None, parent=None,
        label="benchmark", token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
        granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )  # fmt: skip
    write_row(space_paths, row)


def exchange(url: str, cap: str, idp_token: str) -> str:
    body = json.dumps({"idpToken": idp_token, "actor": ACTOR, "ttlSec": BEARER_TTL_S}).encode()
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
    url: str
    service_pid: int
    broker_pid: int | None
    static_options: Callable[[], dict[str, Any]]
    callout_options: Callable[[], dict[str, Any]]
    batches: list[Batch] = field(default_factory=list)

    async def batch(self, kind: str, mode: str, rnd: int, n: int, concurrency: int) -> Batch:
        make = self.static_options if kind == "static" else self.callout_options
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
        svc0, brk0, gen0 = proc_cpu_s(self.service_pid), proc_cpu_s(self.broker_pid), time.process_time()
        all0 = machine_busy_s()
        t0 = time.perf_counter()
        try:
            bound = 60 + n * (CONNECT_S + CLOSE_S) / workers
            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(workers))), bound)
        except TimeoutError:
            print(f"  ! {kind} {mode} batch hit its {bound:.0f} s bound", flush=True)
        wall = time.perf_counter() - t0
        svc1, brk1, gen1 = proc_cpu_s(self.service_pid), proc_cpu_s(self.broker_pid), time.process_time()
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


def report(bench: Bench, args: argparse.Namespace, idle_ms_per_s: float, log_counts: dict[str, int]) -> None:
    def cell(kind: str, mode: str, f: Callable[[Batch], float]) -> float:
        return med([f(b) for b in bench.batches if b.kind == kind and b.mode == mode])

    def ratio(mode: str) -> float:
        per_round = []
        for rnd in range(1, args.rounds + 1):
            s = [b for b in bench.batches if b.round == rnd and b.mode == mode and b.kind == "static"]
            c = [b for b in bench.batches if b.round == rnd and b.mode == mode and b.kind == "callout"]
            if s and c and s[0].rate > 0:
                per_round.append(c[0].rate / s[0].rate)
        return med(per_round)

    conc = f"conc{args.concurrency}"
    rows = [
        ("seq rate (/s)", "seq", lambda b: b.rate, "{:.0f}"),
        ("seq p50 (ms)", "seq", lambda b: b.pct(0.5), "{:.2f}"),
        ("seq p99 (ms)", "seq", lambda b: b.pct(0.99), "{:.2f}"),
        (f"{conc} rate (/s)", "conc", lambda b: b.rate, "{:.0f}"),
        (f"{conc} p50 (ms)", "conc", lambda b: b.pct(0.5), "{:.2f}"),
        (f"{conc} p99 (ms)", "conc", lambda b: b.pct(0.99), "{:.2f}"),
        ("seq service CPU ms/connect", "seq", lambda b: b.per_connect_ms(b.service_cpu_s), "{:.3f}"),
        (f"{conc} service CPU ms/connect", "conc", lambda b: b.per_connect_ms(b.service_cpu_s), "{:.3f}"),
        ("seq broker CPU ms/connect", "seq", lambda b: b.per_connect_ms(b.broker_cpu_s), "{:.3f}"),
        (f"{conc} broker CPU ms/connect", "conc", lambda b: b.per_connect_ms(b.broker_cpu_s), "{:.3f}"),
        ("seq loadgen CPU ms/connect", "seq", lambda b: b.per_connect_ms(b.loadgen_cpu_s), "{:.3f}"),
        (f"{conc} loadgen CPU ms/connect", "conc", lambda b: b.per_connect_ms(b.loadgen_cpu_s), "{:.3f}"),
        ("seq total CPU ms/connect", "seq", lambda b: b.per_connect_ms(b.total_cpu_s), "{:.3f}"),
        (f"{conc} total CPU ms/connect", "conc", lambda b: b.per_connect_ms(b.total_cpu_s), "{:.3f}"),
        ("seq other load (cores)", "seq", lambda b: b.other_cpu_s / b.wall_s, "{:.2f}"),
        (f"{conc} other load (cores)", "conc", lambda b: b.other_cpu_s / b.wall_s, "{:.2f}"),
    ]
    fails = {k: sum(b.n - b.ok for b in bench.batches if b.kind == k) for k in ("static", "callout")}
    print()
    print(f"medians over {args.rounds} rounds, {args.n} connects per batch")
    print(f"{'':32}{'static':>10}{'callout':>10}{'callout/static':>16}")
    for label, mode, f, fmt in rows:
        s, c = cell("static", mode, f), cell("callout", mode, f)
        extra = ""
        if label.endswith("rate (/s)"):
            extra = f"{ratio(mode):16.2f}"
        print(f"{label:32}{fmt.format(s):>10}{fmt.format(c):>10}{extra}")
    print(f"{'failed connects (all batches)':32}{fails['static']:>10}{fails['callout']:>10}")
    print(f"service idle CPU: {idle_ms_per_s:.1f} ms per second (over {IDLE_S:.0f} s; one tick is {1000 / CLK_TCK:.0f} ms)")
    print("service log outcomes: " + " ".join(f"{k}={v}" for k, v in log_counts.items()))
    print()
    print(f"ratio (callout/static, concurrent {args.concurrency}) = {ratio('conc'):.2f}"
          f"   [sequential: {ratio('seq'):.2f}; median of per-round ratios]")
    print(f"service CPU per callout (median) = "
          f"{cell('callout', 'conc', lambda b: b.per_connect_ms(b.service_cpu_s)):.2f} ms"
          f"   [concurrent {args.concurrency} batches; sequential batches: "
          f"{cell('callout', 'seq', lambda b: b.per_connect_ms(b.service_cpu_s)):.2f} ms]")


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


# -- main --------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, tmp: Path) -> None:
    paths = RootPaths(tmp / "root")
    space_paths = paths.space(SPACE)
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
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
        brk = broker_pid(paths, proc.pid)

        material = DevIdpMaterial.from_json(paths.devidp_json.read_bytes())
        issuer = load_idp_pin(space_paths.idp_json).issuer
        secret = load_owner_secret(space_paths.owner_secret_json)
        subs = [f"bench-{i:04d}" for i in range(args.actors)]
        for sub in subs:
            grant(space_paths, derive_owner(secret, issuer, sub))

        bearers: list[str] = []

        def refresh_bearers() -> None:
            now = int(time.time())
            bearers[:] = [exchange(service["url"], service["cap"], mint_dev_token(material, sub=s, now=now)) for s in subs]

        sentinel = creds_callbacks(space_paths.sentinel_creds.read_text())
        now = int(time.time())
        static_creds = mint_service_user(
            load_space(space_paths.callout_json, SPACE), name="bench-static",
            permissions={"pub": {"allow": ["bench.>"]}, "sub": {"allow": ["bench.>", "_INBOX.>"]}},
            iat=now, exp=now + 3600,
        )  # fmt: skip
        static = creds_callbacks(static_creds)
        turn = iter(range(1 << 62))

        def callout_options() -> dict[str, Any]:
            nonce = "ibx" + secrets.token_hex(8)
            bearer = bearers[next(turn) % len(bearers)]
            return {**sentinel, "token": bearer, "name": nonce, "inbox_prefix": f"_INBOX_{nonce}"}

        def static_options() -> dict[str, Any]:
            return {**static, "name": "ibx" + secrets.token_hex(8)}

        bench = Bench(url, proc.pid, brk, static_options, callout_options)

        await asyncio.sleep(1.0)  # past the start-up work
        idle0 = proc_cpu_s(proc.pid)
        await asyncio.sleep(IDLE_S)
        idle_ms_per_s = (proc_cpu_s(proc.pid) - idle0) / IDLE_S * 1000

        print(f"service pid {proc.pid}, nats-server pid {brk}, broker {url}, "
              f"{args.actors} actors, bearers round-robin")
        for rnd in range(1, args.rounds + 1):
            await asyncio.to_thread(refresh_bearers)  # 100 loopback exchanges, outside any batch
            order = ("static", "callout") if rnd % 2 else ("callout", "static")
            for mode in ("seq", "conc"):
                for kind in order:
                    await bench.batch(kind, mode, rnd, args.n, args.concurrency)
        await asyncio.sleep(0.5)  # let the last log lines land
        report(bench, args, idle_ms_per_s, count_outcomes(log_path))
    finally:
        print(f"service: {stop_service(proc)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500, help="connects per batch (default 500)")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent connectors (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; static/callout order alternates (default 3)")
    parser.add_argument("--actors", type=int, default=100, help="granted actors whose bearers rotate (default 100)")
    args = parser.parse_args()
    if min(args.n, args.concurrency, args.rounds, args.actors) < 1:
        parser.error("--n, --concurrency, --rounds and --actors must be at least 1")
    print("cotal-trio callout benchmark")
    print(f"machine: nproc={os.cpu_count()} ({len(os.sched_getaffinity(0))} usable), "
          f"{platform.platform()}, Python {platform.python_version()}, "
          f"{nats_server_version()}, nats-py {nats.aio.client.__version__}")
    print(f"code: {Path(cotal_trio.__file__).parent} ({code_version()})")
    print(f"command: python bench/callout.py --n {args.n} --concurrency {args.concurrency} "
          f"--rounds {args.rounds} --actors {args.actors}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="cotal-bench-"))
    try:
        asyncio.run(run(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
