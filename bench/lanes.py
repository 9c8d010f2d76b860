#!/usr/bin/env python3
"""Benchmark: a lane host's live manifest changes and its memory per lane, in one run (issue 3).

Usage::

    python bench/lanes.py [--lanes 1,10,50] [--repeats 10] [--latency-lanes 10] [--modes full,callout-only]

What it does (DESIGN.md sections 5, 9 and 10):

1. Creates a temporary root with ``max(--lanes)`` spaces ``m000...`` plus ``--repeats`` spaces
   ``a00...`` to add one at a time, all pinned to one development IdP, each with one granted
   actor. Renders the operator-mode broker config (``authorization { timeout: 2 }``), runs
   nats-server and pushes every space's two accounts over the system account, as an operator
   would (the auth service pushes nothing).
2. For each mode (full lanes, then ``--callout-only`` replica lanes) and each lane count ``N``:
   writes a manifest of ``N`` spaces and starts ``python -m cotal_trio auth-service --spaces
   <manifest> --server <url> --root <root> --auth-timeout 2`` as a subprocess; times the start
   until ``<manifest>.applied`` shows all ``N`` serving; waits ``--settle`` seconds and reads
   the host's ``VmRSS`` (and ``RssAnon``, threads, open fds) from ``/proc/<pid>`` ("idle").
   Then has every lane answer once (a full lane: an exchange on its face, then a connect with
   that bearer; a callout-only lane: a connect) and reads it again after ``--settle`` ("warm").
   Stops the host with SIGINT and times its exit. One fresh host per ``N``.
3. In the host of ``--latency-lanes`` lanes, ``--repeats`` times: renames a manifest with one
   more space over the old one and polls (every 10 ms) until ``.applied`` shows the new lane
   ``serving``; for a full lane, until its ``auth-service.json`` exists and ``GET /health``
   answers 200, then exchanges a development IdP token for a bearer on that face; then connects
   as a user of the new space (sentinel creds, the bearer, a name nonce) until admitted. A
   callout-only lane has no face: its connect uses a bearer signed beforehand with the space's
   issuer key, as the exchange would. Then renames the old manifest back and polls until
   ``.applied`` no longer lists the space. Every time is from the rename. After the last
   removal, one connect to that space shows it refused (the broker's 2 s auth timeout), and
   the host's RSS is read again (before / after the adds).
4. Prints every step, then a table: medians and maxima of the latencies, RSS by lane count,
   RSS per additional lane ``(RSS(N) - RSS(1)) / (N - 1)``, each against its target (issue 3:
   add and remove applied in under 1 s; under 10 MiB per additional lane; the verdict uses the
   worst add or remove and the warm RSS of the largest host).

It measures and prints; it asserts nothing about timing. Only 127.0.0.1 is used. Each host
is stopped with SIGINT by pid; the broker is stopped by this process and the temporary folder
removed.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
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
from typing import TypeVar

import trio
from _host import code_version, machine_busy_s, nats_server_version, proc_cpu_s

import cotal_trio
from cotal_trio.broker import provision
from cotal_trio.broker.accounts import open_system_connection, push_accounts
from cotal_trio.broker.config import write_config
from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.core.bearer import issue_bearer
from cotal_trio.core.errors import ConfigError, Unavailable, leaves
from cotal_trio.core.exchange import grant_from_row
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.devidp import DevIdpMaterial, create_dev_idp, mint_dev_token
from cotal_trio.natsio import open_connection, open_loop
from cotal_trio.state import (
    IdpPinRecord,
    RootPaths,
    atomic_write,
    load_issuer_keys,
    load_owner_secret,
    read_json,
    save_idp_pin,
    write_row,
)

ADD_TARGET_S = 1.0  # issue 3: add and remove applied in under 1 s
MIB = 1024 * 1024
PER_LANE_TARGET_BYTES = 10 * MIB  # issue 3: under 10 MiB per additional lane
AUTH_TIMEOUT_S = 2  # the broker's authorization timeout, passed to the host too
POLL_S = 0.01  # between reads of .applied, auth-service.json, /health
STEP_BOUND_S = 20.0  # one add or remove must be seen within this
START_BOUND_S = 60.0  # a host must serve all its lanes within this (plus START_PER_LANE_S each)
START_PER_LANE_S = 1.0
STOP_S = 30.0  # a host must exit this long after SIGINT (then SIGTERM, then SIGKILL)
PAUSE_S = 0.3  # between repeats, so one change's tail does not overlap the next
HTTP_S = 5.0
SUB = "bench"  # the IdP subject of the one granted actor per space
ACTOR = "bench"
BEARER_TTL_S = 900
MODES = ("full", "callout-only")

T = TypeVar("T")


# -- /proc -------------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile (bytes), Threads, and fds of ``pid``; empty if gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {}
    out = {"fds": fds}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024  # kB
        elif key == "Threads":
            out[key] = int(value)
    return out






class OtherLoad:
    """CPU used by every process but the host, the broker and this one while open (noise), in cores."""

    def __init__(self, *pids: int) -> None:
        self._pids = pids
        self._t0, self._ours0, self._all0 = time.perf_counter(), self._ours(), machine_busy_s()

    def _ours(self) -> float:
        return sum(proc_cpu_s(pid, gone=0.0) for pid in self._pids) + time.process_time()

    def cores(self) -> float:
        other = (machine_busy_s() - self._all0) - (self._ours() - self._ours0)
        return max(0.0, other) / (time.perf_counter() - self._t0)






# -- the root: spaces, grants, bearers -----------------------------------------------------------


@dataclass(frozen=True)
class Root:
    paths: RootPaths
    idp: DevIdpMaterial
    server_url: str
    broker_pid: int
    bearers: dict[str, str]  # space -> a bearer signed with its issuer key (callout-only connects)


def provision_root(root: Path, spaces: list[str]) -> tuple[RootPaths, DevIdpMaterial, dict[str, str]]:
    """ensure_root + ensure_space, one dev IdP pinned for all, one granted actor per space."""
    paths, now = RootPaths(root), int(time.time())
    broker = provision.ensure_root(paths, iat=now)
    idp = create_dev_idp(os.urandom)
    atomic_write(paths.devidp_json, idp.to_json().encode())
    pin = IdpPinRecord(kind="dev", url="", issuer=idp.issuer, audience=idp.audience, jwks_uri="")
    bearers = {}
    for space in spaces:
        provision.ensure_space(paths, broker, space, iat=now)
        sp = paths.space(space)
        save_idp_pin(sp.idp_json, pin)
        row = LedgerRow(
            kind=LedgerKind.INTERACTIVE, owner=derive_owner(load_owner_secret(sp.owner_secret_json), idp.issuer, SUB),
            actor=ACTOR, scope=("spawn",), allow_subscribe=("bench.>",), allow_publish=("bench.>",), role=None,
            parent=None, label="benchmark", token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
            granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )  # fmt: skip
        write_row(sp, row)
        key = load_issuer_keys(sp.issuer_json, space).active
        bearers[space], _ = issue_bearer(grant_from_row(row), key=key, space=space, now=now, ttl_s=BEARER_TTL_S)
    return paths, idp, bearers


async def push_all(paths: RootPaths, url: str, spaces: list[str]) -> None:
    broker = provision.ensure_root(paths, iat=int(time.time()))
    jwts = []
    for space in spaces:
        record = provision.load_space_accounts(paths, broker, space)
        jwts += [record.data_jwt, record.auth_jwt]
    async with open_loop(), open_system_connection(url, broker) as system:
        await push_accounts(system, jwts)


# -- probes ----------------------------------------------------------------------------------------


def _http(url: str, *, cap: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if cap is not None:
        headers["Authorization"] = f"Bearer {cap}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}
    except OSError:
        return 0, {}


async def connect(url: str, creds: str, bearer: str) -> str | None:
    """One user connect (sentinel creds, bearer, name nonce); None when admitted, else why not."""
    nonce = "ibx" + secrets.token_hex(8)
    error: str | None = "not connected"
    try:
        async with open_loop(), open_connection(
            url, creds=creds, token=bearer, name=nonce, inbox_prefix=f"_INBOX_{nonce}", reconnect=False
        ) as conn:
            await conn.flush()
            error = None
    except* Unavailable as group:
        error = str(leaves(group)[0])
    return error


async def poll(check: Callable[[], T | None], *, start: float, bound_s: float = STEP_BOUND_S) -> tuple[float, T | None]:
    """Call ``check`` every POLL_S until it returns a value; (seconds since ``start``, value)."""
    deadline = start + bound_s
    while (value := check()) is None and time.perf_counter() < deadline:
        await trio.sleep(POLL_S)
    return time.perf_counter() - start, value


def applied(manifest: Path) -> dict[str, dict] | None:
    try:
        return json.loads(manifest.with_name(manifest.name + ".applied").read_bytes())["spaces"]
    except (OSError, ValueError, KeyError):
        return None


def swap_manifest(manifest: Path, spaces: list[str]) -> float:
    """Write ``spaces`` to a temporary file, rename it over ``manifest``; perf_counter at the rename."""
    temp = manifest.with_name(f".{manifest.name}.{secrets.token_hex(4)}")
    temp.write_bytes(json.dumps({"version": 2, "spaces": [{"space": s} for s in spaces]}).encode())
    start = time.perf_counter()
    os.replace(temp, manifest)
    return start


# -- the host --------------------------------------------------------------------------------------


@dataclass
class Host:
    mode: str
    proc: subprocess.Popen[bytes]
    manifest: Path
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


def start_host(root: Root, mode: str, folder: Path) -> Host:
    manifest = folder / "spaces.json"
    cmd = [
        sys.executable, "-m", "cotal_trio", "auth-service", "--spaces", str(manifest),
        "--server", root.server_url, "--root", str(root.paths.root), "--auth-timeout", str(AUTH_TIMEOUT_S),
    ]  # fmt: skip
    if mode == "callout-only":
        cmd.append("--callout-only")
    log = folder / "host.log"
    with open(folder / "host.out", "ab") as out, open(log, "ab") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=folder, start_new_session=True)
    return Host(mode, proc, manifest, log)


async def stop_host(host: Host) -> str:
    """SIGINT the host by pid and wait (bounded); escalate to SIGTERM, then SIGKILL."""
    start = time.perf_counter()
    for sig, wait_s in ((signal.SIGINT, STOP_S), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if host.proc.poll() is not None:
            break
        os.kill(host.proc.pid, sig)
        deadline = time.perf_counter() + wait_s
        while host.proc.poll() is None and time.perf_counter() < deadline:
            await trio.sleep(0.02)
        if host.proc.poll() is not None:
            return f"stopped with {sig.name} in {time.perf_counter() - start:.2f} s, exit code {host.proc.returncode}"
    return f"exit code {host.proc.returncode}"


async def exercise(root: Root, mode: str, spaces: list[str]) -> int:
    """One answered request per lane: a full lane's exchange then a connect with its bearer; a
    callout-only lane's connect with the pre-signed bearer. The number of connects admitted."""
    admitted = 0
    for space in spaces:
        sp, bearer = root.paths.space(space), root.bearers[space]
        if mode == "full":
            service = read_json(sp.auth_service_json)
            body = {"idpToken": mint_dev_token(root.idp, sub=SUB, now=int(time.time())), "actor": ACTOR}
            status, reply = await trio.to_thread.run_sync(
                functools.partial(_http, service["url"] + "/exchange", cap=service["cap"], body=body)
            )
            bearer = reply["token"] if status == 200 else bearer
        admitted += await connect(root.server_url, sp.sentinel_creds.read_text(), bearer) is None
    return admitted


def all_serving(manifest: Path, spaces: list[str]) -> Callable[[], bool | None]:
    def check() -> bool | None:
        got = applied(manifest)
        if got is not None and sorted(got) == sorted(spaces) and all(s["state"] == "serving" for s in got.values()):
            return True
        return None
    return check


# -- measurements ----------------------------------------------------------------------------------


@dataclass
class Add:
    serving_s: float
    health_s: float | None  # full lanes: auth-service.json present and GET /health 200
    admitted_s: float
    attempts: int
    removed_s: float
    face_gone_s: float | None  # full lanes: auth-service.json removed
    other_cores: float  # every other process's CPU over the add and the remove (noise)


@dataclass
class Results:
    start_s: dict[tuple[str, int], float] = field(default_factory=dict)
    stop: dict[tuple[str, int], str] = field(default_factory=dict)
    status: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)  # idle, after all serving
    warm: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)  # after one request per lane
    churn: dict[str, tuple[int, int]] = field(default_factory=dict)  # VmRSS before and after the adds
    broker_rss: dict[tuple[str, int], int] = field(default_factory=dict)
    adds: dict[str, list[Add]] = field(default_factory=dict)


async def add_once(root: Root, host: Host, base: list[str], space: str) -> Add:
    sp = root.paths.space(space)
    creds = sp.sentinel_creds.read_text()
    load = OtherLoad(host.proc.pid, root.broker_pid)
    start = swap_manifest(host.manifest, [*base, space])
    serving_s, _ = await poll(lambda: True if (applied(host.manifest) or {}).get(space, {}).get("state") == "serving" else None, start=start)
    health_s = None
    bearer = root.bearers[space]
    if host.mode == "full":
        def healthy() -> dict | None:
            try:
                service = read_json(sp.auth_service_json)
            except ConfigError:  # not written yet
                return None
            return service if _http(service["url"] + "/health")[0] == 200 else None
        health_s, service = await poll(healthy, start=start)
        if service is not None:
            body = {"idpToken": mint_dev_token(root.idp, sub=SUB, now=int(time.time())), "actor": ACTOR}
            status, reply = await trio.to_thread.run_sync(
                functools.partial(_http, service["url"] + "/exchange", cap=service["cap"], body=body)
            )
            bearer = reply.get("token", bearer) if status == 200 else bearer
    attempts, error = 0, "not tried"
    while error is not None and time.perf_counter() < start + STEP_BOUND_S:
        attempts += 1
        error = await connect(root.server_url, creds, bearer)
    admitted_s = time.perf_counter() - start if error is None else float("nan")
    if error is not None:
        print(f"    ! {space}: never admitted: {error}", flush=True)

    start = swap_manifest(host.manifest, base)
    removed_s, _ = await poll(lambda: True if space not in (applied(host.manifest) or {space: None}) else None, start=start)
    face_gone_s = None
    if host.mode == "full":
        face_gone_s, _ = await poll(lambda: True if not sp.auth_service_json.exists() else None, start=start)
    return Add(serving_s, health_s, admitted_s, attempts, removed_s, face_gone_s, load.cores())


async def prime_stores(root: Root, spaces: list[str], tmp: Path) -> None:
    """Run one full host over every space until it serves, then stop it: its lanes create the
    spaces' stores, as an operator's first full service does. A replica creates no store, and
    denies every connect of a space whose store is missing (the issuance row has nowhere to go)."""
    folder = tmp / "host-prime"
    folder.mkdir()
    swap_manifest(folder / "spaces.json", spaces)
    t0 = time.perf_counter()
    host = start_host(root, "full", folder)
    try:
        elapsed, ok = await poll(all_serving(host.manifest, spaces), start=t0,
                                 bound_s=START_BOUND_S + START_PER_LANE_S * len(spaces))  # fmt: skip
        if not ok:
            raise SystemExit(f"the full host priming the stores was not serving after {elapsed:.0f} s:\n{host.tail()}")
    finally:
        await stop_host(host)
    print(f"stores: created by one full host over {len(spaces)} spaces ({elapsed:.2f} s), then stopped", flush=True)


async def run_mode(root: Root, mode: str, args: argparse.Namespace, tmp: Path, results: Results) -> None:
    latency_lanes = args.latency_lanes if args.latency_lanes in args.lanes else args.lanes[0]
    for n in args.lanes:
        folder = tmp / f"host-{mode}-{n}"
        folder.mkdir()
        spaces = [f"m{i:03d}" for i in range(n)]
        swap_manifest(folder / "spaces.json", spaces)
        t0 = time.perf_counter()
        host = start_host(root, mode, folder)
        try:
            elapsed, ok = await poll(all_serving(host.manifest, spaces), start=t0,
                                     bound_s=START_BOUND_S + START_PER_LANE_S * n)  # fmt: skip
            if not ok:
                raise SystemExit(f"{mode} host of {n} lanes not serving after {elapsed:.0f} s:\n{host.tail()}")
            results.start_s[(mode, n)] = elapsed
            await trio.sleep(args.settle)
            status = proc_status(host.proc.pid)
            results.status[(mode, n)] = status
            results.broker_rss[(mode, n)] = proc_status(root.broker_pid).get("VmRSS", 0)
            print(f"  {mode:12} {n:3} lanes: all serving {elapsed:6.2f} s after spawn; host pid {host.proc.pid} "
                  f"VmRSS {status['VmRSS'] / MIB:6.1f} MiB (RssAnon {status['RssAnon'] / MIB:6.1f}, "
                  f"HWM {status['VmHWM'] / MIB:6.1f}) threads {status['Threads']:3} fds {status['fds']:4}; "
                  f"(the run's one broker: VmRSS {results.broker_rss[(mode, n)] / MIB:6.1f} MiB)", flush=True)  # fmt: skip
            t = time.perf_counter()
            admitted = await exercise(root, mode, spaces)
            took = time.perf_counter() - t
            await trio.sleep(args.settle)
            warm = results.warm[(mode, n)] = proc_status(host.proc.pid)
            print(f"  {mode:12} {n:3} lanes: {admitted}/{n} lanes admitted a connect"
                  f"{' after an exchange on their face' if mode == 'full' else ''} ({took:.2f} s); then VmRSS "
                  f"{warm['VmRSS'] / MIB:6.1f} MiB (RssAnon {warm['RssAnon'] / MIB:6.1f})", flush=True)  # fmt: skip
            if n == latency_lanes:
                adds = results.adds.setdefault(mode, [])
                rss_before = warm["VmRSS"]
                for i in range(args.repeats):
                    a = await add_once(root, host, spaces, f"a{i:02d}")
                    adds.append(a)
                    face = "" if a.health_s is None else f"  /health {a.health_s:5.3f}"
                    gone = "" if a.face_gone_s is None else f"  (auth-service.json gone {a.face_gone_s:5.3f})"
                    print(f"    add a{i:02d}: .applied serving {a.serving_s:5.3f}{face}  admitted {a.admitted_s:5.3f} s "
                          f"({a.attempts} connect{'s' if a.attempts > 1 else ''});  remove: gone from .applied "
                          f"{a.removed_s:5.3f} s{gone}  other load {a.other_cores:4.2f} cores", flush=True)  # fmt: skip
                    await trio.sleep(PAUSE_S)
                if adds:  # the last removed space: its callout no longer answers (broker auth timeout)
                    space = f"a{args.repeats - 1:02d}"
                    t = time.perf_counter()
                    error = await connect(root.server_url, root.paths.space(space).sentinel_creds.read_text(),
                                          root.bearers[space])  # fmt: skip
                    print(f"    removed {space}: connect {'ADMITTED' if error is None else 'refused'} after "
                          f"{time.perf_counter() - t:.2f} s ({error})", flush=True)
                    await trio.sleep(args.settle)
                    results.churn[mode] = (rss_before, proc_status(host.proc.pid)["VmRSS"])
        finally:
            results.stop[(mode, n)] = await stop_host(host)
        warnings = sum("retrying" in line or "Traceback" in line for line in host.tail().splitlines())
        print(f"  {mode:12} {n:3} lanes: {results.stop[(mode, n)]}"
              + (f"; {warnings} warning lines in {host.log.name}" if warnings else ""), flush=True)


# -- report ----------------------------------------------------------------------------------------


def med_max(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} / {max(values):.3f}"


def worst(value: float) -> float:
    """A missed step (nan: never seen within the bound) counts as infinitely late."""
    return value if value == value else float("inf")


def verdict(worst: float, target: float) -> str:
    return f"{worst / target:.2f} of target" + (" (met)" if worst < target else " (NOT met)")


def report(results: Results, args: argparse.Namespace) -> None:
    modes = args.modes
    width = 24
    print()
    print(f"latency from the manifest rename, seconds, median / max over {args.repeats} adds "
          f"(host of {args.latency_lanes if args.latency_lanes in args.lanes else args.lanes[0]} lanes)")
    print(f"{'':40}" + "".join(f"{m:>{width}}" for m in modes))
    rows: list[tuple[str, Callable[[Add], float | None]]] = [
        ("add -> .applied serving", lambda a: a.serving_s),
        ("add -> auth-service.json + /health 200", lambda a: a.health_s),
        ("add -> first admitted connect", lambda a: a.admitted_s),
        ("remove -> gone from .applied", lambda a: a.removed_s),
        ("remove -> auth-service.json removed", lambda a: a.face_gone_s),
        ("other load during an add+remove (cores)", lambda a: a.other_cores),
    ]
    for label, f in rows:
        cells = [med_max([v for a in results.adds.get(m, []) if (v := f(a)) is not None]) for m in modes]
        print(f"{label:40}" + "".join(f"{c:>{width}}" for c in cells))
    print()
    print("host memory with N lanes (fresh host per N), MiB; idle = read after all serving + "
          f"{args.settle:g} s, warm = after one exchange + connect per lane + {args.settle:g} s")
    print(f"{'':40}" + "".join(f"{m:>{width}}" for m in modes))

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:40}" + "".join(f"{c:>{width}}" for c in cells))

    def rss(table: dict[tuple[str, int], dict[str, int]], m: str, n: int) -> float:
        return table.get((m, n), {}).get("VmRSS", float("nan")) / MIB

    first = args.lanes[0]
    for n in args.lanes:
        row(f"start -> all {n} serving (s)", [f"{results.start_s.get((m, n), float('nan')):.2f}" for m in modes])
    for n in args.lanes:
        row(f"VmRSS {n} lanes, idle / warm", [f"{rss(results.status, m, n):.1f} / {rss(results.warm, m, n):.1f}" for m in modes])
    for n in args.lanes[1:]:
        row(f"per additional lane {first}->{n}, idle / warm", [
            f"{(rss(results.status, m, n) - rss(results.status, m, first)) / (n - first):.2f}"
            f" / {(rss(results.warm, m, n) - rss(results.warm, m, first)) / (n - first):.2f}"
            for m in modes
        ])  # fmt: skip
    for n in args.lanes:
        row(f"threads / open fds, {n} lanes", [
            f"{results.status.get((m, n), {}).get('Threads', 0)} / {results.status.get((m, n), {}).get('fds', 0)}"
            for m in modes
        ])  # fmt: skip
    row(f"VmRSS before / after the {args.repeats} adds", [
        f"{results.churn[m][0] / MIB:.1f} / {results.churn[m][1] / MIB:.1f}" if m in results.churn else "-" for m in modes
    ])  # fmt: skip
    print()
    for m in modes:
        adds = results.adds.get(m, [])
        if adds:
            worst_add = max(worst(a.admitted_s) for a in adds)
            worst_remove = max(worst(a.removed_s) for a in adds)
            print(f"{m}: add (rename -> admitted connect) max {worst_add:.3f} s = {verdict(worst_add, ADD_TARGET_S)};"
                  f" remove (rename -> gone from .applied) max {worst_remove:.3f} s = {verdict(worst_remove, ADD_TARGET_S)}")
        last = args.lanes[-1]
        a, b = results.warm.get((m, first)), results.warm.get((m, last))
        if a and b and last > first:
            per = (b["VmRSS"] - a["VmRSS"]) / (last - first)
            print(f"{m}: per additional lane ({first}->{last}, warm) {per / MIB:.2f} MiB"
                  f" = {verdict(per, PER_LANE_TARGET_BYTES)}")


# -- main --------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, tmp: Path) -> None:
    spaces = [f"m{i:03d}" for i in range(max(args.lanes))]
    adds = [f"a{i:02d}" for i in range(args.repeats)]
    t0 = time.perf_counter()
    paths, idp, bearers = await trio.to_thread.run_sync(provision_root, tmp / "root", spaces + adds)
    broker = provision.ensure_root(paths, iat=int(time.time()))
    port = free_port()
    conf = write_config(paths, broker, port=port, auth_timeout_s=AUTH_TIMEOUT_S)
    url = f"nats://127.0.0.1:{port}"
    async with trio.open_nursery() as nursery:
        broker_pid = await nursery.start(functools.partial(run_nats_server, conf, log_path=paths.broker_log, port=port))
        with trio.fail_after(60):
            await push_all(paths, url, spaces + adds)
        print(f"setup: {len(spaces) + len(adds)} spaces provisioned and {2 * (len(spaces) + len(adds))} accounts "
              f"pushed in {time.perf_counter() - t0:.1f} s; broker {url} pid {broker_pid}", flush=True)
        root = Root(paths=paths, idp=idp, server_url=url, broker_pid=broker_pid, bearers=bearers)
        results = Results()
        if args.modes[0] != "full":
            await prime_stores(root, spaces + adds, tmp)
        for mode in args.modes:
            await run_mode(root, mode, args, tmp, results)
        report(results, args)
        nursery.cancel_scope.cancel()  # stops the broker (SIGTERM, awaited)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", default="1,10,50", help="lane counts, one fresh host each (default 1,10,50)")
    parser.add_argument("--repeats", type=int, default=10, help="adds (each then removed) timed (default 10)")
    parser.add_argument("--latency-lanes", type=int, default=10,
                        help="time the adds in the host of this many lanes (default 10; else the first of --lanes)")
    parser.add_argument("--modes", default=",".join(MODES), help="full, callout-only or both (default both)")
    parser.add_argument("--callout-only", action="store_true", help="only callout-only lanes (= --modes callout-only)")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds after all serving before reading RSS (default 1)")
    args = parser.parse_args()
    try:
        args.lanes = sorted({int(x) for x in args.lanes.split(",")})
    except ValueError:
        parser.error("--lanes takes comma-separated integers, e.g. 1,10,50")
    args.modes = ["callout-only"] if args.callout_only else [m.strip() for m in args.modes.split(",")]
    if min(args.lanes) < 1 or args.repeats < 0 or any(m not in MODES for m in args.modes):
        parser.error(f"--lanes must be at least 1, --repeats at least 0, --modes among {', '.join(MODES)}")
    logging.getLogger("cotal").addHandler(logging.NullHandler())  # this process's refused connects
    print("cotal-trio lanes benchmark")
    print(f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%SZ')}")
    print(f"machine: nproc={os.cpu_count()} ({len(os.sched_getaffinity(0))} usable), "
          f"{platform.platform()}, Python {platform.python_version()}, {nats_server_version()}")
    print(f"code: {Path(cotal_trio.__file__).parent} ({code_version()})")
    print(f"command: python bench/lanes.py --lanes {','.join(map(str, args.lanes))} --repeats {args.repeats} "
          f"--latency-lanes {args.latency_lanes} --modes {','.join(args.modes)} --settle {args.settle:g}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="cotal-bench-lanes-"))
    t0 = time.perf_counter()
    try:
        trio.run(run, args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
