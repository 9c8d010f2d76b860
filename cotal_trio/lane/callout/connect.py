"""The connect half of a lane's callout: one admitted request's way from its bearer to its answer.

Steps 3 to 7 of spec "Auth callout" (:mod:`cotal_trio.core.callout`), each timed into the
request's :class:`~cotal_trio.core.callout_log.CalloutRecord`: the bearer, then the connect
limits, charged right after the bearer check, before any ledger read or store write, on trio
time (:func:`~cotal_trio.core.callout.check_connect`; spec "Connect limits"); the ledger (or the
rows it last gave, :data:`~cotal_trio.lane.callout.ports.RecallLedger`) and the policy; the
issuance row and the re-check; the issued authority; the signed mint. The admission half
(:mod:`cotal_trio.lane.callout.responder`) runs it under the request's deadline scope, which
:func:`_next_step` checks between the steps.

Before answering a mint the connect records its issuance row and checks authority again
(:mod:`cotal_trio.stores.issuance`); a row the request sent but did not answer with a mint
(deadline, re-check denial) is withdrawn by the responder after the answer, in a task of its
own, so the worker is free for the next request. The ledger port is awaited: in a lane a
principal whose row files are gone or unchanged is answered by a ``stat`` check run inline on
the lane's trio thread (no thread hop, issue 14 item 4), and only a read of a new or changed
file runs in a worker thread (:func:`~cotal_trio.state.ledger_threads.read_in_threads`). So a
read that stalls holds one request, never the lane, but a ``stat`` that hangs (a dead NFS mount)
holds the lane's trio thread (state/ledger_threads.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math

import trio

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.callout import CalloutKeys, ConnectGrant, check_connect, decide_connect, encode_response, mint_user_jwt
from cotal_trio.core.callout_log import CalloutRecord, Outcome, Step
from cotal_trio.core.connect_authority import widen
from cotal_trio.core.errors import CodecError, RateLimited, RefusalCode, Refused, Unavailable
from cotal_trio.core.issuance import issuance_row
from cotal_trio.core.limits import ConnectLimiter
from cotal_trio.core.natsjwt import AuthorizationRequest
from cotal_trio.stores.issuance import Issuance, IssuanceFailed
from cotal_trio.lane.callout.ports import ConnectPorts, Prepared

__all__ = ["AUTHORITY_MARGIN_S", "INTERNAL_ERROR_REASON", "ConnectCheck"]

log = logging.getLogger("cotal.callout")

# Seconds before a request's deadline at which the issued-authority writes' acks (and the port
# awaited after the re-check) stop being awaited: a hung issuer session then costs the connect
# its rows, never the connect. Covers the deadline keeper's early wake (KEEPER_MAX_LEAD_S) and
# the re-check and signing after it (under a millisecond when the row files are unchanged).
AUTHORITY_MARGIN_S = 0.2

INTERNAL_ERROR_REASON = "internal error in the auth callout - see the auth service log"
# Views whose bearer names a record the callout confirms at connect (spec "Listener policy").
RECORD_BOUND_VIEWS = frozenset({"manager-caller", "session-caller", "service-host"})
NO_CONFIRM = "connect to a member of the space's callout queue that reads its records store"


class ConnectCheck:
    """One lane's connect check over its :class:`~cotal_trio.lane.callout.ports.ConnectPorts`.

    Args:
        keys: the lane's callout keys (the mint and the denial are signed and sealed with them).
        ports: what the check reads and writes (the bearer verifier, the ledger, the issuance
            rows' store, the connect limits, the view check and the issued authority).
    """

    def __init__(self, keys: CalloutKeys, ports: ConnectPorts) -> None:
        self._keys, self._verifier, self._read_ledger = keys, ports.verifier, ports.read_ledger
        self._confirm_view, self._issue_authority = ports.confirm_view, ports.issue_authority
        self._recall_ledger, self._row_expiries, self._store = ports.recall_ledger, ports.row_expiries, ports.store
        self._connect_limits = ConnectLimiter() if ports.connect_limits is None else ports.connect_limits

    def issuance(self) -> Issuance:
        """A fresh :class:`~cotal_trio.stores.issuance.Issuance` for one request's row (sync)."""
        return Issuance(self._store, self._keys.space, expiries=self._row_expiries)

    def deny(self, request: AuthorizationRequest, reason: str, now: float) -> bytes:
        """The signed, sealed denial of ``request`` with ``reason`` (sync)."""
        return encode_response(request, keys=self._keys, now=int(now), error=reason)

    async def answer(
        self, request: AuthorizationRequest, record: CalloutRecord, now: float, scope: trio.CancelScope,
        issuance: Issuance,
    ) -> bytes:
        """The answer to one admitted request (the signed mint or denial); Cancelled (the
        request's deadline, ``scope``) between its steps. ``issuance`` is :meth:`issuance`'s:
        the caller keeps or withdraws its row once the answer is out."""
        try:
            return await self._allow(request, record, now, scope, issuance)
        # CodecError: a corrupt ledger row, named; IssuanceFailed: the row's store, named.
        except (Refused, CodecError, IssuanceFailed) as refused:
            reason = refused.reason() if isinstance(refused, Refused) else str(refused)
        except Exception:  # our bug: deny this connect, keep the lane (STYLE.md practice 10)
            log.exception("auth callout: space=%s failed on one request", self._keys.space)
            reason = INTERNAL_ERROR_REASON
        record.outcome, record.reason = Outcome.DENIED, reason
        with _timed(record, Step.SIGN):
            return self.deny(request, reason, now)

    async def _allow(
        self, request: AuthorizationRequest, record: CalloutRecord, now: float, scope: trio.CancelScope,
        issuance: Issuance,
    ) -> bytes:
        space, next_step = self._keys.space, functools.partial(_next_step, scope)
        await next_step()  # a request that waited out its deadline in the queue stops here
        with _timed(record, Step.VERIFY):
            bearer = self._admit(request, record, now)
        grant = self._recalled_grant(request, bearer, record, now)
        if grant is None:
            await next_step()
            with _timed(record, Step.LEDGER):
                rows = await self._read_ledger(bearer.owner, bearer.actor)
            await next_step()
            with _timed(record, Step.POLICY):
                grant = decide_connect(request, bearer, rows, space=space, now=now)
        await next_step()
        with _timed(record, Step.LEDGER):  # spec: ledger_ms is the actor check and the issuance record
            grant = await self._issue(request, bearer, grant, issuance, now)
        await next_step()
        with _timed(record, Step.SIGN):
            user_jwt = mint_user_jwt(request, grant, keys=self._keys, now=int(now))
            return encode_response(request, keys=self._keys, now=int(now), jwt=user_jwt)

    async def _confirm(self, bearer: ValidatedBearer, now: float) -> None:
        """A record-bound view's record is still live (spec "Listener policy"), else Refused."""
        if self._confirm_view is None:
            raise Refused(RefusalCode.NOT_GRANTED, f"this callout cannot confirm a {bearer.view} bearer - {NO_CONFIRM}")
        await self._confirm_view(bearer, now)

    def _recalled_grant(
        self, request: AuthorizationRequest, bearer: ValidatedBearer, record: CalloutRecord, now: float
    ) -> ConnectGrant | None:
        """The grant the remembered rows give, or None: nothing remembered, or it does not grant."""
        rows = None if self._recall_ledger is None else self._recall_ledger(bearer.owner, bearer.actor)
        if rows is None:
            return None
        with _timed(record, Step.POLICY):
            try:
                return decide_connect(request, bearer, rows, space=self._keys.space, now=now)
            except Refused:
                return None  # perhaps stale: the real read decides

    async def _issue(
        self, request: AuthorizationRequest, bearer: ValidatedBearer, grant: ConnectGrant, issuance: Issuance,
        now: float,
    ) -> ConnectGrant:
        """Step 6: write the issuance row, then re-read the ledger and decide again.

        A revoke or re-grant that landed since the first read (or since the remembered rows
        were read) denies here, as does the retirement of a view bearer's manager instance or
        chat session (:data:`ConfirmView`). Returns the grant the user JWT is minted from (the row's ``iat``
        is the mint's, ``int(now)``; its ``exp`` the bearer's, as in both grants), widened by the
        ``ep.v1`` rows :data:`IssueAuthority` gives, when there is a port. A port with
        ``prepare``/``sent``/``finish`` (``ConnectAuthority``) has a fresh token's rows sent on the
        issuer session beside the issuance row on the store connection, one round trip for
        both, and kept only if the re-check grants the same (issue 14 item 3); the re-check
        reads unchanged rows on this thread
        (:func:`read_in_threads`, issue 14 item 4). The issued authority is awaited only until
        ``AUTHORITY_MARGIN_S`` before the request's deadline (the acks, and the port or
        ``finish``): past that its writes count as Unavailable and the connect is minted
        without its rows, never timed out for them (lane/callout/authority.py).

        The row's create is retried while its stream has no leader, until ``AUTHORITY_MARGIN_S``
        before the deadline (:meth:`~cotal_trio.stores.issuance.Issuance.write`).

        Raises:
            Refused: the row exists already, or the re-check refuses.
            IssuanceFailed: the row could not be written (the reason names the fix).
            CodecError: a corrupt ledger row.
        """
        space = self._keys.space
        authority_by = trio.current_effective_deadline() - AUTHORITY_MARGIN_S  # the request's deadline scope
        prepared = self._prepare_authority(request, bearer, grant, now)
        row_of_connect = issuance_row(bearer, grant, space=space, iat=int(now))
        outcomes: list[int | Exception] | None = None
        # A row refused for want of a stream leader (an election) is sent again until the margin
        # before the deadline: a connect late in the election is minted, not denied (issue 17).
        if prepared is None:
            await issuance.write(request.user_nkey, row_of_connect, now=now, retry_until=authority_by)
        else:  # the rows on the issuer session, the row on the store connection: one round trip
            async with self._issue_authority.sent(prepared) as acks:  # type: ignore[union-attr]
                await issuance.write(request.user_nkey, row_of_connect, now=now, retry_until=authority_by)
                with trio.move_on_at(authority_by):  # a hung issuer session: no rows, still minted
                    outcomes = await acks()
            if outcomes is None:
                unacked = Unavailable(f"issued-authority writes not acknowledged {AUTHORITY_MARGIN_S:g} s before the deadline")
                outcomes = [unacked] * len(prepared.writes)
        rows = await self._read_ledger(bearer.owner, bearer.actor)
        if bearer.view in RECORD_BOUND_VIEWS:  # after the row, like the ledger: a retirement since bites
            await self._confirm(bearer, now)
        grant = decide_connect(request, bearer, rows, space=space, now=now)
        if self._issue_authority is None:
            return grant
        row = rows[0] if rows[0] is not None else rows[1]  # decide_connect granted: exactly one
        assert row is not None and request.connect_name is not None
        extra = None
        with trio.move_on_at(authority_by):  # a hung issuer session: no rows, still minted
            if prepared is not None and outcomes is not None:
                finish = self._issue_authority.finish  # type: ignore[attr-defined]
                extra = await finish(prepared, outcomes, bearer, grant, row, request.connect_name, now)
            else:
                extra = await self._issue_authority(bearer, grant, row, request.connect_name, now)
        return grant if extra is None else dataclasses.replace(grant, permissions=widen(grant.permissions, extra))

    def _prepare_authority(
        self, request: AuthorizationRequest, bearer: ValidatedBearer, grant: ConnectGrant, now: float
    ) -> Prepared | None:
        """The issued-authority writes to send with the issuance row (one round trip for both:
        issue 14 item 3), made from the first check's rows as the ledger port last gave them
        (:data:`RecallLedger`, no I/O), or None: the port is awaited after the re-check instead.
        The re-check decides whether they are kept (``ConnectAuthority.finish``).

        Remembered rows may be as stale as the principal's last connect: writes made from them
        after a re-grant would leave the fresh nonce's accepted row with the old ceiling (no rows
        for this connect, and the identical-ceiling rule failing every later one under the
        nonce). So they are prepared only when the ledger port's ``unchanged`` check (two
        ``stat`` calls, no read: :class:`~cotal_trio.state.ledger_threads.LedgerPort`) gives
        exactly the remembered rows; a port without it never prepares."""
        prepare = getattr(self._issue_authority, "prepare", None)
        unchanged = getattr(self._read_ledger, "unchanged", None)
        if prepare is None or unchanged is None or self._recall_ledger is None or request.connect_name is None:
            return None
        rows = self._recall_ledger(bearer.owner, bearer.actor)
        if rows is None or unchanged(bearer.owner, bearer.actor) != rows:
            return None  # forgotten, or a file changed since: the re-check's fresh row decides
        row = rows[0] if rows[0] is not None else rows[1]
        if row is None or (rows[0] is not None and rows[1] is not None):
            return None
        return prepare(bearer, grant, row, request.connect_name, now)

    def _admit(self, request: AuthorizationRequest, record: CalloutRecord, now: float) -> ValidatedBearer:
        """Steps 3-4: the bearer, then connect limits, before any ledger read or store write.

        A limited connect's line still names the owner and actor it was charged to (spec
        "Connect limits"). Raises RateLimited or Refused (:func:`check_connect`).
        """
        try:
            bearer = check_connect(
                request, space=self._keys.space, verifier=self._verifier, limiter=self._connect_limits,
                now=now, at=trio.current_time(),
            )
        except RateLimited as limited:
            record.owner, record.actor = limited.owner or "-", limited.actor or "-"
            raise
        record.owner, record.actor = bearer.owner, bearer.actor
        return bearer


async def _next_step(scope: trio.CancelScope) -> None:
    """Stop here if the deadline passed, even inside one synchronous stretch of a task.

    trio turns an expired deadline into a cancellation only between task steps, so a step that
    ran past it (a slow disk) would otherwise carry on to the next one.
    """
    if trio.current_time() >= scope.deadline:
        scope.cancel()
    await trio.lowlevel.checkpoint_if_cancelled()


class _timed:
    """Context manager adding the elapsed trio time to ``record`` under ``step``.

    It also marks ``step`` as the one in progress, so a deadline names it as ``at=<step>``.
    """

    __slots__ = ("_record", "_step", "_start")

    def __init__(self, record: CalloutRecord, step: Step) -> None:
        self._record, self._step, self._start = record, step, math.nan

    def __enter__(self) -> None:
        self._start = trio.current_time()
        self._record.enter(self._step, self._start)

    def __exit__(self, *exc_info: object) -> None:
        if self._record.at_since is not None:  # not cut short by an answer at the deadline
            self._record.add(self._step, trio.current_time() - self._start)
            self._record.at_since = None
