"""Serve a quart-trio app with hypercorn on trio (DESIGN 5 "http faces"; stack-prototype 4).

:func:`serve_app` is a startable (STYLE practice 7): ``port = await nursery.start(serve_app,
app)`` returns once the listener is bound, with the real port, and the server then runs until
its scope is cancelled. Cancelling closes the listener at once (new connects are refused).
"""

from __future__ import annotations

import errno
import functools
import logging
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
# Bind failures that are the operator's to fix, and how the sentence names them.
_BIND_ERRNOS: Mapping[int, str] = MappingProxyType(
    {errno.EADDRINUSE: "busy", errno.EADDRNOTAVAIL: "not an address of this host", errno.EACCES: "not permitted"}
)


def _config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    # hypercorn logs "Running on ..." at INFO; our banner says where we listen.
    server_log = LOGGER.getChild("hypercorn")
    server_log.setLevel(logging.WARNING)
    config.errorlog = server_log
    config.include_server_header = False
    config.graceful_timeout = GRACEFUL_TIMEOUT_S
    return config


async def _probe_bind(host: str, port: int) -> None:
    """Bind ``host:port`` the way hypercorn will, then release it.

    hypercorn leaks its socket when its own bind fails (a ``ResourceWarning`` at garbage
    collection), so the common failures are found here first, on a socket we close. A port
    taken between this probe and hypercorn's bind still fails below, as the same ConfigError.

    Raises:
        ConfigError: as :func:`_bind_error`; any other ``OSError`` propagates.
    """
    family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
    with trio.socket.socket(family, trio.socket.SOCK_STREAM) as probe:
        probe.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
        try:
            await probe.bind((host, port))
        except OSError as exc:
            error = _bind_error(exc, host, port)
            if error is None:
                raise
            raise error from None


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
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` over HTTP/1.1 on ``host:port``; runs until cancelled.

    Binds the listener, then calls ``task_status.started(port)`` with the bound port (``port=0``
    picks a free one). Access logging is off; hypercorn's own messages go to ``cotal.http``.

    Args:
        app: the quart-trio app (a face).
        host: the address to bind, normally ``127.0.0.1``.
        port: the TCP port, or 0 for any free port.
        shutdown_trigger: optional; when the awaitable it returns completes, hypercorn stops
            accepting, lets in-flight requests finish for up to :data:`GRACEFUL_TIMEOUT_S`, and
            this function returns. Without it, only cancellation ends the server.
        task_status: from ``nursery.start``; receives the bound port (int).

    Raises:
        ConfigError: the port is busy, the address is not local, or binding is not permitted
            (raised from ``nursery.start``, before anything is served).

    Cancellation: closes the listener and every connection; nothing is left open.
    """
    await _probe_bind(host, port)
    config = _config(host, port)
    trigger = shutdown_trigger if shutdown_trigger is not None else trio.sleep_forever
    bound = False
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(functools.partial(serve, app, config, shutdown_trigger=trigger))
            bound = True
            task_status.started(int(binds[0].rsplit(":", 1)[1]))
    except (OSError, BaseExceptionGroup) as failure:
        # Only a failure to bind is the operator's; anything after binding propagates as is.
        error = None if bound else _bind_error(failure, host, port)
        if error is None:
            raise
        raise error from None
