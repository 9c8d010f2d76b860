"""``cotal status``: one line per space of the running root (issue 4 item 7).

Read-only. Sources, in order:

* ``<root>/spaces.json.applied``: the lane host's state of every hosted space (``serving``,
  ``retrying`` with its reason, ``starting``, ``stopping``; DESIGN.md 9);
* each space's readiness file ``auth-service.json`` (``url``, ``pid``), present only while a full
  lane serves the space;
* that lane's loopback face: ``GET /health`` and ``GET /metrics`` (no capability needed; see
  :mod:`cotal_trio.http.loopback`), over a client that follows no redirect and uses no proxy.

A space whose readiness file names a live process and whose ``/health`` answers is ``serving``,
with its callout counts and in-flight read from ``/metrics``; one whose face does not answer is
``unreachable``. Otherwise the ``.applied`` state stands while the host that wrote it (the pid
the file names, checked to have started before the file was written: :mod:`cotal_trio.state.applied`)
is alive, and the space is ``stopped`` when it is not, with the reason ``no host running (the
last host, pid N, is gone)``: ``.applied`` outlives the host that wrote it (issue 15 item 11). A
file that names no writer (an older host's) stands while the root's ``cotal up`` (the pid in
``<root>/up.lock``) is alive. Replicas have no face and are not
reported; a host started with ``cotal auth-service --spaces`` reports through readiness files
only (its ``.applied`` lies beside its own manifest).

With ``--server`` (a cluster root's seeds, issue 17 item 6) each seed is contacted first: a TCP
connect and the broker's ``INFO`` line, each bounded by :data:`SEED_TIMEOUT_S`, so one line per
seed says ``reachable`` (with the node's ``server_name``) or ``unreachable`` (with why). No
credentials are sent: this checks the address answers as a nats-server, not that connects are
admitted (``cotal check`` does that).

Each live operator face of the root (``<root>/ops/<port>.json`` naming a live pid; issue 18
item 8) is one more line after the spaces, ``operator face <url>  pid <pid>  (capability in
<file>)``; the JSON's ``opsFaces`` lists them (``[{"url", "pid", "file"}]``). They never change
the exit code.

A ``spaces.json`` that cannot be read or that its host refused (a typo) hides nothing (issue 18
item 4): the host keeps serving the lanes it has, so they are listed as above, and one more line
says the refusal (:mod:`cotal_trio.cli._hosted`): ``manifest <path> refused, the current lanes
keep serving: <the host's sentence, naming the fix>``, after the spaces (on stderr with
``--json``, whose object then carries the sentence as ``refused``, a key absent while the
manifest is accepted, as ``servers`` is without ``--server``).

Each listed space's stores (issue 17 item 1) are read from the broker when one answers (the first
reachable ``--server`` seed, else the root's own broker by ``policy.json``): the line ends with
``stores R3 (leader n2)`` (:func:`~cotal_trio.ops.store_replicas.summary`; ``, 1 below replicas
3`` when a store has fewer copies than the space's entry asks for), the JSON's ``stores`` lists
each store's count and leader. No broker answering leaves them out; they never change the exit code.

Exit code: 0 when at least one space is listed and every one is ``serving`` (and, with
``--server``, at least one seed is reachable); 1 otherwise (a space not serving, no auth service
running for the root, or no seed reachable, each said on stderr). A refused manifest changes
neither: 0 while its lanes serve, 1 when nothing does (as before, with the refusal's line). An
unreadable root is one sentence on stderr and exit 1, like every command.
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
from urllib.parse import urlsplit
import dataclasses
import time
from dataclasses import dataclass
from typing import Annotated, Any

import trio
from cyclopts import Parameter

from ..broker.spaces import list_spaces, resolve_server_url
from ..ops.store_replicas import SpaceStores, read_spaces_stores, summary
from ..state.space_folders import require_root, unrenamed_note, unrenamed_spaces
from ..core.errors import ConfigError
from ..core.manifest import LaneStatus
from ..http.client import ServiceRecord, check_url, no_redirect_opener, pid_alive, read_service
from cotal_trio.lane.metrics import MetricsSummary, read_summary
from ..state import RootPaths, read_json
from ..state.applied import applied_path, read_applied
from ..state.lock import LOCK_NAME
from ._hosted import read_hosted
from ._servers import parse_servers
from .common import Where

__all__ = ["OpsFace", "SeedReach", "SpaceStatus", "probe_seed", "read_ops_faces", "read_status", "status"]

# Each probe of a loopback face (GET /health, GET /metrics), seconds; a face answers in ms.
PROBE_TIMEOUT_S = 2.0
# A seed's TCP connect, and then its INFO line, each within this (seconds).
SEED_TIMEOUT_S = 1.0
# nats-server's INFO line is a few hundred bytes; more than this is not a broker.
MAX_INFO_BYTES = 64 * 1024
NATS_PORT = 4222
MAX_SCRAPE_BYTES = 1 << 20
SERVING = "serving"
# A live face whose /health says its lane cannot answer connects (its self-probe failed).
UNHEALTHY = "unhealthy"


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceStatus:
    """One space's line.

    Attributes:
        space: the space name.
        state: ``serving``, ``unhealthy`` (its face's ``/health`` answers 503 with the lane's
            reason), ``unreachable``, ``stopped``, or the ``.applied`` state.
        reason: why it is not serving (a sentence), or None.
        pid: the serving process, or None.
        url: the loopback exchange face, or None.
        metrics: the face's callout counts and in-flight, or None when not read.
        stores: the space's stores with their replica counts and leaders, or None when no
            broker answered (issue 17 item 1).
    """

    space: str
    state: str
    reason: str | None = None
    pid: int | None = None
    url: str | None = None
    metrics: MetricsSummary | None = None
    stores: SpaceStores | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"space", "state", "reason", "pid", "url", "callouts": {outcome: n} | null,
        "inFlight": n | null, "queueDepth": n | null}``, plus ``"stores": {"wanted", "stores":
        [{"stream", "replicas", "leader", "current"}], "error"}`` when a broker answered."""
        m = self.metrics
        stores = {} if self.stores is None else {"stores": self.stores.to_json()}
        return {
            "space": self.space, "state": self.state, "reason": self.reason, "pid": self.pid, "url": self.url,
            "callouts": None if m is None else dict(m.answers),
            "inFlight": None if m is None else m.in_flight,
            "queueDepth": None if m is None else m.queue_depth,
            **stores,
        }

    def line(self) -> str:
        """``<space>  <state>  pid <pid>  <url>  minted <n> ...  in-flight <n>`` or the reason."""
        parts = [self.space, self.state]
        if self.pid is not None:
            parts += [f"pid {self.pid}", self.url or "-"]
        if self.metrics is not None:
            parts += [" ".join(f"{outcome} {n}" for outcome, n in self.metrics.answers.items())]
            parts += [f"in-flight {self.metrics.in_flight}", f"queued {self.metrics.queue_depth}"]
        if self.stores is not None and self.stores.error is None:
            parts.append(summary(self.stores))
        if self.reason is not None:
            parts.append(f"({self.reason})")
        return "  ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedReach:
    """Whether one ``--server`` seed answers as a nats-server.

    Attributes:
        url: the seed as given.
        server_name: its ``INFO``'s ``server_name`` when reachable (None if it names none).
        reason: why it is unreachable (``connection refused``, ``timed out``, ...), else None.
    """

    url: str
    server_name: str | None = None
    reason: str | None = None

    @property
    def reachable(self) -> bool:
        """True when the seed accepted a connect and sent an ``INFO`` line."""
        return self.reason is None

    def to_json(self) -> dict[str, Any]:
        """``{"url", "reachable", "serverName", "reason"}``."""
        return {"url": self.url, "reachable": self.reachable, "serverName": self.server_name, "reason": self.reason}

    def line(self) -> str:
        """``server <url>  reachable  <name>`` or ``server <url>  unreachable  (<reason>)``."""
        if self.reachable:
            return f"server {self.url}  reachable  {self.server_name or '-'}"
        return f"server {self.url}  unreachable  ({self.reason})"


def probe_seed(url: str, *, timeout_s: float = SEED_TIMEOUT_S) -> SeedReach:
    """Blocking: TCP-connect to ``url`` (a parsed ``--server`` seed) and read its ``INFO`` line,
    each within ``timeout_s`` seconds; sends nothing. Never raises."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or NATS_PORT), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            first = sock.makefile("rb").readline(MAX_INFO_BYTES)
    except TimeoutError:
        return SeedReach(url=url, reason="timed out")
    except ConnectionRefusedError:
        return SeedReach(url=url, reason="connection refused")
    except OSError as exc:
        return SeedReach(url=url, reason=exc.strerror or str(exc))
    if not first.startswith(b"INFO "):
        return SeedReach(url=url, reason="it answered, but not as a nats-server (no INFO line)")
    try:
        info = json.loads(first[5:])
    except ValueError:
        return SeedReach(url=url, reason="its INFO line is not JSON")
    name = info.get("server_name") if isinstance(info, dict) else None
    return SeedReach(url=url, server_name=name if isinstance(name, str) else None)


def status(
    *,
    root: Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal).")] = None,
    as_json: Annotated[bool, Parameter(name="--json", negative="", help="Print one JSON object.")] = False,
    server: Annotated[
        str | None,
        Parameter(help="Broker seeds to check, nats://host:port, comma-separated: each is contacted (1 s) and reported reachable or not."),
    ] = None,
) -> int:
    """Print each space's state, pid, exchange URL, callout counts and in-flight.

    With --server (a cluster root's nodes, comma-separated) each seed is contacted first and
    one line per seed says whether it is reachable (the JSON's servers). Exits 0 when every
    space is serving, 1 when one is not, nothing runs for the root, or no seed is reachable.
    """
    servers = None if server is None else parse_servers(server)
    paths = Where(root=root).paths()
    require_root(paths)  # a mistyped --root is named, not reported as a root nothing serves
    seeds = None if servers is None else [probe_seed(url) for url in servers]
    running, spaces = read_status(paths)
    ops = read_ops_faces(paths)
    hosted = read_hosted(paths)  # a refused spaces.json: its line, after the lanes (issue 18 item 4)
    reachable = next((seed.url for seed in seeds or () if seed.reachable), None)
    if spaces and (seeds is None or reachable is not None):
        spaces = _with_stores(paths, spaces, reachable)
    if as_json:
        shown = {} if seeds is None else {"servers": [seed.to_json() for seed in seeds]}
        refused = {} if hosted.refused is None else {"refused": hosted.refused}
        print(json.dumps({"root": str(paths.root), **shown, "running": running, "spaces": [s.to_json() for s in spaces],
                          "opsFaces": [face.to_json() for face in ops], **refused}))
    else:
        for seed in seeds or ():
            print(seed.line())
        for space in spaces:
            print(space.line())
        for face in ops:
            print(face.line())
    if (refusal := hosted.line()) is not None:
        print(refusal, file=sys.stderr if as_json else sys.stdout)
    for name in unrenamed_spaces(paths):  # listed by no row until a start renames the folder
        print(unrenamed_note(name), file=sys.stderr if as_json else sys.stdout)
    if not running:
        print(f"cotal status: no auth service is running for root {paths.root} - start it with `cotal up`", file=sys.stderr)
    none_reachable = seeds is not None and not any(seed.reachable for seed in seeds)
    if none_reachable:
        print(
            f"cotal status: no seed of --server is reachable ({','.join(servers or ())}) - check the nodes and the URLs",
            file=sys.stderr,
        )
    return 0 if running and spaces and all(s.state == SERVING for s in spaces) and not none_reachable else 1


def _with_stores(paths: RootPaths, spaces: list[SpaceStatus], seed: str | None) -> list[SpaceStatus]:
    """``spaces`` with their stores read from ``seed`` (else the root's broker, when it listens)."""

    async def read() -> list[SpaceStores]:
        url = seed or await resolve_server_url(paths, None)
        return [] if url is None else await read_spaces_stores(paths, url, [s.space for s in spaces], now=time.time())

    found = {stores.space: stores for stores in trio.run(read)}
    return [dataclasses.replace(s, stores=found.get(s.space)) for s in spaces]


def read_status(paths: RootPaths) -> tuple[bool, list[SpaceStatus]]:
    """``(running, spaces)`` for the root, sorted by space (blocking: files and HTTP).

    ``running`` is True while the root's ``cotal up`` or any of its lanes' processes is alive.

    Raises:
        ConfigError: ``spaces.json.applied`` or a space's ``mode.json`` is corrupt (a refused
            ``spaces.json`` is not read: the lanes stand as ``.applied`` and the readiness
            files say, issue 18 item 4).
    """
    applied = read_applied(applied_path(paths.spaces_manifest))
    records = {row["space"]: _service(paths, row["space"]) for row in list_spaces(paths, hosted=())}
    served = {space: record for space, record in records.items() if record is not None}
    up_alive = _up_alive(paths)
    # `.applied` outlives the host that wrote it: it stands only while that host runs (the pid
    # it names; a file naming none, while the root's `cotal up` runs).
    host_alive = up_alive if applied is None or applied.alive is None else applied.alive
    running = bool(served) or up_alive or host_alive
    lanes = {} if applied is None else applied.report.spaces
    gone = None if applied is None else applied.gone
    names = sorted(lanes.keys() | served.keys())
    return running, [
        _space_status(name, served.get(name), lanes.get(name), host_alive=host_alive, gone=gone) for name in names
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class OpsFace:
    """A running process's operator face of the root (issue 18 item 8): its readiness file
    ``<root>/ops/<port>.json``, which holds the capability, names a live pid."""

    url: str
    pid: int
    file: str

    def to_json(self) -> dict[str, Any]:
        """``{"url", "pid", "file"}``."""
        return {"url": self.url, "pid": self.pid, "file": self.file}

    def line(self) -> str:
        """``operator face <url>  pid <pid>  (capability in <file>)``."""
        return f"operator face {self.url}  pid {self.pid}  (capability in {self.file})"


def read_ops_faces(paths: RootPaths) -> list[OpsFace]:
    """The root's live operator faces by port (blocking; a file of a gone process, or one that
    cannot be read, is left out: a killed process's file claims nothing)."""
    faces = []
    for path in sorted(paths.ops_dir.glob("*.json")) if paths.ops_dir.is_dir() else ():
        try:
            record, written = read_json(path), path.stat().st_mtime
            url, pid = record["url"], record["pid"]
        except (ConfigError, OSError, KeyError):
            continue
        if isinstance(url, str) and type(pid) is int and pid_alive(pid, since=written):
            faces.append(OpsFace(url=url, pid=pid, file=str(path)))
    return faces


def _service(paths: RootPaths, space: str) -> ServiceRecord | None:
    """The space's running full lane (its readiness file, live pid), or None."""
    try:
        return read_service(paths.space(space))
    except ConfigError:  # no file, a gone process, or a half-written file: not serving
        return None


def _up_alive(paths: RootPaths) -> bool:
    """True when ``<root>/up.lock`` names a live process (``cotal up`` holds it while it runs)."""
    lock = paths.root / LOCK_NAME
    try:
        pid, written = int(lock.read_text().strip() or 0), lock.stat().st_mtime
    except (OSError, ValueError):
        return False
    return pid > 0 and pid_alive(pid, since=written)  # a pid reused since is not cotal up


def _space_status(
    space: str, service: ServiceRecord | None, lane: LaneStatus | None, *, host_alive: bool, gone: str | None
) -> SpaceStatus:
    if service is not None:
        return _probe(space, service)
    if lane is not None and host_alive:
        return SpaceStatus(space=space, state=lane.state, reason=lane.reason)
    return SpaceStatus(space=space, state="stopped", reason=gone if lane is not None and gone else "no auth service serves it")


def _probe(space: str, service: ServiceRecord) -> SpaceStatus:
    """Ask a live lane's face for ``/health`` then ``/metrics``."""
    where = {"space": space, "pid": service.pid, "url": service.url}
    try:
        health = json.loads(_get(service.url, "/health"))
    except _Unhealthy as unhealthy:  # issue 15 item 11: the lane says it cannot answer
        return SpaceStatus(state=UNHEALTHY, reason=f"the lane cannot answer connects: {unhealthy}", **where)
    except (ConfigError, OSError, ValueError) as exc:
        reason = f"its face at {service.url} did not answer ({_why(exc)}) - check the auth service log"
        return SpaceStatus(state="unreachable", reason=reason, **where)
    try:
        if not (isinstance(health, dict) and health.get("ok") is True):
            raise ValueError("not ok")
        summary = read_summary(_get(service.url, "/metrics").decode("utf-8"), space)
    except (ConfigError, OSError, ValueError) as exc:
        reason = f"its face at {service.url} did not answer ({_why(exc)}) - check the auth service log"
        return SpaceStatus(state="unreachable", reason=reason, **where)
    return SpaceStatus(state=SERVING, metrics=summary, **where)


def _get(url: str, path: str) -> bytes:
    """``GET <url><path>`` on a loopback face: the body of a 200 (blocking).

    Raises:
        ConfigError: ``url`` is not loopback http or https.
        OSError: no answer, a timeout, or an answer other than 200 (``HTTP <status>``); a 503
            ``/health`` naming its lane's reason is the subclass ``_Unhealthy``.
    """
    base = check_url(url)
    try:
        with no_redirect_opener(base).open(f"{base}{path}", timeout=PROBE_TIMEOUT_S) as response:
            return response.read(MAX_SCRAPE_BYTES)
    except urllib.error.HTTPError as answered:
        with answered:  # it holds the socket
            reason = _health_reason(answered) if path == "/health" and answered.code == 503 else None
            if reason is not None:
                raise _Unhealthy(reason) from None
            raise OSError(f"{path} answered HTTP {answered.code}") from None


class _Unhealthy(OSError):
    """A face's ``/health`` answered 503 with its lane's reason (``lane.health``)."""


def _health_reason(answered: urllib.error.HTTPError) -> str | None:
    """The ``reason`` of a 503 ``/health`` answer ``{"ok": false, "reason"}``, or None."""
    try:
        body = json.loads(answered.read(MAX_SCRAPE_BYTES))
    except (OSError, ValueError):
        return None
    reason = body.get("reason") if isinstance(body, dict) and body.get("ok") is False else None
    return reason if isinstance(reason, str) and reason else None


def _why(exc: BaseException) -> str:
    return str(getattr(exc, "reason", exc)) or type(exc).__name__
