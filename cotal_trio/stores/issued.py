"""A space's issued-authority stores: issue, resolve, renew, retire, accepted rows (SPEC §13.15;
spec credential-authority "Issued authority"; upstream-notes 9; docs/issued-authority.md).

Two streams per space, with the exact shapes of upstream-notes 9.1 plus per-message TTL
(:func:`issued_shapes`), created or verified by :meth:`IssuedStores.ensure`; a store with any
other shape is refused with the remedy (:data:`RECREATE_REMEDY`), never adopted or changed:

* ``KV_cotal_issued_<space>``: append-only (no message delete, no purge, no rollup), every
  message kept per subject. Evidence is read as the FIRST message on its key, so nothing
  written on the key later changes it; the attempt row is the LAST message on its key, moved
  only by compare-and-set (``Nats-Expected-Last-Subject-Sequence``).
* ``KV_cotal_accepted_<space>``: one message per key, further publishes on it refused
  (``discard_new_per_subject``): accepted rows are write-once; direct get allowed, for the
  per-key read grant a credential's ceiling carries.

Every row is written with ``Nats-TTL: horizon + 60 - now`` (:func:`~cotal_trio.core.issued.row_ttl_s`),
so the broker removes a generation's rows a minute after its horizon, and every operation on a
generation first refuses it at or after its horizon (:func:`~cotal_trio.core.issued.check_live`),
before any store read.

:func:`recreate_issued_stores` is the recovery for a drifted store (``cotal up --space <s>
--recreate-issued-stores <backup-dir>``, and the embedder's same step): back both streams up,
delete them, create them again.

Every async function here is trio-flavoured and a checkpoint, bounded by the caller's deadline.
Wall time comes in as ``now`` arguments (unix seconds).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from cotal_trio.core.errors import CodecError, ConfigError, RefusalCode, Refused, Unavailable
from cotal_trio.core.issued import (
    ROW_GRACE_S,
    Accepted,
    Attempt,
    Ceiling,
    Evidence,
    IssuedRef,
    Source,
    SourceRow,
    accepted_bucket,
    accepted_key,
    attempt_key,
    bysource_key,
    bysource_prefix,
    check_live,
    digest_of,
    evidence_digest,
    evidence_key,
    issued_bucket,
    new_generation,
    parse_accepted,
    parse_attempt,
    parse_evidence,
    ref_from_key,
    render_accepted,
    render_attempt,
    render_evidence,
    render_source_row,
    row_ttl_s,
)
from cotal_trio.natsio import (
    Connection,
    Publish,
    StreamNotFound,
    SubjectFull,
    WrongLastSequence,
    StreamDrift,
    StreamShape,
    SubjectConflict,
    backup_stream,
    delete_stream,
    ensure_stream,
    expecting_headers,
    first_message,
    js_publish_many,
    js_publishes_sent,
    kv_keys,
    last_message,
    publish_expecting,
    stream_config,
)

__all__ = [
    "IssuedStores",
    "IssuedStoresMissing",
    "RECREATE_REMEDY",
    "Renewal",
    "Resolved",
    "Staged",
    "check_backup_dir",
    "issued_shapes",
    "recreate_issued_stores",
]

log = logging.getLogger("cotal.issued")

RECREATE_REMEDY = (
    "stop the space's auth service, its callout replicas and managers, then run"
    " `cotal up --space {space} --recreate-issued-stores <backup-dir>`"
)
# A retirement re-reads the attempt row after a concurrent change at most this many times.
RETIRE_ATTEMPTS = 3
# Bound on marking a half-made issuance aborted after its activation failed (seconds, shielded).
ABORT_S = 2.0

SourceLive = Callable[[Source], Awaitable[bool]]


def issued_shapes(space: str) -> tuple[StreamShape, StreamShape]:
    """Sync: the exact shapes of ``KV_cotal_issued_<space>`` and ``KV_cotal_accepted_<space>``.

    Both: file storage, no age/count/byte limits, ``deny_delete``, ``deny_purge``,
    ``allow_rollup_hdrs: false``, ``allow_msg_ttl`` (upstream-notes 9.1). The issued store keeps
    every message per subject (``max_msgs_per_subject: -1``) and has no direct get; the accepted
    store keeps one per subject, refuses a second (``discard: new`` per subject) and allows
    direct get.
    """
    issued, accepted = issued_bucket(space), accepted_bucket(space)
    return (
        StreamShape(name=f"KV_{issued}", subjects=(f"$KV.{issued}.>",), allow_direct=False, max_msgs_per_subject=-1),
        StreamShape(
            name=f"KV_{accepted}", subjects=(f"$KV.{accepted}.>",), allow_direct=True, max_msgs_per_subject=1,
            discard_new_per_subject=True,
        ),
    )


RENEW_PAST_HORIZON = (
    "a renewal cannot move the horizon past {horizon}: renewals stop at the horizon - respawn the agent "
    "for a fresh issuance"
)


class IssuedStoresMissing(Unavailable):
    """The space's issued or accepted store does not exist; the message names the fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Staged:
    """An issuance whose rows are written and whose attempt is ``prepared``.

    Attributes:
        evidence: what was staged.
        attempt_revision: the attempt row's sequence, the compare-and-set point of
            :meth:`IssuedStores.activate` / :meth:`IssuedStores.abort`.
        digest: the evidence's digest (:func:`~cotal_trio.core.issued.evidence_digest`),
            computed once at staging; empty: compute it again.
    """

    evidence: Evidence
    attempt_revision: int
    digest: str = ""

    @property
    def ref(self) -> IssuedRef:
        return self.evidence.ref


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolved:
    """A live, active issuance: its evidence and the attempt row's sequence it was read at."""

    evidence: Evidence
    attempt_revision: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Renewal:
    """What :meth:`IssuedStores.renew` gave: the generation to use, and whether it is the old one."""

    ref: IssuedRef
    kept: bool


def _not_granted(ref: IssuedRef, problem: str) -> Refused:
    return Refused(
        RefusalCode.NOT_GRANTED,
        f"issued generation {ref.generation} of {ref.owner}.{ref.actor} {problem} - it authorizes nothing;"
        " connect with a freshly issued credential",
    )


class IssuedStores:
    """The issued and accepted stores of ``space`` over one data-account connection.

    Args:
        conn: the lane's issuer session (the ``issuer`` profile,
            :func:`~cotal_trio.core.profiles.issuer_permissions`) for issuing and checking;
            :meth:`ensure` rides the full lane's store user (``STREAM.INFO``/``CREATE`` of both).
        space: the space.
        grace_s: how long rows outlive their generation's horizon (seconds; 60, the spec's).
        random_bytes: a CSPRNG (``os.urandom``) for fresh generations.
    """

    def __init__(
        self, conn: Connection, space: str, *, grace_s: int = ROW_GRACE_S, random_bytes: Callable[[int], bytes] = os.urandom
    ) -> None:
        self._conn = conn
        self.space = space
        self.issued, self.accepted = issued_bucket(space), accepted_bucket(space)
        self._shapes = issued_shapes(space)
        self._grace_s = grace_s
        self._random = random_bytes

    @asynccontextmanager
    async def writes_sent(self, writes: Sequence[Publish]) -> AsyncIterator[Callable[[], Awaitable[list[int | Exception]]]]:
        """Trio: a connect's issued-authority ``writes`` handed to this store's connection (the
        issuer session) on entry; ``await acks()`` in the block gives each write's sequence or
        error (:func:`~cotal_trio.natsio.js_publishes_sent`). The callout writes its issuance row
        on its store connection inside the block, so both leave together: one round trip (issue
        14 item 3). A connection that cannot send (closed, renewing) gives every write its
        :class:`~cotal_trio.core.errors.Unavailable` instead of raising: the connect then gets
        no rows, never a refusal."""
        async with AsyncExitStack() as stack:
            try:
                acks = await stack.enter_async_context(js_publishes_sent(self._conn, writes))
            except (Unavailable, ValueError) as exc:
                failed = Unavailable(f"issued-authority writes not sent: {exc}")

                async def acks() -> list[int | Exception]:
                    return [failed] * len(writes)

            yield acks

    # -- the stores ----------------------------------------------------------------------------

    async def ensure(self, *, replicas: int = 1) -> dict[str, int]:
        """Trio: create both stores with their exact shapes at ``replicas`` copies, or verify them
        and scale them up to it (idempotent; issue 17 item 1); each store's stream name and its
        copies after it (more than ``replicas`` when it had more: never scaled down).

        Raises:
            ConfigError: a store exists with another shape; the sentence names the differences
                and the remedy (:data:`RECREATE_REMEDY`). The store is left as it is.
            NoPlacement: the broker cannot place ``replicas`` copies.
            Unavailable: the broker or JetStream did not answer, or refused.
        """
        copies = {}
        for shape in self._shapes:
            with self._drift():
                copies[shape.name] = await ensure_stream(self._conn, shape, replicas=replicas)
        return copies

    async def check(self) -> None:
        """Trio: verify both stores without creating one (a binder that is not their creator).

        Raises:
            IssuedStoresMissing: a store does not exist.
            ConfigError: a store has another shape (sentence with the remedy).
            Unavailable: the broker or JetStream did not answer.
        """
        for shape in self._shapes:
            config = await stream_config(self._conn, shape.name)
            if config is None:
                raise self._missing(shape.name)
            if differences := shape.drift(config):
                with self._drift():
                    raise StreamDrift(shape.name, differences)

    @contextmanager
    def _drift(self) -> Iterator[None]:
        try:
            yield
        except StreamDrift as exc:
            raise ConfigError(
                f"space {self.space}'s store {exc.stream} has another shape than issued authority needs"
                f" ({'; '.join(exc.differences)}) and is refused - " + RECREATE_REMEDY.format(space=self.space)
            ) from None

    def _missing(self, stream: str) -> IssuedStoresMissing:
        return IssuedStoresMissing(
            f"space {self.space} has no store {stream} - start the space's full auth service once"
            f" (`cotal up --space {self.space}`): it creates the issued stores"
        )

    @contextmanager
    def _errors(self, stream: str) -> Iterator[None]:
        try:
            yield
        except StreamNotFound as exc:  # BucketMissing too: a publish no stream took
            raise self._missing(stream) from exc

    def _subject(self, bucket: str, key: str) -> str:
        return f"$KV.{bucket}.{key}"

    async def _write(self, bucket: str, key: str, data: bytes, ref: IssuedRef, *, expected: int, now: float) -> int:
        """One row of ``ref``'s generation, with its TTL, expecting the key's last sequence."""
        ttl_s = row_ttl_s(ref.generation, now=now, grace_s=self._grace_s)
        with self._errors(f"KV_{bucket}"):
            return await publish_expecting(
                self._conn, self._subject(bucket, key), data, expected_last_subject_seq=expected, ttl_s=ttl_s
            )

    def _own(self, ref: IssuedRef) -> None:
        if ref.space != self.space:
            raise ValueError(f"issued reference of space {ref.space} given to space {self.space}'s stores")

    # -- issuing -------------------------------------------------------------------------------

    def new_ref(self, *, owner: str, actor: str, uid: str, horizon: int) -> IssuedRef:
        """Sync: a reference on a fresh generation carrying ``horizon`` (unix seconds).

        Raises:
            ValueError: ``horizon`` out of range. CodecError: a malformed field.
        """
        generation = new_generation(horizon, self._random(12))
        return IssuedRef(space=self.space, owner=owner, actor=actor, uid=uid, generation=generation)

    async def stage(self, evidence: Evidence, *, now: float) -> Staged:
        """Trio: write the evidence (create-only), the attempt row ``prepared`` and the source
        index rows, each with the generation's TTL.

        Raises:
            Refused: NOT_GRANTED, the generation is at or past its horizon (nothing read or
                written); CONFLICT, the generation already has evidence (a generation is never
                reused: mint a new one).
            IssuedStoresMissing: the issued store does not exist.
            Unavailable: the broker did not answer (rows written so far stay until their TTL;
                the attempt is not active, so they authorize nothing).
        """
        ref = evidence.ref
        self._own(ref)
        check_live(ref.generation, now=now)
        rendered = render_evidence(evidence)  # once: the write and the digest (issue 14 item 4)
        digest = digest_of(rendered)
        try:
            await self._write(self.issued, evidence_key(ref), rendered, ref, expected=0, now=now)
            attempt = Attempt(state="prepared", digest=digest)
            revision = await self._write(self.issued, attempt_key(ref), render_attempt(attempt), ref, expected=0, now=now)
        except SubjectConflict:
            raise Refused(
                RefusalCode.CONFLICT, f"issued generation {ref.generation} already has evidence - issue on a fresh generation"
            ) from None
        staged = Staged(evidence=evidence, attempt_revision=revision, digest=digest)
        try:
            for source in evidence.sources:
                row = render_source_row(SourceRow(source=source, ref=ref))
                await self._write(self.issued, bysource_key(source, ref), row, ref, expected=0, now=now)
        except BaseException:
            await self._abort_quietly(staged, now=now)
            raise
        return staged

    async def activate(self, staged: Staged, *, now: float) -> None:
        """Trio: move the attempt from ``prepared`` to ``active`` at the revision staging saw.

        Raises:
            Refused: NOT_GRANTED, past the horizon; CONFLICT, the attempt changed since it was
                staged (aborted or retired meanwhile).
            IssuedStoresMissing, Unavailable: as :meth:`stage`.
        """
        await self._move(staged.ref, staged.digest or evidence_digest(staged.evidence), "active", staged.attempt_revision, now=now)

    async def abort(self, staged: Staged, *, now: float) -> None:
        """Trio: move a staged attempt to ``aborted`` (its rows then authorize nothing).

        Raises:
            Refused: as :meth:`activate`.
            IssuedStoresMissing, Unavailable: as :meth:`stage`.
        """
        await self._move(staged.ref, staged.digest or evidence_digest(staged.evidence), "aborted", staged.attempt_revision, now=now)

    async def _move(self, ref: IssuedRef, digest: str, state: str, revision: int, *, now: float) -> int:
        check_live(ref.generation, now=now)
        row = render_attempt(Attempt(state=state, digest=digest))  # type: ignore[arg-type]
        try:
            return await self._write(self.issued, attempt_key(ref), row, ref, expected=revision, now=now)
        except SubjectConflict:
            raise Refused(
                RefusalCode.CONFLICT,
                f"the attempt of issued generation {ref.generation} changed since revision {revision} - issue again",
            ) from None

    async def _abort_quietly(self, staged: Staged, *, now: float) -> None:
        with trio.move_on_after(ABORT_S, shield=True):
            try:
                await self.abort(staged, now=now)
            except Exception as exc:  # noqa: BLE001 - the original failure is what the caller sees
                log.warning("space %s: issuance %s not marked aborted: %s", self.space, staged.ref.generation, exc)

    async def issue(self, evidence: Evidence, *, now: float) -> IssuedRef:
        """Trio: :meth:`stage` then :meth:`activate`; a failed activation marks the attempt
        ``aborted`` (best effort, shielded). Returns the evidence's reference.

        A caller with a step between the two (a ledger append) calls them itself.

        Raises:
            Refused, IssuedStoresMissing, Unavailable: as :meth:`stage` and :meth:`activate`.
        """
        staged = await self.stage(evidence, now=now)
        try:
            await self.activate(staged, now=now)
        except BaseException:
            await self._abort_quietly(staged, now=now)
            raise
        return staged.ref

    async def issue_accepted(self, evidence: Evidence, token: str, *, now: float) -> bool:
        """Trio: issue ``evidence`` at a connect and accept it under ``token``, in one round trip.

        The callout's path (issue 14 item 3; spec "User-auth manager callers"): the evidence
        (create-only), the attempt row written ``active`` at once (create-only) and
        ``accepted.v1.<token>`` (write-once) leave together, each with the generation's TTL, and
        their acks are awaited together (:meth:`connect_writes`, then :meth:`connect_outcome`;
        the callout sends them beside its issuance row instead). There is no ``prepared``
        step because the caller releases the credential that carries the generation only after
        every ack came back good: a generation whose connect is never answered (a deadline, a
        denial, a crash) is carried by no credential, so nobody can publish on its rows, whatever
        of them landed, and they go with their TTL (``horizon + grace - now``).

        Returns:
            True: all three rows are stored. False: the token already has its row (written by an
            earlier connect under the same nonce): this generation is named by no accepted row
            and authorizes nothing; the caller reads the row there and applies the reuse rules.

        Raises:
            Refused: NOT_GRANTED, the generation is at or past its horizon (nothing written);
                CONFLICT, the generation already has evidence or an attempt.
            CodecError: ``token`` is not 32 lowercase hex digits (nothing written).
            IssuedStoresMissing: a store does not exist.
            Unavailable: the broker did not answer one of the writes (rows written so far stay
                until their TTL and authorize nothing anyone holds).
        """
        writes = self.connect_writes(evidence, token, now=now)
        return self.connect_outcome(evidence, await js_publish_many(self._conn, writes))

    def connect_writes(self, evidence: Evidence, token: str, *, now: float) -> list[Publish]:
        """Sync: the three JetStream publishes of :meth:`issue_accepted`, in order (evidence,
        attempt ``active``, accepted row), for a caller that sends them with its own.

        Raises:
            Refused: NOT_GRANTED, the generation is at or past its horizon.
            CodecError: ``token`` is malformed.
        """
        ref = evidence.ref
        self._own(ref)
        accepted = accepted_key(token)
        check_live(ref.generation, now=now)
        rendered = render_evidence(evidence)  # once: the write and the digest (issue 14 item 4)
        attempt = render_attempt(Attempt(state="active", digest=digest_of(rendered)))
        headers = expecting_headers(expected_last_subject_seq=0, ttl_s=row_ttl_s(ref.generation, now=now, grace_s=self._grace_s))
        return [
            (self._subject(self.issued, evidence_key(ref)), rendered, headers),
            (self._subject(self.issued, attempt_key(ref)), attempt, headers),
            (self._subject(self.accepted, accepted), render_accepted(Accepted(ref=ref)), headers),
        ]

    def connect_outcome(self, evidence: Evidence, outcomes: list[int | Exception]) -> bool:
        """Sync: what the acks of :meth:`connect_writes` mean (see :meth:`issue_accepted`).

        Raises:
            As :meth:`issue_accepted`.
        """
        for outcome, stream in zip(outcomes, (self.issued, self.issued, self.accepted), strict=True):
            if isinstance(outcome, StreamNotFound):
                raise self._missing(f"KV_{stream}") from outcome
        for outcome in outcomes[:2]:
            if isinstance(outcome, WrongLastSequence | SubjectFull):
                raise Refused(
                    RefusalCode.CONFLICT,
                    f"issued generation {evidence.ref.generation} already has rows - issue on a fresh generation",
                ) from None
            if isinstance(outcome, Exception):
                raise outcome
        if isinstance(outcomes[2], WrongLastSequence | SubjectFull):  # write-once: the token has its row
            return False
        if isinstance(outcomes[2], Exception):
            raise outcomes[2]
        return True

    # -- reading -------------------------------------------------------------------------------

    async def resolve(self, ref: IssuedRef, *, now: float, source_live: SourceLive | None = None) -> Resolved:
        """Trio: the evidence of a live, active issuance.

        Refuses a generation at or after its horizon before any read. Then reads the evidence as
        the first message on its key, and the attempt row (its last message), which must be
        ``active`` and name the evidence's digest. With ``source_live``, every source must be
        live, and the attempt is read again and must be at the same revision.

        Raises:
            Refused: NOT_GRANTED, with the reason (past the horizon, no evidence, unreadable
                evidence, another reference, evidence expired, attempt not active, a source not
                live, attempt changed).
            IssuedStoresMissing: the issued store does not exist.
            Unavailable: the broker did not answer.
        """
        self._own(ref)
        check_live(ref.generation, now=now)
        evidence, digest = await self._evidence(ref)
        if evidence.expires_at is not None and now >= evidence.expires_at:
            raise _not_granted(ref, f"expired at unix {evidence.expires_at}")
        revision = await self._active_revision(ref, digest)
        if source_live is not None:
            for source in evidence.sources:
                if not await source_live(source):
                    raise _not_granted(ref, f"depends on {source.bucket} {source.key}, which is no longer live")
            if await self._active_revision(ref, digest) != revision:
                raise _not_granted(ref, "changed while it was resolved")
        return Resolved(evidence=evidence, attempt_revision=revision)

    async def _evidence(self, ref: IssuedRef) -> tuple[Evidence, str]:
        """The evidence of ``ref`` and its digest (of the stored bytes, which parsing proved
        are exactly its canonical rendering)."""
        with self._errors(f"KV_{self.issued}"):
            msg = await first_message(self._conn, f"KV_{self.issued}", self._subject(self.issued, evidence_key(ref)))
        if msg is None:
            raise _not_granted(ref, "has no evidence")
        try:
            evidence = parse_evidence(msg.data)
        except CodecError as exc:
            log.warning("space %s: evidence of %s is unreadable: %s", self.space, ref.generation, exc)
            raise _not_granted(ref, "has unreadable evidence") from None
        if evidence.ref != ref:
            raise _not_granted(ref, "has evidence for another reference")
        return evidence, digest_of(msg.data)

    async def _attempt(self, ref: IssuedRef) -> tuple[Attempt, int] | None:
        with self._errors(f"KV_{self.issued}"):
            msg = await last_message(self._conn, f"KV_{self.issued}", self._subject(self.issued, attempt_key(ref)))
        if msg is None:
            return None
        try:
            return parse_attempt(msg.data), msg.seq
        except CodecError as exc:
            log.warning("space %s: attempt of %s is unreadable: %s", self.space, ref.generation, exc)
            raise _not_granted(ref, "has an unreadable attempt row") from None

    async def _active_revision(self, ref: IssuedRef, digest: str) -> int:
        found = await self._attempt(ref)
        if found is None:
            raise _not_granted(ref, "has no attempt row")
        attempt, revision = found
        if attempt.state != "active":
            raise _not_granted(ref, f"is {attempt.state}, not active")
        if attempt.digest != digest:
            raise _not_granted(ref, "has an attempt row for other evidence")
        return revision

    # -- renewing and retiring -----------------------------------------------------------------

    async def renew(self, ref: IssuedRef, ceiling: Ceiling, *, now: float, horizon: int | None = None) -> Renewal:
        """Trio: renew an issuance: the same generation only for a byte-identical ceiling.

        The ceiling's canonical bytes are compared with the evidence's. Equal (and ``horizon``
        None or the generation's own): the generation is kept and nothing is written. Otherwise a
        fresh issuance on a fresh generation, with the same reference triple and sources and
        ``horizon`` (default: the old one), which a new connection adopts; the old generation
        stays as it was until its horizon. ``expiresAt`` is kept, or follows a new ``horizon``.

        A renewal never moves the horizon later (spec "Issued authority": renewals stop at the
        horizon and the agent is respawned); an earlier ``horizon`` is allowed.

        Raises:
            Refused: NOT_GRANTED for a ``horizon`` later than the generation's; as :meth:`resolve`
                for the old generation, or :meth:`issue`.
            IssuedStoresMissing, Unavailable: as :meth:`resolve`.
        """
        if horizon is not None and horizon > ref.horizon:  # checked before any read
            raise Refused(RefusalCode.NOT_GRANTED, RENEW_PAST_HORIZON.format(horizon=ref.horizon))
        old = (await self.resolve(ref, now=now)).evidence
        if ceiling.canonical() == old.permissions.canonical() and horizon in (None, ref.horizon):
            return Renewal(ref=ref, kept=True)
        fresh = self.new_ref(owner=ref.owner, actor=ref.actor, uid=ref.uid, horizon=horizon or ref.horizon)
        expires_at = old.expires_at if horizon is None or old.expires_at is None else horizon
        evidence = Evidence(ref=fresh, sources=old.sources, permissions=ceiling, expires_at=expires_at)
        return Renewal(ref=await self.issue(evidence, now=now), kept=False)

    async def retire(self, ref: IssuedRef, *, now: float) -> bool:
        """Trio: move the attempt to ``revoked``; False when it was not there or already ended.

        Raises:
            Refused: NOT_GRANTED, the generation is at or past its horizon (nothing read: it
                authorizes nothing already).
            IssuedStoresMissing: the issued store does not exist.
            Unavailable: the broker did not answer, or the attempt kept changing.
        """
        self._own(ref)
        check_live(ref.generation, now=now)
        for _ in range(RETIRE_ATTEMPTS):
            found = await self._attempt(ref)
            if found is None or found[0].state in ("aborted", "revoked"):
                return False
            row = render_attempt(Attempt(state="revoked", digest=found[0].digest))
            try:
                await self._write(self.issued, attempt_key(ref), row, ref, expected=found[1], now=now)
                return True
            except SubjectConflict:
                continue
        raise Unavailable(f"the attempt of issued generation {ref.generation} kept changing while it was retired - retire it again")

    async def by_source(self, source: Source, *, now: float) -> list[IssuedRef]:
        """Trio: the live generations whose evidence names ``source`` (its index rows), sorted.

        Generations at or past their horizon are left out without reading their rows.

        Raises:
            IssuedStoresMissing: the issued store does not exist.
            Unavailable: the broker did not answer.
        """
        with self._errors(f"KV_{self.issued}"):
            keys = await kv_keys(self._conn, self.issued, prefix=bysource_prefix(source))
        refs = [ref_from_key(self.space, key) for key in keys]
        return [ref for ref in refs if now < ref.horizon]

    async def retire_source(self, source: Source, *, now: float) -> int:
        """Trio: retire every live issuance that depends on ``source``; how many were active.

        Raises:
            IssuedStoresMissing, Unavailable: as :meth:`by_source` and :meth:`retire`.
        """
        retired = 0
        for ref in await self.by_source(source, now=now):
            try:
                retired += await self.retire(ref, now=now)
            except Refused:
                continue  # reached its horizon meanwhile: it authorizes nothing already
        return retired

    # -- accepted rows -------------------------------------------------------------------------

    async def accept(self, token: str, ref: IssuedRef, *, now: float) -> int:
        """Trio: write ``accepted.v1.<token>`` naming ``ref``, once; its sequence.

        Raises:
            Refused: NOT_GRANTED, ``ref`` is at or past its horizon; CONFLICT, the token already
                has its row (write-once at the broker).
            CodecError: ``token`` is not 32 lowercase hex digits.
            IssuedStoresMissing, Unavailable: the accepted store is missing, or the broker.
        """
        self._own(ref)
        key = accepted_key(token)
        check_live(ref.generation, now=now)
        try:
            return await self._write(self.accepted, key, render_accepted(Accepted(ref=ref)), ref, expected=0, now=now)
        except SubjectConflict:
            raise Refused(RefusalCode.CONFLICT, f"accepted row {key} is already written and is write-once") from None

    async def accepted_ref(self, token: str, *, now: float) -> IssuedRef | None:
        """Trio: the reference ``accepted.v1.<token>`` names, or None when there is no row.

        Raises:
            Refused: NOT_GRANTED, the row names a generation at or past its horizon, or is
                unreadable.
            CodecError: ``token`` is malformed.
            IssuedStoresMissing, Unavailable: as :meth:`accept`.
        """
        key = accepted_key(token)
        with self._errors(f"KV_{self.accepted}"):
            msg = await first_message(self._conn, f"KV_{self.accepted}", self._subject(self.accepted, key))
        if msg is None:
            return None
        try:
            ref = parse_accepted(msg.data).ref
        except CodecError as exc:
            log.warning("space %s: accepted row %s is unreadable: %s", self.space, key, exc)
            raise Refused(RefusalCode.NOT_GRANTED, f"accepted row {key} is unreadable - connect again") from None
        check_live(ref.generation, now=now)
        return ref


async def recreate_issued_stores(conn: Connection, space: str, backup_dir: Path) -> dict[str, int]:
    """Trio: back up both issued stores of ``space`` into ``backup_dir``, delete them, create them
    again in the current shape, with as many copies as the old ones had (the next full-lane start
    scales them to the space's ``replicas``). Returns ``{stream: messages backed up}`` (absent
    streams: none).

    Run it with the space's auth service, callout replicas and managers stopped: a write between
    the backup and the delete is lost. Both streams are backed up before either is deleted.

    Args:
        conn: a connection allowed ``$JS.API.>`` in the space's data account.
        backup_dir: a folder that is missing or empty.

    Raises:
        ConfigError: ``backup_dir`` is not an empty folder, or a backup file cannot be written.
        Unavailable: the broker or JetStream did not answer (nothing is deleted when a backup
            failed).
    """
    await trio.to_thread.run_sync(check_backup_dir, backup_dir)
    counts: dict[str, int] = {}
    shapes = issued_shapes(space)
    replicas = 1
    for shape in shapes:
        if (config := await stream_config(conn, shape.name)) is not None:
            replicas = max(replicas, _replicas_of(config))
            try:
                counts[shape.name] = await backup_stream(conn, shape.name, backup_dir)
            except OSError as exc:
                raise ConfigError(f"the backup of {shape.name} into {backup_dir} failed ({exc}) - pass a folder you can write") from None
    for shape in shapes:
        await delete_stream(conn, shape.name)
        log.warning("space %s: deleted %s (backed up into %s)", space, shape.name, backup_dir)
    await IssuedStores(conn, space).ensure(replicas=replicas)  # as many copies as before (issue 17 item 1)
    return counts


def _replicas_of(config: dict) -> int:
    count = config.get("num_replicas")
    return count if isinstance(count, int) and 1 <= count <= 5 else 1


def check_backup_dir(backup_dir: Path) -> None:
    """Sync: refuse a backup folder that is not missing or empty (file I/O).

    Raises:
        ConfigError: it exists and is not an empty folder.
    """
    if backup_dir.exists() and (not backup_dir.is_dir() or any(backup_dir.iterdir())):
        raise ConfigError(
            f"--recreate-issued-stores {backup_dir} is not an empty folder - pass a new or empty folder for the backup"
        )
