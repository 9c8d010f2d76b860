"""Static-space credentials: mint and revoke them (issue 6 item 3; the I/O ``cotal auth`` runs).

Spec "Credential authority", section "Provisioning"; docs/static-credentials.md. The rules
(lifetime, ``--replace``, the record, the principal) are :mod:`cotal_trio.core.credentials`;
the records are :mod:`cotal_trio.state.credentials`. A mint signs a standard NATS user JWT with
the space's data-account service signing key, so the broker accepts the file by itself (a
static space has no callout). A revocation re-signs the data account JWT with the operator
signing key, its ``revocations`` rebuilt from every record of the space, saves it in
``accounts.json`` and pushes it to the running broker the way ``cotal space add`` does.

A mint is :func:`plan_mint` (the space, lifetime, key, principal, label and file), then under
the credential lock :func:`check_label_state`, :func:`new_credential` and :func:`creds_text`;
:func:`mint_native` writes a profile credential, :func:`cotal_trio.ops.caller_mint.mint_caller`
a standalone caller with the same steps. ``cli/auth.py`` parses the flags into a
:class:`MintRequest` and prints the receipt.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path

import trio

from cotal_trio import natsio
from cotal_trio.broker import provision
from cotal_trio.broker.accounts import open_system_connection, push_accounts
from cotal_trio.broker.spaces import MODE_STATIC, resolve_server_url, space_mode
from cotal_trio.core import callers, natsjwt, profiles, static_issuance
from cotal_trio.core import credentials as rules
from cotal_trio.core.credentials import Credential, LabelRecord
from cotal_trio.core.creds import format_creds, parse_creds
from cotal_trio.core.errors import CodecError, ConfigError, Unavailable
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.ops.callers import open_temporary_user
from cotal_trio.ops.errors import as_config_error, one_sentence
from cotal_trio.state import (
    RootPaths,
    SpaceMaterial,
    SpacePaths,
    load_broker,
    load_owner_secret,
    load_space,
    read_json,
    save_accounts,
)
from cotal_trio.stores.issued import IssuedStores, IssuedStoresMissing
from cotal_trio.state.credentials import (
    default_creds_path,
    hold_credentials,
    list_records,
    load_record,
    record_path,
    save_record,
    write_creds,
)

__all__ = [
    "INBOX_NONCE_BYTES",
    "LIFECYCLE_UID_RANDOM_BYTES",
    "PUSH_DEADLINE_S",
    "MintPlan",
    "MintRequest",
    "Revoked",
    "check_label_state",
    "creds_text",
    "mint_native",
    "new_credential",
    "permissions_of",
    "plan_mint",
    "read_identity",
    "revoke_credential",
    "retire_issuances",
    "read_own_key",
    "revoke_in_root",
    "signed_creds",
    "static_space",
    "trust_conflict",
    "undo_record",
]

LIFECYCLE_UID_RANDOM_BYTES = 20
INBOX_NONCE_BYTES = 16
ROOT_MARKER = "broker.json"  # a folder holding it is a root
DOT_ROOT = ".cotal"
PUSH_DEADLINE_S = 30


# -- checks before anything is signed --------------------------------------------------------------


def static_space(sp: SpacePaths) -> tuple[SpacePaths, SpaceMaterial]:
    """``sp`` (a provisioned space) and its material, once it is a static space.

    Raises:
        ConfigError: a user-auth space (the sentence says why it refuses).
    """
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
    of an issued static agent (:func:`cotal_trio.core.static_issuance.issued_agent_permissions`:
    its ``ep.v1`` rows and UID-keyed inbox), or of a standalone caller
    (:func:`cotal_trio.core.callers.standalone_caller_permissions`).

    Raises:
        ConfigError: an input breaks its grammar.

    Spec "Provisioning" / "Issued authority" / "Standalone callers".
    """
    if cred.generation is not None:
        with as_config_error():
            return static_issuance.issued_agent_permissions(cred).to_nats()
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
class MintRequest:
    """What every mint is asked for (``cotal auth mint``'s shared flags, as given, and its space).

    Attributes:
        profile: ``agent``, ``observer`` or ``admin``.
        label: the record's label, or None (the ``identity``'s actor, else the profile).
        out: the file to write, or None (``ROOT/auth/creds/SPACE/LABEL.creds``).
        expires_in, expires_at: the lifetime in seconds, or the expiry in unix seconds.
        no_expiry: no expiry at all.
        replace: replace the label's credential (:func:`~cotal_trio.core.credentials.check_replace`).
        identity: a ``.creds`` file this root minted whose key and principal the mint keeps.
        paths: the root.
        sp: the space's paths, already found in the root (``Where.provisioned``).

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
    paths: RootPaths
    sp: SpacePaths


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


def plan_mint(flags: MintRequest) -> MintPlan:
    """The space, lifetime, key, principal, label and file of a mint (blocking file reads).

    Raises:
        ConfigError: not a static space, a lifetime flag, an ``--identity`` or label problem, or
            trust held for another root (:func:`trust_conflict`).

    Spec "Provisioning" / "Standalone callers".
    """
    sp, material = static_space(flags.sp)
    now = int(time.time())
    exp = rules.choose_expiry(now=now, expires_in=flags.expires_in, expires_at=flags.expires_at, no_expiry=flags.no_expiry)
    if flags.identity is not None:
        key, owner, actor = read_identity(flags.identity, material)
    else:
        key, owner, actor = KeyPair.generate(Prefix.USER), rules.static_owner(load_owner_secret(sp.owner_secret_json)), None
    name = rules.check_label(flags.label if flags.label is not None else actor or flags.profile)
    paths = flags.paths
    target = Path(flags.out).expanduser().absolute() if flags.out is not None else default_creds_path(paths, sp.space, name)
    conflict = trust_conflict(paths, sp.space, material.data_account, [Path.cwd(), target.parent])
    if conflict is not None:
        raise ConfigError(conflict)
    return MintPlan(sp=sp, material=material, paths=paths, now=now, exp=exp, key=key, owner=owner,
                    actor=actor or name, label=name, target=target)  # fmt: skip


def check_label_state(plan: MintPlan, flags: MintRequest) -> tuple[LabelRecord | None, int]:
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


def new_credential(plan: MintPlan, flags: MintRequest, *, iat: int, grant: dict, uid: str | None = None, **caller) -> Credential:
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
    return signed_creds(cred, plan.material, plan.key)


def signed_creds(cred: Credential, material: SpaceMaterial, key: KeyPair) -> tuple[str, dict]:
    """``(the .creds text, its NATS permissions)`` of ``cred`` with user ``key``, signed by
    ``material``'s data-account service key.

    Raises:
        ConfigError: an input breaks its grammar.

    Spec "Provisioning".
    """
    permissions = permissions_of(cred)
    claims = rules.credential_claims(cred, data_account=material.data_account, permissions=permissions)
    return format_creds(natsjwt.encode(claims, material.data_service_signing, iat=cred.issued_at), key.seed), permissions


def read_own_key(cred: Credential) -> KeyPair:
    """The user key in ``cred``'s own file (a renewal keeps it). Blocking read.

    Raises:
        ConfigError: the file is missing, unreadable, or holds another key.

    Spec "Issued authority" (renewal).
    """
    try:
        _, seed = parse_creds(Path(cred.path).read_text())
        key = KeyPair.from_seed(seed)
    except (OSError, CodecError, UnicodeDecodeError) as exc:
        raise ConfigError(f"credential {cred.label}'s file {cred.path} cannot be read ({exc}) - a renewal keeps the "
                          f"key in it; put the file back, or {_revoke_and_remint(cred)}") from None  # fmt: skip
    if key.public_key != cred.user_key:
        raise ConfigError(f"{cred.path} does not hold credential {cred.label}'s key {cred.user_key} - put its own file back, "
                          f"or {_revoke_and_remint(cred)}")  # fmt: skip
    return key


def _revoke_and_remint(cred: Credential) -> str:
    """The way past a credential whose file is lost: ``--replace`` alone refuses a live one."""
    return (f"revoke the credential (`cotal auth revoke-credential {cred.label} --space {cred.space}`) and mint it again"
            f" (`cotal auth mint --label {cred.label} --space {cred.space} --replace`)")


def undo_record(sp: SpacePaths, label: str, record: LabelRecord | None) -> None:
    """Put the label's record back as it was before a mint (none: remove it). Blocking.

    Spec "Provisioning" / "Standalone callers".
    """
    if record is None:
        record_path(sp, label).unlink(missing_ok=True)
    else:
        save_record(sp, record)


def mint_native(flags: MintRequest, grant: dict) -> tuple[Credential, LabelRecord, bool]:
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


# -- revoke-credential -----------------------------------------------------------------------------


def revoke_in_root(
    paths: RootPaths, sp: SpacePaths, label: str, key: str | None, now: int
) -> tuple[Credential, str, int, tuple[Credential, ...]]:
    """Mark the key revoked in the record, and sign the data account with every revocation
    (blocking; under the space's credential lock).

    Raises:
        ConfigError: no such label or key, or a record of the space cannot be read; nothing
            was written.

    Returns:
        ``(the revoked credential, the new data account JWT, how many keys it revokes, every
        credential revoked now that carries an issued generation)``.
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
    issued = tuple(c for c in revoked.values() if c.generation is not None)
    return revoked[matches[0].lifecycle_uid], data_jwt, len(keys), issued


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


@dataclass(frozen=True, slots=True)
class Revoked:
    """What a revocation did: the revoked credential, where its account went, how many keys it revokes.

    Attributes:
        cred: the credential, ``revoked_at`` set.
        pushed_to: the broker URL the account was pushed to, or None (no broker running).
        revocations: how many keys the space's data account now revokes.
        retired: how many issuances of the revoked credentials' ledger families were retired now
            (spec "Issued authority"), or None when none could be (no broker running).
    """

    cred: Credential
    pushed_to: str | None
    revocations: int
    retired: int | None = 0


async def revoke_credential(paths: RootPaths, sp: SpacePaths, label: str, key: str | None, server: str | None) -> Revoked:
    """Trio: revoke ``label``'s key (its current one, or ``key``): record it, sign it into the
    space's account (:func:`revoke_in_root`), push that to the broker at ``server`` (default: the
    root's, if it runs), then retire the issuances of every revoked static agent's credential
    ledger family (:func:`~cotal_trio.core.static_issuance.ledger_family`: the lifecycle terminal,
    spec "Issued authority"). Running it again re-pushes the account and retires again.

    Raises:
        ConfigError: as :func:`revoke_in_root`; the issued stores are drifted; or the push and
            retirement did not finish within :data:`PUSH_DEADLINE_S` (the record and account are
            written: the sentence says to run it again).

    Spec "Provisioning" / "Issued authority".
    """
    cred, data_jwt, count, issued = await trio.to_thread.run_sync(revoke_in_root, paths, sp, label, key, int(time.time()))
    retired: int | None = None
    try:
        with trio.fail_after(PUSH_DEADLINE_S):
            url = await resolve_server_url(paths, server)
            if url is not None:
                broker = await trio.to_thread.run_sync(load_broker, paths.broker_json)
                async with natsio.open_loop(), open_system_connection(url, broker) as conn:
                    await push_accounts(conn, [data_jwt])
                retired = await retire_issuances(paths, sp, url, issued) if issued else 0
    except trio.TooSlowError:
        raise ConfigError(f"pushing space {sp.space}'s account did not finish within {PUSH_DEADLINE_S} s - "
                          f"run `cotal auth revoke-credential {label} --space {sp.space}` again") from None  # fmt: skip
    return Revoked(cred, url, count, retired)


async def retire_issuances(paths: RootPaths, sp: SpacePaths, url: str, creds: tuple[Credential, ...]) -> int:
    """Trio: retire every live issuance naming the ledger family of each of ``creds`` (a temporary
    ``issuer`` user of the space); how many were active.

    Raises:
        ConfigError: the broker cannot be reached or the issued stores do not answer (the
            sentence names the rerun), or a store is drifted.

    Spec "Issued authority".
    """
    material = await trio.to_thread.run_sync(load_space, sp.callout_json, sp.space)
    nonce = secrets.token_urlsafe(INBOX_NONCE_BYTES)
    permissions = profiles.issuer_permissions(space=sp.space, inbox_nonce=nonce).to_nats()
    retired = 0
    rerun = f"run `cotal auth revoke-credential {creds[0].label} --space {sp.space}` again to retire its issuances"
    try:
        with one_sentence():
            async with natsio.open_loop(), open_temporary_user(material, url, name=f"cotal:retire:{sp.space}",
                                                               permissions=permissions, inbox_nonce=nonce,
                                                               now=int(time.time())) as conn:  # fmt: skip
                stores = IssuedStores(conn, sp.space)
                for cred in creds:
                    source = static_issuance.ledger_family(sp.space, cred.lifecycle_uid)
                    retired += await stores.retire_source(source, now=time.time())
    except IssuedStoresMissing:
        return retired  # no store: nothing was ever issued there
    except Unavailable as exc:
        raise ConfigError(f"the key is revoked, but its issuances were not retired ({exc}) - {rerun}") from None
    return retired
