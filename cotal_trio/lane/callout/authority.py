"""The callout's issued-authority port over a space's issued stores (issue 6 item 6;
:mod:`cotal_trio.core.connect_authority`; docs/issued-authority.md "Issued authority at connect").

:class:`ConnectAuthority` is the responder's ``issue_authority`` port: awaited after the ledger
re-check, it returns the rows to add to the grant, or None for none.

A token this lane has not seen (a fresh inbox nonce: the usual connect) is issued at once: the
evidence, the attempt written ``active`` and the accepted row leave together, create-only, in
one round trip (:meth:`~cotal_trio.stores.issued.IssuedStores.issue_accepted`; issue 14 item 3).
The accepted row's create is also the read: when the token already has its row, the write is
refused and that row is read and reused or not, by the same rules as a read first (spec
"User-auth manager callers": the same caller, a live generation, an identical ceiling; never a
second generation under one token). A token this lane wrote before (the same nonce connecting
again) is read first, as before, so a reconnect costs no fresh rows. The fresh generation a
refused write leaves is named by no accepted row and carried by no credential: it authorizes
nothing and goes with its TTL. The rows and the ceiling come from an
:class:`~cotal_trio.core.connect_authority.AuthorityMemo` (built once per principal and grant).

The callout sends those three writes beside its issuance row: the writes on the lane's issuer
session (spec "Profiles", issuer row), the row on its store connection, both handed over in one
scheduler pass so they cost one round trip together (:meth:`ConnectAuthority.prepare`, made
from the grant the first ledger check gave; :meth:`ConnectAuthority.sent`),
and keeps them only when the re-check after the row plans the same and grants the same
permissions (:meth:`ConnectAuthority.finish`); otherwise the connect gets no rows and the
prepared generation, carried by no credential, goes with its TTL.

A managed ``run`` seat's spawner row is read fresh through the ``read_ledger`` port first
(:func:`~cotal_trio.core.connect_authority.spawner_to_read`); an unreadable or absent spawner
row makes the seat a listing caller, never a refused connect.

A store that fails (missing, drifted, unreachable), one that hangs (the callout awaits the
issued authority only until ``AUTHORITY_MARGIN_S`` before its deadline, then counts each write
Unavailable: lane/callout/connect.py) or a lost race for the token costs the connect its rows, never
the connect: the credential is minted on the legacy rail, as one issued
before this existed (spec "User-auth manager callers": a failed issuance never retries on that
rail). Cancellation (the callout's deadline) propagates; rows left written by a connect that
was never answered authorize nothing (no credential carries their generation) and go with their
TTL.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.callout import ConnectGrant
from cotal_trio.core.connect_authority import (
    AuthorityMemo,
    AuthorityPlan,
    plan_connect_authority,
    reusable,
    spawner_to_read,
)
from cotal_trio.core.errors import CodecError, Refused, Unavailable
from cotal_trio.core.issued import Ceiling, Evidence, IssuedRef
from cotal_trio.core.ledger import LedgerRow
from cotal_trio.core.profiles import Permissions
from cotal_trio.lane.callout.ports import Prepared, ReadLedger
from cotal_trio.stores.issued import IssuedStores

__all__ = ["ConnectAuthority", "Prepared"]  # Prepared: lane/callout/ports.py

log = logging.getLogger("cotal.callout")

# Accepted tokens this lane wrote (or tried to), remembered so that the same nonce connecting
# again reads its row first instead of issuing rows a refused write would leave (about 100 B each).
SEEN_TOKENS = 65536


class ConnectAuthority:
    """``await port(bearer, grant, row, inbox_nonce, now) -> Permissions | None`` over ``stores``.

    Args:
        stores: the space's :class:`~cotal_trio.stores.issued.IssuedStores` over the lane's store
            connection.
        read_ledger: the callout's ledger port, for a managed ``run`` seat's spawner row; without
            one no managed seat is issued (spec "User-auth manager callers").
        memo: where rows and ceilings are built once per principal and grant (default: one of
            its own).
    """

    def __init__(
        self, stores: IssuedStores, *, read_ledger: ReadLedger | None = None, memo: AuthorityMemo | None = None
    ) -> None:
        self._stores, self._read_ledger = stores, read_ledger
        self._memo = AuthorityMemo() if memo is None else memo
        self._seen: dict[str, None] = {}  # accepted tokens written here, oldest first

    async def __call__(
        self, bearer: ValidatedBearer, grant: ConnectGrant, row: LedgerRow, inbox_nonce: str, now: float
    ) -> Permissions | None:
        """Trio: the rows to add to ``grant``, or None (no rows owed, or none to be had).

        A checkpoint only when rows are owed (``agent`` and ``manager-caller`` bearers).
        """
        spawner = await self._spawner(bearer, row)
        plan = plan_connect_authority(
            space=self._stores.space, bearer=bearer, row=row, inbox_nonce=inbox_nonce, spawner=spawner
        )
        if plan is None:
            return None
        try:
            return await self._rows(plan, grant.permissions, inbox_nonce, now)
        except (Refused, CodecError, Unavailable) as exc:
            log.warning(
                "auth callout: space=%s %s.%s gets no ep.v1 rows (%s generation): %s",
                plan.space, plan.owner, plan.actor, plan.kind, exc,
            )
            return None

    def prepare(
        self, bearer: ValidatedBearer, grant: ConnectGrant, row: LedgerRow, inbox_nonce: str, now: float
    ) -> Prepared | None:
        """Sync: a fresh token's issuance writes, for the callout to send with its issuance row.

        ``grant`` and ``row`` are the first ledger check's (possibly recalled). None when there is
        nothing to send ahead: no rows owed, a managed ``run`` seat (its spawner is read fresh,
        after the row), a token this lane wrote before (read first), or rows that cannot be made
        (logged); the callout then awaits the port after the re-check as before.
        """
        if spawner_to_read(bearer, row) is not None:
            return None
        plan = plan_connect_authority(space=self._stores.space, bearer=bearer, row=row, inbox_nonce=inbox_nonce)
        if plan is None or plan.token in self._seen:
            return None
        try:
            fresh = self._stores.new_ref(owner=plan.owner, actor=plan.actor, uid=plan.uid, horizon=plan.horizon)
            extra = self._memo.rows(plan, fresh.generation)
            ceiling = self._memo.ceiling(grant.permissions, extra, nonce=inbox_nonce)
            evidence = Evidence(ref=fresh, sources=(), permissions=ceiling, expires_at=plan.horizon)
            writes = self._stores.connect_writes(evidence, plan.token, now=now)
        except (Refused, CodecError, ValueError) as exc:
            log.warning("auth callout: space=%s %s.%s gets no ep.v1 rows: %s", plan.space, plan.owner, plan.actor, exc)
            return None
        self._see(plan.token)  # before the write: a cancelled one may still land
        return Prepared(plan=plan, permissions=grant.permissions, extra=extra, evidence=evidence, writes=writes)

    def sent(self, prepared: Prepared) -> AbstractAsyncContextManager[Callable[[], Awaitable[list[int | Exception]]]]:
        """Trio: ``async with port.sent(prepared) as acks``: the prepared writes handed to the
        issuer session on entry, their outcomes from ``await acks()`` for :meth:`finish`
        (:meth:`~cotal_trio.stores.issued.IssuedStores.writes_sent`; never raises for a session
        that cannot send: each write then carries its error)."""
        return self._stores.writes_sent(prepared.writes)

    async def finish(
        self, prepared: Prepared, outcomes: list[int | Exception], bearer: ValidatedBearer, grant: ConnectGrant,
        row: LedgerRow, inbox_nonce: str, now: float,
    ) -> Permissions | None:
        """Trio: the rows of a :meth:`prepare`-d connect once its writes were acknowledged
        (``outcomes``, in order) and the ledger checked again (``grant``, ``row``: the re-check's).

        The prepared rows when the re-check plans the same and grants the same permissions and
        every write landed; when the token already had its row, that row under the reuse rules;
        otherwise None (the prepared generation is carried by no credential and goes with its
        TTL). A checkpoint only when the token's row must be read.
        """
        plan = plan_connect_authority(space=self._stores.space, bearer=bearer, row=row, inbox_nonce=inbox_nonce)
        if plan != prepared.plan or grant.permissions != prepared.permissions:
            log.info("auth callout: space=%s %s.%s changed since its rows were made; none given",
                     prepared.plan.space, prepared.plan.owner, prepared.plan.actor)  # fmt: skip
            return None
        try:
            if self._stores.connect_outcome(prepared.evidence, outcomes):
                return prepared.extra
            ref = await self._stores.accepted_ref(plan.token, now=now)  # the token had its row: found by the write
            return None if ref is None else await self._reuse(plan, ref, grant.permissions, inbox_nonce, now)
        except (Refused, CodecError, Unavailable) as exc:
            log.warning(
                "auth callout: space=%s %s.%s gets no ep.v1 rows (%s generation): %s",
                plan.space, plan.owner, plan.actor, plan.kind, exc,
            )
            return None

    async def _spawner(self, bearer: ValidatedBearer, row: LedgerRow) -> LedgerRow | None:
        """The fresh row of a managed ``run`` seat's spawner (its one row, of either kind), or None:
        not such a seat, no ledger port, no row, rows of both kinds (a broken ledger, which the
        connect check refuses too) or an unreadable one (logged)."""
        principal = spawner_to_read(bearer, row)
        if principal is None or self._read_ledger is None:
            return None
        try:
            interactive, managed = await self._read_ledger(*principal)
        except (CodecError, Refused) as exc:
            log.warning("auth callout: space=%s spawner %s of %s unreadable: %s", self._stores.space, row.parent, row.principal, exc)
            return None
        if interactive is not None and managed is not None:  # a broken ledger: never a spawner
            log.warning("auth callout: space=%s spawner %s holds rows of both kinds", self._stores.space, row.parent)
            return None
        return managed if managed is not None else interactive

    async def _rows(self, plan: AuthorityPlan, permissions: Permissions, nonce: str, now: float) -> Permissions | None:
        if plan.token in self._seen:  # the same nonce again: its row is likely there, read it first
            ref = await self._stores.accepted_ref(plan.token, now=now)
            if ref is not None:
                return await self._reuse(plan, ref, permissions, nonce, now)
        self._see(plan.token)  # before the write: a cancelled one may still land
        fresh = self._stores.new_ref(owner=plan.owner, actor=plan.actor, uid=plan.uid, horizon=plan.horizon)
        extra = self._memo.rows(plan, fresh.generation)
        ceiling = self._memo.ceiling(permissions, extra, nonce=nonce)
        evidence = Evidence(ref=fresh, sources=(), permissions=ceiling, expires_at=plan.horizon)
        if await self._stores.issue_accepted(evidence, plan.token, now=now):
            return extra
        # The token had its row already: found by the refused write, decided by the reuse rules.
        ref = await self._stores.accepted_ref(plan.token, now=now)
        if ref is None:  # gone since (its TTL): never a second try at a generation under it
            return None
        return await self._reuse(plan, ref, permissions, nonce, now)

    def _see(self, token: str) -> None:
        if len(self._seen) >= SEEN_TOKENS:
            del self._seen[next(iter(self._seen))]
        self._seen[token] = None

    async def _reuse(
        self, plan: AuthorityPlan, ref: IssuedRef, permissions: Permissions, nonce: str, now: float
    ) -> Permissions | None:
        """The existing generation's rows if it may be reused (caller, horizon, ceiling), else None."""
        if not reusable(plan, ref, now=now):  # before any evidence read: a dead generation is never read
            log.info("auth callout: space=%s accepted row %s names another caller or horizon", plan.space, plan.token)
            return None
        evidence = (await self._stores.resolve(ref, now=now)).evidence
        extra = self._memo.rows(plan, ref.generation)
        return extra if _same(evidence.permissions, self._memo.ceiling(permissions, extra, nonce=nonce)) else None


def _same(recorded: Ceiling, ceiling: Ceiling) -> bool:
    """Whether the evidence recorded exactly ``ceiling`` (canonical bytes; spec "User-auth
    manager callers": reuse needs an identical ceiling)."""
    return recorded.canonical() == ceiling.canonical()
