"""``cotal auth``: mint and revoke the credentials of a static space (issue 6 item 3).

Spec "Credential authority", section "Provisioning"; docs/static-credentials.md. This module is
the commands' skin: flags -> a request -> one call, then the receipt. The mint, the revocation
and the issued stores' recovery are :mod:`cotal_trio.ops.static_credentials` and
:mod:`cotal_trio.ops.caller_mint`; the rules :mod:`cotal_trio.core.credentials` and
:mod:`cotal_trio.core.callers`.

``cotal auth mint --endpoint E --out PATH [--channels a,b]`` (issue 6 item 7; spec "Standalone
callers") mints a standalone caller: it asks the endpoint for its surface now, then records the
label pending, creates the private create-only issuance intent, provisions the native footprint
and writes the file, in that order (:func:`cotal_trio.ops.caller_mint.mint_caller`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import cyclopts
import trio
from cyclopts import Parameter

from ..core import callers, static_issuance
from ..core import credentials as rules
from ..core.credentials import Credential, LabelRecord
from ..core.errors import ConfigError
from ..core.identity import check_channel_pattern, check_role
from ..core.wire import Durable
from ..ops.caller_mint import mint_caller, recreate_static_issued_stores
from ..ops.errors import as_config_error
from ..ops.static_agents import mint_agent, provision_uid, renew_agent
from ..ops.static_credentials import MintRequest, mint_native, revoke_credential as revoke
from ._servers import resolve_servers
from .actor import provisioned, split_list
from .common import Where

__all__ = ["AgentFlags", "CallerFlags", "MintFlags", "agent_grant", "auth_app", "check_caller_flags", "mint"]

auth_app = cyclopts.App(name="auth", help="Mint and revoke the credentials of a static space.")
# Registered first, by name, so the command list keeps its order (recreate-issued-stores, mint, revoke-credential).
auth_app.command("cotal_trio.cli.auth:recreate_issued_stores", name="recreate-issued-stores")

Flag = Parameter(negative="")
Json = Annotated[bool, Parameter(name="--json", negative="", help="Print a JSON object.")]
Server = Annotated[str | None, Parameter(help="Broker URL (default: the root's broker on 127.0.0.1, if it runs).")]


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class MintFlags:
    """The flags every mint shares (a profile credential's and a standalone caller's)."""

    profile: Annotated[Literal["agent", "observer", "admin"], Parameter(help=(
        "What it may do: agent (its channels, DMs and inbox), observer (read-only), admin\n(read-only, DMs too)."))] = "agent"
    label: Annotated[str | None, Parameter(help=(
        "Names the credential in the root's records, and the actor of a fresh principal\n(letters, digits and _; "
        "default: the --identity principal's actor, else the profile)."))] = None
    out: Annotated[str | None, Parameter(help="Where to write the file (default ROOT/auth/creds/SPACE/LABEL.creds).")] = None
    expires_in: Annotated[int | None, Parameter(help="Lifetime in seconds (default 24 h).")] = None
    expires_at: Annotated[int | None, Parameter(help="Expiry as unix seconds.")] = None
    no_expiry: Annotated[bool, Parameter(negative="", help="No expiry at all (cotal doctor auth warns about it).")] = False
    replace: Annotated[bool, Parameter(negative="", help=(
        "Replace the label's credential; allowed once it expired, when it has no expiry, or\nwhen its key was revoked "
        "with cotal auth revoke-credential."))] = False
    identity: Annotated[str | None, Parameter(help=(
        "A file this root minted: keep its nkey and principal (a new lifecycle UID)."))] = None

    def request(self, where: Where) -> MintRequest:
        """The mint's :class:`~cotal_trio.ops.static_credentials.MintRequest` on the selected space.

        Raises:
            ConfigError: a bad space name, no root at --root, or the root does not hold the space.
        """
        sp = provisioned(where)
        return MintRequest(profile=self.profile, label=self.label, out=self.out, expires_in=self.expires_in,
                           expires_at=self.expires_at, no_expiry=self.no_expiry, replace=self.replace,
                           identity=self.identity, paths=where.paths(), sp=sp)  # fmt: skip


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class AgentFlags:
    """An agent credential's own grant (``--profile agent``, no ``--endpoint``)."""

    allow_subscribe: Annotated[str | None, Parameter(help="Agent only: comma-separated channel patterns it may read.")] = None
    allow_publish: Annotated[str | None, Parameter(help="Agent only: comma-separated channel patterns it may post to.")] = None
    role: Annotated[str | None, Parameter(help="Agent only: its role (its task queue).")] = None

    def given(self) -> list[str]:
        """The flags of this group that were passed, in flag order."""
        return [name for name, value in (("--allow-subscribe", self.allow_subscribe),
                                          ("--allow-publish", self.allow_publish), ("--role", self.role)) if value is not None]  # fmt: skip


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class CallerFlags:
    """A standalone caller's flags (``--endpoint`` and what goes with it)."""

    endpoint: Annotated[str | None, Parameter(help=(
        "A standalone caller of this endpoint: its describe and surface verbs, from the surface\nthe endpoint answers "
        "now (needs --out and a running broker)."))] = None
    channels: Annotated[str | None, Parameter(help="With --endpoint: comma-separated channel patterns it may read and post to.")] = None
    server: Annotated[str | None, Parameter(help=(
        "With --endpoint or an agent: the broker URL (default: the root's broker on 127.0.0.1,\nif it runs)."))] = None
    provision: Annotated[bool, Parameter(negative="--no-provision", help=(
        "An agent: pre-create its DM inbox (keyed by its lifecycle UID), its role's task queue and\nits two watch "
        "readers (default; --no-provision leaves them to `cotal auth provision UID`)."))] = True


def agent_grant(profile: str, agent: AgentFlags) -> dict:
    """The agent-only flags as record fields; ConfigError for another profile or a bad entry."""
    given = agent.given()
    if given and profile != "agent":
        shape, them = ("shapes", "it") if len(given) == 1 else ("shape", "them")
        raise ConfigError(f"{', '.join(given)} {shape} an agent's grant; profile {profile} has a fixed one - drop {them}")
    if agent.role is not None:
        with as_config_error():
            check_role(agent.role)
    return {
        "allow_subscribe": split_list(agent.allow_subscribe, check_channel_pattern),
        "allow_publish": split_list(agent.allow_publish, check_channel_pattern),
        "role": agent.role,
    }


def check_caller_flags(flags: MintFlags, agent: AgentFlags) -> None:
    """Refuse what ``--endpoint`` does not combine with (spec "Standalone callers": "arbitrary raw
    files, different profiles and issued-generation files are not reinterpreted").

    Raises:
        ConfigError: another profile, ``--identity``, no ``--out``, ``--allow-subscribe``,
            ``--allow-publish`` or ``--role``, or ``--no-expiry``; each sentence names the fix.
    """
    given = agent.given()
    if flags.profile != "agent":
        raise ConfigError(f"--endpoint mints an agent footprint; profile {flags.profile} does not combine with it - drop --profile")
    if flags.identity is not None:
        raise ConfigError("--identity does not combine with --endpoint: another file is not reinterpreted as a standalone "
                          "caller - drop --identity (the mint makes a fresh key)")  # fmt: skip
    if flags.out is None:
        raise ConfigError("--endpoint needs --out PATH: a standalone caller file is private and handed out by you - pass --out")
    if given:
        raise ConfigError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not combine with --endpoint - use --channels (read and post), "
                          "a standalone caller has no role")  # fmt: skip
    if flags.no_expiry:
        raise ConfigError("--no-expiry is refused with --endpoint: an issuance with no lifecycle gate must carry an "
                          "expiry - pass --expires-in or --expires-at, or neither for 24 h")  # fmt: skip


@auth_app.command
async def mint(
    *,
    flags: MintFlags = MintFlags(),
    agent: AgentFlags = AgentFlags(),
    caller: CallerFlags = CallerFlags(),
    as_json: Json = False,
    where: Where = Where(),
) -> None:
    """Mint a NATS credential file of a static space (0600) and print its receipt."""
    if caller.endpoint is None:
        if caller.channels is not None:
            raise ConfigError("--channels goes with --endpoint (a standalone caller) - for an agent pass --allow-subscribe "
                              "and --allow-publish, or add --endpoint")  # fmt: skip
        if flags.profile != "agent" and (caller.server is not None or not caller.provision):
            flag = "--server" if caller.server is not None else "--no-provision"
            raise ConfigError(f"{flag} goes with an agent or --endpoint; profile {flags.profile} is minted without the "
                              f"broker - drop {flag}")  # fmt: skip
        grant = agent_grant(flags.profile, agent)
        if flags.profile == "agent":  # an issuance (issue 19 item 2): evidence before the file
            cred, record, replaced = await mint_agent(flags.request(where), grant, caller.server, provision=caller.provision)
        else:
            cred, record, replaced = await trio.to_thread.run_sync(mint_native, flags.request(where), grant)
    else:
        check_caller_flags(flags, agent)
        if not caller.provision:
            raise ConfigError("--no-provision does not combine with --endpoint: a standalone caller's footprint is part of "
                              "its mint - drop --no-provision")  # fmt: skip
        chosen = split_list(caller.channels, check_channel_pattern)
        endpoint = callers.check_endpoint(caller.endpoint)
        cred, record, replaced = await mint_caller(flags.request(where), endpoint, chosen, caller.server)
    # An observer's or admin's mint is offline: its history readers wait for `cotal auth provision`.
    provisioned_now = flags.profile == "agent" and caller.provision
    _print_receipt(cred, record, replaced=replaced, as_json=as_json, server=_receipt_server(where, caller.server),
                   provisioned=provisioned_now)  # fmt: skip


def _provision_command(cred: Credential) -> str:
    """The command that creates ``cred``'s consumers: ``cotal auth provision <uid> --space <S>``."""
    return f"cotal auth provision {cred.lifecycle_uid} --space {cred.space}"


def _footprint_json(durables: tuple[Durable, ...]) -> list[dict[str, str]]:
    """Consumers as ``[{"stream", "name"}]`` (an admin's two history readers share one name)."""
    return [{"stream": d.stream, "name": d.name} for d in durables]


def _footprint_text(durables: tuple[Durable, ...]) -> str:
    """Consumers as ``name (stream), ...``."""
    return ", ".join(f"{d.name} ({d.stream})" for d in durables)


# The receipt's server line on a root without policy.json (a cluster's: docs/deploy.md).
UNKNOWN_SERVER = "your broker's URL (this root has no policy.json; `cotal connect-info --server` takes it)"


def _receipt_server(where: Where, server: str | None) -> str | None:
    """The broker the credential's client connects to (issue 18 item 5): ``--server``, else the
    root's ``cotal up`` broker (``policy.json``), else None."""
    paths = where.paths()
    if server is not None or not paths.policy_json.exists():
        return server
    return ",".join(resolve_servers(paths, None))


def _print_receipt(
    cred: Credential, record: LabelRecord, *, replaced: bool, as_json: bool, server: str | None, provisioned: bool,
) -> None:
    # A standalone caller's footprint is its own (ops/callers.py); the other static credentials'
    # consumers are listed, with the command that creates them when the mint did not.
    footprint = () if cred.endpoint is not None else static_issuance.footprint_of(cred)
    later = None if provisioned or not footprint else _provision_command(cred)
    if as_json:
        extra = {} if cred.endpoint is not None else {"durables": _footprint_json(footprint), "provision": later}
        print(json.dumps({**rules.receipt(cred, replaced=replaced), **extra, "server": server}, indent=2))
        return
    expiry = "never (--no-expiry: `cotal doctor auth` warns about it)" if cred.expires_at is None else (
        f"{cred.expires_at} ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(cred.expires_at))})")
    print(f"{'replaced' if replaced else 'minted'} {cred.profile} credential {cred.label} in space {cred.space}")
    rows = [("principal", cred.principal), ("lifecycle", cred.lifecycle_uid), ("user key", cred.user_key),
            ("expires", expiry), ("file", cred.path), ("inbox", f"_INBOX_{cred.inbox_nonce} (the client's inbox prefix)")]  # fmt: skip
    if cred.endpoint is not None:
        rows += [("endpoint", cred.endpoint), ("surface", cred.surface_digest), ("verbs", ", ".join(cred.verbs)),
                 ("channels", ", ".join(cred.allow_publish) or "none")]  # fmt: skip
    if cred.generation is not None:
        horizon = rules.receipt(cred, replaced=replaced)["horizon"]
        rows += [("generation", f"{cred.generation} (horizon {horizon}, "
                                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(horizon))})"),
                 ("accepted", f"{cred.accepted_token} (the token of its accepted row: its generation)")]  # fmt: skip
    if footprint:
        rows.append(("binds", _footprint_text(footprint)))
    if later is not None:
        rows.append(("provision", f"not yet: `{later}` creates them (with the broker running)"))
    rows.append(("server", server or UNKNOWN_SERVER))
    for name, value in rows:
        print(f"  {name + ' ':<10}{value}")  # a name of 10 letters (generation) still gets its space
    for old in rules.unbounded_replaced(record):
        print(f"  note: the replaced credential {old.user_key} has no expiry and still connects - revoke it with "
              f"`cotal auth revoke-credential {cred.label} --space {cred.space} --key {old.user_key}`")  # fmt: skip


@auth_app.command(name="revoke-credential")
async def revoke_credential(
    label: str,
    /,
    *,
    key: str | None = None,
    server: Server = None,
    as_json: Json = False,
    where: Where = Where(),
) -> None:
    """Revoke a credential's key: record it, sign it into the space's account, push that to the broker.

    Running it again re-pushes the account (for a broker that was down the first time).

    Parameters
    ----------
    label
        The credential's label.
    key
        Revoke this earlier key of the label (a replaced credential) instead of the current one.
    """
    with as_config_error():
        rules.check_label(label)
    sp = provisioned(where)
    done = await revoke(where.paths(), sp, label, key, server)
    _print_revoked(done.cred, done.pushed_to, done.revocations, done.retired, as_json)


def _print_revoked(cred: Credential, url: str | None, count: int, retired: int | None, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"space": cred.space, "label": cred.label, "userKey": cred.user_key,
                          "revokedAt": cred.revoked_at, "pushedTo": url, "revocations": count,
                          "retiredIssuances": retired}, indent=2))  # fmt: skip
        return
    where = (f"the account ({count} revoked keys) was pushed to {url}" if url else
             "no broker running: the revocation takes effect when the account is pushed, and its issuances are "
             f"retired then - run `cotal auth revoke-credential {cred.label} --space {cred.space}` again while the broker runs")
    if url and retired:
        where += f"; {retired} issuance{'s' if retired != 1 else ''} of its lifecycle retired"
    print(f"revoked credential {cred.label} key {cred.user_key} in space {cred.space} ({where})")


@auth_app.command(name="provision")
async def provision(uid: str, /, *, server: Server = None, as_json: Json = False, where: Where = Where()) -> None:
    """Pre-create the consumers of a static credential: an agent's DM inbox (keyed by its
    lifecycle UID), role's task queue and two watch readers; an observer's or admin's history
    readers.

    For an agent minted with --no-provision, or whose durables were removed, and for every
    observer and admin (their mint does not touch the broker). Idempotent.

    Parameters
    ----------
    uid
        The lifecycleUid its mint receipt printed.
    """
    sp = provisioned(where)
    cred, durables = await provision_uid(sp, where.paths(), uid, server)
    if as_json:
        print(json.dumps({"space": cred.space, "label": cred.label, "lifecycleUid": cred.lifecycle_uid,
                          "durables": _footprint_json(durables)}, indent=2))  # fmt: skip
        return
    print(f"provisioned lifecycle {cred.lifecycle_uid} of credential {cred.label} in space {cred.space}: "
          f"{_footprint_text(durables)}")  # fmt: skip


RENEW_FIELDS = (("--allow-subscribe", "allow_subscribe"), ("--allow-publish", "allow_publish"), ("--role", "role"))


@auth_app.command(name="renew")
async def renew(
    label: str,
    /,
    *,
    expires_in: Annotated[int | None, Parameter(help="Lifetime in seconds from now (default 24 h).")] = None,
    expires_at: Annotated[int | None, Parameter(help="Expiry as unix seconds.")] = None,
    agent: AgentFlags = AgentFlags(),
    server: Server = None,
    as_json: Json = False,
    where: Where = Where(),
) -> None:
    """Renew a static agent's credential: the same key, principal and lifecycle, a new expiry.

    It keeps its issued generation when the renewed ceiling is byte-identical (no new grant
    flags); --allow-subscribe, --allow-publish or --role give a fresh issuance on a fresh
    generation, adopted by a new connection. Renewals stop at the generation's horizon (30 days
    after the mint): then mint again with --identity FILE --replace.

    Parameters
    ----------
    label
        The credential's label.
    """
    with as_config_error():
        rules.check_label(label)
    now = int(time.time())
    exp = rules.choose_expiry(now=now, expires_in=expires_in, expires_at=expires_at, no_expiry=False)
    full, given = agent_grant("agent", agent), agent.given()
    grant = {field: full[field] for flag, field in RENEW_FIELDS if flag in given} or None  # only the flags given change
    done = await renew_agent(provisioned(where), where.paths(), label, exp=exp, grant=grant, server=server)
    cred = done.cred
    if as_json:
        print(json.dumps({**rules.receipt(cred, replaced=False), "keptGeneration": done.kept}, indent=2))
        return
    kept = "kept its generation" if done.kept else "a fresh generation (a new connection adopts it)"
    print(f"renewed credential {cred.label} in space {cred.space} until {cred.expires_at}: {kept}")
    print(f"  generation {cred.generation}\n  accepted  {cred.accepted_token}\n  file      {cred.path}")


async def recreate_issued_stores(
    backup_dir: Path, /, *, server: Server = None, where: Where = Where(),
) -> None:
    """Back a static space's issued stores up into BACKUP_DIR, delete them and create them again.

    The recovery for a store refused as drifted (`cotal auth mint --endpoint` names it). Stop every
    process using the space's issued stores first (its endpoint hosts, and anything else reading
    them): a write between the backup and the delete is lost, and callers minted before lose their
    intents (they are in the backup) - mint them again.

    Parameters
    ----------
    backup_dir
        A new or empty folder for the backup.
    """
    sp = provisioned(where)
    counts = await recreate_static_issued_stores(where.paths(), sp, backup_dir, server)
    kept = ", ".join(f"{stream}: {count} messages" for stream, count in counts.items()) or "no old stores"
    print(f"recreated space {sp.space}'s issued stores; the old ones are backed up in {backup_dir} ({kept})")
