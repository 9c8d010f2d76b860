"""The process's operator face, served for the life of the process (issue 18 item 8).

:func:`run_ops_face` is a startable the service starts before its lanes (``cotal up``,
``cotal auth-service --space`` and ``--spaces``, ``--callout-only`` too: a replica's lanes have
callout metrics and lane states). It mints the face's capability, binds 127.0.0.1:``port``
(``--ops-port``; 0 picks a free one), writes ``<root>/ops/<port>.json`` ``{ver, url, pid, cap}``
(0600) and sets the board's URL, so every full lane then records it as ``opsUrl`` in its
``auth-service.json``. The face and its capability outlive every lane restart; cancelling the
process stops the face and removes the file if it is still this process's. Routes and rules:
:mod:`cotal_trio.http.ops`.
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Callable

import trio

from cotal_trio.core.errors import ConfigError
from cotal_trio.http.ops import build_ops_app
from cotal_trio.http.serve import serve_app
from cotal_trio.lane.events import EventBus
from cotal_trio.lane.ops import OpsBoard
from cotal_trio.state import RootPaths, read_json, remove_quietly, write_json

__all__ = ["check_ops_port", "run_ops_face"]


def check_ops_port(port: int | None) -> None:
    """Refuse an ``--ops-port`` that is no port (ConfigError naming the fix); None passes."""
    if port is not None and (isinstance(port, bool) or not 0 <= port <= 65535):
        raise ConfigError(f"--ops-port {port} is not a port - pass 1 to 65535, or 0 for any free one")


async def run_ops_face(
    *, root: RootPaths, port: int, board: OpsBoard, events: EventBus, clock: Callable[[], float],
    source: str | None = None, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the operator face on 127.0.0.1:``port`` until cancelled (startable; ``started``
    with its URL ``http://127.0.0.1:<bound port>``, once the readiness file is written).

    Args:
        root: where ``ops/<port>.json`` is written.
        port: the TCP port, 0 for a free one.
        board: the process's metrics board (its ``url`` is set here).
        events: the process's event bus (``/events``, the lane states of ``/health``).
        clock: seconds, for the bad-capability window.
        source: how the port's refusal names where the port came from; None: ``--ops-port
            <port>`` (``cotal up`` names its recorded one so).

    Raises:
        ConfigError: the port is busy or not permitted (before ``started``): one sentence
            naming the flag and the fix.
    """
    capability = secrets.token_hex(32)
    app = build_ops_app(capability=capability, clock=clock, metrics=board.exposition, events=events, lanes=events.lanes)
    refused: ConfigError | None = None
    async with trio.open_nursery() as nursery:
        try:
            bound = await nursery.start(functools.partial(serve_app, app, port=port))
        except ConfigError as exc:
            refused = exc  # raised below, outside the nursery: one sentence, not a group
        else:
            path = root.ops_json(bound)
            url = f"http://127.0.0.1:{bound}"
            try:
                write_json(path, {"ver": 1, "url": url, "pid": os.getpid(), "cap": capability})
                board.url = url
                task_status.started(url)
                await trio.sleep_forever()
            finally:
                board.url = None
                _unpublish(path, capability)
    if refused is not None:
        problem = str(refused).split(" - ", 1)[0]  # "port N on 127.0.0.1 is busy" (http/serve.py)
        raise ConfigError(
            f"{source or f'--ops-port {port}'}: the operator face's {problem} - stop whatever holds it,"
            " or pass --ops-port with another port (0 picks a free one)"
        ) from None


def _unpublish(path: os.PathLike[str], capability: str) -> None:
    """Remove the readiness file if it is still this face's (its capability)."""
    try:
        ours = read_json(path).get("cap") == capability
    except ConfigError:
        return
    if ours:
        remove_quietly(path)
