"""``cotal auth-service``: serve one space (``--space``) or a manifest of spaces (``--spaces``).

It starts no broker and pushes no account: the broker at ``--server`` must already trust the
spaces (the operator pushes them; ``cotal up`` does for its root's space). ``--callout-only``
runs replica lanes: the callout alone, no HTTP face and no ``auth-service.json``. The replica
refuses the HTTP flags (the public-face flags and ``--service-endpoints``, once they exist);
``--auth-timeout`` applies to both modes.
"""

from __future__ import annotations

import functools
import signal
import sys
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import trio
from cyclopts import Parameter

from ..core.admission import DEADLINE_MARGIN_S, CalloutLimits
from ..core.errors import ConfigError
from ..lanes.hosting import ServiceConfig, ServiceInfo, run_service
from ..state.records import MAX_AUTH_TIMEOUT_S
from .common import Where

__all__ = ["auth_service"]

_SCHEMES = ("nats", "tls")


async def auth_service(
    *,
    space: Annotated[str | None, Parameter(help="Serve this one space (exclusive with --spaces).")] = None,
    spaces: Annotated[Path | None, Parameter(help="Serve the spaces this manifest lists, following its changes live (exclusive with --space).")] = None,
    server: Annotated[str, Parameter(help="The broker, nats://host:port; it must already trust the spaces' accounts.")],
    root: Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal).")] = None,
    callout_only: Annotated[bool, Parameter(help="Replica: the callout only (no HTTP face, no auth-service.json).")] = False,
    auth_timeout: Annotated[float | None, Parameter(help="The broker's authorization timeout in seconds (default 2); the callout deadline budget.")] = None,
) -> int:
    """Run the auth service for one space or a manifest of spaces until Ctrl-C.

    With --spaces, a space that fails is retried every 5 s while the others keep serving;
    with --space, a failure ends the process with exit 1.
    """
    if (space is None) == (spaces is None):
        raise ConfigError("pass exactly one of --space (one space) and --spaces (a manifest of spaces)")
    if space is not None:
        Where(root=root, space=space).space_paths()  # validates the name
    config = ServiceConfig(
        root=Where(root=root).paths(), server_url=_check_server(server), space=space, manifest=spaces,
        callout_only=callout_only, limits=_limits(auth_timeout),
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, nursery.cancel_scope)  # Ctrl-C works during start-up too
        _banner(await nursery.start(functools.partial(run_service, config)), config)
    return 0


def _check_server(server: str) -> str:
    parts = urlsplit(server)
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise ConfigError(f"--server {server} is not a broker address - pass nats://host:port")
    return server


def _limits(auth_timeout: float | None) -> CalloutLimits:
    if auth_timeout is None:
        return CalloutLimits()
    if not DEADLINE_MARGIN_S < auth_timeout <= MAX_AUTH_TIMEOUT_S:
        raise ConfigError(
            f"--auth-timeout {auth_timeout} is out of range - pass seconds above {DEADLINE_MARGIN_S} "
            f"and at most {MAX_AUTH_TIMEOUT_S:g}, the broker's authorization timeout (its default is 2)"
        )
    return CalloutLimits(auth_timeout_s=auth_timeout)


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            print(f"cotal auth-service: {signal.Signals(signum).name} - stopping", file=sys.stderr, flush=True)
            scope.cancel()
            return


def _banner(info: ServiceInfo, config: ServiceConfig) -> None:
    mode = " (callout only)" if config.callout_only else ""
    if info.manifest is not None:
        print(
            f"✓ auth-service up{mode} - {len(info.spaces)} spaces from {info.manifest}, "
            f".applied at {info.applied}",
            flush=True,
        )
        return
    face = f", exchange at {info.lane.url}" if info.lane is not None and info.lane.url else ""
    print(f"✓ auth-service up{mode} - space {info.spaces[0]} on {config.server_url}{face}", flush=True)
