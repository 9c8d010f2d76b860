#!/usr/bin/env python3
"""Benchmark: connects at a steady rate while a 3-node cluster loses a node (issue 17's benchmark).

Usage::

    python bench/cluster.py [--rate 4] [--down 8] [--settle 10] [--auth-timeout S] [--scenarios kill,term,rolling]

What it does:

1. Makes a root as docs/deploy.md does (``cotal space add --new-root``), renders three nodes on
   127.0.0.1 with ``cotal broker config``, starts them, pushes the space with ``--replicas 3``
   (every store R3), and starts in this process the full auth service (seeds ``n1,n2,n3``, so it
   sits on n1) and a callout replica per node (its own node first).
   ``--auth-timeout S`` renders the nodes with ``authorization { timeout: S }`` and gives the
   services the same callout limit (``cotal broker config --auth-timeout``): a longer callout
   budget, so a connect waits longer on a stream without a leader before it is denied.
2. Grants ``2 * --rate`` actors (each under the 60-a-minute actor limit) and takes a bearer for
   each from the full service's loopback face.
3. Per scenario, starts connects at ``--rate`` a second (open loop: a connect starts on schedule
   whether or not the one before ended; each is bounded by 5 s), with the sentinel creds and a
   bearer, through nodes that stay up:

   * ``kill``: every stream led by n1 (``STREAM.LEADER.STEPDOWN`` with n1 preferred), n1
     SIGKILLed, restarted after ``--down`` s; connects through n2 and n3.
   * ``term``: the same with SIGTERM (lame-duck-free, nats-server's default shutdown).
   * ``rolling``: each node SIGTERMed and restarted in turn, the next once it rejoined and
     ``--settle`` s passed; connects through every node that is up, none started through the
     node for 1 s before it is stopped (as a load balancer drains one).

   It also polls ``STREAM.INFO`` of every stream of the space every 0.1 s and reports how long
   each had no leader (JetStream's election: the floor of the failed-connect window, since a
   connect writes its issuance row in the auth bucket's stream).
4. Prints, per scenario, the connects, the failed ones, each window of consecutive failures
   (seconds from the event) and the longest; where the failures went (the client's error and
   the node it connected through; the callout lines' outcomes and reasons, read from the
   services' own log records at INFO); and our connections' disconnect/reconnect lines, which
   name the node reached. It asserts nothing about timing.

Only 127.0.0.1 is used; the nats-servers are stopped by this process (by pid) and the folder removed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cotal_trio.broker import provision  # noqa: E402
from cotal_trio.broker.process import free_port, run_nats_server  # noqa: E402
from cotal_trio.core import wire  # noqa: E402
from cotal_trio.core.admission import CalloutLimits  # noqa: E402
from cotal_trio.core.errors import Unavailable  # noqa: E402
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid  # noqa: E402
from cotal_trio.core.ledger import LedgerKind, LedgerRow  # noqa: E402
from cotal_trio.devidp import DevIdpMaterial, mint_dev_token  # noqa: E402
from cotal_trio.http.client import post_exchange, read_service  # noqa: E402
from cotal_trio.natsio import JetStreamError, js_api, open_connection, open_loop  # noqa: E402
from cotal_trio.service.hosting import ServiceConfig, run_service  # noqa: E402
from cotal_trio.state import RootPaths, load_idp_pin, load_owner_secret, load_space, write_row  # noqa: E402
from cotal_trio.stores.replicas import read_store_replicas, space_stream_names  # noqa: E402

SPACE = "alpha"
NODES = ("n1", "n2", "n3")
CONNECT_S = 5
AUTH_STREAM = wire.kv_stream(wire.auth_bucket(SPACE))


@dataclasses.dataclass(frozen=True)
class Attempt:
    started: float
    ended: float
    admitted: bool
    via: str = ""
    error: str = ""


class Records(logging.Handler):
    """The services' log records, kept with their monotonic time: a scenario reads the callout
    lines and our connections' reconnect lines of its own stretch."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))


RECORDS = Records()


def stem(line: str) -> str:
    """A callout line's outcome and the first words of its reason (keys, nonces cut)."""
    outcome = re.search(r"outcome=(\w+)", line)
    reason = re.search(r'reason="([^"(]*)', line)
    at = re.search(r" at=(\w+)", line)
    return " ".join(x for x in (outcome and outcome[1], at and f"at={at[1]}", reason and reason[1][:70].strip()) if x)


def cotal(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "cotal_trio", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"cotal {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


async def node(config: Path, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    try:
        await run_nats_server(config, log_path=config.with_suffix(".log"), port=port, task_status=task_status)
    except Unavailable:  # exited after start: our own kill
        pass


async def until_logged(log: Path, text: str, after: int = 0) -> None:
    with trio.fail_after(120):
        while text not in log.read_text()[after:]:
            await trio.sleep(0.1)


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.paths = tmp, RootPaths(tmp / "root")
        self.ports = {name: (free_port(), free_port()) for name in NODES}
        self.urls = {name: f"nats://127.0.0.1:{port}" for name, (port, _) in self.ports.items()}
        self.pids: dict[str, int] = {}
        self.nursery: trio.Nursery | None = None

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    async def start(self, name: str) -> None:
        size = self.log(name).stat().st_size if self.log(name).exists() else 0
        self.pids[name] = await self.nursery.start(functools.partial(node, self.tmp / f"{name}.conf", self.ports[name][0]))
        await until_logged(self.log(name), "metadata leader", after=size)

    async def stop(self, name: str, sig: signal.Signals) -> None:
        size = self.log(name).stat().st_size
        os.kill(self.pids[name], sig)
        if sig == signal.SIGTERM:
            await until_logged(self.log(name), "Server Exiting", after=size)

    def admin(self, url: str):
        material = load_space(self.paths.space(SPACE).callout_json, SPACE)
        now = int(time.time())
        creds = provision.mint_service_user(
            material, name="bench-cluster-admin", permissions={"pub": {"allow": ["$JS.API.>"]}, "sub": {"allow": ["_INBOX.>"]}},
            iat=now, exp=now + 3600,
        )  # fmt: skip
        return open_connection(url, creds=creds, name="bench-cluster-admin", reconnect=False)


async def lead_from(cluster: Cluster, url: str, leader: str) -> None:
    with trio.fail_after(120):
        async with cluster.admin(url) as conn:
            while elsewhere := [s.stream for s in await read_store_replicas(conn, SPACE) if s.leader != leader]:
                for stream in elsewhere:
                    try:
                        await js_api(conn, f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", {"placement": {"preferred": leader}})
                    except (JetStreamError, Unavailable):
                        pass
                await trio.sleep(1)


async def leaderless(cluster: Cluster, pick, stop: trio.Event, gaps: dict[str, list[tuple[float, float, str]]]) -> None:
    """Poll every stream's leader of the space every 0.1 s (a task per stream, so one stream's
    unanswered STREAM.INFO does not delay the others') through the node ``pick()`` names (one that
    is up), reconnecting when that node goes; append each stream's leaderless stretches (start,
    end, the leader that came back)."""
    since: dict[str, float] = {}

    async def poll(conn, stream: str) -> None:
        while not stop.is_set():
            now = time.monotonic()
            try:
                with trio.fail_after(0.5):
                    info = await js_api(conn, wire.js_stream_info(stream))
                leader = (info.get("cluster") or {}).get("leader") or ""
            except (JetStreamError, trio.TooSlowError):
                leader = ""
            if not leader and stream not in since:
                since[stream] = now
            elif leader and stream in since:
                gaps.setdefault(stream, []).append((since.pop(stream), now, leader))
            await trio.sleep(0.1)

    while not stop.is_set():
        try:
            async with cluster.admin(cluster.urls[pick()]) as conn, trio.open_nursery() as polls:
                for stream in space_stream_names(SPACE):
                    polls.start_soon(poll, conn, stream)
                while not stop.is_set() and conn.is_connected:
                    await trio.sleep(0.1)
                polls.cancel_scope.cancel()
        except* (Unavailable, OSError):
            await trio.sleep(0.1)  # the polled node went: the next one up


def windows(attempts: list[Attempt]) -> list[tuple[float, float]]:
    found, run = [], []
    for a in [*sorted(attempts, key=lambda a: a.started), None]:
        if a is not None and not a.admitted:
            run.append(a)
        elif run:
            found.append((run[0].started, max(r.ended for r in run)))
            run = []
    return found


async def connect(cluster: Cluster, via: str, bearer: str, out: list[Attempt]) -> None:
    started, admitted, error = time.monotonic(), False, ""
    url = cluster.urls[via]
    nonce = "ibx" + secrets.token_hex(8)
    creds = cluster.paths.space(SPACE).sentinel_creds.read_text()
    try:
        with trio.fail_after(CONNECT_S):
            async with open_connection(url, creds=creds, token=bearer, name=nonce, inbox_prefix=f"_INBOX_{nonce}", reconnect=False) as conn:
                await conn.flush()
        admitted = True
    except* (Exception, trio.TooSlowError) as group:  # noqa: BLE001 - a failed connect is what is counted
        first = group.exceptions[0]
        error = type(first).__name__ + ": " + str(first)[:80]
    out.append(Attempt(started, time.monotonic(), admitted, via, error))


async def scenario(cluster: Cluster, name: str, bearers: list[str], args) -> None:
    up = {"kill": ["n2", "n3"], "term": ["n2", "n3"], "rolling": list(NODES)}[name]
    down: set[str] = set()
    attempts: list[Attempt] = []
    gaps: dict[str, list[tuple[float, float, str]]] = {}
    first_line = len(RECORDS.lines)
    node_logs = {n: cluster.log(n).stat().st_size for n in NODES}
    stop = trio.Event()
    events: list[tuple[str, float]] = []
    if name in ("kill", "term"):
        async with open_loop():
            await lead_from(cluster, cluster.urls["n2"], "n1")

    async def load(nursery: trio.Nursery) -> None:
        i, next_at = 0, time.monotonic()
        while not stop.is_set():
            via = [n for n in up if n not in down][i % 2]
            nursery.start_soon(connect, cluster, via, bearers[i % len(bearers)], attempts)
            i += 1
            next_at += 1 / args.rate
            await trio.sleep(max(0.0, next_at - time.monotonic()))

    async with open_loop(), trio.open_nursery() as nursery:
        nursery.start_soon(load, nursery)
        nursery.start_soon(leaderless, cluster, lambda: [n for n in ("n2", "n3", "n1") if n not in down][0], stop, gaps)
        await trio.sleep(args.settle)
        targets = ["n1"] if name != "rolling" else list(NODES)
        for target in targets:
            down.add(target)
            await trio.sleep(1)  # connects in flight through it end first (a load balancer's drain)
            events.append((f"{target} {'SIGKILL' if name == 'kill' else 'SIGTERM'}", time.monotonic()))
            await cluster.stop(target, signal.SIGKILL if name == "kill" else signal.SIGTERM)
            await trio.sleep(args.down)
            await cluster.start(target)
            events.append((f"{target} rejoined", time.monotonic()))
            down.discard(target)
            await trio.sleep(args.settle)
        stop.set()
    t0 = events[0][1]
    failed = [a for a in attempts if not a.admitted]
    found = windows(attempts)
    longest = max((e - s for s, e in found), default=0.0)
    print(f"{name}: {len(attempts)} connects, {len(failed)} failed, longest window {longest:.1f} s")
    print("  events (s from the first):", ", ".join(f"{label} {t - t0:+.1f}" for label, t in events))
    print("  failure windows:", [(round(s - t0, 1), round(e - t0, 1)) for s, e in found])
    for stream in space_stream_names(SPACE):
        stretches = [(round(s - t0, 1), round(e - s, 1), leader) for s, e, leader in gaps.get(stream, [])]
        print(f"  {stream} leaderless:", stretches, "(start, length, new leader)")
    print("  failed connects (client's error, via):", dict(collections.Counter(f"{a.error} via {a.via}" for a in failed)))
    lines = RECORDS.lines[first_line:]
    outcomes = collections.Counter(stem(line) for _, line in lines if "outcome=" in line and "outcome=minted" not in line)
    print("  callout lines other than minted:", dict(outcomes))
    print("  callout lines other than minted, (s from the first):",
          [(round(t - t0, 1), stem(line)[:30]) for t, line in lines if "outcome=" in line and "outcome=minted" not in line][:40])
    in_windows = collections.Counter(
        stem(line) or "minted" for t, line in lines if "outcome=" in line and any(s <= t <= e for s, e in found)
    )
    print("  callout lines inside the failure windows:", dict(in_windows))
    for n in NODES:  # the broker's own errors and warnings (ids, addresses and numbers cut)
        text = cluster.log(n).read_text()[node_logs[n]:] if cluster.log(n).exists() else ""
        found_lines = collections.Counter(
            re.sub(r"[0-9a-f]{8,}|[A-Z0-9]{40,}|\d+", "#", line.split("] ", 2)[-1])[:90]
            for line in text.splitlines() if "[ERR]" in line or "[WRN]" in line
        )
        print(f"  {n} log [ERR]/[WRN]:", dict(found_lines.most_common(8)))
    print("  our connections:", [(round(t - t0, 1), line) for t, line in lines if re.match(r"nats \S+: (disconnected|reconnected)", line)])


async def run(args, tmp: Path) -> None:
    cluster = Cluster(tmp)
    paths = cluster.paths
    cotal("space", "add", SPACE, "--root", str(paths.root), "--new-root")
    routes = ",".join(f"nats-route://127.0.0.1:{c}" for _, c in cluster.ports.values())
    async with trio.open_nursery() as nursery:
        cluster.nursery = nursery
        for name, (port, cport) in cluster.ports.items():
            timeout = () if args.auth_timeout is None else ("--auth-timeout", f"{args.auth_timeout:g}")
            text = cotal("broker", "config", "--root", str(paths.root), "--node", name, "--port", str(port),
                         "--cluster-port", str(cport), "--cluster-routes", routes, *timeout)  # fmt: skip
            (tmp / f"{name}.conf").write_text(text)
            cluster.pids[name] = await nursery.start(functools.partial(node, tmp / f"{name}.conf", port))
        for name in NODES:
            await until_logged(cluster.log(name), "metadata leader")
        cotal("space", "add", SPACE, "--root", str(paths.root), "--server", cluster.urls["n1"], "--replicas", "3")
        seeds = ",".join(cluster.urls[n] for n in NODES)
        limits = CalloutLimits() if args.auth_timeout is None else CalloutLimits(auth_timeout_s=args.auth_timeout)
        await nursery.start(run_service, ServiceConfig(root=paths, server_url=seeds, manifest=paths.spaces_manifest, limits=limits))
        for name in NODES:
            own = ",".join(cluster.urls[n] for n in (name, *(n for n in NODES if n != name)))
            manifest = tmp / f"replica-{name}" / "spaces.json"
            manifest.parent.mkdir()
            shutil.copy(paths.spaces_manifest, manifest)
            await nursery.start(run_service, ServiceConfig(root=paths, server_url=own, manifest=manifest, callout_only=True, limits=limits))
        space_paths = paths.space(SPACE)
        idp = DevIdpMaterial.from_json(paths.devidp_json.read_bytes())
        issuer = load_idp_pin(space_paths.idp_json).issuer
        bearers = []
        with trio.fail_after(60):
            while True:
                try:
                    service = read_service(space_paths)
                    break
                except Exception:  # noqa: BLE001 - until the full lane writes auth-service.json
                    await trio.sleep(0.2)
            for i in range(max(2, 2 * int(args.rate))):
                sub, actor = f"bench-{i}", f"bench_{i}"
                owner = derive_owner(load_owner_secret(space_paths.owner_secret_json), issuer, sub)
                write_row(space_paths, LedgerRow(
                    kind=LedgerKind.INTERACTIVE, owner=owner, actor=actor, scope=(), allow_subscribe=(), allow_publish=(),
                    role=None, parent=None, label="bench", token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
                    granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                ))  # fmt: skip
                body = {"idpToken": mint_dev_token(idp, sub=sub, now=int(time.time())), "actor": actor}
                answer = await trio.to_thread.run_sync(functools.partial(post_exchange, service.url, service.cap, body))
                bearers.append(answer["token"])
        print(f"3 nodes, stores R3, full service + 3 replicas; {args.rate:g} connects/s over {len(bearers)} actors,"
              f" node down {args.down:g} s, settle {args.settle:g} s, auth timeout {args.auth_timeout or 2:g} s")  # fmt: skip
        for name in args.scenarios.split(","):
            await scenario(cluster, name, bearers, args)
        for name in NODES:
            os.kill(cluster.pids[name], signal.SIGTERM)
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rate", type=float, default=4, help="connects a second (default 4)")
    parser.add_argument("--down", type=float, default=8, help="seconds a node stays down (default 8)")
    parser.add_argument("--settle", type=float, default=10, help="seconds of load before and after each event (default 10)")
    parser.add_argument("--auth-timeout", type=float, default=None,
                        help="the nodes' authorization { timeout } and the services' callout limit, seconds (default nats-server's 2)")
    parser.add_argument("--scenarios", default="kill,term,rolling", help="comma-separated: kill, term, rolling")
    args = parser.parse_args()
    # The services' INFO lines (every callout line, every reconnect) are counted per scenario;
    # nothing below WARNING is printed.
    logging.basicConfig(level=logging.WARNING)
    for name in ("cotal", "cotal_trio"):
        logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger().handlers[0].setLevel(logging.WARNING)
    logging.getLogger().addHandler(RECORDS)
    with tempfile.TemporaryDirectory(prefix="cotal-bench-cluster-") as tmp:
        trio.run(run, args, Path(tmp))


if __name__ == "__main__":
    main()
