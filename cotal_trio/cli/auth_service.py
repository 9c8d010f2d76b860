"""``cotal auth-service``: serve one space (``--space``) or a manifest of spaces (``--spaces``).

A deprecated entry (spec "Callout replicas", issue 19 item 7), kept for existing units and
scripts: when it starts serving it says so once on stderr (:data:`DEPRECATED`) and names the
service presets that replace it, ``cotal service install auth-service|callout-replica``. Their
units run ``cotal service run auth-service|callout-replica`` (cli/service.py), which is
:func:`serve` without the note; ``cotal up`` runs its lane through the service layer and never
reaches this module.

It starts no broker and pushes no account: the broker at ``--server`` must already trust the
spaces (the operator pushes them; ``cotal up`` does for its root's space). ``--callout-only``
runs replica lanes: the callout alone, no HTTP face and no ``auth-service.json``. The replica
refuses the public-face flags and ``--service-endpoints``; ``--auth-timeout`` applies to both
modes.

``--exchange-public-port N`` (with ``--space``; a manifest sets ``exchangePublicPort`` and
friends per entry) adds the space's public exchange face on 127.0.0.1:N, behind the operator's
TLS-terminating reverse proxy; ``--exchange-public-url``, ``--exchange-trusted-proxy`` and
``--advertised-server`` need it. The flags become the space's manifest-entry fields
(:class:`~cotal_trio.service.hosting.ServiceConfig`), checked by the manifest's own rules.

``--ops-port N`` serves the process's operator face on 127.0.0.1:N (0, the default, a free port):
every space's metrics, the status page and ``/events`` (:mod:`cotal_trio.service.ops_face`).

``--service-endpoints`` (with ``--space``; a manifest sets ``serviceEndpoints`` per entry) hosts
the space's service endpoints: its public face serves ``POST /service-endpoint-authority`` and
``POST /service-endpoint-host`` and its callout admits ``service-host`` connections
(docs/http-api.md "Service endpoints"). It also opens the space's service-endpoint admission for
good, and a callout-only replica then refuses the space (spec "Callout replicas";
:mod:`cotal_trio.lane.service_endpoints`).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import trio
from cyclopts import Parameter

from ..core.admission import CalloutLimits
from ..broker.spaces import MODE_STATIC, space_mode
from ..core.errors import ConfigError, Unavailable, leaves
from ..core.manifest import LaneStatus, ManifestRefused, parse_manifest
from ..core.servers import join_servers, parse_servers
from cotal_trio.service.host import LaneState
from cotal_trio.service.hosting import ServiceConfig, ServiceInfo, public_fields, run_service
from cotal_trio.service.runtime import tune_for_serving
from ..state.space_folders import migrate_space_folders, rename_note
from ..state import RootPaths
from ._servers import refused_connect, resolve_servers
from .common import PortRange, PublicFaceFlags, Where, check_auth_timeout, serve_until_signal

__all__ = [
    "DEPRECATED", "AuthTimeoutFlag", "CalloutServerFlag", "RootFlag", "Served", "ServerFlag", "ServiceEndpointsFlag", "auth_service",
    "serve",
]

@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class Served:
    """What the service serves: exactly one of ``--space`` and ``--spaces``."""

    space: Annotated[str | None, Parameter(help="Serve this one space (exclusive with --spaces).")] = None
    spaces: Annotated[Path | None, Parameter(help="Serve the spaces this manifest lists, following its changes live (exclusive with --space).")] = None


# The flags `cotal auth-service` shares with `cotal service run` (cli/service.py).
ServerFlag = Annotated[str | None, Parameter(help="The broker's seed URLs, comma-separated: nats://host:port, or every node of a cluster (the first that answers is used; default: the nodes `cotal broker config` rendered, else the root's `cotal up` broker); it must already trust the spaces' accounts.")]
RootFlag = Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal).")]
AuthTimeoutFlag = Annotated[float | None, Parameter(help="The broker's authorization timeout in seconds (default 2); the callout deadline budget.")]
CalloutServerFlag = Annotated[str | None, Parameter(help="With --callout-only: answer the connects of this server, a leaf node's URL(s) (its stores stay on --server, the hub); docs/deploy.md \"Leaf nodes\".")]
OpsPortFlag = Annotated[int, Parameter(validator=PortRange(free=True), help="The process's operator face on 127.0.0.1: /metrics of every space (with lane states and build info), the status page of every space and /events; its capability is in `<root>/ops/<port>.json`. Pass a port for a fixed scrape target; 0 picks a free one at each start.")]
ServiceEndpointsFlag = Annotated[bool, Parameter(help="With --space: host service endpoints (the public face serves POST /service-endpoint-authority and /service-endpoint-host, the callout admits service-host connections; docs/http-api.md) and open the space's service-endpoint admission; nothing closes it, and callout-only replicas then refuse the space.")]

# Spec "Callout replicas": the entry stays for existing units and scripts; new setups use the
# service presets, whose units run `cotal service run <preset>` (cli/service.py).
DEPRECATED = (
    "cotal: `cotal auth-service` is a deprecated entry, kept for existing units and scripts - new setups use"
    " the service presets `cotal service install auth-service` (the full service) and `cotal service install"
    " callout-replica` (a replica), whose units run `cotal service run auth-service|callout-replica`"
    " with the same flags"
)


async def auth_service(
    *,
    served: Served = Served(),
    server: ServerFlag = None,
    root: RootFlag = None,
    callout_only: Annotated[bool, Parameter(help="Replica: the callout only (no HTTP face, no auth-service.json).")] = False,
    callout_server: CalloutServerFlag = None,
    auth_timeout: AuthTimeoutFlag = None,
    service_endpoints: ServiceEndpointsFlag = False,
    ops_port: OpsPortFlag = 0,
    public: PublicFaceFlags = PublicFaceFlags(),
) -> int:
    """Run the auth service for one space or a manifest of spaces until Ctrl-C (deprecated entry).

    A deprecated entry kept for existing units and scripts: it says so once on stderr when it
    starts serving. New setups use the service presets, `cotal service install auth-service` and
    `cotal service install callout-replica`, whose units run `cotal service run
    auth-service|callout-replica` with the same flags (without --callout-only).

    With --spaces, a space that fails is retried every 5 s while the others keep serving;
    with --space, a failure ends the process with exit 1. --service-endpoints and the
    public-face flags are refused with --callout-only and with --spaces (set the manifest
    entry's fields instead).
    """
    return await serve(
        served=served, server=server, root=root, callout_only=callout_only, callout_server=callout_server,
        auth_timeout=auth_timeout, service_endpoints=service_endpoints, public=public, command="cotal auth-service",
        note=DEPRECATED, ops_port=ops_port,
    )


async def serve(
    *, served: Served, server: str | None, root: str | None, callout_only: bool, auth_timeout: float | None,
    service_endpoints: bool, public: PublicFaceFlags, command: str, callout_server: str | None = None,
    note: str | None = None, ops_port: int = 0,
) -> int:
    """Trio: check the serving flags, then run the lanes until SIGINT or SIGTERM; returns 0.

    What `cotal auth-service` and `cotal service run` both run. ``command`` names the process in
    the stop messages; ``note`` (one line, or None) goes to stderr once, when the flags are
    accepted and serving starts: never for a refused start (its error is the one line), never
    again for a lane the host restarts or a manifest it rereads (both happen inside the host).

    Raises:
        ConfigError: a refused flag, a missing manifest, a space the root does not hold or a
            static one (one sentence each).
    """
    space, spaces = served.space, served.spaces
    if (space is None) == (spaces is None):
        raise ConfigError("pass exactly one of --space (one space) and --spaces (a manifest of spaces)")
    if space is not None:
        Where(root=root, space=space).space_paths()  # validates the name
    config = ServiceConfig(
        root=Where(root=root).paths(), server_url=_check_server(Where(root=root).paths(), server), space=space, manifest=spaces,
        callout_only=callout_only, callout_server=None if callout_server is None else join_servers(parse_servers(callout_server, flag="--callout-server")),
        service_endpoints=service_endpoints, limits=_limits(auth_timeout), ops_port=ops_port,
        **public_fields(public),
    )
    # The flags first; then a root of an earlier version is renamed (state/space_folders.py), and
    # the space found: a mistyped --space or --root is named as every command names it.
    renamed = await trio.to_thread.run_sync(migrate_space_folders, config.root)
    if renamed:
        print(rename_note(config.root, renamed), flush=True)
    if space is not None:
        _refuse_static(Where(root=root, space=space))
    else:
        assert spaces is not None
        check_manifest_exists(spaces)
    if note is not None:
        print(note, file=sys.stderr, flush=True)
    async with serve_until_signal(command) as nursery:  # Ctrl-C works during start-up too
        tune_for_serving()  # gc.freeze and the GIL switch interval: service/runtime.py
        # A callout user missing from auth_users is named by the lane itself (lane/refusals.py).
        try:
            info = await nursery.start(functools.partial(run_service, config))
        except* Unavailable as group:
            if any(refused_connect(leaf) for leaf in leaves(group)):
                raise ConfigError(_no_broker(config)) from group
            raise
        _banner(info, config, await info.host.first_outcomes() if info.host is not None else {})
    return 0


def check_manifest_exists(manifest: Path) -> None:
    """Refuse a ``--spaces`` manifest that does not exist: a host on it would serve nothing and
    still report up (issue 18 item 6). A manifest removed later is the host's (it keeps watching).

    Raises:
        ConfigError: no file at ``manifest`` (a dangling symlink included).
    """
    if not os.path.exists(manifest):
        raise ConfigError(
            f"--spaces {manifest}: {os.path.abspath(manifest)} does not exist - write the manifest there"
            ' (an empty one is {"version": 2, "spaces": []}), or pass the path of an existing one'
        )


def _refuse_static(where: Where) -> None:
    """ConfigError for a ``--space`` the root does not hold, or one that is static: its clients
    connect with minted credentials, and there is no callout to serve (issue 18 item 6)."""
    if space_mode(where.provisioned()) == MODE_STATIC:
        raise ConfigError(
            f"space {where.space} is a static space: it has no auth callout - its clients connect with "
            "minted credentials (cotal auth mint)"
        )


def _zero_spaces_reason(manifest: Path, callout_only: bool) -> str:
    """Why a host serves no space at start: its manifest lists none, or is refused (blocking read)."""
    try:
        parse_manifest(Path(manifest).read_bytes(), callout_only=callout_only)
    except (OSError, ManifestRefused):
        return "the manifest is refused (see above) - fix it and it is applied live"
    return "the manifest lists none"


def _check_server(paths: RootPaths, server: str | None) -> str:
    """``--server`` checked and normalised (blanks dropped), else the root's recorded nodes or
    its ``cotal up`` broker (:func:`resolve_servers`): the comma-separated seed list every
    connection of the service's lanes opens with (issue 17 item 3)."""
    return join_servers(resolve_servers(paths, server))


def _no_broker(config: ServiceConfig) -> str:
    """The sentence for a broker that refused the lane's connect, with the fix."""
    return (
        f"the broker at {config.server_url} did not answer (connection refused) - start it "
        f"(`cotal up --root {config.root.root}`, or the broker's unit), or pass the right --server"
    )


def hosted_summary(states: Mapping[str, LaneStatus]) -> str:
    """``serving 1 space, retrying 1: c (see .applied for why)`` for lane ``states`` by space.

    Only a ``serving`` lane counts as serving: a start banner claims no more (DESIGN.md 9).
    """
    serving = sum(status.state == LaneState.SERVING for status in states.values())
    text = f"serving {serving} space{'' if serving == 1 else 's'}"
    retrying = [space for space, status in states.items() if status.state == LaneState.RETRYING]
    if retrying:
        text += f", retrying {len(retrying)}: {', '.join(retrying)} (see .applied for why)"
    return text


def _limits(auth_timeout: float | None) -> CalloutLimits:
    if check_auth_timeout(auth_timeout) is None:
        return CalloutLimits()
    return CalloutLimits(auth_timeout_s=auth_timeout)


def _banner(info: ServiceInfo, config: ServiceConfig, states: Mapping[str, LaneStatus]) -> None:
    """Print the start line; a host's says how many of its ``states`` (its lanes' first outcomes,
    :meth:`~cotal_trio.service.host.Host.first_outcomes`) serve and names those retrying."""
    mode = " (callout only)" if config.callout_only else ""
    if info.manifest is not None:
        where = f"from {info.manifest}, .applied at {info.applied}"
        if not states:
            where = f"serving 0 spaces - {_zero_spaces_reason(info.manifest, config.callout_only)} ({where})"
        else:
            where = f"{hosted_summary(states)} - {where}"
        print(f"✓ auth-service up{mode} - {where}", _ops_line(info, config), sep="\n", flush=True)
        return
    face = f", exchange at {info.lane.url}" if info.lane is not None and info.lane.url else ""
    if config.exchange_public_port is not None:
        face += f", public face on 127.0.0.1:{config.exchange_public_port}"
        face += f" ({config.exchange_public_url})" if config.exchange_public_url else ""
    callout = f" (callout on {config.callout_server})" if config.callout_server else ""
    print(f"✓ auth-service up{mode} - space {info.spaces[0]} on {config.server_url}{callout}{face}", _ops_line(info, config),
          sep="\n", flush=True)


def _ops_line(info: ServiceInfo, config: ServiceConfig) -> str:
    """Where the process's operator face is, and where its capability is (issue 18 item 8)."""
    port = info.ops_url.rsplit(":", 1)[-1]
    return f"  operator face: {info.ops_url} (/metrics, status page, /events; capability in {config.root.ops_dir / f'{port}.json'})"
