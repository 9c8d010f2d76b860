"""Serve a quart-trio app with hypercorn on trio (DESIGN 5 "http faces"; stack-prototype 4).

:func:`serve_app` is a startable (STYLE practice 7): ``port = await nursery.start(serve_app,
app)`` returns once the listener is bound, with the real port, and the server then runs until
its scope is cancelled. Cancelling closes the listener at once (new connects are refused). A
``shutdown_trigger`` stops it gracefully instead: the listener stops at once and the requests in
flight finish (a lane's drain, issue 15 item 8).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio

from cotal_trio.core.errors import ConfigError, leaves
from cotal_trio.http.errors import LOGGER

__all__ = ["serve_app"]

# How long an in-flight request may finish after a graceful shutdown trigger (seconds).
GRACEFUL_TIMEOUT_S = 3.0
# How long a peer may leave sent data unacknowledged (or its window shut) before its connection
# is cut (seconds; TCP_USER_TIMEOUT, see _bound_socket).
USER_TIMEOUT_S = 10.0
# Bind failures that are the operator's to fix, and how the sentence names them.
_BIND_ERRNOS: Mapping[int, str] = MappingProxyType(
    {errno.EADDRINUSE: "busy", errno.EADDRNOTAVAIL: "not an address of this host", errno.EACCES: "not permitted"}
)


def _config(fd: int) -> Config:
    config = Config()
    config.bind = [f"fd://{fd}"]
    config.accesslog = None
    # hypercorn logs "Running on ..." at INFO; our banner says where we listen.
    server_log = LOGGER.getChild("hypercorn")
    server_log.setLevel(logging.WARNING)
    config.errorlog = server_log
    config.include_server_header = False
    config.graceful_timeout = GRACEFUL_TIMEOUT_S
    return config


def _bound_socket(host: str, port: int, user_timeout_s: float) -> socket.socket:
    """A TCP socket bound to ``host:port`` for hypercorn to listen on (handed over as ``fd://``).

    Binding here, on a socket we close on failure, keeps the operator's bind failures clean
    (hypercorn leaks its own socket when its bind fails). ``TCP_USER_TIMEOUT`` is set on it, and
    Linux gives every accepted connection the same: data a peer leaves unacknowledged, or a
    window it keeps shut, for ``user_timeout_s`` seconds ends the connection. hypercorn shields
    its socket writes from cancellation, so without this a peer that stops reading (an
    ``/events`` consumer) would hold its handler, and the face's shutdown, forever.

    Raises:
        ConfigError: as :func:`_bind_error`; any other ``OSError`` propagates.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(user_timeout_s * 1000))
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        error = _bind_error(exc, host, port)
        if error is None:
            raise
        raise error from None
    return sock


def _bind_error(error: BaseException, host: str, port: int) -> ConfigError | None:
    """A ConfigError for the first bind ``OSError`` in ``error`` (a group or not), or ``None``."""
    for leaf in leaves(error):
        if isinstance(leaf, OSError) and leaf.errno in _BIND_ERRNOS:
            problem = _BIND_ERRNOS[leaf.errno]
            return ConfigError(f"port {port} on {host} is {problem} - stop whatever holds it or choose another port")
    return None


async def serve_app(
    app: QuartTrio,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    user_timeout_s: float = USER_TIMEOUT_S,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` over HTTP/1.1 on ``host:port``; runs until cancelled.

    Binds the listener, then calls ``task_status.started(port)`` with the bound port (``port=0``
    picks a free one). Access logging is off; hypercorn's own messages go to ``cotal.http``.

    Args:
        app: the quart-trio app (a face).
        host: the address to bind, normally ``127.0.0.1``.
        port: the TCP port, or 0 for any free port.
        shutdown_trigger: optional; when the awaitable it returns completes, the listener
            stops (new connects are refused at once), in-flight requests finish for up to
            :data:`GRACEFUL_TIMEOUT_S` (idle keep-alive connections close), and this function
            returns. Without it, only cancellation ends the server (a lane's drain sets it:
            issue 15 item 8).
        user_timeout_s: seconds a peer may leave sent data unacknowledged (or its receive
            window shut) before its connection is cut (``TCP_USER_TIMEOUT``,
            :func:`_bound_socket`); this also bounds how long a peer that stopped reading holds
            the server's shutdown.
        task_status: from ``nursery.start``; receives the bound port (int).

    Raises:
        ConfigError: the port is busy, the address is not local, or binding is not permitted
            (raised from ``nursery.start``, before anything is served).

    Cancellation: closes the listener and every connection; nothing is left open.
    """
    with _bound_socket(host, port, user_timeout_s) as ours:
        # hypercorn takes its own descriptor of the socket (and closes it); ours closes here.
        config = _config(os.dup(ours.fileno()))
        triggered = False

        async def trigger() -> None:
            nonlocal triggered
            await (shutdown_trigger if shutdown_trigger is not None else trio.sleep_forever)()
            triggered = True
            _stop_listening(ours)  # hypercorn's stop follows in this same step (no checkpoint)

        try:
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(functools.partial(serve, app, config, shutdown_trigger=trigger))
                task_status.started(int(binds[0].rsplit(":", 1)[1]))
        except* OSError as group:
            if not (triggered and all(leaf.errno == errno.EINVAL for leaf in leaves(group))):
                raise
            # A connect that woke the accept loop in the very step the listener stopped: its
            # accept saw the shut socket. Nothing was taken from it; the stop goes on.
            LOGGER.info("a connect arrived as the listener on %s:%d stopped; it was refused", host, port)


def _stop_listening(sock: socket.socket) -> None:
    """Stop accepting on ``sock`` now: new connects are refused, accepted ones are untouched.

    ``shutdown`` (not ``close``) because hypercorn holds a second descriptor of the same socket;
    on Linux it ends the listen state for both, and connects the kernel queued but nobody
    accepted are reset (they were never taken, so nothing in flight is cut).
    """
    try:
        sock.shutdown(socket.SHUT_RD)
    except OSError as exc:  # already shut, or not listening: nothing to stop
        LOGGER.debug("listener shutdown: %s", exc)
