"""Standalone callers: the mint of one (issue 6 item 7; spec "Standalone callers";
docs/static-credentials.md "Standalone callers"), and the recovery of a static space's issued stores.

``cotal auth mint --endpoint`` (``cli/auth.py``) runs :func:`mint_caller`: the steps every mint
shares (:mod:`cotal_trio.ops.static_credentials`), then the surface, the intent and the footprint
(the I/O steps :mod:`cotal_trio.ops.callers`, the rules :mod:`cotal_trio.core.callers`).
``cotal auth recreate-issued-stores`` runs :func:`recreate_static_issued_stores`.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import trio

from cotal_trio import natsio
from cotal_trio.broker.provision import mint_service_user
from cotal_trio.broker.spaces import MODE_STATIC, resolve_server_url, space_mode
from cotal_trio.core import callers
from cotal_trio.core import credentials as rules
from cotal_trio.core.credentials import Credential, LabelRecord
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.lane.service_users import new_inbox_nonce, recreate_permissions
from cotal_trio.ops.callers import (
    IntentExists,
    IntentNotCreated,
    IntentUnsettled,
    create_intent,
    ensure_issued_stores,
    fetch_surface,
    open_minter,
    provision_caller,
)
from cotal_trio.ops.errors import as_config_error, one_sentence
from cotal_trio.ops.static_credentials import (
    INBOX_NONCE_BYTES,
    LIFECYCLE_UID_RANDOM_BYTES,
    MintPlan,
    MintRequest,
    check_label_state,
    creds_text,
    new_credential,
    plan_mint,
    undo_record,
)
from cotal_trio.state import RootPaths, SpacePaths, load_space
from cotal_trio.state.credentials import hold_credentials, save_record, write_creds
from cotal_trio.stores.issued import check_backup_dir
from cotal_trio.stores.issued import recreate_issued_stores as recreate_stores

__all__ = [
    "DESCRIBE_DEADLINE_S",
    "HANDOUT_MARGIN_S",
    "MINT_DEADLINE_S",
    "CallerSteps",
    "check_handout",
    "held_credentials",
    "mint_caller",
    "recreate_static_issued_stores",
]

# The endpoint must answer describe within this long, and the whole mint (describe, stores,
# intent, footprint) finish within MINT_DEADLINE_S. Seconds.
DESCRIBE_DEADLINE_S = 5
MINT_DEADLINE_S = 30
# A standalone caller file must still be valid this long when its intent is created (seconds).
HANDOUT_MARGIN_S = 30
# Bound on undoing a record or removing a file on the way out of a failure (seconds, shielded).
CLEANUP_S = 5
# `cotal auth recreate-issued-stores`: its temporary store user's lifetime and the step's bound.
RECREATE_USER_LIFETIME_S = 300
RECREATE_DEADLINE_S = 120


@dataclass(frozen=True, slots=True, kw_only=True)
class CallerSteps:
    """The I/O steps of a standalone-caller mint after its surface, in order (a seam: tests wrap
    one to interrupt the mint there). Defaults: :mod:`cotal_trio.ops.callers` and the records.

    Spec "Standalone callers".
    """

    ensure_stores: Callable[[natsio.Connection, str], Awaitable[None]] = ensure_issued_stores
    create_intent: Callable[..., Awaitable[int]] = create_intent
    provision: Callable[[natsio.Connection, str, str, str], Awaitable[None]] = provision_caller
    write_file: Callable[[Path, str], None] = write_creds
    save_final: Callable[[SpacePaths, LabelRecord], None] = save_record


@asynccontextmanager
async def held_credentials(sp: SpacePaths) -> AsyncIterator[None]:
    """Trio: :func:`~cotal_trio.state.credentials.hold_credentials`, waited for in a thread.

    Spec "Provisioning" / "Standalone callers".
    """
    with ExitStack() as stack:
        await trio.to_thread.run_sync(stack.enter_context, hold_credentials(sp))
        yield


async def fresh_surface(conn: natsio.Connection, plan: MintPlan, endpoint: str) -> callers.Surface:
    """Trio: the surface ``endpoint`` answers now, parsed, digest-checked and supported.

    Raises:
        ConfigError: no answer within :data:`DESCRIBE_DEADLINE_S`, a malformed answer, a digest
            mismatch or an unsupported surface (each named).

    Spec "Provisioning" / "Standalone callers".
    """
    with trio.move_on_after(DESCRIBE_DEADLINE_S):
        data = await fetch_surface(conn, space=plan.sp.space, endpoint=endpoint, owner=plan.owner, actor=plan.actor)
        if data is None:  # the broker's no-responders status: nothing subscribes
            raise ConfigError(f"nothing serves endpoint {endpoint} in space {plan.sp.space} (no host subscribes to its "
                              "describe) - start its host, or check the name given to --endpoint")  # fmt: skip
        surface = callers.parse_describe_answer(data, endpoint=endpoint)
        callers.check_supported(surface)
        return surface
    raise ConfigError(f"endpoint {endpoint} did not answer describe in space {plan.sp.space} within {DESCRIBE_DEADLINE_S:g} s "
                      "- check that its host runs, or the name given to --endpoint")  # fmt: skip


async def mint_caller(
    flags: MintRequest, endpoint: str, channels: tuple[str, ...], server: str | None, *,
    steps: CallerSteps = CallerSteps(), deadline_s: float = MINT_DEADLINE_S,
) -> tuple[Credential, LabelRecord, bool]:
    """Trio: mint a standalone caller (spec "Standalone callers"; docs/static-credentials.md).

    Order: checks -> the fresh surface -> the credential (a new lifecycle UID) -> the issued
    stores -> the label's record, marked pending -> the lifetime again -> the private create-only
    intent -> the native footprint -> the file (0600, atomic) -> the record, final.

    What a failure leaves: before the create, or a create the broker definitively refused
    (:class:`~cotal_trio.ops.callers.IntentExists`, :class:`~cotal_trio.ops.callers.IntentNotCreated`),
    nothing (the record is undone). From a create that was sent but not acknowledged (no ack,
    the deadline, an interrupt) on, the intent may exist: the record stays pending, so a rerun
    refuses naming the lifecycle UID and the remedy. A file whose record could not be made final
    is removed, so no file is usable that the record does not show as handed out.

    Args:
        steps: the I/O steps (:class:`CallerSteps`); deadline_s: the whole mint's bound (the
            command's :data:`MINT_DEADLINE_S`).

    Returns:
        ``(the credential, the label's record now, whether it replaced one)``.

    Raises:
        ConfigError: a refusal (named), no broker, a lifetime under :data:`HANDOUT_MARGIN_S`, or
            the mint did not finish in time; each sentence says what was written and the fix.
    """
    plan = await trio.to_thread.run_sync(plan_mint, flags)
    check_handout(plan.exp, now=plan.now)  # type: ignore[arg-type]  # --no-expiry was refused
    url = await resolve_server_url(plan.paths, server)
    if url is None:
        raise ConfigError(f"no broker answers for the root {plan.paths.root} - start it (`cotal up`), or pass --server "
                          "nats://host:port: --endpoint asks the endpoint itself")  # fmt: skip
    grant = {"allow_subscribe": channels, "allow_publish": channels, "role": None}
    async with held_credentials(plan.sp):
        record, iat = await trio.to_thread.run_sync(check_label_state, plan, flags)
        uid = mint_lifecycle_uid(os.urandom(LIFECYCLE_UID_RANDOM_BYTES))
        stage = _Stage()
        try:
            with trio.fail_after(deadline_s), one_sentence():
                async with natsio.open_loop(), open_minter(
                    plan.material, url, owner=plan.owner, actor=plan.actor, uid=uid, endpoint=endpoint,
                    inbox_nonce=secrets.token_urlsafe(INBOX_NONCE_BYTES), now=int(time.time()),
                ) as conn:  # fmt: skip
                    surface = await fresh_surface(conn, plan, endpoint)
                    cred = new_credential(plan, flags, iat=iat, grant=grant, uid=uid, endpoint=endpoint,
                                          surface_digest=surface.digest, verbs=surface.verbs, pending=True)  # fmt: skip
                    return await _issue(conn, plan, cred, surface, record, stage, steps)
        except trio.TooSlowError:
            raise ConfigError(stage.sentence(f"the mint did not finish within {deadline_s:g} s")) from None


def check_handout(exp: int, *, now: float) -> None:
    """Refuse a lifetime that ends within :data:`HANDOUT_MARGIN_S` of ``now`` (unix seconds): the
    file would be handed out expired or about to, its intent's TTL a second or two.

    Raises:
        ConfigError: names a longer ``--expires-in``; nothing was written.

    Spec "Standalone callers".
    """
    if exp < now + HANDOUT_MARGIN_S:
        raise ConfigError(
            f"the credential would expire at {exp}, {int(exp - now)} s from now - pass a longer --expires-in (or a later "
            f"--expires-at): a standalone caller file must outlive its hand-out by at least {HANDOUT_MARGIN_S} s; nothing "
            "was written"
        )


class _Stage:
    """How far a standalone-caller mint got: once its intent was sent, a failure names the remedy."""

    def __init__(self) -> None:
        self.cred: Credential | None = None

    def sentence(self, problem: str, *, file_exists: bool = False) -> str:
        if self.cred is None:
            return f"{problem} - check that the broker answers; nothing was written"
        return f"{problem} - {rules.interrupted_sentence(self.cred, file_exists=file_exists)}"


async def _issue(conn: natsio.Connection, plan: MintPlan, cred: Credential, surface: callers.Surface,
                 record: LabelRecord | None, stage: _Stage, steps: CallerSteps) -> tuple[Credential, LabelRecord, bool]:  # fmt: skip
    """Trio: the stores, the pending record, the intent, the footprint, the file, the final record."""
    text, permissions = creds_text(cred, plan)
    with as_config_error():
        intent = callers.Intent(
            space=cred.space, endpoint=surface.endpoint, owner=cred.owner, actor=cred.actor, uid=cred.lifecycle_uid,
            user_key=cred.user_key, surface=surface.digest, ceiling=callers.ceiling_digest(permissions),
            issued_at=cred.issued_at, expires_at=cred.expires_at,
        )  # fmt: skip
    await steps.ensure_stores(conn, cred.space)
    fresh = LabelRecord(current=cred) if record is None else record.replace_with(cred, now=plan.now)
    await trio.to_thread.run_sync(save_record, plan.sp, fresh)  # first: marked pending
    await _create(conn, plan, cred, intent, record, stage, steps)
    try:
        await steps.provision(conn, cred.space, cred.owner, cred.actor)
    except (ConfigError, Unavailable) as exc:
        raise ConfigError(stage.sentence(str(exc))) from None
    done = LabelRecord(current=replace(cred, pending=False), replaced=fresh.replaced)
    await _hand_out(plan, done, text, stage, steps)
    return done.current, done, record is not None


async def _create(conn: natsio.Connection, plan: MintPlan, cred: Credential, intent: callers.Intent,
                  record: LabelRecord | None, stage: _Stage, steps: CallerSteps) -> None:  # fmt: skip
    """Trio: the lifetime once more, then the intent. The record is undone only when the create
    definitively did not happen; from the send on, the intent may exist and the record stays."""
    try:
        check_handout(intent.expires_at, now=time.time())
    except ConfigError:
        await _undo(plan, cred.label, record)
        raise
    stage.cred = cred  # from here a cancellation or an interrupt leaves the record pending
    try:
        await steps.create_intent(conn, intent, now=time.time())
    except (IntentExists, IntentNotCreated) as exc:  # the broker answered no: nothing was written
        await _undo(plan, cred.label, record)
        raise ConfigError(f"{exc.detail if isinstance(exc, IntentExists) else exc} - nothing of this mint was written") from None
    except IntentUnsettled as exc:  # sent, never acknowledged: it may exist, the record stays pending
        raise ConfigError(stage.sentence(str(exc))) from None


async def _undo(plan: MintPlan, label: str, record: LabelRecord | None) -> None:
    """Trio: put the label's record back (shielded: it runs on the way out of a failure)."""
    with trio.move_on_after(CLEANUP_S, shield=True):
        await trio.to_thread.run_sync(undo_record, plan.sp, label, record)


async def _hand_out(plan: MintPlan, done: LabelRecord, text: str, stage: _Stage, steps: CallerSteps) -> None:
    """Trio: write the file, then record it final. If the final record fails (or an interrupt
    lands between the two), the file is removed: a file the record does not show as handed out
    must not be usable without the operator knowing. The record stays pending either way."""
    written = False
    try:
        await trio.to_thread.run_sync(steps.write_file, plan.target, text)
        written = True
        await trio.to_thread.run_sync(steps.save_final, plan.sp, done)
    except BaseException as exc:
        removed = not written
        if written:
            with trio.move_on_after(CLEANUP_S, shield=True):
                removed = await trio.to_thread.run_sync(_remove, plan.target)
        if not isinstance(exc, ConfigError | OSError):
            raise  # an interrupt or a cancellation goes on; the record says where the mint stands
        problem = _sentence(exc)
        if written:
            problem += (f": the file {plan.target} was written but its record could not be made final, "
                        + ("so it was removed" if removed else "and it could not be removed"))  # fmt: skip
        raise ConfigError(stage.sentence(problem, file_exists=not removed)) from None


def _remove(path: Path) -> bool:
    """Blocking: remove ``path`` (missing is fine); False when it could not be removed."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        return False
    return True


def _sentence(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc} ({exc.filename})" if exc.filename else str(exc.strerror or exc)
    return str(exc)


# -- cotal auth recreate-issued-stores -------------------------------------------------------------


async def recreate_static_issued_stores(
    paths: RootPaths, sp: SpacePaths, backup_dir: Path, server: str | None,
) -> dict[str, int]:
    """Trio: back a static space's issued stores up into ``backup_dir``, delete them and create
    them again (the recovery for a store refused as drifted; docs/issued-authority.md).

    Every process using the space's issued stores must be stopped first: a write between the
    backup and the delete is lost, and callers minted before lose their intents (in the backup).
    The step's user is a temporary data-account user holding only the two stores
    (:func:`~cotal_trio.lane.service_users.recreate_permissions`), alive
    :data:`RECREATE_USER_LIFETIME_S`.

    Args:
        paths: the root; sp: the space, already found in it; backup_dir: a new or empty folder;
        server: the broker URL, or None for the root's (if it runs).

    Returns:
        The messages backed up, by stream (empty: there were no old stores).

    Raises:
        ConfigError: a user-auth space (its stores are its auth service's: names ``cotal up``),
            a backup folder that is not new or empty, no broker, or the step did not finish
            within :data:`RECREATE_DEADLINE_S`.
    """
    if space_mode(sp) != MODE_STATIC:  # its stores are its auth service's (a lane creates them)
        raise ConfigError(
            f"space {sp.space} is a user-auth space: its issued stores belong to its auth service - stop it, its "
            f"callout replicas and managers, then run `cotal up --space {sp.space} --recreate-issued-stores <backup-dir>`"
        )
    material = load_space(sp.callout_json, sp.space)
    check_backup_dir(backup_dir)
    url = await resolve_server_url(paths, server)
    if url is None:
        raise ConfigError(f"no broker answers for the root {paths.root} - start it (`cotal up`), or pass --server "
                          "nats://host:port")  # fmt: skip
    nonce = new_inbox_nonce()  # the step's user holds only what it does to the two stores
    permissions = recreate_permissions(sp.space, nonce)
    now = int(time.time())
    creds = mint_service_user(material, name=f"cotal:recreate-issued:{sp.space}", permissions=permissions, iat=now,
                              exp=now + RECREATE_USER_LIFETIME_S)  # fmt: skip
    try:
        with trio.fail_after(RECREATE_DEADLINE_S), one_sentence():
            async with natsio.open_loop(), natsio.open_connection(url, creds=creds, name=f"cotal-recreate-issued-{sp.space}",
                                                                  inbox_prefix=f"_INBOX_{nonce}", reconnect=False) as conn:  # fmt: skip
                return await recreate_stores(conn, sp.space, backup_dir)
    except trio.TooSlowError:
        raise ConfigError(f"recreating space {sp.space}'s issued stores did not finish within {RECREATE_DEADLINE_S} s - "
                          f"check the broker, then run it again with a new empty folder (see {backup_dir})") from None  # fmt: skip
