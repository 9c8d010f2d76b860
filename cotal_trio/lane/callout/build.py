"""A lane's callout responder, built from its spec, its start and its sessions (DESIGN.md 5).

:func:`build_responder` wires the responder's ports: the callout keys from the space's material,
the bearer verifier over its issuer keys, the ledger read in worker threads (issue 14 item 4),
the issuance rows on the store session, the view check over the records store, the issued
authority over the issuer session (issue 6 item 6, issue 15 item 4), the connect limiter shared
with the exchange faces, and its answers fed to the metrics, the event bus and the lane's
health (issue 15 item 11), which it builds too: the probe reads the same ledger port.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from cotal_trio.core.bearer import BearerVerifier
from cotal_trio.core.callout import CalloutKeys
from cotal_trio.core.callout_log import CalloutRecord
from cotal_trio.core.jose import BearerKeySet
from cotal_trio.core.ledger import ReadRows
from cotal_trio.state import SpaceMaterial
from cotal_trio.stores.issuance import issuance_store
from cotal_trio.lane.callout.authority import ConnectAuthority
from cotal_trio.lane.callout.ports import AnswerPorts, ConnectPorts
from cotal_trio.lane.callout.responder import CalloutResponder, read_in_threads
from cotal_trio.lane.callout.views import view_confirmer
from cotal_trio.lane.events import callout_hook
from cotal_trio.lane.health import LaneHealth
from cotal_trio.lane.sessions import LaneStart, Sessions
from cotal_trio.lane.spec import LaneSpec

__all__ = ["build_responder", "callout_keys"]


def callout_keys(material: SpaceMaterial) -> CalloutKeys:
    """The space's callout keys: provenance, signing and sealing (sync, no I/O)."""
    return CalloutKeys(
        space=material.space,
        auth_account=material.auth_account,
        data_account=material.data_account,
        xkey=material.xkey,
        auth_signer=material.auth_signing,
        data_signer=material.data_callout_signing,
    )


def build_responder(spec: LaneSpec, start: LaneStart, sessions: Sessions) -> tuple[CalloutResponder, LaneHealth]:
    """The lane's :class:`CalloutResponder` and its :class:`LaneHealth` (sync; nothing runs yet).

    The start's metrics watch the responder's statistics and the limiter's.
    """
    common, space, ledger = spec.common, spec.space, start.ledger
    blocking: ReadRows = ledger if common.wrap_ledger is None else common.wrap_ledger(ledger)
    read_ledger = read_in_threads(blocking, max_threads=common.limits.max_in_flight)
    health = LaneHealth(
        space, read_ledger=read_ledger, store=issuance_store(sessions.store, space),
        budget_s=common.limits.budget_s, every_s=common.probe_every_s,
    )
    answered = callout_hook(start.metrics.callout_answered, common.events)  # metrics, then the event (issue 7)
    responder = CalloutResponder(
        AnswerPorts(
            keys=callout_keys(start.material), limits=common.limits, clock=common.clock,
            publish=sessions.callout.publish_nowait, on_answer=functools.partial(_answered, answered, health),
        ),
        ConnectPorts(
            verifier=BearerVerifier(BearerKeySet.from_keys(start.issuer.keys)),
            read_ledger=read_ledger,
            store=issuance_store(sessions.store, space),
            connect_limits=start.limiter,
            recall_ledger=ledger.recall,
            row_expiries=start.row_expiries,
            # a replica serves no service endpoints (spec "Callout replicas"): only a full lane's flag
            confirm_view=view_confirmer(sessions.records, service_endpoints=getattr(spec, "service_endpoints", False)),
            # issue 6 item 6, over the lane's own issuer session (issue 15 item 4)
            issue_authority=ConnectAuthority(sessions.issued, read_ledger=read_ledger),
        ),
    )
    start.metrics.watch(responder.statistics, limits=start.limiter.statistics)
    return responder, health


def _answered(hook: Callable[[CalloutRecord], None], health: LaneHealth, record: CalloutRecord) -> None:
    """The responder's answer hook: metrics and the event, then the lane's health."""
    hook(record)
    health.answered(record)
