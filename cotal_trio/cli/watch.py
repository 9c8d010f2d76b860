"""``cotal watch``: the live view of a root's spaces, from each loopback face's ``/events`` (issue 7 item 2).

For each space (``--space``, repeatable; default: every user-auth space of the root, rescanned
every :data:`RESCAN_S` so a space added later appears) it reads the space's ``auth-service.json``
(``cotal up`` and ``cotal auth-service`` both write it), opens ``ws://127.0.0.1:<port>/events``
with ``Authorization: Bearer <cap>`` (trio-websocket) and merges what every face sends. Events
are deduped by ``(pid, seq)``: a process's host-level and lane events reach every one of its
faces. A hello below the highest seq seen for its pid on the pid's only open face is a restarted
process reusing the pid (pid 1 in a container), whose seqs count again from 1
(:class:`~cotal_trio.core.events.SeqFilter`). A face that is not running or closes is shown ``disconnected`` and retried every
:data:`RETRY_S` (the file is read again: a restarted lane has a new port and capability).

Every :data:`RENDER_S` it prints, per space: lane state, connects per second by outcome (last
10 s), p50/p99 callout time (last 60 s), connect-limit denials and the last denial reasons
(:class:`~cotal_trio.core.events.WatchModel`; :func:`render_view`). ``--json`` prints each event
instead, one JSON line each, exactly as the face sent it (docs/events.md). Ctrl-C (or SIGTERM)
exits 0.

A manifest its host refused (a typo in ``spaces.json``) hides nothing (issue 18 item 4): the
root's spaces are listed without reading it, their lanes keep serving and streaming, and the view
starts with one line per refusal, ``manifest <path> refused, the current lanes keep serving:
<the host's sentence>`` (with ``--json``, the same line on stderr when it appears). A refusal is
learnt live from a face's ``manifest`` event and, for one made before the watcher started (a
hello does not carry it), from the root's ``spaces.json.applied``, read every :data:`RESCAN_S`
(:class:`Refusals`); the host's next ``applied`` event, or a file without it, clears the line.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, NoReturn

import trio
from cyclopts import Parameter
from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError, wrap_client_stream

from ..broker.spaces import list_spaces
from ..core.errors import ConfigError, leaves
from ..core.events import LATENCY_WINDOW_S, RATE_WINDOW_S, SeqFilter, SpaceView, WatchModel
from ..http.client import ServiceRecord, check_url, read_service
from ..state import RootPaths
from ..state.applied import refusal_line
from ..state.space_folders import require_root
from ._hosted import Hosted, read_hosted
from .common import Where, stop_on_signal

__all__ = ["Refusals", "WatchConfig", "render_view", "run_watch", "watch"]

RETRY_S = 2.0  # a disconnected face is tried again after this long
RENDER_S = 1.0  # the view is printed this often
RESCAN_S = 2.0  # the root's spaces are listed again this often (no --space)
FEED_BUFFER = 256  # messages between the faces' readers and the merger (a reader waits when full)
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen (a terminal only)
CLOSE_S = 2.0  # the websocket close handshake, at most (shielded, on every exit)
_LOST = (ConfigError, OSError, HandshakeError, ConnectionClosed, trio.BrokenResourceError)


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchConfig:
    """What ``cotal watch`` follows.

    Attributes:
        paths: the root.
        spaces: the spaces to show; empty: every user-auth space of the root, rescanned.
        as_json: print each event as received instead of the view.
    """

    paths: RootPaths
    spaces: tuple[str, ...] = ()
    as_json: bool = False


async def watch(
    *,
    space: Annotated[tuple[str, ...], Parameter(negative="", help="A space to watch (repeatable; default: every space of the root).")] = (),
    as_json: Annotated[bool, Parameter(name="--json", negative="", help="Print each event as one JSON line.")] = False,
    root: Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal).")] = None,
) -> int:
    """Show each space's lane state, connects per second, callout p50/p99 and denials, live.

    Runs until Ctrl-C or SIGTERM, then exits 0. ``--json`` prints the raw events instead.
    """
    paths = Where(root=root).paths()
    require_root(paths)  # the sentence every command says for a mistyped --root
    for name in space:
        Where(root=root, space=name).provisioned()  # a bad name, or not in the root: one sentence
    config = WatchConfig(paths=paths, spaces=tuple(dict.fromkeys(space)), as_json=as_json)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_signal, scope, "cotal watch")
            await run_watch(config, emit=_printer(clear=not as_json and sys.stdout.isatty()))
    return 0


def _printer(*, clear: bool) -> Callable[[str], None]:
    def emit(text: str) -> None:
        print(CLEAR + text if clear else text, flush=True)

    return emit


# --- the shell ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Message:
    space: str
    pid: int
    text: str


@dataclass(frozen=True, slots=True)
class _Refused:
    """The root's ``.applied`` (or ``spaces.json`` itself) changed what it says: ``line`` under
    ``key`` (the host's pid, or ``"root"`` for a file no host refused), None to clear it;
    ``manifest`` is the path the host with ``pid`` follows (None if none runs)."""

    key: int | str | None
    line: str | None
    pid: int | None = None
    manifest: str | None = None


@dataclass(frozen=True, slots=True)
class _Link:
    """A space's face came up (``pid``: its process) or went down (``why``)."""

    space: str
    up: bool
    why: str | None = None
    pid: int | None = None


_Item = _Message | _Refused | _Link  # what the followers send the merger


async def run_watch(
    config: WatchConfig, *, emit: Callable[[str], None], clock: Callable[[], float] = time.time
) -> NoReturn:
    """Follow the faces and print (``emit``, one call per event or per view) until cancelled.

    Args:
        config: what to follow.
        emit: prints one text (an event's JSON line, or the whole view); sync.
        clock: wall time, unix seconds (the view's windows end now).
    """
    send, receive = trio.open_memory_channel[_Item](FEED_BUFFER)
    model = WatchModel(config.spaces, only=bool(config.spaces))
    refusals = Refusals()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_follow_root, nursery, config, send)
        nursery.start_soon(_follow_applied, config.paths, send)
        if not config.as_json:
            nursery.start_soon(_render, model, refusals, emit, clock)
        await _merge(receive, model, emit if config.as_json else None, refusals=refusals)
    raise AssertionError("unreachable")  # pragma: no cover


class Refusals:
    """The manifest refusals a watcher shows, one line per host (its pid) or for the root's
    ``spaces.json`` no host refused yet (``"root"``); insertion-ordered.

    A face's ``manifest`` event sets (``refused``) or clears (``applied``) its process's line;
    :func:`_follow_applied` reports what the root's ``.applied`` says each time it changes,
    and which manifest path each host follows, so an event's line names it.
    """

    def __init__(self) -> None:
        self._lines: dict[int | str, str] = {}
        self._manifests: dict[int, str] = {}  # host pid -> the manifest it follows

    def lines(self) -> list[str]:
        """The lines shown now, each once."""
        return list(dict.fromkeys(self._lines.values()))

    def event(self, pid: int, event: dict[str, object]) -> str | None:
        """Fold a ``manifest`` event of process ``pid``; the line it sets, when new."""
        if event.get("outcome") == "applied":
            self._lines.pop(pid, None)
            return None
        reason = event.get("reason")
        if event.get("outcome") != "refused" or not isinstance(reason, str) or not reason:
            return None
        return self._set(pid, refusal_line(self._manifests.get(pid, f"of host pid {pid}"), reason))

    def applied(self, item: _Refused) -> str | None:
        """Fold a change of the root's ``.applied``; the line it sets, when new."""
        if item.pid is not None and item.manifest is not None:
            self._manifests[item.pid] = item.manifest
        if item.key is None:
            return None
        if item.line is None:
            self._lines.pop(item.key, None)
            return None
        return self._set(item.key, item.line)

    def _set(self, key: int | str, line: str) -> str | None:
        new = self._lines.get(key) != line
        self._lines[key] = line
        return line if new else None


async def _follow_applied(paths: RootPaths, send: trio.MemorySendChannel[_Item]) -> NoReturn:
    """Every :data:`RESCAN_S`, read the root's ``spaces.json`` and ``.applied``
    (:func:`~cotal_trio.cli._hosted.read_hosted`) and send what they say when it changed since
    the last read (the key it was said under cleared first). Only changes are sent, so a file
    read just before its host rewrote it never undoes the newer event."""
    said = _Refused(None, None)
    while True:
        now = _refused_now(await trio.to_thread.run_sync(read_hosted, paths))
        if now != said:
            if said.key is not None and said.key != now.key:
                await send.send(_Refused(said.key, None))
            await send.send(now)
            said = now
        await trio.sleep(RESCAN_S)


def _refused_now(hosted: Hosted) -> _Refused:
    """What the root's files say: the refusal's line under its host's pid (``"root"`` when no
    running host refused the file), and the manifest that host follows."""
    applied = hosted.applied if hosted.applied is not None and hosted.applied.alive is not False else None
    pid = None if applied is None else applied.report.pid
    line = hosted.line()
    by_host = pid is not None and applied is not None and applied.refused is not None
    key = None if line is None else (pid if by_host else "root")
    return _Refused(key, line, pid=pid, manifest=None if pid is None else str(hosted.manifest))


async def _merge(
    receive: trio.MemoryReceiveChannel[_Item], model: WatchModel, emit_json: Callable[[str], None] | None,
    *, refusals: Refusals | None = None,
) -> None:
    """Dedupe and fold (or print) every message; note links going up and down, and refusals
    (each new one a stderr line with ``--json``).

    Each space has one follower, so at most one open link per space (``live``: its pid); a
    link's up and down tell the :class:`SeqFilter` which processes have a face open.
    """
    seqs = SeqFilter()
    live: dict[str, int] = {}  # space -> the pid of its open link
    refusals = Refusals() if refusals is None else refusals
    async for item in receive:
        if isinstance(item, _Refused):
            _said(refusals.applied(item), emit_json)
            continue
        if isinstance(item, _Link):
            model.connected(item.space, item.up)
            _track(seqs, live, item)
            if not item.up and emit_json is not None:
                print(f"cotal watch: space {item.space}: disconnected ({item.why}) - retrying in {RETRY_S:g} s",
                      file=sys.stderr, flush=True)
            continue
        try:
            event = json.loads(item.text)
        except ValueError:
            continue  # not our schema; a face never sends this
        if not isinstance(event, dict):
            continue
        seq = event.get("seq")
        if event.get("type") == "hello":
            if isinstance(seq, int):
                seqs.hello(item.pid, seq)  # a restarted process (same pid) counts from 1 again
        elif not (isinstance(seq, int) and seqs.fresh(item.pid, seq)):
            continue  # a process's shared events reach every one of its faces
        said = refusals.event(item.pid, event) if event.get("type") == "manifest" else None
        if emit_json is not None:
            emit_json(item.text)
            _said(said, emit_json)
        else:
            model.add(event)


def _said(line: str | None, emit_json: Callable[[str], None] | None) -> None:
    """A new refusal's line on stderr with ``--json`` (the view shows it at the top)."""
    if line is not None and emit_json is not None:
        print(f"cotal watch: {line}", file=sys.stderr, flush=True)


def _track(seqs: SeqFilter, live: dict[str, int], link: _Link) -> None:
    """Report a face's link going up or down to ``seqs`` (``live``: space -> pid of its open link)."""
    gone = live.pop(link.space, None)
    if gone is not None:
        seqs.closed(gone)
    if link.up and link.pid is not None:
        live[link.space] = link.pid
        seqs.opened(link.pid)


async def _render(model: WatchModel, refusals: Refusals, emit: Callable[[str], None], clock: Callable[[], float]) -> NoReturn:
    while True:
        emit(render_view(model.views(clock()), refusals=refusals.lines()))
        await trio.sleep(RENDER_S)


async def _follow_root(nursery: trio.Nursery, config: WatchConfig, send: trio.MemorySendChannel[_Item]) -> None:
    """Start one follower per space: the given ones, or the root's, rescanned forever."""
    started: set[str] = set()
    while True:
        names = config.spaces or await trio.to_thread.run_sync(_root_spaces, config.paths)
        for name in names:
            if name not in started:
                started.add(name)
                nursery.start_soon(_follow_face, config.paths, name, send, name=f"watch[{name}]")
        if config.spaces:
            return
        await trio.sleep(RESCAN_S)


def _root_spaces(paths: RootPaths) -> list[str]:
    """The root's user-auth spaces (blocking); none when the root cannot be listed. ``spaces.json``
    is not read (the view has no hosted column), so a refused one hides no space."""
    try:
        return [row["space"] for row in list_spaces(paths, hosted=()) if row["mode"] != "static"]
    except ConfigError:
        return []


async def _follow_face(paths: RootPaths, space: str, send: trio.MemorySendChannel[_Item]) -> NoReturn:
    """Stream one space's face into ``send``; on losing it (or not finding it) report it down
    and retry after :data:`RETRY_S`. Anything but the expected losses (:data:`_LOST`) propagates."""
    while True:
        why = "the face ended the stream"
        try:
            record = await trio.to_thread.run_sync(read_service, paths.space(space))
            await _stream(record, space, send)
        except* _LOST as group:
            why = _why(leaves(group)[0])
        await send.send(_Link(space, False, why))
        await trio.sleep(RETRY_S)


def _why(lost: BaseException) -> str:
    if isinstance(lost, ConnectionClosed):
        return f"closed {lost.reason.code}: {lost.reason.reason or lost.reason.name}"
    if isinstance(lost, ConnectionRejected):
        return f"refused: HTTP {lost.status_code}"
    return str(lost) or type(lost).__name__


async def _stream(record: ServiceRecord, space: str, send: trio.MemorySendChannel[_Item]) -> NoReturn:
    """One connection to ``record``'s ``/events``, forwarding every text message; runs until
    the connection is lost. The TCP stream is ours and closed on every exit (trio-websocket
    leaves a refused handshake's socket open).

    Raises (in a group, from the connection's nursery):
        ConfigError: the face's URL is not loopback http (the capability is not sent there).
        OSError, HandshakeError: no connection, or the handshake was refused (``ConnectionRejected``).
        ConnectionClosed: the face closed the connection (a drop names its reason).
    """
    base = check_url(record.url)
    address = base.removeprefix("http://")
    host, _, port = address.rpartition(":")
    if not base.startswith("http://") or not port.isdigit():
        raise ConfigError(f"space {space}: its face {record.url} is not http://<host>:<port> on this host - cannot watch it")
    headers = [(b"Authorization", f"Bearer {record.cap}".encode("ascii"))]
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream, trio.open_nursery() as nursery:
        ws = await wrap_client_stream(nursery, stream, address, "/events", extra_headers=headers)
        try:
            await send.send(_Link(space, True, pid=record.pid))
            while True:
                message = await ws.get_message()
                if isinstance(message, str):
                    await send.send(_Message(space, record.pid, message))
        finally:
            with trio.move_on_after(CLOSE_S, shield=True):
                await ws.aclose()


# --- the view (pure) ----------------------------------------------------------------------------


def render_view(views: Iterable[SpaceView], *, refusals: Iterable[str] = ()) -> str:
    """The watch view's text for these :class:`SpaceView` lines (no trailing newline).

    One block per space::

        alpha  serving
          connects/s (10 s)  minted 1.2  denied 0.3  timeout 0.0  shed 0.0
          callout (60 s)     p50 3 ms  p99 12 ms
          limit denials      2
          last denials       RATE_LIMITED retry-after 1s ...
                             no token ...

    ``disconnected`` replaces the state while no face of the space streams (the last known
    state follows in parentheses); a state with a reason shows it after `` - ``. Each of
    ``refusals`` (a refused manifest's line, :class:`Refusals`) comes first, one line each.
    """
    blocks = [_block(view) for view in views]
    shown = "\n\n".join(blocks) if blocks else "no space serves a face yet - start `cotal up`, or pass --space"
    return "\n".join([*refusals, shown])


def _block(view: SpaceView) -> str:
    state = view.state + (f" - {view.reason}" if view.reason else "")
    head = f"{view.space}  {state}" if view.connected else f"{view.space}  disconnected (last: {state})"
    rates = "  ".join(f"{outcome} {rate:.1f}" for outcome, rate in view.rates.items())
    latency = "-" if view.p50_ms is None else f"p50 {view.p50_ms} ms  p99 {view.p99_ms} ms"
    lines = [
        head,
        f"  connects/s ({RATE_WINDOW_S:g} s)  {rates}",
        f"  callout ({LATENCY_WINDOW_S:g} s)     {latency}",
        f"  limit denials      {view.limit_denials}",
    ]
    for i, reason in enumerate(view.denials):
        lines.append(f"  {'last denials' if i == 0 else '':<19}{reason}")
    return "\n".join(lines)
