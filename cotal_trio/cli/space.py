"""``cotal space``: add, remove and list the spaces of a root while its broker runs.

A thin skin over :mod:`cotal_trio.broker.spaces` (which documents the order of operations, the
``spaces.json`` manifest and the ``mode.json`` of static spaces). ``deprovision --dry-run``
prints a space's offline secret inventory (:func:`cotal_trio.state.deprovision_secret_keys`).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Annotated

import cyclopts
import trio
from cyclopts import Parameter

from ..broker.spaces import add_space, list_spaces, remove_space
from ..core.errors import ConfigError
from ..core.identity import is_space
from cotal_trio.service.pins import choose_pin
from ..state import (
    RootPaths,
    SecretInventory,
    SecretKey,
    deprovision_secret_keys,
    resolve_root,
)
from ..state.space_folders import ROOT_MARKER, require_root, unrenamed_note, unrenamed_spaces
from ._hosted import read_hosted

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
            done = await add_space(
                paths, name, static=static, server_url=server, now=time.time(), idp_pin=pin, replicas=replicas
            )
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
    as_json: Annotated[bool, Parameter(name="--json", negative="", help="Print a JSON object.")] = False,
    root: Root = None,
) -> None:
    """List the secret keys deprovisioning a space would remove (only --dry-run is built).

    Parameters
    ----------
    name
        The space name.
    """
    if not dry_run:
        raise ConfigError(
            f"deprovisioning a space is not built yet - run `cotal space deprovision {name} --dry-run`"
            " to list its secret keys"
        )
    paths = _paths(root)
    inventory = await trio.to_thread.run_sync(deprovision_secret_keys, paths, name)
    if as_json:
        print(json.dumps(inventory.to_json()))
        return
    print(_inventory_table(paths, inventory))


def _inventory_table(paths: RootPaths, inventory: SecretInventory) -> str:
    """Header, one tab-separated row per key, then the root-level keys the space shares."""
    lines = [
        (f"space {inventory.space}: {sum(key.exists for key in inventory.keys)} secret keys on disk,"
         f" {len(inventory.keys)} places in {inventory.segment} (dry run: no secret read, nothing deleted)"),
        "kind\tfile\tfield\tmode\tpublic key",
        *(_inventory_row(paths, key) for key in inventory.keys),
        "shared by every space of the root (not this space's to delete):",
        *(_inventory_row(paths, key) for key in inventory.shared),
    ]
    return "\n".join(lines)


def _inventory_row(paths: RootPaths, key: SecretKey) -> str:
    mode = "missing" if key.mode is None else f"{key.mode:04o}"
    where = key.path.relative_to(paths.root)
    return f"{key.kind}\t{where}\t{key.field}\t{mode}\t{key.public_key or '-'}"
