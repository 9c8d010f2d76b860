"""``cotal manager``: register, list and retire the manager instances of a space (issue 5).

A manager instance is a row ``mgr.<owner>.<instanceId>`` in the space's records store
``cotal_records_<space>`` (:mod:`cotal_trio.core.managers`, :mod:`cotal_trio.stores.records`);
the ``manager-caller`` view binds a bearer to one of them. These commands connect to the broker
as a fresh data-account service user of the space that may touch only those rows
(:func:`~cotal_trio.stores.records.manager_cli_permissions`), and decide nothing themselves. The
store is created by the space's full auth service when it starts; before that every command
refuses with that fix.

Registration requires the manager actor's ledger row (interactive or managed) to carry scope
``supervise``; the instance id is a fresh lifecycle token and the serve epoch starts at 1.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import cyclopts
import trio
from cyclopts import Parameter

from ..broker.spaces import resolve_server_url
from ..core.errors import ConfigError
from ..core.identity import check_actor, is_lifecycle_uid, mint_lifecycle_uid
from ..core.ledger import LedgerRow
from ..core.managers import MAX_LABEL_CHARS, ManagerInstance, render_manager_row
from ..core.manifest import format_utc
from cotal_trio.stores.records import RecordsStore, manager_cli_permissions
from cotal_trio.lane.service_endpoints import open_store_user
from ..natsio import open_loop
from ..state import RootPaths, SpaceMaterial, SpacePaths, load_space, read_principal
from .actor import Whose, as_config_error, check_label, provisioned
from .common import Where

__all__ = ["list_cmd", "manager_app", "register", "retire"]

manager_app = cyclopts.App(
    name="manager",
    help="Register, list and retire the manager instances of a space (live on its broker).",
)

# Every broker round trip of one command, together (STYLE 12: a deadline on every wait).
COMMAND_DEADLINE_S = 30
SUPERVISE = "supervise"
INSTANCE_ID_RANDOM_BYTES = 20

Json = Annotated[bool, Parameter(name="--json", negative="", help="Print JSON instead of text.")]
Server = Annotated[str | None, Parameter(help="Broker URL (default: the root's broker on 127.0.0.1, if it runs).")]


@dataclass(frozen=True, slots=True)
class _Space:
    """What a command read from the root before it connects."""

    root: RootPaths
    paths: SpacePaths
    material: SpaceMaterial
    owner: str | None


def _read_space(where: Where, whose: Whose, *, owner_needed: bool) -> _Space:
    """Blocking: the provisioned space, its material, and the owner (None: every owner)."""
    space_paths = provisioned(where)
    if not owner_needed and whose.sub is None and whose.owner is None:
        owner = None
    else:
        owner = whose.resolve(space_paths)
    return _Space(where.paths(), space_paths, load_space(space_paths.callout_json, space_paths.space), owner)


def _check_supervisor(space_paths: SpacePaths, owner: str, actor: str) -> LedgerRow:
    """Blocking: the manager actor's ledger row that carries scope ``supervise``.

    Raises:
        ConfigError: no row of either kind, a corrupt row, or no row with ``supervise``; the
            sentence names the grant to run.
    """
    with as_config_error():
        rows = [row for row in read_principal(space_paths, owner, actor) if row is not None]
    for row in rows:
        if SUPERVISE in row.scope:
            return row
    if not rows:
        raise ConfigError(
            f"manager actor {actor} of owner {owner} has no ledger row in space {space_paths.space} - grant it"
            f" first: `cotal actor grant {actor} --owner {owner} --scope {SUPERVISE}`"
        )
    row = rows[0]
    managed = " --managed" if row.kind.value == "managed" else ""
    scope = ",".join((*row.scope, SUPERVISE))
    raise ConfigError(
        f"manager actor {actor} of owner {owner} lacks ledger scope {SUPERVISE} in space {space_paths.space}"
        f" - grant it again with `cotal actor grant {actor} --owner {owner}{managed} --scope {scope}`"
        " (and its --allow-* lists)"
    )


def _checked_label(label: str | None) -> str | None:
    label = check_label(label)
    if label is not None and len(label) > MAX_LABEL_CHARS:
        raise ConfigError(f"--label has {len(label)} characters - keep it to {MAX_LABEL_CHARS}")
    return label


@asynccontextmanager
async def _open_store(space: _Space, server: str | None) -> AsyncIterator[RecordsStore]:
    """Trio: the space's records store as the CLI's own data-account user, on the root's broker
    (or ``--server``). Enter it under the command's deadline."""
    url = await resolve_server_url(space.root, server)
    if url is None:
        raise ConfigError(
            f"no broker answers for the root {space.root.root} - start it with `cotal up`, or pass"
            " --server nats://host:port"
        )
    name = f"cotal:manager-cli:{space.paths.space}"
    async with open_loop(), open_store_user(
        space.material, url, name=name, permissions=manager_cli_permissions(space.paths.space),
        iat=int(time.time()), reconnect=False,
    ) as conn:
        yield RecordsStore(conn, space.paths.space)


def _too_slow(what: str) -> ConfigError:
    return ConfigError(f"{what} did not finish within {COMMAND_DEADLINE_S} s - check that the broker answers")


def _row_object(instance: ManagerInstance) -> dict[str, Any]:
    """The stored row as a JSON object (the ``--json`` form)."""
    return json.loads(render_manager_row(instance))


def _row_line(instance: ManagerInstance) -> str:
    fields = [
        f"owner={instance.owner}", f"actor={instance.actor}", f"epoch={instance.serve_epoch}",
        f"registered={format_utc(instance.registered_at)}",
    ]
    if instance.label:
        fields.append(f"label={json.dumps(instance.label, ensure_ascii=False)}")
    return f"{instance.instance_id} " + " ".join(fields)


@manager_app.command
async def register(
    *,
    actor: Annotated[str, Parameter(help="The manager actor; its ledger row needs scope supervise.")],
    whose: Whose = Whose(),
    label: Annotated[str | None, Parameter(help=f"Free text for operators, at most {MAX_LABEL_CHARS} characters.")] = None,
    server: Server = None,
    as_json: Json = False,
    where: Where = Where(),
) -> None:
    """Register a new manager instance of an owner's manager actor; prints its instance id."""
    with as_config_error():
        check_actor(actor)
    label = _checked_label(label)
    space = await trio.to_thread.run_sync(functools.partial(_read_space, where, whose, owner_needed=True))
    assert space.owner is not None
    await trio.to_thread.run_sync(_check_supervisor, space.paths, space.owner, actor)
    instance = ManagerInstance(
        instance_id=mint_lifecycle_uid(os.urandom(INSTANCE_ID_RANDOM_BYTES)), owner=space.owner, actor=actor,
        serve_epoch=1, registered_at=int(time.time()), label=label,
    )
    try:
        with trio.fail_after(COMMAND_DEADLINE_S):
            async with _open_store(space, server) as store:
                await store.register_manager(instance)
    except trio.TooSlowError:
        raise _too_slow("registering the manager instance") from None
    print(json.dumps(_row_object(instance), indent=2, ensure_ascii=False) if as_json else instance.instance_id)


@manager_app.command(name="list")
async def list_cmd(
    *,
    whose: Whose = Whose(),
    server: Server = None,
    as_json: Json = False,
    where: Where = Where(),
) -> None:
    """List the live manager instances of an owner (--owner or --sub), or of every owner."""
    space = await trio.to_thread.run_sync(functools.partial(_read_space, where, whose, owner_needed=False))
    try:
        with trio.fail_after(COMMAND_DEADLINE_S):
            async with _open_store(space, server) as store:
                instances = await store.list_managers(space.owner)
    except trio.TooSlowError:
        raise _too_slow("listing the manager instances") from None
    if as_json:
        print(json.dumps([_row_object(i) for i in instances], indent=2, ensure_ascii=False))
    elif instances:
        print("\n".join(_row_line(i) for i in instances))
    else:
        whom = "" if space.owner is None else f" to owner {space.owner}"
        print(f"no manager instance is registered{whom} in space {space.paths.space}")


@manager_app.command
async def retire(
    instance_id: str,
    /,
    *,
    whose: Whose = Whose(),
    server: Server = None,
    as_json: Json = False,
    where: Where = Where(),
) -> None:
    """Retire a manager instance of an owner: its row is deleted, so it is no longer live.

    Retiring an instance that is not registered is not an error; the output says so.

    Parameters
    ----------
    instance_id
        The instance id, as `cotal manager list` prints it.
    """
    if not is_lifecycle_uid(instance_id):
        raise ConfigError(
            f"{instance_id!r} is not a manager instance id (26 to 32 of a-z and 0-9) - copy it from `cotal manager list`"
        )
    space = await trio.to_thread.run_sync(functools.partial(_read_space, where, whose, owner_needed=True))
    assert space.owner is not None
    try:
        with trio.fail_after(COMMAND_DEADLINE_S):
            async with _open_store(space, server) as store:
                retired = await store.retire_manager(space.owner, instance_id)
    except trio.TooSlowError:
        raise _too_slow("retiring the manager instance") from None
    if as_json:
        print(json.dumps({"owner": space.owner, "instanceId": instance_id, "retired": retired}, indent=2))
    elif retired:
        print(f"retired manager instance {instance_id} of owner {space.owner}")
    else:
        print(
            f"nothing to retire: manager instance {instance_id} is not registered to owner {space.owner}"
            f" in space {space.paths.space}"
        )
