"""The callout's check that a view bearer's record is still live (spec "Listener policy").

A ``manager-caller`` bearer is bound to one registered manager instance, a ``session-caller``
bearer to one chat session (docs/managers-and-sessions.md). The bearer outlives neither in
authority: at each connect the callout reads the record again (``mgr.<owner>.<instanceId>`` in
``cotal_records_<space>``, ``s.<sessionId>`` in ``cotal_sessions_<space>``) and denies the connect
once the instance is retired or the session is retired, expired, or belongs to someone else.
A ``service-host`` bearer is bound to one service endpoint registration (``svcep.<endpoint>`` in
``cotal_records_<space>``): its connect is admitted only while the lane serves service endpoints
and the registration still names the bearer's principal and instance
(:func:`~cotal_trio.core.service_endpoints.decide_service_connect`; docs/http-api.md "Service
endpoints"). Replicas read the same records over their store user
(:func:`~cotal_trio.lane.service_users.replica_store_permissions`: ``STREAM.MSG.GET`` of both stores).
"""

from __future__ import annotations

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.errors import RefusalCode, Refused, Unavailable
from cotal_trio.core.managers import ManagerInstance
from cotal_trio.core.service_endpoints import decide_service_connect
from cotal_trio.core.views import SERVICE_HOST
from cotal_trio.core.sessions import ChatSession
from cotal_trio.lane.callout.ports import ConfirmView
from cotal_trio.stores.records import RecordsStore

__all__ = ["INSTANCE_GONE", "RECORDS_UNAVAILABLE", "SESSION_GONE", "view_confirmer"]

INSTANCE_GONE = (
    "manager instance {id} is no longer registered - exchange a fresh manager-caller bearer "
    "(`cotal manager list` shows the live instances)"
)
SESSION_GONE = "chat session {id} is retired, expired or not yours - open a new one with POST /chat-session/open"
RECORDS_UNAVAILABLE = "the space's records store did not answer - retry the connect shortly"


def _instance_live(instance: ManagerInstance | None, bearer: ValidatedBearer) -> bool:
    return instance is not None and instance.owner == bearer.owner


def _session_live(row: ChatSession | None, bearer: ValidatedBearer, now: float) -> bool:
    binding = bearer.session
    return (
        row is not None and binding is not None
        and (row.owner, row.actor, row.epoch) == (bearer.owner, bearer.actor, binding.epoch)
        and now < row.exp
    )  # fmt: skip


def view_confirmer(records: RecordsStore, *, service_endpoints: bool = False) -> ConfirmView:
    """The callout's :data:`~cotal_trio.lane.callout.ports.ConfirmView` over the space's stores.

    The returned trio function reads one record per connect of a record-bound view.

    Args:
        service_endpoints: the lane serves service endpoints (a full lane with
            ``--service-endpoints`` or ``serviceEndpoints``); without it every ``service-host``
            connect is denied, before any read. A replica never serves them.

    Raises (from the returned function):
        Refused: NOT_GRANTED when the record is gone or no longer the bearer's
            (:data:`INSTANCE_GONE`, :data:`SESSION_GONE`), or :data:`RECORDS_UNAVAILABLE` when the
            store did not answer (a denial, not a lane failure).
    """

    async def confirm_view(bearer: ValidatedBearer, now: float) -> None:
        try:
            if bearer.view == "manager-caller" and bearer.manager_instance_id is not None:
                instance = await records.get_manager(bearer.owner, bearer.manager_instance_id)
                if _instance_live(instance, bearer):
                    return
                raise Refused(RefusalCode.NOT_GRANTED, INSTANCE_GONE.format(id=bearer.manager_instance_id))
            if bearer.view == SERVICE_HOST:
                binding = bearer.service_endpoint
                found = None
                if service_endpoints and binding is not None:
                    found = await records.get_service_endpoint(binding.endpoint)
                record = None if found is None else found[0]
                decide_service_connect(bearer.owner, bearer.actor, binding, record, serving=service_endpoints)
                return
            if bearer.view == "session-caller" and bearer.session is not None:
                row = await records.get_session(bearer.session.session_id)
                if _session_live(row, bearer, now):
                    return
                raise Refused(RefusalCode.NOT_GRANTED, SESSION_GONE.format(id=bearer.session.session_id))
        except Unavailable:
            raise Refused(RefusalCode.NOT_GRANTED, RECORDS_UNAVAILABLE) from None
        raise Refused(RefusalCode.NOT_GRANTED, f"a {bearer.view} bearer without its binding - exchange a fresh one")

    return confirm_view
