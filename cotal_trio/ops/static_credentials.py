"""``cotal auth``: mint and revoke the credentials of a static space (issue 6 item 3).

Spec "Credential authority", section "Provisioning"; docs/static-credentials.md. The rules
(lifetime, ``--replace``, the record, the principal) are :mod:`cotal_trio.core.credentials`;
the records are :mod:`cotal_trio.state.credentials`. A mint signs a standard NATS user JWT with
the space's data-account service signing key, so the broker accepts the file by itself (a
static space has no callout). A revocation re-signs the data account JWT with the operator
signing key, its ``revocations`` rebuilt from every record of the space, saves it in
``accounts.json`` and pushes it to the running broker the way ``cotal space add`` does.

``cotal auth mint --endpoint E --out PATH [--channels a,b]`` (issue 6 item 7; spec "Standalone
callers") mints a standalone caller: it asks the endpoint for its surface now, then records the
label pending, creates the private create-only issuance intent, provisions the native footprint
and writes the file, in that order (``cli/_auth_caller.py``; the I/O steps are
:mod:`cotal_trio.ops.callers`, the rules :mod:`cotal_trio.core.callers`).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

import cyclopts
import trio
from cyclopts import Parameter

from .. import natsio
from ..broker import provision
from ..broker.accounts import open_system_connection, push_accounts
from ..broker.spaces import MODE_STATIC, resolve_server_url, space_mode
from ..core import callers, natsjwt, profiles
from ..core import credentials as rules
from ..core.credentials import Credential, LabelRecord
from ..core.creds import format_creds, parse_creds
from ..core.errors import CodecError, ConfigError
from ..core.identity import check_channel_pattern, check_role, mint_lifecycle_uid
from ..core.nkeys import KeyPair, Prefix
from ..state import (
    RootPaths,
    SpaceMaterial,
    SpacePaths,
    load_broker,
    load_owner_secret,
    load_space,
    read_json,
    save_accounts,
)
from ..state.credentials import (
    default_creds_path,
    hold_credentials,
    list_records,
    load_record,
    record_path,
    save_record,
    write_creds,
)
from ._servers import resolve_servers
from .actor import as_config_error, provisioned, split_list
from .common import Where

__all__ = [
    "MintFlags",
    "MintPlan",
    "auth_app",
    "check_label_state",
    "creds_text",
    "mint",
    "mint_native",
    "new_credential",
    "plan_mint",
    "revoke_credential",
    "trust_conflict",
    "undo_record",
]

auth_app = cyclopts.App(name="auth", help="Mint and revoke the credentials of a static space.")
auth_app.command("cotal_trio.cli._auth_caller:recreate_issued_stores", name="recreate-issued-stores")

LIFECYCLE_UID_RANDOM_BYTES = 20
INBOX_NONCE_BYTES = 16
ROOT_MARKER = "broker.json"  # a folder holding it is a root
DOT_ROOT = ".cotal"
PUSH_DEADLINE_S = 30

Flag = Parameter(negative="")
Json = Annotated[bool, Parameter(name="--json", negative="", help="Print a JSON object.")]
Server = Annotated[str | None, Parameter(help="Broker URL (default: the root's broker on 127.0.0.1, if it runs).")]
CallerServer = Annotated[str | None, Parameter(
    help="With --endpoint: the broker URL (default: the root's broker on 127.0.0.1, if it runs).")]


# -- checks before anything is signed --------------------------------------------------------------


def static_space(where: Where) -> tuple[SpacePaths, SpaceMaterial]:
    """The selected space's paths and material, once it is a provisioned static space.

    Raises:
        ConfigError: not provisioned, or a user-auth space (the sentence says why it refuses).
    """
    sp = provisioned(where)
    if space_mode(sp) != MODE_STATIC:
        raise ConfigError(
            f"space {sp.space} is a user-auth space: its agents join under a logged-in user (`cotal actor "
            "grant` and the exchange), never with a handed-out credential file - mint on a static space "
            "(`cotal space add NAME --static`)"
        )
    return sp, load_space(sp.callout_json, sp.space)


def _roots_near(folder: Path) -> list[Path]:
    """The roots a folder holds: ``<folder>/.cotal``, and the root it lies in (if any)."""
    found = [folder / DOT_ROOT] if (folder / DOT_ROOT / ROOT_MARKER).exists() else []
    found += [p for p in (folder, *folder.parents) if (p / ROOT_MARKER).exists()][:1]
    return found


def _data_account(root: Path, space: str) -> str | None:
    try:
        account = read_json(RootPaths(root).space(space).accounts_json).get("data", {}).get("account")
    except (ConfigError, AttributeError):
        return None
    return account if isinstance(account, str) else None


def trust_conflict(paths: RootPaths, space: str, data_account: str, folders: list[Path]) -> str | None:
    """The refusal when a folder holds trust for another space or account, else None.

    A folder "holds trust" for a root when it contains ``.cotal/broker.json`` or lies inside a
    root. Another root is fine only when it holds the same space with the same data account
    (the same trust under another path). Blocking file reads.
    """
    selected = paths.root.resolve()
    for folder in dict.fromkeys(f.resolve() for f in folders):
        for other in _roots_near(folder):
            if other.resolve() == selected:
                continue
            theirs = _data_account(other, space)
            if theirs == data_account:
                continue
            there = f"space {space} is account {theirs} there" if theirs else f"it has no space {space}"
            return (
                f"{folder} holds trust for another root, {other} ({there}), but this mint signs with root "
                f"{paths.root} (space {space}, account {data_account}) - run it from another folder, write "
                f"--out outside {folder}, or pass --root {other} to mint there"
            )
    return None


def agent_grant(profile: str, allow_subscribe: str | None, allow_publish: str | None, role: str | None) -> dict:
    """The agent-only flags as record fields; ConfigError for another profile or a bad entry."""
    given = [name for name, value in (("--allow-subscribe", allow_subscribe), ("--allow-publish", allow_publish),
                                      ("--role", role)) if value is not None]  # fmt: skip
    if given and profile != "agent":
        shape, them = ("shapes", "it") if len(given) == 1 else ("shape", "them")
        raise ConfigError(f"{', '.join(given)} {shape} an agent's grant; profile {profile} has a fixed one - drop {them}")
    if role is not None:
        with as_config_error():
            check_role(role)
    return {
        "allow_subscribe": split_list(allow_subscribe, check_channel_pattern),
        "allow_publish": split_list(allow_publish, check_channel_pattern),
        "role": role,
    }


def read_identity(path: str, material: SpaceMaterial) -> tuple[KeyPair, str, str]:
    """``(key, owner, actor)`` of a ``.creds`` file this space's root minted (``--identity``).

    Raises:
        ConfigError: unreadable, not a creds file, its seed not the JWT's user, or minted into
            another account (the sentence names both accounts).
    """
    try:
        jwt, seed = parse_creds(Path(path).expanduser().read_text())
        key = KeyPair.from_seed(seed)
        claims = natsjwt.verify(jwt)
    except (CodecError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--identity {path} is not a NATS credential file ({exc}) - pass a file `cotal auth mint` wrote") from None
    if key.prefix != Prefix.USER or claims.get("sub") != key.public_key:
        raise ConfigError(f"--identity {path}: its seed is not the user its JWT names - pass an unedited file")
    account = claims["nats"].get("issuer_account")
    signers = (material.data_callout_signing.public_key, material.data_service_signing.public_key)
    if account != material.data_account or claims.get("iss") not in signers:
        raise ConfigError(
            f"--identity {path} was minted into account {account}, not space {material.space}'s account "
            f"{material.data_account} - pass a file of this space, or --space its own space"
        )
    owner, actor = rules.principal_of_claims(claims)
    return key, owner, actor


def permissions_of(cred: Credential) -> dict:
    """The NATS ``{pub, sub}`` of ``cred``'s profile (:func:`cotal_trio.core.profiles.profile_permissions`),
    or of a standalone caller (:func:`cotal_trio.core.callers.standalone_caller_permissions`).

    Raises:
        ConfigError: an input breaks its grammar.

    Spec "Provisioning" / "Standalone callers".
    """
    if cred.endpoint is not None:
        with as_config_error():
            return callers.standalone_caller_permissions(
                space=cred.space, owner=cred.owner, actor=cred.actor, channels=cred.allow_publish,
                inbox_nonce=cred.inbox_nonce, endpoint=cred.endpoint, verbs=cred.verbs,
            ).to_nats()  # fmt: skip
    context: dict = {"space": cred.space, "inbox_nonce": cred.inbox_nonce}
    if cred.profile == "agent":
        context.update(owner=cred.owner, actor=cred.actor, allow_publish=cred.allow_publish,
                       allow_subscribe=cred.allow_subscribe, role=cred.role)  # fmt: skip
    with as_config_error():
        return profiles.profile_permissions(cred.profile, **context).to_nats()


def _check_out(out: Path, record: LabelRecord | None, identity: str | None) -> None:
    ours = {Path(c.path) for c in (record.all() if record else ())}
    if identity is not None:
        ours.add(Path(identity).expanduser().absolute())
    if out.exists() and out not in ours:
        raise ConfigError(f"{out} exists and is not this label's credential - choose another --out, or move it aside")


# -- mint ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MintFlags:
    """The flags every mint shares (``cotal auth mint``'s parameters, as given).

    Spec "Provisioning" / "Standalone callers".
    """

    profile: str
    label: str | None
    out: str | None
    expires_in: int | None
    expires_at: int | None
    no_expiry: bool
    replace: bool
    identity: str | None
    where: Where


@dataclass(frozen=True, slots=True, kw_only=True)
class MintPlan:
    """What a mint signs with and where it writes, once the space, label and folders checked out.

    Spec "Provisioning" / "Standalone callers".
    """

    sp: SpacePaths
    material: SpaceMaterial
    paths: RootPaths
    now: int
    exp: int | None
    key: KeyPair
    owner: str
    actor: str
    label: str
    target: Path


def plan_mint(flags: MintFlags) -> MintPlan:
    """The space, lifetime, key, principal, label and file of a mint (blocking file reads).

    Raises:
        ConfigError: not a static space, a lifetime flag, an ``--identity`` or label problem, or
            trust held for another root (:func:`trust_conflict`).

    Spec "Provisioning" / "Standalone callers".
    """
    sp, material = static_space(flags.where)
    now = int(time.time())
    exp = rules.choose_expiry(now=now, expires_in=flags.expires_in, expires_at=flags.expires_at, no_expiry=flags.no_expiry)
    if flags.identity is not None:
        key, owner, actor = read_identity(flags.identity, material)
    else:
        key, owner, actor = KeyPair.generate(Prefix.USER), rules.static_owner(load_owner_secret(sp.owner_secret_json)), None
    name = rules.check_label(flags.label if flags.label is not None else actor or flags.profile)
    paths = flags.where.paths()
    target = Path(flags.out).expanduser().absolute() if flags.out is not None else default_creds_path(paths, sp.space, name)
    conflict = trust_conflict(paths, sp.space, material.data_account, [Path.cwd(), target.parent])
    if conflict is not None:
        raise ConfigError(conflict)
    return MintPlan(sp=sp, material=material, paths=paths, now=now, exp=exp, key=key, owner=owner,
                    actor=actor or name, label=name, target=target)  # fmt: skip


def check_label_state(plan: MintPlan, flags: MintFlags) -> tuple[LabelRecord | None, int]:
    """``(the label's record, the new JWT's iat)``; hold the credential lock (blocking reads).

    Raises:
        ConfigError: the label may not be minted (:func:`~cotal_trio.core.credentials.check_replace`,
            an interrupted standalone-caller mint included), ``--out`` is another file, or the
            expiry is not after the issue time.

    Spec "Provisioning" / "Standalone callers".
    """
    record = load_record(plan.sp, plan.label)
    if flags.identity is not None:
        _check_identity_label(plan.sp, plan.label, plan.key.public_key, flags.identity)
    pending_file = record is not None and record.current.pending and Path(record.current.path).exists()
    rules.check_replace(record, replace=flags.replace, space=plan.sp.space, now=plan.now, pending_file=pending_file)
    _check_out(plan.target, record, flags.identity)
    iat = rules.issue_time(record, plan.key.public_key, now=plan.now)
    if plan.exp is not None and plan.exp <= iat:
        raise ConfigError(f"the expiry {plan.exp} is not after the issue time {iat} - pass a later --expires-at")
    return record, iat


def new_credential(plan: MintPlan, flags: MintFlags, *, iat: int, grant: dict, uid: str | None = None, **caller) -> Credential:
    """The credential a mint records: lifecycle ``uid`` (default a fresh one) and a fresh inbox
    nonce (``caller``: a standalone caller's ``endpoint``, ``surface_digest``, ``verbs``, ``pending``).

    Raises:
        ConfigError: a field breaks its grammar (a flag the checks let through).

    Spec "Provisioning" / "Standalone callers".
    """
    uid = uid or mint_lifecycle_uid(os.urandom(LIFECYCLE_UID_RANDOM_BYTES))
    with as_config_error():
        return Credential(
            label=plan.label, space=plan.sp.space, profile=flags.profile, owner=plan.owner, actor=plan.actor,
            lifecycle_uid=uid, user_key=plan.key.public_key,
            issued_at=iat, expires_at=plan.exp, path=str(plan.target),
            inbox_nonce=secrets.token_urlsafe(INBOX_NONCE_BYTES), **grant, **caller,
        )  # fmt: skip


def creds_text(cred: Credential, plan: MintPlan) -> tuple[str, dict]:
    """``(the .creds text, its NATS permissions)``: the JWT signed by the data account's service key.

    Spec "Provisioning" / "Standalone callers".
    """
    permissions = permissions_of(cred)
    claims = rules.credential_claims(cred, data_account=plan.material.data_account, permissions=permissions)
    return format_creds(natsjwt.encode(claims, plan.material.data_service_signing, iat=cred.issued_at), plan.key.seed), permissions


def undo_record(sp: SpacePaths, label: str, record: LabelRecord | None) -> None:
    """Put the label's record back as it was before a mint (none: remove it). Blocking.

    Spec "Provisioning" / "Standalone callers".
    """
    if record is None:
        record_path(sp, label).unlink(missing_ok=True)
    else:
        save_record(sp, record)


def mint_native(flags: MintFlags, grant: dict) -> tuple[Credential, LabelRecord, bool]:
    """A profile mint (blocking): checks, the record, then the file; a failed write undoes the record.

    Returns:
        ``(the credential, the label's record now, whether it replaced one)``.

    Spec "Provisioning" / "Standalone callers".
    """
    plan = plan_mint(flags)
    with hold_credentials(plan.sp):
        record, iat = check_label_state(plan, flags)
        cred = new_credential(plan, flags, iat=iat, grant=grant)
        text, _ = creds_text(cred, plan)
        fresh = LabelRecord(current=cred) if record is None else record.replace_with(cred, now=plan.now)
        save_record(plan.sp, fresh)  # first: a file that exists is always recorded, so it can be revoked
        try:
            write_creds(plan.target, text)
        except BaseException:  # the file never existed (its seed was never written): undo the record
            undo_record(plan.sp, plan.label, record)
            raise
    return cred, fresh, record is not None


@auth_app.command
async def mint(
    *,
    profile: Literal["agent", "observer", "admin"] = "agent",
    label: str | None = None,
    out: str | None = None,
    expires_in: int | None = None,
    expires_at: int | None = None,
    no_expiry: Annotated[bool, Flag] = False,
    replace: Annotated[bool, Flag] = False,
    identity: str | None = None,
    allow_subscribe: str | None = None,
    allow_publish: str | None = None,
    role: str | None = None,
    endpoint: str | None = None,
    channels: str | None = None,
    server: CallerServer = None,
    as_json: Json = False,
    where: Where = Where(),
) -> None:
    """Mint a NATS credential file of a static space (0600) and print its receipt.

    Parameters
    ----------
    profile
        What it may do: agent (its channels, DMs and inbox), observer (read-only), admin
        (read-only, DMs too).
    label
        Names the credential in the root's records, and the actor of a fresh principal
        (letters, digits and _; default: the --identity principal's actor, else the profile).
    out
        Where to write the file (default ROOT/auth/creds/SPACE/LABEL.creds).
    expires_in
        Lifetime in seconds (default 24 h).
    expires_at
        Expiry as unix seconds.
    no_expiry
        No expiry at all (cotal doctor auth warns about it).
    replace
        Replace the label's credential; allowed once it expired, when it has no expiry, or
        when its key was revoked with cotal auth revoke-credential.
    identity
        A file this root minted: keep its nkey and principal (a new lifecycle UID).
    allow_subscribe
        Agent only: comma-separated channel patterns it may read.
    allow_publish
        Agent only: comma-separated channel patterns it may post to.
    role
        Agent only: its role (its task queue).
    endpoint
        A standalone caller of this endpoint: its describe and surface verbs, from the surface
        the endpoint answers now (needs --out and a running broker).
    channels
        With --endpoint: comma-separated channel patterns it may read and post to.
    """
    flags = MintFlags(profile=profile, label=label, out=out, expires_in=expires_in, expires_at=expires_at,
                      no_expiry=no_expiry, replace=replace, identity=identity, where=where)  # fmt: skip
    if endpoint is None:
        if channels is not None or server is not None:
            raise ConfigError(f"{'--channels' if channels is not None else '--server'} goes with --endpoint (a standalone "
                              "caller) - for an agent pass --allow-subscribe and --allow-publish, or add --endpoint")  # fmt: skip
        grant = agent_grant(profile, allow_subscribe, allow_publish, role)
        cred, record, replaced = await trio.to_thread.run_sync(mint_native, flags, grant)
    else:
        from ._auth_caller import check_caller_flags, mint_caller  # it builds on this module's mint steps

        check_caller_flags(flags, allow_subscribe, allow_publish, role)
        chosen = split_list(channels, check_channel_pattern)
        cred, record, replaced = await mint_caller(flags, callers.check_endpoint(endpoint), chosen, server)
    _print_receipt(cred, record, replaced=replaced, as_json=as_json, server=_receipt_server(where, server))


# The receipt's server line on a root without policy.json (a cluster's: docs/deploy.md).
UNKNOWN_SERVER = "your broker's URL (this root has no policy.json; `cotal connect-info --server` takes it)"


def _receipt_server(where: Where, server: str | None) -> str | None:
    """The broker the credential's client connects to (issue 18 item 5): ``--server``, else the
    root's ``cotal up`` broker (``policy.json``), else None."""
    paths = where.paths()
    if server is not None or not paths.policy_json.exists():
        return server
    return ",".join(resolve_servers(paths, None))


def _print_receipt(cred: Credential, record: LabelRecord, *, replaced: bool, as_json: bool, server: str | None) -> None:
    if as_json:
        print(json.dumps({**rules.receipt(cred, replaced=replaced), "server": server}, indent=2))
        return
    expiry = "never (--no-expiry: `cotal doctor auth` warns about it)" if cred.expires_at is None else (
        f"{cred.expires_at} ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(cred.expires_at))})")
    print(f"{'replaced' if replaced else 'minted'} {cred.profile} credential {cred.label} in space {cred.space}")
    rows = [("principal", cred.principal), ("lifecycle", cred.lifecycle_uid), ("user key", cred.user_key),
            ("expires", expiry), ("file", cred.path), ("inbox", f"_INBOX_{cred.inbox_nonce} (the client's inbox prefix)")]  # fmt: skip
    if cred.endpoint is not None:
        rows += [("endpoint", cred.endpoint), ("surface", cred.surface_digest), ("verbs", ", ".join(cred.verbs)),
                 ("channels", ", ".join(cred.allow_publish) or "none")]  # fmt: skip
    rows.append(("server", server or UNKNOWN_SERVER))
    for name, value in rows:
        print(f"  {name:<10}{value}")
    for old in rules.unbounded_replaced(record):
        print(f"  note: the replaced credential {old.user_key} has no expiry and still connects - revoke it with "
              f"`cotal auth revoke-credential {cred.label} --space {cred.space} --key {old.user_key}`")  # fmt: skip


# -- revoke-credential -----------------------------------------------------------------------------


def _revoke_in_root(paths: RootPaths, sp: SpacePaths, label: str, key: str | None, now: int) -> tuple[Credential, str, int]:
    """Mark the key revoked in the record, and sign the data account with every revocation.

    Returns:
        ``(the revoked credential, the new data account JWT, how many keys it revokes)``.
    """
    broker = load_broker(paths.broker_json)
    with hold_credentials(sp):
        record = load_record(sp, label)
        if record is None:
            raise ConfigError(f"space {sp.space} has no credential labelled {label} - see `cotal doctor auth`")
        matches = [c for c in record.all() if (c is record.current if key is None else c.user_key == key)]
        if not matches:
            raise ConfigError(f"credential {label} never had key {key} - see `cotal doctor auth` for its keys")
        revoked = {c.lifecycle_uid: replace(c, revoked_at=c.revoked_at or max(now, c.issued_at)) for c in matches}
        record = LabelRecord(current=revoked.get(record.current.lifecycle_uid, record.current),
                             replaced=tuple(revoked.get(c.lifecycle_uid, c) for c in record.replaced))  # fmt: skip
        # Everything that can refuse comes before the first write: a revocation is recorded only
        # together with the account that carries it (then the account; a re-run re-signs it).
        records, bad = list_records(sp)
        if bad:
            raise ConfigError(f"{bad[0][1]} - the account cannot carry the revocations of a record it cannot read")
        records = [record if other.current.label == label else other for other in records]
        keys = rules.revocations(records, now=now)
        accounts = provision.load_space_accounts(paths, broker, sp.space)
        previous = natsjwt.verify(accounts.data_jwt)
        claims = rules.with_revocations(previous, keys)
        data_jwt = natsjwt.encode(claims, broker.operator_signing, iat=max(now, int(previous.get("iat", 0)) + 1))
        save_record(sp, record)
        save_accounts(sp.accounts_json, replace(accounts, data_jwt=data_jwt))
    return revoked[matches[0].lifecycle_uid], data_jwt, len(keys)


def _check_identity_label(sp: SpacePaths, label: str, user_key: str, identity: str) -> None:
    """Refuse an ``--identity`` whose key another label's credential holds: two labels sharing one
    nkey would revoke each other (a revocation names the key).

    Raises:
        ConfigError: the key belongs to another label; names it.
    """
    records, _bad = list_records(sp)
    for other in records:
        if other.current.label != label and any(c.user_key == user_key for c in other.all()):
            raise ConfigError(
                f"the key of --identity {identity} belongs to credential {other.current.label} - replace that one "
                f"(--label {other.current.label} --replace), or mint {label} without --identity"
            )


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
    paths = where.paths()
    cred, data_jwt, count = await trio.to_thread.run_sync(_revoke_in_root, paths, sp, label, key, int(time.time()))
    try:
        with trio.fail_after(PUSH_DEADLINE_S):
            url = await resolve_server_url(paths, server)
            if url is not None:
                broker = await trio.to_thread.run_sync(load_broker, paths.broker_json)
                async with natsio.open_loop(), open_system_connection(url, broker) as conn:
                    await push_accounts(conn, [data_jwt])
    except trio.TooSlowError:
        raise ConfigError(f"pushing space {sp.space}'s account did not finish within {PUSH_DEADLINE_S} s - "
                          f"run `cotal auth revoke-credential {label} --space {sp.space}` again") from None  # fmt: skip
    _print_revoked(cred, url, count, as_json)


def _print_revoked(cred: Credential, url: str | None, count: int, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"space": cred.space, "label": cred.label, "userKey": cred.user_key,
                          "revokedAt": cred.revoked_at, "pushedTo": url, "revocations": count}, indent=2))  # fmt: skip
        return
    where = (f"the account ({count} revoked keys) was pushed to {url}" if url else
             "no broker running: the revocation takes effect when the account is pushed - run "
             f"`cotal auth revoke-credential {cred.label} --space {cred.space}` again while the broker runs")
    print(f"revoked credential {cred.label} key {cred.user_key} in space {cred.space} ({where})")

