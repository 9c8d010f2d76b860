"""``cotal space``: add, remove and list the spaces of a root while its broker runs.

A thin skin over :mod:`cotal_trio.broker.spaces` (which documents the order of operations, the
``spaces.json`` manifest and the ``mode.json`` of static spaces). ``deprovision --dry-run``
prints a space's offline secret inventory (:func:`cotal_trio.state.deprovision_secret_keys`);
``deprovision --yes`` deletes those keys, all or none (spec "Offline secret inventory", issue 19
item 6: :func:`cotal_trio.state.inventory.delete_secret_keys`), once nothing uses them.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import cyclopts
import trio
from cyclopts import Parameter

from .. import natsio
from ..broker.accounts import open_system_connection
from ..broker.provision import load_space_accounts
from ..broker.spaces import add_space, broker_holds, list_spaces, remove_space, resolve_server_url
from ..core.errors import ConfigError, Unavailable, leaves
from ..core.identity import is_space
from cotal_trio.service.pins import choose_pin
from ..state import (
    RootPaths,
    SecretInventory,
    SecretKey,
    deprovision_secret_keys,
    load_broker,
    read_json,
    resolve_root,
)
from ..state.applied import applied_path
from ..state.inventory import DeletedSecrets, delete_secret_keys
from ..state.liveness import pid_alive
from ..state.space_folders import ROOT_MARKER, require_root, unrenamed_note, unrenamed_spaces
from ._hosted import read_hosted
from ._servers import refused_connect

__all__ = ["add", "deprovision", "list_cmd", "remove", "space_app"]

space_app = cyclopts.App(name="space", help="Add, remove and list the spaces of a root (live on its broker).")

# Every broker round trip of one command, together (STYLE 12: a deadline on every wait).
COMMAND_DEADLINE_S = 30
# How long `remove` waits for a running host's `.applied` to drop the space's lane.
LANE_WAIT_S = 10

Root = Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal).")]
Server = Annotated[str | None, Parameter(help="Broker URL (default: the root's broker on 127.0.0.1, if it runs).")]


def _paths(root: str | None) -> RootPaths:
    if root is not None and not root.strip():
        raise ConfigError("--root is empty - pass a folder, or leave it out for ./.cotal")
    return RootPaths(resolve_root(root, os.environ))


def _deadline_error(what: str) -> ConfigError:
    return ConfigError(f"{what} did not finish within {COMMAND_DEADLINE_S} s - check that the broker answers")


@space_app.command
async def add(
    name: str,
    /,
    *,
    static: Annotated[bool, Parameter(negative="", help="A static-auth space: no lane, kept out of spaces.json.")] = False,
    root: Root = None,
    server: Server = None,
    idp: Annotated[str | None, Parameter(help="Pin a real EdDSA IdP at this base URL (JWKS at URL/jwks). Default: the root's development IdP. A pin never changes.")] = None,
    new_root: Annotated[bool, Parameter(negative="", help="Create the root first when --root holds none (new operator keys).")] = False,
    replicas: Annotated[int | None, Parameter(help="Copies JetStream keeps of each of the space's stores, 1 to 5 (more than 1 needs a cluster); written to its spaces.json entry. Default: an existing entry's count, else 1.")] = None,
) -> None:
    """Provision a space, pin its IdP, push its accounts to the running broker, and host it.

    A --root that holds no root is refused unless --new-root is given: creating one makes new
    operator keys, a trust domain no running broker knows, so a mistyped --root would otherwise
    provision the space somewhere nothing serves it, and the operator would find out only when its
    clients are refused (issue 18 item 3). With --new-root the first line says it created the root.

    Parameters
    ----------
    name
        The space name (1 to 64 letters, digits, _ and -).
    """
    paths = _paths(root)
    if static and idp is not None:
        raise ConfigError("--idp pins a user-auth space's IdP; a --static space has none - drop one of them")
    fresh = not (paths.root / ROOT_MARKER).exists()
    if fresh and not new_root and is_space(name):  # a bad name is named first (add_space)
        raise ConfigError(
            f"there is no root at {paths.root} - pass the --root of an existing one, or add --new-root "
            "to create one there (new operator keys)"
        )
    try:
        with trio.fail_after(COMMAND_DEADLINE_S):
            # Chosen (and a changed pin refused) before anything is written.
            pin = None if static or not is_space(name) else await choose_pin(paths, name, idp_url=idp)
            try:
                done = await add_space(
                    paths, name, static=static, server_url=server, now=time.time(), idp_pin=pin, replicas=replicas
                )
            except* Unavailable as group:
                if any(refused_connect(leaf) for leaf in leaves(group)):
                    # the space's files are written before the push; a second add reuses them and pushes
                    raise ConfigError(
                        f"the broker at {server or 'the root'} did not answer (connection refused) - start it "
                        f"(`cotal up --root {paths.root}`, or the broker's unit) or pass the right --server, then "
                        f"run `cotal space add {name}` again: the space is provisioned, its accounts are not pushed"
                    ) from None
                raise
    except trio.TooSlowError:
        raise _deadline_error(f"adding space {name}") from None
    if fresh:
        print(f"created a new root at {paths.root} (new operator keys)")
    where = f"accounts pushed to {done.server_url}" if done.server_url else "no broker running: accounts not pushed"
    print(f"added space {done.space} ({where})")
    if pin is not None:
        kind = "the development IdP" if pin.kind == "dev" else "IdP"
        print(f"  IdP: {kind} {pin.issuer}")
    if replicas is not None:
        print(f"  stores: replicas {replicas} (its full lane creates them so, or scales them up, at its start)")


@space_app.command
async def remove(name: str, /, *, root: Root = None, server: Server = None) -> None:
    """Stop hosting a space, delete its streams, then its accounts on the broker.

    Parameters
    ----------
    name
        The space name.
    """
    paths = _paths(root)
    try:
        with trio.fail_after(COMMAND_DEADLINE_S + LANE_WAIT_S):
            done = await remove_space(paths, name, server_url=server, now=time.time(), lane_wait_s=LANE_WAIT_S)
    except trio.TooSlowError:
        raise _deadline_error(f"removing space {name}") from None
    if done.server_url is None:
        where = (
            "no broker running: its streams and accounts are still in the broker's state -"
            f" run `cotal space remove {name}` again while the broker runs"
        )
    elif done.accounts_deleted:
        where = f"{len(done.streams_deleted)} streams and its accounts deleted on {done.server_url}"
    else:
        where = f"{done.server_url} did not hold its accounts"
    print(f"removed space {done.space} ({where})")
    if done.host_gone is not None:
        print(f"  lane: {done.host_gone}")


@space_app.command(name="list")
async def list_cmd(
    *,
    as_json: Annotated[bool, Parameter(name="--json", negative="", help="Print a JSON array.")] = False,
    root: Root = None,
) -> None:
    """List the root's spaces: name, mode (user-auth or static), hosted (in spaces.json).

    While spaces.json cannot be read or is refused (a typo), its lanes keep serving: hosted
    then means served by its host (spaces.json.applied), and a last line names the refusal and
    its fix (on stderr with --json). With nothing served, that is the error (exit 1).
    """
    # Issue 18 item 4: a typo in spaces.json never hides what serves.
    paths = _paths(root)
    require_root(paths)  # a mistyped --root is named, never an empty listing
    hosted = await trio.to_thread.run_sync(read_hosted, paths)
    if hosted.spaces is None:  # refused, and no lane serves to list instead: today's sentence
        assert hosted.problem is not None  # spaces is None only when spaces.json is refused
        raise ConfigError(hosted.problem)
    rows = await trio.to_thread.run_sync(functools.partial(list_spaces, paths, hosted=hosted.spaces))
    # A root an earlier version wrote lists nothing until a start renames its folders: say so.
    notes = [unrenamed_note(name) for name in await trio.to_thread.run_sync(unrenamed_spaces, paths)]
    if (refusal := hosted.line()) is not None:  # last: the lanes above serve, this names the fix
        notes.append(refusal)
    if as_json:
        print(json.dumps(rows))
        for note in notes:  # the JSON array stays the listing of usable spaces
            print(note, file=sys.stderr)
        return
    for row in rows:
        print(f"{row['space']}\t{row['mode']}\t{'hosted' if row['hosted'] else 'not hosted'}")
    for note in notes:
        print(note)


@space_app.command
async def deprovision(
    name: str,
    /,
    *,
    dry_run: Annotated[bool, Parameter(negative="", help="List the space's secret keys; read, change and delete nothing.")] = False,
    yes: Annotated[bool, Parameter(negative="", help="Delete the keys --dry-run lists, for good (a space no manifest lists and no lane serves).")] = False,
    as_json: Annotated[bool, Parameter(name="--json", negative="", help="Print a JSON object.")] = False,
    root: Root = None,
    server: Server = None,
) -> None:
    """List (--dry-run) or delete (--yes) a space's secret keys: the reset of its secrets.

    --yes deletes exactly the files --dry-run lists, all or none, and only for a space that is
    out of service: not in the root's spaces.json (`cotal space remove` takes it out), served by
    no running lane (the host's spaces.json.applied, the space's auth-service.json), and with no
    account left on the broker (asked, or read from the root's broker's resolver folder while it
    is stopped). Each refusal names the fix. The space's
    other files (accounts.json, idp.json, sentinel.creds, the ledger) stay; a later `cotal space
    add` of the name needs that folder moved aside first.

    Parameters
    ----------
    name
        The space name.
    """
    if dry_run == yes:  # both, or neither: before any file is looked at
        raise ConfigError(
            f"pass --dry-run or --yes, not both - `cotal space deprovision {name} --dry-run` lists the secret"
            f" keys, and `cotal space deprovision {name} --yes` deletes them for good"
            if yes else
            f"deprovisioning deletes space {name}'s secret keys for good - list them with `cotal space"
            f" deprovision {name} --dry-run`, then pass --yes to delete them"
        )
    paths = _paths(root)
    inventory = await trio.to_thread.run_sync(deprovision_secret_keys, paths, name)
    if dry_run:
        if as_json:
            print(json.dumps(inventory.to_json()))
            return
        print(_inventory_table(paths, inventory))
        return
    await trio.to_thread.run_sync(_refuse_in_service, paths, name)
    try:
        with trio.fail_after(COMMAND_DEADLINE_S):
            await _refuse_on_broker(paths, name, server)
    except trio.TooSlowError:
        raise _deadline_error(f"checking space {name}'s accounts on the broker") from None
    done = await trio.to_thread.run_sync(delete_secret_keys, inventory)
    if as_json:
        print(json.dumps({
            "space": done.space, "segment": str(done.segment),
            "deleted": [{"kind": k.kind, "path": str(k.path), "field": k.field, "publicKey": k.public_key}
                        for k in done.keys],
            "files": [str(path) for path in done.files], "aside": [str(path) for path in done.aside],
        }))
        return
    print(_deleted_table(paths, done))


def _refuse_in_service(paths: RootPaths, name: str) -> None:
    """Refuse a reset while a manifest lists the space or a lane of it runs (blocking reads).

    "Any manifest" is what the root records: its ``spaces.json``, and what the host serving it
    still runs (its ``.applied``: the lanes of a refused manifest keep serving). A full lane of
    any other host writes the space's ``auth-service.json``, checked by its pid; a replica of
    another host leaves no file here, which :func:`_refuse_on_broker` covers.

    Raises:
        ConfigError: one sentence naming the manifest or the pid, and the fix.
    """
    hosted = read_hosted(paths)
    if hosted.listed is None:
        raise ConfigError(f"cannot tell whether space {name} is still hosted: {hosted.problem}")
    if name in hosted.listed:
        raise ConfigError(
            f"space {name} is still in the manifest {paths.spaces_manifest} - run `cotal space remove {name}`"
            " first (it stops the lane and deletes the space's accounts on the broker)"
        )
    if name in hosted.lanes:
        assert hosted.applied is not None  # lanes come from .applied
        pid = hosted.applied.report.pid
        host = f"pid {pid}" if pid is not None else "a host"
        raise ConfigError(
            f"a lane of space {name} still runs in the host {host} ({applied_path(paths.spaces_manifest)}) -"
            " wait until it stops (`cotal status` shows it), or stop that host"
        )
    service = paths.space(name).auth_service_json
    pid = _live_writer(service)
    if pid is not None:
        raise ConfigError(f"space {name} is still served by pid {pid} ({service}) - stop that auth service first")


def _live_writer(readiness: Path) -> int | None:
    """The pid a readiness file names while that process runs; None when there is no file, or
    it is corrupt or its writer is gone (a lane writes it atomically: a corrupt one is no lane's)."""
    try:
        pid, written = int(read_json(readiness).get("pid", 0)), readiness.stat().st_mtime
    except (ConfigError, OSError, TypeError, ValueError):  # no file (or a corrupt one): no lane
        return None
    return pid if pid > 0 and pid_alive(pid, since=written) else None


async def _refuse_on_broker(paths: RootPaths, name: str, server: str | None) -> None:
    """Trio: refuse while a broker holds one of the space's accounts: `cotal space remove`
    deletes them once the lane stops, and while they are there a lane anywhere (a replica of
    another host included) may still answer for them. Once the keys are gone, `cotal space
    remove` can no longer delete the space's streams, so this is checked first.

    The broker asked is ``--server``, else the root's when it runs (:func:`resolve_server_url`).
    With none reachable, the root's own broker's resolver folder is read instead: it keeps a
    pushed account as ``<account>.jwt`` and renames a deleted one to ``<account>.jwt.deleted``
    (nats-server's full resolver with ``allow_delete``). A remote broker that does not answer
    cannot be checked.

    Raises:
        ConfigError: names the broker (or the resolver file) and `cotal space remove`; a
            corrupt ``accounts.json``.
        Unavailable: the broker refused the root's system user or did not answer.
    """
    url = await resolve_server_url(paths, server)
    sp = paths.space(name)
    if not await trio.to_thread.run_sync(sp.accounts_json.exists):
        return
    broker = await trio.to_thread.run_sync(load_broker, paths.broker_json)
    record = await trio.to_thread.run_sync(load_space_accounts, paths, broker, name)
    accounts = (record.auth_account, record.data_account)
    if url is None:
        kept = [paths.resolver_dir / f"{a}.jwt" for a in accounts]
        kept = [path for path in kept if await trio.to_thread.run_sync(path.exists)]
        if kept:
            raise ConfigError(
                f"the root's broker, which is not running, still holds space {name}'s accounts ({kept[0]}) -"
                f" start it (`cotal up`), then run `cotal space remove {name}`"
            )
        return
    async with natsio.open_loop(), open_system_connection(url, broker) as sys_conn:
        held = [a for a in accounts if await broker_holds(sys_conn, a)]
    if held:
        raise ConfigError(
            f"the broker at {url} still holds space {name}'s accounts - run `cotal space remove {name}`"
            " first (it deletes them once the lane stops)"
        )


def _deleted_table(paths: RootPaths, done: DeletedSecrets) -> str:
    """What a reset deleted: a header, one row per key, and what stays."""
    if not done.keys and not done.aside:
        return f"space {done.space}: no secret key on disk in {done.segment} - nothing to delete"
    files = len(done.files)
    lines = [
        f"space {done.space}: deleted {len(done.keys)} secret keys in {files} file{'s' * (files != 1)} from {done.segment}",
        "kind\tfile\tfield\tpublic key",
        *(f"{k.kind}\t{k.path.relative_to(paths.root)}\t{k.field}\t{k.public_key or '-'}" for k in done.keys),
        *(f"also deleted {folder.relative_to(paths.root)} (left by an interrupted reset)" for folder in done.aside),
        (f"its other files stay (no secret in them); to add a space named {done.space} again with new keys,"
         f" move {done.segment} aside first"),
    ]
    return "\n".join(lines)


def _inventory_table(paths: RootPaths, inventory: SecretInventory) -> str:
    """Header, one tab-separated row per key, then the root-level keys the space shares."""
    lines = [
        (f"space {inventory.space}: {sum(key.exists for key in inventory.keys)} secret keys on disk,"
         f" {len(inventory.keys)} places in {inventory.segment} (dry run: no secret read, nothing deleted)"),
        "kind\tfile\tfield\tmode\tpublic key",
        *(_inventory_row(paths, key) for key in inventory.keys),
        "shared by every space of the root (not this space's to delete):",
        *(_inventory_row(paths, key) for key in inventory.shared),
        *(f"left by an interrupted reset (--yes deletes it too): {folder.relative_to(paths.root)}"
          for folder in inventory.aside),
    ]
    return "\n".join(lines)


def _inventory_row(paths: RootPaths, key: SecretKey) -> str:
    mode = "missing" if key.mode is None else f"{key.mode:04o}"
    where = key.path.relative_to(paths.root)
    return f"{key.kind}\t{where}\t{key.field}\t{mode}\t{key.public_key or '-'}"
