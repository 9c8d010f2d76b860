"""The ports of a lane's callout: what its responder takes, and what the connect authority hands it.

Both :mod:`~cotal_trio.lane.callout.responder` (and its connect check,
:mod:`~cotal_trio.lane.callout.connect`) and :mod:`~cotal_trio.lane.callout.authority` import this
module, and it imports neither: the responder depends on the ports, the authority implements one
(issue 16: no circle between them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.callout import ConnectGrant
from cotal_trio.core.connect_authority import AuthorityPlan
from cotal_trio.core.issued import Evidence
from cotal_trio.core.ledger import LedgerRow
from cotal_trio.core.profiles import Permissions
from cotal_trio.natsio import Publish as JetStreamPublish
from cotal_trio.state.ledger_threads import ReadLedger  # the one port, shared with the faces

__all__ = ["ConfirmView", "IssueAuthority", "Prepared", "Publish", "ReadLedger", "RecallLedger"]

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
