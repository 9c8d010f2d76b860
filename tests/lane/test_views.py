"""The callout's check of a view bearer's record (cotal_trio/lane/callout/views.py; spec "Listener policy")."""

from __future__ import annotations

import pytest

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.errors import Refused, Unavailable
from cotal_trio.core.managers import ManagerInstance
from cotal_trio.core.sessions import ChatSession
from cotal_trio.core.views import SessionBinding
from cotal_trio.lane.callout.views import INSTANCE_GONE, RECORDS_UNAVAILABLE, SESSION_GONE, view_confirmer

OWNER = "u_" + "a" * 26
OTHER = "u_" + "b" * 26
INSTANCE = "m" * 26
SESSION = "S" * 43
NOW = 1_800_000_000


class Records:
    def __init__(self, *, managers=(), sessions=(), down=False):
        self.managers = {(m.owner, m.instance_id): m for m in managers}
        self.sessions = {s.session_id: s for s in sessions}
        self.down = down

    async def get_manager(self, owner, instance_id):
        if self.down:
            raise Unavailable("store gone")
        return self.managers.get((owner, instance_id))

    async def get_session(self, session_id):
        if self.down:
            raise Unavailable("store gone")
        return self.sessions.get(session_id)


def _bearer(view: str, **binding) -> ValidatedBearer:
    return ValidatedBearer(
        owner=OWNER, actor="cli", scope=(), lifecycle_uid="l" * 26, parent=None, view=view, credential_id=None,
        iat=NOW - 10, exp=NOW + 290, **binding,
    )  # fmt: skip


def _instance(owner: str = OWNER) -> ManagerInstance:
    return ManagerInstance(instance_id=INSTANCE, owner=owner, actor="mgr", serve_epoch=1, registered_at=NOW - 100)


def _session(**changes) -> ChatSession:
    fields = {"session_id": SESSION, "endpoint": "chat", "owner": OWNER, "actor": "cli", "epoch": 2,
              "opened_at": NOW - 100, "exp": NOW + 3500, **changes}  # fmt: skip
    return ChatSession(**fields)


CALLER = _bearer("manager-caller", manager_instance_id=INSTANCE)
SESSION_CALLER = _bearer("session-caller", session=SessionBinding(endpoint="chat", session_id=SESSION, epoch=2, exp=NOW + 3500))


async def test_a_live_instance_and_a_live_session_pass():
    confirm = view_confirmer(Records(managers=[_instance()], sessions=[_session()]))
    await confirm(CALLER, NOW)
    await confirm(SESSION_CALLER, NOW)


@pytest.mark.parametrize("managers", [[], [_instance(OTHER)]])
async def test_a_retired_instance_denies(managers):
    with pytest.raises(Refused) as refused:
        await view_confirmer(Records(managers=managers))(CALLER, NOW)
    assert refused.value.detail == INSTANCE_GONE.format(id=INSTANCE)


@pytest.mark.parametrize(
    "sessions",
    [[], [_session(epoch=3)], [_session(actor="ops")], [_session(owner=OTHER)], [_session(exp=NOW)]],
    ids=["retired", "another epoch", "another actor", "another owner", "expired"],
)
async def test_a_session_that_is_not_the_bearers_any_more_denies(sessions):
    with pytest.raises(Refused) as refused:
        await view_confirmer(Records(sessions=sessions))(SESSION_CALLER, NOW)
    assert refused.value.detail == SESSION_GONE.format(id=SESSION)


@pytest.mark.parametrize("bearer", [CALLER, SESSION_CALLER])
async def test_a_store_that_does_not_answer_denies_the_connect_and_keeps_the_lane(bearer):
    with pytest.raises(Refused) as refused:
        await view_confirmer(Records(down=True))(bearer, NOW)
    assert refused.value.detail == RECORDS_UNAVAILABLE
