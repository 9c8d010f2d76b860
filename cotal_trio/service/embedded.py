"""The embedded default: a root, a bundled nats-server and a lane host (``cotal up``).

DESIGN.md section 1: ``cotal up`` provisions a root, starts a bundled nats-server, creates a
space and runs its auth service, so the whole thing works on one machine with one command.
It hosts every user-auth space listed in the root's own manifest, ``<root>/spaces.json``
(version 2, DESIGN.md section 9), through the lane host of :mod:`cotal_trio.service.host`, so
``cotal space add`` and ``cotal space remove`` take effect live (issue 3 item 1). Its own
``--space`` is added to that manifest at start.

``--service-endpoints`` sets ``serviceEndpoints`` on that entry the same way (recorded: a later
``cotal up`` without it keeps it; the space's admission stays open whatever the entry says).

The public face (``--exchange-public-port`` and friends) lives in that same manifest: the flags
are written into the own space's entry (``exchangePublicPort``, ``exchangePublicUrl``,
``exchangeTrustedProxy``, ``advertisedServer``) before the host starts, and the host's lane
factory gives the lane the face its entry names, as for any other hosted space. So the entry is
the one source of truth: ``.applied``, the manifest's own rules (one port per space across the
root) and a live edit of ``spaces.json`` all see the face ``cotal up`` serves, and there is no
second, flag-only path into the lane that could disagree with the file. Like ``--port``, the
face is recorded: a later ``cotal up`` without the flags keeps the entry's face; with any of
them, the four flags replace it as a whole (remove the fields from ``spaces.json`` to drop it).
A face that never served is not recorded: whatever stops ``cotal up`` before its space serves
(a refused pin, the broker, the IdP, the lane's port taken, Ctrl-C), the entry is put back.

``--recreate-issued-stores <backup-dir>`` (``UpConfig.recreate_issued_stores``): once the broker
runs and before any lane starts, the space's two issued-authority streams are backed up into the
folder, deleted and created again in the current shape (:func:`cotal_trio.stores.issued.recreate_issued_stores`;
docs/issued-authority.md), over a data-account service user minted for that step alone.

Order (DESIGN.md section 4, "Adding a space to a running broker"): lock the root (one
``cotal up`` per root), prepare it (keys are created once and never regenerated; the space is
listed in ``spaces.json``), render the config, start the broker and record the policy it runs
with, push the space's data account then its auth account and read both back (and push the
other hosted spaces' accounts, each failing alone), start the IdP (the development IdP's JWKS
face unless a real one is pinned; a new pin is recorded only once its JWKS was read), then
start the process's operator face (``--ops-port``, recorded in ``policy.json`` once bound; issue
18 item 8: :mod:`cotal_trio.service.ops_face`), then start the lane host and wait for the space's
lane to serve. Every child belongs to one nursery;
on cancellation the lanes and the IdP face stop first and the broker last, so no lane sees its
broker vanish while it drains.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import trio

from cotal_trio.broker import provision
from cotal_trio.broker.accounts import open_system_connection, push_accounts
from cotal_trio.broker.config import write_config
from cotal_trio.broker.process import run_nats_server
from cotal_trio.broker.spaces import MODE_STATIC, hosted_entries, space_mode
from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.errors import ConfigError, Unavailable, leaves
from cotal_trio.core.manifest import SpaceEntry, render_manifest
from cotal_trio.devidp import DevicePolicy, DevIdpMaterial, build_dev_idp_app
from cotal_trio.http.serve import serve_app
from cotal_trio.natsio import open_loop
from cotal_trio.state import (
    BrokerMaterial,
    BrokerPolicy,
    IdpPinRecord,
    RootPaths,
    atomic_write,
    hold_root,
    load_idp_pin,
    load_policy,
    load_space,
    read_json,
    remove_quietly,
    save_idp_pin,
    save_policy,
)
from cotal_trio.state.space_folders import rename_note, rename_space_folders
from cotal_trio.lane.events import EventBus
from cotal_trio.lane.ops import OpsBoard
from cotal_trio.service.host import Host, HostConfig, run_host
from cotal_trio.service.hosting import FullLanes, check_public_flags, given_public_flags, lane_factory, public_fields
from cotal_trio.service.idp_keys import fetch_jwks
from cotal_trio.service.ops_face import check_ops_port, run_ops_face
from cotal_trio.stores.issued import check_backup_dir, recreate_issued_stores
from cotal_trio.service.pins import dev_pin, ensure_dev_idp, oidc_pin
from cotal_trio.lane.plane import DEFAULT_LEASE, ClaimRefused
from cotal_trio.lane.service_users import open_service_user, recreate_permissions
from cotal_trio.lane.spec import LaneCommon, PublicFace

__all__ = ["DEFAULT_PORT", "UpConfig", "UpInfo", "prepare_root", "run_up"]

DEFAULT_PORT = 4222
BROKER_START_CEILING_S = 15
PUSH_EACH_S = 5.0  # one other hosted space's account push at start

log = logging.getLogger("cotal.up")


@dataclass(frozen=True, slots=True, kw_only=True)
class UpConfig:
    """``cotal up``'s flags as a value.

    Attributes:
        paths: the root.
        space: the space to create and serve.
        port: broker port on 127.0.0.1; None keeps the recorded one (default 4222).
        auth_timeout_s: the broker's ``authorization { timeout }`` and the callout deadline
            budget; None keeps the recorded value (none: the broker's 2 s default).
        nats_server: the nats-server executable; None finds it on PATH.
        idp_url: pin a real IdP at this base URL; None uses the pinned one or the dev IdP.
        http_port: the loopback exchange port; 0 picks a free one.
        ops_port: the process's operator face (``--ops-port``, issue 18 item 8): this port, 0
            for a free one; None keeps the one recorded in ``policy.json`` (none recorded: a
            free one). The port it binds is recorded, so the face stays on it across restarts.
        nats_server_version: the bundled broker's version, for ``cotal_build_info``; None:
            the one the lanes' broker announces.
        exchange_public_port, exchange_public_url, exchange_trusted_proxy, advertised_server:
            the space's public face (``--exchange-public-port`` and friends); any of them set
            replaces the public-face fields of the space's entry in ``spaces.json``, none keeps
            them (module docstring).
        recreate_issued_stores: back the space's issued stores up into this folder (missing or
            empty), delete and recreate them before the lanes start; None: leave them.
        service_endpoints: ``--service-endpoints`` (True) sets ``serviceEndpoints`` on the space's
            entry in ``spaces.json`` (its lane then hosts service endpoints, docs/http-api.md
            "Service endpoints"); ``--no-service-endpoints`` (False) clears it, closing the doors
            (the admission stays open); None keeps the entry's setting (recorded like the public
            face).
        events: the event bus the host and its lanes publish on and the faces' ``/events``
            stream (issue 7 item 1); None: a fresh :class:`~cotal_trio.lane.events.EventBus`.
        dev_idp_device: the development IdP's device-code interval and lifetime (``cotal
            login``; a test shortens the interval); None: its defaults, 5 s and 30 minutes.
            No flag sets it (an embedding program or a test passes its own).

    Raises:
        ConfigError: a public-face setting the manifest would refuse, named by its flag.
    """

    paths: RootPaths
    space: str
    port: int | None = None
    auth_timeout_s: float | None = None
    nats_server: str | None = None
    idp_url: str | None = None
    http_port: int = 0
    ops_port: int | None = None
    nats_server_version: str | None = None
    exchange_public_port: int | None = None
    exchange_public_url: str | None = None
    exchange_trusted_proxy: bool = False
    advertised_server: str | None = None
    recreate_issued_stores: Path | None = None
    service_endpoints: bool | None = None
    events: EventBus | None = None
    dev_idp_device: DevicePolicy | None = None

    def __post_init__(self) -> None:
        check_ops_port(self.ops_port)
        check_public_flags(public_fields(self))


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """The root after :func:`prepare_root`: what the async part needs."""

    broker: BrokerMaterial
    policy: BrokerPolicy
    policy_changed: bool
    account_jwts: tuple[str, str]
    hosted_jwts: dict[str, tuple[str, str]]
    pin: IdpPinRecord
    pin_is_new: bool
    dev_idp: DevIdpMaterial | None
    entry: SpaceEntry
    entry_before: SpaceEntry | None  # put back if the lane fails to start; None: flags changed nothing


@dataclass(frozen=True, slots=True, kw_only=True)
class UpInfo:
    """A running embedded stack: what ``cotal up`` prints.

    ``host`` is the running lane host, to ask which lanes serve and which retry (``None`` only
    for an info built without one).
    """

    root: Path
    space: str
    server_url: str
    broker_pid: int
    exchange_url: str
    pin: IdpPinRecord
    dev_idp_url: str | None
    manifest: Path
    spaces: tuple[str, ...]
    ops_url: str = ""
    public: PublicFace | None = None
    recreated_issued: dict[str, int] | None = None  # stream -> messages backed up, when recreated
    host: Host | None = None


def _policy(paths: RootPaths, config: UpConfig) -> tuple[BrokerPolicy, bool]:
    """The policy to run with, and whether it differs from the recorded one (saved once the
    broker listens on it, so a busy port is never recorded)."""
    recorded = load_policy(paths.policy_json) if paths.policy_json.exists() else None
    port = config.port if config.port is not None else (recorded.port if recorded else DEFAULT_PORT)
    timeout = config.auth_timeout_s if config.auth_timeout_s is not None else (recorded.auth_timeout_s if recorded else None)
    ops = config.ops_port if config.ops_port is not None else (recorded.ops_port if recorded else None)
    policy = BrokerPolicy(port=port, auth_timeout_s=timeout, ops_port=ops)
    return policy, policy != recorded


def _pin(paths: RootPaths, config: UpConfig) -> tuple[IdpPinRecord, DevIdpMaterial | None, bool]:
    """The IdP pin, the dev IdP (when it is the pin), and whether the pin is new (a new pin is
    saved only once its JWKS has been read: a typo must not pin a space for good)."""
    pin_path = paths.space(config.space).idp_json
    pinned = load_idp_pin(pin_path) if pin_path.exists() else None
    if config.idp_url is not None:
        wanted = oidc_pin(config.idp_url)
        if pinned is not None and (pinned.issuer, pinned.jwks_uri) != (wanted.issuer, wanted.jwks_uri):
            raise ConfigError(
                f"space {config.space} is pinned to IdP {pinned.issuer}; changing the pin re-keys "
                "every owner - keep the pinned IdP, or use a new space (--space)"
            )
        return wanted, None, pinned is None
    if pinned is not None and pinned.kind == "oidc":
        return pinned, None, False
    dev = ensure_dev_idp(paths)
    pin = dev_pin(dev)
    if pinned is not None and pinned.issuer != dev.issuer:
        raise ConfigError(
            f"{pin_path} pins another development IdP than {paths.devidp_json} - restore that file "
            f"from a backup; to start over instead, remove {pin_path} and grant the actors again "
            "(a new development IdP gives every user a new owner)"
        )
    return pin, dev, pinned is None


def _restore_sentinel(path: Path, creds: str) -> None:
    """Rewrite the public sentinel creds file if it is missing or differs from callout.json.

    It is derived material that clients read; a damaged copy would make every connect fail
    while the service looks healthy.
    """
    try:
        intact = path.read_text() == creds
    except (OSError, UnicodeDecodeError):
        intact = False
    if not intact:
        log.warning("up: %s did not match the space's callout.json - rewrote it", path)
        atomic_write(path, creds.encode())


def _warn_loose_modes(paths: RootPaths, space: str) -> None:
    """Warn about secrets (and their folders) that group or others can reach."""
    sp = paths.space(space)
    secrets_ = [paths.broker_json, paths.devidp_json, sp.callout_json, sp.issuer_json, sp.owner_secret_json]
    for path in (paths.root, sp.dir, *secrets_):
        try:
            mode = path.stat().st_mode & 0o777
        except OSError:
            continue
        if mode & 0o077:
            fix = "chmod 700" if path.is_dir() else "chmod 600"
            log.warning("up: %s is open to group or others (mode %04o) - %s %s", path, mode, fix, path)


def prepare_root(config: UpConfig, *, now: float) -> Prepared:
    """Create or reuse the root and render the broker config (sync, file I/O).

    The policy and a new IdP pin are not recorded here: :func:`run_up` records them once the
    broker listens and the IdP's JWKS has been read, so bad input never changes the root.

    Raises:
        ConfigError: a corrupt root file, a bad space name, or a change of IdP pin.
    """
    iat = int(now)
    broker = provision.ensure_root(config.paths, iat=iat)
    material = provision.ensure_space(config.paths, broker, config.space, iat=iat)
    entry, entry_before = _host_space(config)
    try:
        _restore_sentinel(config.paths.space(config.space).sentinel_creds, material.sentinel_creds)
        _warn_loose_modes(config.paths, config.space)
        record = provision.load_space_accounts(config.paths, broker, config.space)
        policy, policy_changed = _policy(config.paths, config)
        _check_own_ports(entry, broker_port=policy.port, http_port=config.http_port)
        pin, dev, pin_is_new = _pin(config.paths, config)
        write_config(config.paths, broker, port=policy.port, auth_timeout_s=policy.auth_timeout_s)
    except BaseException:
        if entry_before is not None:  # refused before it served: the face is not recorded
            _restore_entry(config.paths, entry, entry_before)
        raise
    return Prepared(
        broker=broker, policy=policy, policy_changed=policy_changed,
        account_jwts=(record.data_jwt, record.auth_jwt), hosted_jwts=_hosted_jwts(config, broker),
        pin=pin, pin_is_new=pin_is_new, dev_idp=dev, entry=entry, entry_before=entry_before,
    )


def _host_space(config: UpConfig) -> tuple[SpaceEntry, SpaceEntry | None]:
    """List the space in ``<root>/spaces.json`` (the manifest ``cotal up`` hosts), its entry
    carrying the public-face flags when any is given (module docstring) and ``serviceEndpoints``
    with ``--service-endpoints`` (cleared with ``--no-service-endpoints``); an existing entry is otherwise kept as it is.

    Returns:
        The space's entry now, and the entry to put back (:func:`_restore_entry`) if the lane
        does not start: the one before the flags changed it, or ``None`` when they changed
        nothing.

    Raises:
        ConfigError: the space is a static-auth space, ``spaces.json`` is refused, or another
            space's entry has the flag's public port.
    """
    paths, space = config.paths, config.space
    if space_mode(paths.space(space)) == MODE_STATIC:
        raise ConfigError(
            f"space {space} is a static-auth space, which has no auth service to run - "
            f"serve a user-auth space (--space), or make it one with `cotal space add {space}`"
        )
    entries = hosted_entries(paths)
    old = next((e for e in entries if e.space == space), None)
    plain = old or SpaceEntry(space=space)
    fields = public_fields(config)
    new = dataclasses.replace(plain, **fields) if given_public_flags(fields) else plain
    if config.service_endpoints is not None:  # recorded like the face; the admission stays open
        new = dataclasses.replace(new, service_endpoints=config.service_endpoints)
    _refuse_shared_port(paths, entries, new)
    if new != old:
        _write_entry(paths, entries, new)
    return new, (plain if new != plain else None)


def _write_entry(paths: RootPaths, entries: list[SpaceEntry], entry: SpaceEntry) -> None:
    """Rewrite ``spaces.json`` with ``entry`` in place of its space's (as ``cotal space add``)."""
    atomic_write(paths.spaces_manifest, render_manifest([*(e for e in entries if e.space != entry.space), entry]))


def _refuse_shared_port(paths: RootPaths, entries: list[SpaceEntry], new: SpaceEntry) -> None:
    port = new.exchange_public_port
    other = next((e.space for e in entries if e.space != new.space and e.exchange_public_port == port), None)
    if port is not None and other is not None:
        raise ConfigError(
            f"--exchange-public-port {port} is space {other}'s public port in {paths.spaces_manifest}"
            " - pass another port"
        )


def _check_own_ports(entry: SpaceEntry, *, broker_port: int, http_port: int) -> None:
    """Refuse a public port ``cotal up`` itself listens on (the broker's, the loopback face's).

    Raises:
        ConfigError: one sentence naming the flag it collides with.
    """
    port = entry.exchange_public_port
    if port is not None and port == broker_port:
        raise ConfigError(f"--exchange-public-port {port} is the broker's port (--port) - pass another port")
    if port is not None and port == http_port:
        raise ConfigError(f"--exchange-public-port {port} is the loopback exchange's port (--http-port) - pass another port")


def _restore_entry(paths: RootPaths, written: SpaceEntry, before: SpaceEntry) -> None:
    """Put ``before`` back as the space's entry, if the entry is still the ``written`` one (a
    face that never served is not recorded, as a busy ``--port`` is not)."""
    try:
        entries = hosted_entries(paths)
    except ConfigError:
        return
    if written in entries:
        _write_entry(paths, entries, before)


def _hosted_jwts(config: UpConfig, broker: BrokerMaterial) -> dict[str, tuple[str, str]]:
    """The account JWTs of the other spaces in ``spaces.json``, pushed at start in case the
    broker's resolver lost them; a space whose files are unreadable is left to its lane
    (which fails alone and is retried)."""
    jwts: dict[str, tuple[str, str]] = {}
    for entry in hosted_entries(config.paths):
        if entry.space == config.space:
            continue
        try:
            record = provision.load_space_accounts(config.paths, broker, entry.space)
        except ConfigError as exc:
            log.warning("up: space %s is not pushed: %s", entry.space, exc)
            continue
        jwts[entry.space] = (record.data_jwt, record.auth_jwt)
    return jwts


async def _run_broker(
    config: UpConfig, prepared: Prepared, stop: trio.Event,
    *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the broker until ``stop`` is set, shielded from the host's cancellation once started.

    The broker must outlive the lane: stopping it first would make the lane's connection see
    EOF and reconnect while it drains. So the host sets ``stop`` once the lane has stopped.
    Cancelled before ``started`` (Ctrl-C during start-up), the broker is stopped at once.
    """
    paths, port = config.paths, prepared.policy.port
    start = functools.partial(
        run_nats_server, paths.server_conf, executable=config.nats_server, log_path=paths.broker_log, port=port
    )
    url = f"nats://127.0.0.1:{port}"
    # Cancellable while it starts (a Ctrl-C then stops the broker at once, issue 15 item 9);
    # shielded from the moment it is started, so only `stop` ends it.
    with trio.CancelScope() as guard:
        try:
            async with trio.open_nursery() as nursery:
                try:
                    with trio.fail_after(BROKER_START_CEILING_S):
                        pid = await nursery.start(start)
                        async with open_loop(), open_system_connection(url, prepared.broker) as system:
                            await push_accounts(system, prepared.account_jwts)
                except trio.TooSlowError:
                    raise Unavailable(
                        f"nats-server did not come up within {BROKER_START_CEILING_S} s - see {paths.broker_log}"
                    ) from None
                if prepared.hosted_jwts:
                    await _push_hosted(url, prepared)
                if prepared.policy_changed:
                    save_policy(paths.policy_json, prepared.policy)
                atomic_write(paths.broker_pid, f"{pid}\n".encode())
                task_status.started((url, pid))
                guard.shield = True
                await stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            remove_quietly(paths.broker_pid)  # only once the broker has exited


async def _push_hosted(url: str, prepared: Prepared) -> None:
    """Push the other hosted spaces' accounts, each bounded by ``PUSH_EACH_S``; a refusal or a
    slow answer is that space's alone (logged; its lane then fails and is retried)."""
    try:
        async with open_loop(), open_system_connection(url, prepared.broker) as system:
            for space, jwts in prepared.hosted_jwts.items():
                with trio.move_on_after(PUSH_EACH_S) as scope:
                    try:
                        await push_accounts(system, jwts)
                    except (ConfigError, Unavailable) as exc:
                        log.warning("up: space %s: its accounts were not pushed: %s", space, exc)
                if scope.cancelled_caught:
                    log.warning("up: space %s: its accounts were not pushed within %g s", space, PUSH_EACH_S)
    except Unavailable as exc:
        log.warning("up: the other spaces' accounts were not pushed: %s", exc)


async def _start_idp(nursery: trio.Nursery, config: UpConfig, prepared: Prepared) -> str | None:
    """Serve the development IdP's JWKS (its URL), or check a real IdP's JWKS (None).

    A new pin is recorded only here, after its JWKS was read. Each lane reads (and refreshes)
    its own space's pinned key set (:func:`cotal_trio.service.hosting.lane_factory`).
    """
    if prepared.dev_idp is None:
        if prepared.pin_is_new:
            await fetch_jwks(prepared.pin.jwks_uri)
        url = None
    else:
        app = build_dev_idp_app(prepared.dev_idp, device=config.dev_idp_device)
        port = await nursery.start(functools.partial(serve_app, app))
        url = f"http://127.0.0.1:{port}"
    if prepared.pin_is_new:
        save_idp_pin(config.paths.space(config.space).idp_json, prepared.pin, exclusive=True)
    return url


async def _recreate_issued(config: UpConfig, server_url: str) -> dict[str, int]:
    """Back up, delete and recreate the space's issued stores (``--recreate-issued-stores``).

    Raises:
        ConfigError: the folder is not empty, or the space's material is unreadable.
        Unavailable: the broker refused the step's user or did not answer.
    """
    assert config.recreate_issued_stores is not None
    space, folder = config.space, config.recreate_issued_stores
    material = await trio.to_thread.run_sync(load_space, config.paths.space(space).callout_json, space)
    try:  # the step's user holds only what it does to the two stores (issue 15 item 4)
        async with open_loop(), open_service_user(
            material, server_url, name=f"cotal:recreate-issued:{space}",
            permissions=functools.partial(recreate_permissions, space), iat=int(time.time()), exp=None, reconnect=False,
        ) as conn:
            counts = await recreate_issued_stores(conn, space, folder)
    except* (ConfigError, Unavailable) as group:  # the loop's nursery wraps it: one sentence out
        raise leaves(group)[0]
    log.warning("up: space %s: issued stores recreated; the old ones are backed up in %s (%s)", space, folder, counts)
    return counts


async def _serve(
    config: UpConfig, prepared: Prepared, server_url: str, pid: int, limits: CalloutLimits,
    task_status: trio.TaskStatus[UpInfo], serving: trio.Event, recreated: dict[str, int] | None = None,
) -> NoReturn:
    """The IdP face and a lane host on ``<root>/spaces.json``; ``started`` once our space
    serves, when ``serving`` is set too."""
    async with trio.open_nursery() as nursery:
        dev_url = await _start_idp(nursery, config, prepared)
        events = config.events if config.events is not None else EventBus()  # one per process (issue 7)
        board = OpsBoard(events, nats_server=config.nats_server_version)
        ops_url = await nursery.start(_run_ops_face, config, prepared.policy, board, events)
        start_lane = lane_factory(
            root=config.paths, common=LaneCommon(server_url=server_url, limits=limits, events=events, board=board),
            lanes=FullLanes(http_ports={config.space: config.http_port}, dev_idp_url=dev_url),
        )
        host = await nursery.start(run_host, HostConfig(
            manifest=config.paths.spaces_manifest, start_lane=start_lane, events=events,
        ))
        await _wait_serving(host, config.space, lease_s=DEFAULT_LEASE.lease_s)
        serving.set()
        service = read_json(config.paths.space(config.space).auth_service_json)
        task_status.started(UpInfo(
            root=config.paths.root, space=config.space, server_url=server_url, broker_pid=pid,
            exchange_url=str(service.get("url", "")), pin=prepared.pin, dev_idp_url=dev_url,
            manifest=config.paths.spaces_manifest, spaces=tuple(host.current_states()), ops_url=ops_url,
            public=PublicFace.of(prepared.entry), recreated_issued=recreated, host=host,
        ))
        await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


async def _run_ops_face(
    config: UpConfig, policy: BrokerPolicy, board: OpsBoard, events: EventBus,
    *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The operator face on ``policy.ops_port`` (None: a free one), the port it bound then
    recorded in ``policy.json`` (as ``--port`` is, once it listens), so it does not move.

    Raises:
        ConfigError: the port is busy, naming ``--ops-port`` (or that it was the recorded one).
    """
    port = policy.ops_port or 0
    recorded = config.ops_port is None and port
    source = f"--ops-port {port} (recorded in {config.paths.policy_json})" if recorded else None
    face = functools.partial(run_ops_face, root=config.paths, port=port, board=board, events=events, clock=time.time, source=source)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(face)
        bound = int(url.rsplit(":", 1)[1])
        if bound != policy.ops_port:
            await trio.to_thread.run_sync(save_policy, config.paths.policy_json, dataclasses.replace(policy, ops_port=bound))
        task_status.started(url)


async def _wait_serving(host: Host, space: str, *, lease_s: float) -> None:
    """Wait until ``space``'s lane serves; raise why it failed, except that while an earlier
    ``cotal up`` that was killed still holds the claim the host's retries go on for at most
    two leases (spec "Exclusive ownership").

    Raises:
        ConfigError, Unavailable: the lane's own failure (the first leaf of its group).
    """
    deadline = trio.current_time() + 2 * lease_s
    seen = 0
    while True:
        try:
            outcome = await host.next_outcome(space, seen)
        except KeyError:
            raise ConfigError(
                f"space {space} left or changed in {host.manifest} while starting - run `cotal up` again"
                f" once {host.manifest.name} lists it as you want it"
            ) from None
        if outcome.status.state == "serving":
            return
        failure = leaves(outcome.failure)[0] if outcome.failure is not None else Unavailable(
            f"space {space}: {outcome.status.reason}"
        )
        if not isinstance(failure, ClaimRefused) or trio.current_time() >= deadline:
            raise failure
        log.warning("up: %s - waiting for its lease to lapse", failure)
        seen = outcome.count


async def run_up(config: UpConfig, *, task_status: trio.TaskStatus[UpInfo] = trio.TASK_STATUS_IGNORED) -> NoReturn:
    """Run the embedded stack until cancelled (startable; ``started`` with an :class:`UpInfo`).

    Raises:
        ConfigError: bad root, busy port, missing nats-server, a ``recreate_issued_stores``
            folder that is not empty (before ``started``).
        Unavailable: the broker did not accept the space's accounts, the IdP's JWKS could not
            be read, the space's lane could not start, or the broker failed while running. A
            lane failing after it served is the host's to retry (every 5 s, named in
            ``<root>/spaces.json.applied``); it does not end ``cotal up``.
    """
    with hold_root(config.paths.root):
        # An earlier version's space.<hex> folders get their names, under the lock (state/space_folders.py).
        renamed = await trio.to_thread.run_sync(rename_space_folders, config.paths)
        if renamed:
            log.warning("up: %s", rename_note(config.paths, renamed))
        if config.recreate_issued_stores is not None:  # refused before anything is written
            await trio.to_thread.run_sync(check_backup_dir, config.recreate_issued_stores)
        prepared = await trio.to_thread.run_sync(functools.partial(prepare_root, config, now=time.time()))
        timeout_s = prepared.policy.auth_timeout_s
        limits = CalloutLimits(**({"auth_timeout_s": timeout_s} if timeout_s else {}))
        stop_broker, serving = trio.Event(), trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                try:
                    # Inside the try: a cancel that lands once the broker has started but before
                    # `start` returns (Ctrl-C) still sets `stop_broker`, or the nursery would wait
                    # on the shielded broker for good (issue 15 item 9).
                    server_url, pid = await nursery.start(_run_broker, config, prepared, stop_broker)
                    recreated = None
                    if config.recreate_issued_stores is not None:
                        recreated = await _recreate_issued(config, server_url)
                    await _serve(config, prepared, server_url, pid, limits, task_status, serving, recreated)
                finally:
                    stop_broker.set()
        except BaseException:
            # Whatever ended it (broker, IdP, lane, Ctrl-C) before the space served: a face
            # that never served is not recorded (module docstring), as a busy --port is not.
            if not serving.is_set() and prepared.entry_before is not None:
                _restore_entry(config.paths, prepared.entry, prepared.entry_before)
            raise
    raise AssertionError("unreachable")  # pragma: no cover
