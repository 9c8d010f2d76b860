"""The ports of a lane's callout: what its responder takes, and what the connect authority hands it.

Both :mod:`~cotal_trio.lane.callout.responder` (and its connect check,
:mod:`~cotal_trio.lane.callout.connect`) and :mod:`~cotal_trio.lane.callout.authority` import this
module, and it imports neither: the responder depends on the ports, the authority implements one
(issue 16: no circle between them).

The responder takes its ports in two groups: :class:`AnswerPorts`, what every answer needs (the
keys that open a request and sign its answer, the limits, the clock, the reply and the answer
hook), and :class:`ConnectPorts`, what the connect check reads and writes on the way to a mint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.bearer import BearerVerifier, ValidatedBearer
from cotal_trio.core.callout import CalloutKeys, ConnectGrant
from cotal_trio.core.callout_log import CalloutRecord
from cotal_trio.core.connect_authority import AuthorityPlan
from cotal_trio.core.issued import Evidence
from cotal_trio.core.ledger import LedgerRow
from cotal_trio.core.limits import ConnectLimiter
from cotal_trio.core.profiles import Permissions
from cotal_trio.natsio import Publish as JetStreamPublish
from cotal_trio.state.ledger_threads import ReadLedger  # the one port, shared with the faces
from cotal_trio.stores.issuance import RowExpiries, RowStore

__all__ = [
    "AnswerPorts", "ConfirmView", "ConnectPorts", "IssueAuthority", "Prepared", "Publish", "ReadLedger", "RecallLedger",
]

Publish = Callable[[str, bytes], None]
"""``publish(reply, payload)``: schedules a reply without awaiting (``Connection.publish_nowait``)."""

ConfirmView = Callable[[ValidatedBearer, float], Awaitable[None]]
"""``await confirm_view(bearer, now)``: the record a view bearer is bound to is still live (its
manager instance, its chat session); raises Refused NOT_GRANTED naming the fix, Unavailable when
the store does not answer (``lane.callout.views.confirm_view``)."""

IssueAuthority = Callable[[ValidatedBearer, ConnectGrant, LedgerRow, str, float], Awaitable[Permissions | None]]
"""``await issue_authority(bearer, grant, row, inbox_nonce, now)``: the ``ep.v1`` rows to add to
the grant (issued authority at connect, issue 6 item 6), or None for none; raises Refused to deny
(``lane.callout.authority.ConnectAuthority``)."""

RecallLedger = Callable[[str, str], tuple[LedgerRow | None, LedgerRow | None] | None]
"""Sync, no I/O: ``recall(owner, actor) -> (interactive, managed)`` as last read, or None
(:meth:`~cotal_trio.state.LedgerReader.recall`). Possibly stale; see
:class:`~cotal_trio.lane.callout.responder.CalloutResponder`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A fresh token's issuance, made before the issuance row
    (:meth:`~cotal_trio.lane.callout.authority.ConnectAuthority.prepare`).

    Attributes:
        plan: what the connect is owed, from the first ledger check's row.
        permissions: the grant's permissions the ceiling was made from.
        extra: the rows to add when ``ConnectAuthority.finish`` keeps them.
        evidence: the fresh generation's evidence.
        writes: its three JetStream publishes, to send with the issuance row.
    """

    plan: AuthorityPlan
    permissions: Permissions
    extra: Permissions
    evidence: Evidence
    writes: list[JetStreamPublish]


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerPorts:
    """What the responder needs for every answer, a mint, a denial or a timeout.

    Attributes:
        keys: the lane's callout keys (provenance, signing, sealing).
        limits: callout limits (deadline budget, in-flight cap, slow threshold).
        clock: wall time, unix seconds.
        publish: schedules a reply without awaiting (``Connection.publish_nowait``).
        on_answer: called with each answered request's finished record (outcome, timings),
            after its reply is scheduled; sync, must not block (``LaneMetrics.callout_answered``).
    """

    keys: CalloutKeys
    limits: CalloutLimits
    clock: Callable[[], float]
    publish: Publish
    on_answer: Callable[[CalloutRecord], None] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectPorts:
    """What the connect check reads and writes (:class:`~cotal_trio.lane.callout.connect.ConnectCheck`).

    Attributes:
        verifier: the space's bearer verifier (issuer keys plus the verified-token memo).
        read_ledger: the ledger port (:data:`ReadLedger`), read at the ledger step and again
            after the issuance row; a lane's is ``read_in_threads`` over a
            :class:`~cotal_trio.state.LedgerReader`.
        store: the space's auth bucket, where each mint's issuance row is written
            (:func:`~cotal_trio.stores.issuance.issuance_store`; an in-memory fake in tests).
        connect_limits: the lane's connect limits, shared with its exchange faces (spec "Connect
            limits"); charged on trio time. None: a limiter of its own at the spec's limits.
        recall_ledger: the principal's rows as last read, without I/O (:data:`RecallLedger`), or
            None. When they grant the connect, the first ledger read is skipped: the decision
            that counts is the one made on the real read after the issuance row, so a stale
            grant costs a row written and withdrawn, never a mint. Rows that do not grant are
            read again for real. This leaves one thread hop per mint instead of two.
        row_expiries: where each minted connect's issuance row is noted, so the lane's prune
            sweep need not read it (:class:`~cotal_trio.stores.issuance.RowExpiries`), or None.
        confirm_view: :data:`ConfirmView`, awaited for a bearer whose view is bound to a
            record (``manager-caller``: its manager instance; ``session-caller``: its chat
            session) after the issuance row is written, beside the ledger's re-read (inside
            ``ledger_ms``), so a retirement that lands before the row denies the connect;
            None: such bearers are denied (nothing could confirm the record is still live).
        issue_authority: :data:`IssueAuthority`, awaited after the ledger re-check (inside
            ``ledger_ms``) with the row that granted the connect; the rows it returns are added
            to the grant before the user JWT is minted. None: no ``ep.v1`` rows (as before).
    """

    verifier: BearerVerifier
    read_ledger: ReadLedger
    store: RowStore
    connect_limits: ConnectLimiter | None = None
    recall_ledger: RecallLedger | None = None
    row_expiries: RowExpiries | None = None
    confirm_view: ConfirmView | None = None
    issue_authority: IssueAuthority | None = None
