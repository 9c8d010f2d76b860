"""``cotal actor``: grant, revoke and list the actor ledger of a space (upstream-notes 1.3, 8).

The ledger is files in the space's folder (``actors/`` interactive, ``managed-actors/``
managed); these commands write them atomically through :mod:`cotal_trio.state` and decide
nothing themselves: grammars, the row model and the delegation envelope live in
:mod:`cotal_trio.core`. A grant always mints a fresh lifecycle UID, so re-granting a principal
ends every bearer issued for its previous row. A managed grant prints the agent's actor token
once; only its SHA-256 is stored.

While the space's auth service runs, re-granting or revoking a principal's interactive row first
retires its lifecycle through the service's ``/interactive-lifecycle/retire`` door
(:mod:`._actor_service`; spec "Host-only routes"), which also withdraws the lifecycle's issuance
rows. A refusal with ``outcome: "not-executed"`` is printed and changes nothing (exit 1); any
other failure leaves the outcome unknown, says so and names ``cotal actor list`` (exit 1). With
no service running the commands edit the files directly.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import cyclopts
from cyclopts import Parameter

from ..core.delegation import check_within_spawner_grant
from ..core.errors import CodecError, ConfigError
from ..core.identity import (
    check_actor,
    check_channel_pattern,
    check_owner,
    check_role,
    check_scope_token,
    derive_owner,
    mint_lifecycle_uid,
    principal,
)
from ..core.ledger import LedgerKind, LedgerRow, hash_actor_token, new_actor_token
from ..state import (
    SpacePaths,
    list_rows,
    load_idp_pin,
    load_owner_secret,
    read_principal,
    remove_quietly,
    remove_row,
    row_lookup,
    row_path,
    write_row,
)
from ..ops.errors import as_config_error
from ._actor_output import ledger_problems, print_granted, row_line, row_object
from .common import Where

if TYPE_CHECKING:
    from ._actor_service import Retired

__all__ = ["actor_app", "grant", "list_actors", "revoke"]

actor_app = cyclopts.App(
    name="actor",
    help="Grant, revoke and list the actors of a space (the actor ledger).",
)

# `--full` (upstream-notes 8): the default grant of a person's own CLI.
FULL_SCOPE = ("spawn", "role:default")
FULL_ACL = (">",)
ACTOR_TOKEN_RANDOM_BYTES = 32
LIFECYCLE_UID_RANDOM_BYTES = 20


def provisioned(where: Where) -> SpacePaths:
    """The space's paths, once its material exists (``callout.json`` is written first).

    Raises:
        ConfigError: a bad space name, no root at --root, or the root does not hold the space
            (:meth:`Where.provisioned`: names `cotal space list`).
    """
    return where.provisioned()


def check_argv_text(value: str, flag: str, what: str) -> str:
    """``value`` back if it is text, for a flag that reaches an owner derivation.

    Python reads argv bytes that are not UTF-8 as lone surrogates (``\\udcXX``, PEP 383); an
    owner derived from those is one no IdP will ever send (its token's JSON holds UTF-8 text),
    so the grant would silently go to nobody.

    Raises:
        ConfigError: ``value`` holds a surrogate (one sentence naming ``flag`` and the fix).
    """
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        raise ConfigError(
            f"{flag} holds bytes that are not UTF-8 (the shell's locale is not UTF-8?) - pass {what} as UTF-8 text,"
            " exactly as the IdP's token carries it"
        )
    return value


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class Whose:
    """Whose actor a command works on: exactly one of ``--sub`` and ``--owner``.

    Attributes:
        sub: the person's IdP subject; the owner is derived from it (the IdP token's `sub` claim).
        owner: the owner itself, u_ followed by 26 characters.
    """

    sub: Annotated[str | None, Parameter(help="The person's IdP subject (the owner is derived from it).")] = None
    owner: Annotated[str | None, Parameter(help="The owner, u_ followed by 26 characters.")] = None

    def resolve(self, space_paths: SpacePaths) -> str:
        """The owner ``u_...``: given, or derived from ``--sub`` with the space's secret and pin.

        Raises:
            ConfigError: both or neither flag, a malformed owner, a ``--sub`` that is not text
                (:func:`check_argv_text`), or the space's owner secret or IdP pin is missing or
                corrupt (upstream-notes 1.2).
        """
        if (self.sub is None) == (self.owner is None):
            raise ConfigError("name the owner with exactly one of --sub <IdP subject> or --owner <u_...>")
        if self.owner is not None:
            with as_config_error():
                return check_owner(self.owner)
        if not self.sub:
            raise ConfigError("--sub needs the person's IdP subject, which is not empty")
        sub = check_argv_text(self.sub, "--sub", "the subject")
        pin = load_idp_pin(space_paths.idp_json)
        return derive_owner(load_owner_secret(space_paths.owner_secret_json), pin.issuer, sub)


# --- grant ----------------------------------------------------------------------------------


def split_list(value: str | None, check: Callable[[object], str]) -> tuple[str, ...]:
    """A comma-separated flag value as a tuple; each entry passes ``check``, duplicates drop.

    ``None`` or a blank value is the empty tuple. Raises ConfigError with the grammar sentence.
    """
    if value is None or not value.strip():
        return ()
    with as_config_error():
        entries = [check(entry.strip()) for entry in value.split(",")]
    return tuple(dict.fromkeys(entries))


@dataclass(frozen=True, slots=True)
class Grant:
    """The scope and channel ACLs a grant writes."""

    scope: tuple[str, ...]
    allow_subscribe: tuple[str, ...]
    allow_publish: tuple[str, ...]


def grant_from_flags(full: bool, scope: str | None, subscribe: str | None, publish: str | None) -> Grant:
    """``--full`` or the three list flags (upstream-notes 8).

    Raises:
        ConfigError: ``--full`` combined with a list flag, or an entry breaking its grammar.
    """
    if full and (scope, subscribe, publish) != (None, None, None):
        raise ConfigError("--full grants scope spawn,role:default and > both ways - drop --scope and --allow-*")
    if full:
        return Grant(FULL_SCOPE, FULL_ACL, FULL_ACL)
    return Grant(
        split_list(scope, check_scope_token),
        split_list(subscribe, check_channel_pattern),
        split_list(publish, check_channel_pattern),
    )


def check_label(label: str | None) -> str | None:
    """``label`` if it is printable text on one line (or ``None``); else ConfigError."""
    if label is not None and not (label and label.isprintable()):
        raise ConfigError("--label is printable text on one line, for example --label 'david laptop'")
    return label


def utc_now_iso() -> str:
    """Now, as ISO-8601 UTC with milliseconds and ``Z`` (the ledger's ``grantedAt`` form)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def check_envelope(space_paths: SpacePaths, row: LedgerRow) -> None:
    """A managed row with a spawner must sit inside the spawner's grant (upstream-notes 1.3).

    Raises:
        ConfigError: the spawner has no row, a row on the chain is corrupt, or the envelope
            refuses (the core's sentence).
    """
    if row.parent is None:
        return
    lookup = row_lookup(functools.partial(read_principal, space_paths))
    with as_config_error():
        if lookup(row.owner, row.parent.split(".", 1)[1]) is None:
            raise ConfigError(f"spawner {row.parent} has no ledger row - grant it first")
        check_within_spawner_grant(row, lookup)


def retire_current(space_paths: SpacePaths, owner: str, actor: str) -> Retired | None:
    """Retire the principal's interactive lifecycle through the running auth service, if both exist.

    Returns:
        The confirmed retirement, or None when there is no interactive row (a corrupt one grants
        nothing and is replaced or removed as before) or no running service (edit the files).

    Raises:
        RetireRefused: the service refused before its barrier; nothing changed.
        RetireUnknown: the retirement's outcome is unknown (the sentence names `cotal actor list`).
    """
    if not space_paths.auth_service_json.exists():
        return None  # no service: and `cotal actor` never imports the HTTP stack
    try:
        current, _managed = read_principal(space_paths, owner, actor)
    except CodecError:
        return None
    if current is None:
        return None
    from ._actor_service import retire_interactive, running_service  # the HTTP client, only now

    service = running_service(space_paths)
    return None if service is None else retire_interactive(service, current)


def retired_line(retired: Retired) -> str:
    """What a retirement through the service did, in words (a partial one names the rows left)."""
    done = f"the running auth service retired lifecycle {retired.lifecycle_uid} and withdrew {retired.withdrawn} issuance rows"
    if not retired.partial:
        return done
    left = "some" if retired.left is None else f"{retired.left} more"
    return f"{done}; {left} were not withdrawn and expire within their TTL, at most {retired.expire_within_s} s"


def build_row(
    kind: LedgerKind, owner: str, actor: str, grant: Grant, *, role: str | None,
    parent: str | None, label: str | None, token_hash: str | None,
) -> LedgerRow:  # fmt: skip
    """A new row with a fresh lifecycle UID, granted now (ConfigError if a field is bad)."""
    with as_config_error():
        return LedgerRow(
            kind=kind, owner=owner, actor=actor, scope=grant.scope,
            allow_subscribe=grant.allow_subscribe, allow_publish=grant.allow_publish,
            role=role, parent=parent, label=label, token_hash=token_hash,
            lifecycle_uid=mint_lifecycle_uid(os.urandom(LIFECYCLE_UID_RANDOM_BYTES)),
            granted_at=utc_now_iso(),
        )  # fmt: skip


def checked_parent(owner: str, parent: str | None, managed: bool) -> str | None:
    """``<owner>.<parent>`` for ``--parent`` (managed grants only), or ``None``."""
    if parent is None:
        return None
    if not managed:
        raise ConfigError("--parent names the spawner of a managed agent - add --managed")
    with as_config_error():
        return principal(owner, check_actor(parent))


# Upstream-notes 1.3 (row shape, envelope) and 8 (`cotal actor grant` flags).
@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class GrantFlags:
    """What a granted actor may do: ``--full`` or the scope and channel lists, and its role."""

    full: Annotated[bool, Parameter(negative="", help="Scope spawn,role:default and > both ways; not with --scope or --allow-*.")] = False
    scope: Annotated[str | None, Parameter(help="Comma-separated scope tokens, for example spawn,role:default.")] = None
    allow_subscribe: Annotated[str | None, Parameter(help="Comma-separated channel patterns the actor may read.")] = None
    allow_publish: Annotated[str | None, Parameter(help="Comma-separated channel patterns the actor may post to.")] = None
    role: Annotated[str | None, Parameter(help="The actor's role name.")] = None

    def grant(self) -> Grant:
        """The row's scope and channel lists (:func:`grant_from_flags`); ConfigError as it raises."""
        return grant_from_flags(self.full, self.scope, self.allow_subscribe, self.allow_publish)

    def checked_role(self) -> str | None:
        """``--role`` once it is a role name; ConfigError naming the grammar."""
        if self.role is not None:
            with as_config_error():
                check_role(self.role)
        return self.role


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class ManagedFlags:
    """A managed (agent) grant and its spawner."""

    managed: Annotated[bool, Parameter(negative="", help="Write a managed (agent) row and print its actor token once.")] = False
    parent: Annotated[str | None, Parameter(help=(
        "With --managed: the spawning actor of the same owner; the grant must sit inside its own."))] = None


# Upstream-notes 1.3 (row shape, envelope) and 8 (`cotal actor grant` flags).
@actor_app.command
def grant(
    actor: str,
    /,
    *,
    whose: Whose = Whose(),
    what: GrantFlags = GrantFlags(),
    label: str | None = None,
    managed: ManagedFlags = ManagedFlags(),
    as_json: Annotated[bool, Parameter(name="--json", negative="")] = False,
    where: Where = Where(),
) -> None:
    """Grant an actor of an owner into the space (writes its ledger row).

    Re-granting replaces the row with a fresh lifecycle UID: bearers of the old row stop
    connecting. While the space's auth service runs, an interactive row's old lifecycle is
    first retired through it; if that fails nothing is written and the command exits 1. A
    managed grant prints the agent's actor token once.

    Parameters
    ----------
    actor
        The actor name (letters, digits and _).
    label
        Free text for operators, for example "david laptop".
    as_json
        Print a JSON object instead of a sentence.
    """
    space_paths = provisioned(where)
    with as_config_error():
        check_actor(actor)
    owner = whose.resolve(space_paths)
    acl = what.grant()
    role = what.checked_role()
    spawner = checked_parent(owner, managed.parent, managed.managed)
    token = new_actor_token(os.urandom(ACTOR_TOKEN_RANDOM_BYTES)) if managed.managed else None
    kind = LedgerKind.MANAGED if managed.managed else LedgerKind.INTERACTIVE
    row = build_row(
        kind, owner, actor, acl, role=role, parent=spawner, label=check_label(label),
        token_hash=None if token is None else hash_actor_token(token),
    )  # fmt: skip
    check_envelope(space_paths, row)
    retired = retire_current(space_paths, owner, actor) if kind is LedgerKind.INTERACTIVE else None
    write_row(space_paths, row)
    if retired is not None and not as_json:
        print(retired_line(retired))
    print_granted(row, token, as_json)


# --- revoke ---------------------------------------------------------------------------------


@actor_app.command
def revoke(
    actor: str,
    /,
    *,
    whose: Whose = Whose(),
    as_json: Annotated[bool, Parameter(name="--json", negative="")] = False,
    where: Where = Where(),
) -> None:
    """Revoke an actor of an owner: remove its ledger rows (both kinds).

    The next exchange and the next connect of that principal are refused. Revoking a principal
    that has no row is not an error; the output says nothing was removed. While the space's
    auth service runs, an interactive row is retired through it (its issuance rows withdrawn
    too); if that fails the command exits 1.

    Parameters
    ----------
    actor
        The actor name.
    as_json
        Print {"owner", "actor", "removed"} instead of a sentence (plus "retiredLifecycle" and
        "withdrawn" when the running auth service retired the row; "withdrawn": "partial" with
        "withdrawnRows", "rowsLeft" and "rowsExpireWithinS" when its withdrawal did not finish).
    """
    space_paths = provisioned(where)
    with as_config_error():
        check_actor(actor)
    owner = whose.resolve(space_paths)
    retired = retire_current(space_paths, owner, actor)
    if retired is None:
        removed = remove_row(space_paths, owner, actor)
    else:  # the service removed the interactive row (one written since is a new grant and stays);
        # a managed row of the same principal (a broken ledger) goes too, as without a service
        remove_quietly(row_path(space_paths, LedgerKind.MANAGED, owner, actor))
        removed = True
    if as_json:
        answer: dict[str, object] = {"owner": owner, "actor": actor, "removed": removed}
        if retired is not None and retired.partial:
            answer.update(
                retiredLifecycle=retired.lifecycle_uid, withdrawn="partial", withdrawnRows=retired.withdrawn,
                rowsLeft=retired.left, rowsExpireWithinS=retired.expire_within_s,
            )  # fmt: skip
        elif retired is not None:
            answer.update(retiredLifecycle=retired.lifecycle_uid, withdrawn=retired.withdrawn)
        print(json.dumps(answer, indent=2))
    elif retired is not None:
        print(f"revoked {actor} of owner {owner} ({retired_line(retired)})")
    elif removed:
        print(f"revoked {actor} of owner {owner}")
    else:
        print(f"nothing to revoke: {actor} of owner {owner} has no ledger row in space {space_paths.space}")


# --- list -----------------------------------------------------------------------------------


@actor_app.command(name="list")
def list_actors(
    *,
    as_json: Annotated[bool, Parameter(name="--json", negative="")] = False,
    where: Where = Where(),
) -> int:
    """List every ledger row of the space.

    Corrupt row files are reported on stderr (path and reason) after the good rows are
    printed, and make the command exit 1.

    Parameters
    ----------
    as_json
        Print a JSON array of rows.
    """
    space_paths = provisioned(where)
    rows, bad = list_rows(space_paths)
    if as_json:
        print(json.dumps([row_object(row) for row in rows], indent=2, ensure_ascii=False))
    elif rows:
        print("\n".join(row_line(row) for row in rows))
    else:
        print(f"no actors are granted in space {space_paths.space}")
    problems = ledger_problems(space_paths, rows, bad)
    for problem in problems:
        print(f"cotal: {problem}", file=sys.stderr)
    return 1 if problems else 0
