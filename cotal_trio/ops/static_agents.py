"""Static agents: a mint that is an issuance, its bind-only durables, and its renewal (issue 19
items 2 and 3; spec credential-authority "Issued authority", "Provisioning", "DM confidentiality";
docs/static-credentials.md, docs/issued-authority.md "Static agents").

``cotal auth mint --profile agent`` runs :func:`mint_agent`: the checks every mint shares
(:mod:`cotal_trio.ops.static_credentials`), a fresh lifecycle UID, a fresh generation whose
horizon is 30 days after the mint and an accepted token chosen now, then over a temporary
data-account user of the space (:func:`~cotal_trio.core.static_issuance.static_minter_permissions`):

1. the issued stores, created or verified in their current shape;
2. the **evidence** of the credential's final ceiling (its JWT's ``{pub, sub}``, the ``ep.v1`` rows
   included), its attempt ``prepared`` then ``active`` and its source index row
   (:meth:`~cotal_trio.stores.issued.IssuedStores.issue`), then the accepted row under the token
   (:meth:`~cotal_trio.stores.issued.IssuedStores.accept`);
3. with ``provision`` (the default), the space's streams, the DM inbox durable keyed by the
   lifecycle UID and the role's task queue (:func:`provision_durables`);
4. the record, then the ``.creds`` file (0600, temporary file and rename).

A failure before the file leaves no file and no record; an issuance already written is marked
revoked (best effort) and is carried by no credential either way, so it authorizes nothing: the
sentence says to run the same mint again (a rerun picks a fresh UID, generation and token).

``cotal auth provision UID`` runs :func:`provision_uid`; ``cotal auth renew LABEL`` runs
:func:`renew_agent`.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import trio

from cotal_trio import natsio
from cotal_trio.broker.spaces import resolve_server_url
from cotal_trio.core import static_issuance
from cotal_trio.core.credentials import Credential, LabelRecord
from cotal_trio.core.errors import ConfigError, Refused, Unavailable
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.issued import new_generation, static_agent_horizon
from cotal_trio.core.nkeys import KeyPair
from cotal_trio.ops.caller_mint import held_credentials
from cotal_trio.ops.callers import ensure_issued_stores, open_temporary_user
from cotal_trio.ops.errors import one_sentence
from cotal_trio.ops.static_credentials import (
    INBOX_NONCE_BYTES,
    LIFECYCLE_UID_RANDOM_BYTES,
    MintRequest,
    check_label_state,
    creds_text,
    new_credential,
    plan_mint,
    read_own_key,
    signed_creds,
    static_space,
    undo_record,
)
from cotal_trio.state import RootPaths, SpaceMaterial, SpacePaths
from cotal_trio.state.credentials import list_records, load_record, save_record, write_creds
from cotal_trio.stores.issued import IssuedStores
from cotal_trio.stores.streams import ensure_durable, ensure_space_streams

__all__ = [
    "ACCEPTED_TOKEN_BYTES",
    "MINT_DEADLINE_S",
    "Renewed",
    "mint_agent",
    "provision_durables",
    "provision_uid",
    "renew_agent",
]

# The whole static agent mint (stores, evidence, accepted row, durables, file) finishes within
# this long; so do a provision and a renewal. Seconds.
MINT_DEADLINE_S = 30
# The accepted token chosen at mint time: 16 CSPRNG bytes, 32 lowercase hex (the token grammar).
ACCEPTED_TOKEN_BYTES = 16
# Bound on marking a half-made issuance revoked on the way out of a failure (seconds, shielded).
CLEANUP_S = 5
GENERATION_RANDOM_BYTES = 12


def no_broker(paths: RootPaths, what: str) -> ConfigError:
    """The refusal when no broker answers for the root: ``what`` needs one.

    Spec "Issued authority".
    """
    return ConfigError(f"no broker answers for the root {paths.root} - start it (`cotal up`), or pass --server "
                       f"nats://host:port: {what}; nothing was written")  # fmt: skip


@asynccontextmanager
async def _minter(material: SpaceMaterial, url: str, what: str) -> AsyncIterator[natsio.Connection]:
    """Trio: a temporary data-account user holding the static minter's permissions, inside its
    own trio-asyncio loop."""
    nonce = secrets.token_urlsafe(INBOX_NONCE_BYTES)
    permissions = static_issuance.static_minter_permissions(space=material.space, inbox_nonce=nonce).to_nats()
    async with natsio.open_loop(), open_temporary_user(material, url, name=f"cotal:{what}:{material.space}",
                                                       permissions=permissions, inbox_nonce=nonce,
                                                       now=int(time.time())) as conn:  # fmt: skip
        yield conn


async def provision_durables(conn: natsio.Connection, cred: Credential) -> tuple[str, ...]:
    """Trio: the space's streams and the bind-only durables ``cred`` binds
    (:func:`~cotal_trio.core.static_issuance.durables_of`); their names.

    Raises:
        ConfigError: a stream or durable exists with another shape (never changed).
        Unavailable: the broker or JetStream did not answer, or refused.

    Spec "Provisioning", "DM confidentiality".
    """
    await ensure_space_streams(conn, cred.space)
    durables = static_issuance.durables_of(cred)
    for durable in durables:
        await ensure_durable(conn, durable)
    return tuple(d.name for d in durables)


async def mint_agent(
    flags: MintRequest, grant: dict, server: str | None, *, provision: bool = True, deadline_s: float = MINT_DEADLINE_S,
) -> tuple[Credential, LabelRecord, bool]:
    """Trio: mint a static agent credential as an issuance (module docstring; spec "Issued authority").

    Returns:
        ``(the credential, the label's record now, whether it replaced one)``.

    Raises:
        ConfigError: a refusal (named), no broker, a drifted issued store, or a failure or the
            deadline before the file was written (the sentence says nothing was handed out and
            to run the same mint again).
    """
    plan = await trio.to_thread.run_sync(plan_mint, flags)
    url = await resolve_server_url(plan.paths, server)
    if url is None:
        raise no_broker(plan.paths, "a static agent credential is an issuance, recorded in the space's issued stores "
                        "before its file is written")  # fmt: skip
    async with held_credentials(plan.sp):
        record, iat = await trio.to_thread.run_sync(check_label_state, plan, flags)
        uid = mint_lifecycle_uid(os.urandom(LIFECYCLE_UID_RANDOM_BYTES))
        # 30 days after the mint, counted from the JWT's iat (a second past an earlier revocation of
        # an --identity key), so the receipt's horizon is its issuedAt + 30 days.
        generation = new_generation(static_agent_horizon(iat), os.urandom(GENERATION_RANDOM_BYTES))
        cred = new_credential(plan, flags, iat=iat, grant=grant, uid=uid, generation=generation,
                              accepted_token=secrets.token_hex(ACCEPTED_TOKEN_BYTES))  # fmt: skip
        text, fragment = creds_text(cred, plan)
        evidence = static_issuance.static_evidence(cred, fragment)
        fresh = LabelRecord(current=cred) if record is None else record.replace_with(cred, now=plan.now)
        issued = False
        try:
            with trio.fail_after(deadline_s), one_sentence():
                async with _minter(plan.material, url, "static-mint") as conn:
                    stores = IssuedStores(conn, cred.space)
                    try:
                        await ensure_issued_stores(conn, cred.space)
                        await stores.issue(evidence, now=time.time())
                        issued = True
                        await stores.accept(cred.accepted_token or "", evidence.ref, now=time.time())
                        if provision:
                            await provision_durables(conn, cred)
                        await trio.to_thread.run_sync(save_record, plan.sp, fresh)
                        await _write_or_undo(plan.target, text, plan.sp, cred.label, record)
                    except BaseException as exc:
                        if not issued:
                            raise
                        await _retire_quietly(stores, cred)
                        if isinstance(exc, ConfigError):  # the file could not be written, or a durable drifted
                            raise ConfigError(_unissued(cred, str(exc), issued=True)) from None
                        raise
        except trio.TooSlowError:
            raise ConfigError(_unissued(cred, f"the mint did not finish within {deadline_s:g} s", issued=issued)) from None
        except (Refused, Unavailable) as exc:
            raise ConfigError(_unissued(cred, exc.detail if isinstance(exc, Refused) else str(exc), issued=issued)) from None
        except OSError as exc:
            raise ConfigError(_unissued(cred, f"{exc.strerror or exc} ({exc.filename})", issued=issued)) from None
    return cred, fresh, record is not None


def _unissued(cred: Credential, problem: str, *, issued: bool) -> str:
    """The sentence of a mint that failed before its file: nothing was written, or its issuance
    was written and no credential carries it."""
    if not issued:
        return f"{problem} - nothing was written"
    return (f"{problem} - nothing was handed out (no file, no record; generation {cred.generation} is carried by no "
            f"credential and authorizes nothing): run the same `cotal auth mint` again")  # fmt: skip


async def _write_or_undo(target: Path, text: str, sp: SpacePaths, label: str, record: LabelRecord | None) -> None:
    """Trio: write the file; if it fails (or is interrupted), put the record back (shielded)."""
    try:
        await trio.to_thread.run_sync(write_creds, target, text)
    except BaseException:
        with trio.move_on_after(CLEANUP_S, shield=True):
            await trio.to_thread.run_sync(undo_record, sp, label, record)
        raise


async def _retire_quietly(stores: IssuedStores, cred: Credential) -> None:
    """Trio: mark an issuance no credential will carry revoked (best effort, shielded): it
    authorizes nothing anyway, this only makes the rows say so."""
    with trio.move_on_after(CLEANUP_S, shield=True):
        try:
            await stores.retire(static_issuance.ref_of(cred), now=time.time())
        except (Refused, Unavailable):
            pass  # the original failure is what the caller sees


# -- cotal auth provision ------------------------------------------------------------------------


def find_uid(sp: SpacePaths, uid: str) -> Credential:
    """The recorded agent credential of lifecycle ``uid`` in the space (blocking reads).

    Raises:
        ConfigError: no credential of the space has that UID, or it is no agent.

    Spec "Provisioning".
    """
    records, _bad = list_records(sp)
    for record in records:
        for cred in record.all():
            if cred.lifecycle_uid == uid:
                if cred.profile != "agent":
                    article = "an" if cred.profile[:1] in "aeiou" else "a"
                    raise ConfigError(f"lifecycle {uid} is credential {cred.label}, {article} {cred.profile} credential:"
                                      " it binds no durable")  # fmt: skip
                return cred
    raise ConfigError(f"space {sp.space} has no credential of lifecycle {uid} - pass the lifecycleUid a `cotal auth mint` "
                      "receipt printed (see `cotal connect-info`)")  # fmt: skip


async def provision_uid(sp: SpacePaths, paths: RootPaths, uid: str, server: str | None) -> tuple[Credential, tuple[str, ...]]:
    """Trio: pre-create the bind-only durables of the agent credential of lifecycle ``uid`` (a
    receipt's UID, for an agent minted with ``--no-provision``, or whose durables were removed).

    Returns:
        ``(the credential, the durable names)``.

    Raises:
        ConfigError: a user-auth space, an unknown UID, no broker, a durable of another shape, or
            the broker did not answer within :data:`MINT_DEADLINE_S`.

    Spec "Provisioning", "DM confidentiality".
    """
    sp, material = await trio.to_thread.run_sync(static_space, sp)
    cred = await trio.to_thread.run_sync(find_uid, sp, uid)
    url = await resolve_server_url(paths, server)
    if url is None:
        raise no_broker(paths, "the durables are created on the broker")
    try:
        with trio.fail_after(MINT_DEADLINE_S), one_sentence():
            async with _minter(material, url, "provision") as conn:
                return cred, await provision_durables(conn, cred)
    except trio.TooSlowError:
        raise ConfigError(f"provisioning lifecycle {uid} did not finish within {MINT_DEADLINE_S} s - check the broker, "
                          "then run it again") from None  # fmt: skip
    except Unavailable as exc:
        raise ConfigError(f"{exc} - run `cotal auth provision {uid} --space {sp.space}` again") from None


# -- cotal auth renew ----------------------------------------------------------------------------


class Renewed:
    """What a renewal did: the renewed credential, and whether it kept its generation.

    Attributes:
        cred: the credential now current (same key, principal and lifecycle UID).
        kept: True when the ceiling was byte-identical and the generation kept (nothing was
            written to the issued stores); False for a fresh issuance on a fresh generation.

    Spec "Issued authority".
    """

    def __init__(self, cred: Credential, kept: bool) -> None:
        self.cred, self.kept = cred, kept


async def renew_agent(
    sp: SpacePaths, paths: RootPaths, label: str, *, exp: int | None, grant: dict | None, server: str | None,
) -> Renewed:
    """Trio: re-sign ``label``'s current static agent credential with expiry ``exp`` (same key,
    principal, lifecycle UID and inbox nonce) and, with ``grant``, new agent flags.

    The renewed credential's permissions are built on the same generation and accepted token.
    When their ceiling is byte-identical to the evidence's, the generation is kept and nothing is
    written to the issued stores; otherwise the renewal is a fresh issuance on a fresh generation
    (the same horizon: renewals never move it) with a fresh accepted token, whose evidence and
    accepted row are written before the file (spec "Issued authority": a changed scope is a fresh
    issuance, adopted by a new connection). The file is rewritten in place (temporary file and
    rename), then the record.

    Raises:
        ConfigError: no such label, not an issued agent, revoked, at or after its horizon
            (:func:`~cotal_trio.core.static_issuance.check_renewable`), an expiry not after now, no
            broker, or the issued stores refused or did not answer (nothing was written).
    """
    sp, material = await trio.to_thread.run_sync(static_space, sp)
    url = await resolve_server_url(paths, server)
    if url is None:
        raise no_broker(paths, "a renewal reads its issuance's evidence")
    async with held_credentials(sp):
        record = await trio.to_thread.run_sync(load_record, sp, label)
        if record is None:
            raise ConfigError(f"space {sp.space} has no credential labelled {label} - see `cotal doctor auth`")
        now = int(time.time())
        old = record.current
        static_issuance.check_renewable(old, now=now)
        if exp is not None and exp <= now:
            raise ConfigError(f"the expiry {exp} is not after now ({now}) - pass a later --expires-at")
        key = await trio.to_thread.run_sync(read_own_key, old)
        candidate = replace(old, issued_at=max(now, old.issued_at + 1), expires_at=exp, **(grant or {}))
        try:
            with trio.fail_after(MINT_DEADLINE_S), one_sentence():
                async with _minter(material, url, "renew") as conn:
                    renewed, kept = await _renew_issuance(IssuedStores(conn, sp.space), old, candidate, material, key)
                    if grant and renewed.role is not None:
                        await provision_durables(conn, renewed)
        except trio.TooSlowError:
            raise ConfigError(f"the renewal did not finish within {MINT_DEADLINE_S} s - nothing was handed out; run it again") from None
        except (Refused, Unavailable) as exc:
            detail = exc.detail if isinstance(exc, Refused) else str(exc)
            raise ConfigError(f"{detail} - the renewal handed nothing out; run it again") from None
        text, _ = signed_creds(renewed, material, key)
        await trio.to_thread.run_sync(write_creds, Path(renewed.path), text)
        await trio.to_thread.run_sync(save_record, sp, LabelRecord(current=renewed, replaced=record.replaced))
    return Renewed(renewed, kept)


async def _renew_issuance(
    stores: IssuedStores, old: Credential, candidate: Credential, material: SpaceMaterial, key: KeyPair,
) -> tuple[Credential, bool]:
    """Trio: keep ``old``'s generation for ``candidate`` when its ceiling is byte-identical to the
    evidence's; else issue and accept a fresh generation (same horizon) under a fresh token."""
    resolved = await stores.resolve(static_issuance.ref_of(old), now=time.time())
    _, fragment = signed_creds(candidate, material, key)
    if static_issuance.renewal_keeps(resolved.evidence, fragment):
        return candidate, True
    horizon = static_issuance.ref_of(old).horizon
    fresh = replace(candidate, generation=new_generation(horizon, os.urandom(GENERATION_RANDOM_BYTES)),
                    accepted_token=secrets.token_hex(ACCEPTED_TOKEN_BYTES))  # fmt: skip
    _, fragment = signed_creds(fresh, material, key)
    evidence = static_issuance.static_evidence(fresh, fragment)
    await stores.issue(evidence, now=time.time())
    await stores.accept(fresh.accepted_token or "", evidence.ref, now=time.time())
    return fresh, False


