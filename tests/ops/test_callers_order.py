"""The host's request check reads no intent before the checks that need none passed
(cotal_trio/ops/callers.py ``check_caller_request``; spec "Standalone callers": the routes consume
the intent "only after native signature/current-issuer, user-key, time-window, permission-builder
and principal-tag checks"; docs/static-credentials.md "Host check").

The connection is a fake that records every request and answers ``STREAM.MSG.GET`` with the
stored intent, so each test shows how many store reads a request cost.
"""

from __future__ import annotations

import base64
import dataclasses
import json

import pytest
import trio

from cotal_trio.core import caller_checks, callers
from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.ops.callers import check_caller_request, create_intent
from cotal_trio.natsio import Message
from tests.support.callers import (
    ACTOR,
    DATA,
    ENDPOINT,
    GOOD,
    IAT,
    OTHER_SIGNER,
    OWNER,
    SPACE,
    UID,
    caller_jwt,
    make_intent,
)

CEILING_S = 5
INTENT_READ = f"$JS.API.STREAM.MSG.GET.KV_cotal_issued_{SPACE}"


class FakeStore:
    """A fake ``Connection``: records each request; a message get answers ``intent`` (or "no
    message found"), a publish answers ``ack`` (JSON) or raises ``fail``."""

    def __init__(self, intent: bytes | None = None, *, ack: object = None, fail: BaseException | None = None) -> None:
        self.intent, self.ack, self.fail = intent, ack, fail
        self.requests: list[tuple[str, bytes]] = []

    async def request(self, subject: str, payload: bytes, headers: dict | None = None) -> Message:
        await trio.lowlevel.checkpoint()
        self.requests.append((subject, payload))
        if self.fail is not None:
            raise self.fail
        if subject.startswith("$JS.API.STREAM.MSG.GET."):
            return Message(subject, None, self._get(json.loads(payload)), None)
        return Message(subject, None, json.dumps(self.ack).encode(), None)

    def _get(self, body: dict) -> bytes:
        if self.intent is None:
            return json.dumps({"error": {"code": 404, "err_code": 10037, "description": "no message found"}}).encode()
        message = {"seq": 1, "subject": body["next_by_subj"], "data": base64.b64encode(self.intent).decode(), "time": ""}
        return json.dumps({"message": message}).encode()


def request(jwt: str | None, *, verb: str = "invoke", actor: str = ACTOR) -> Message:
    headers = None if jwt is None else {callers.CALLER_JWT_HEADER: jwt}
    return Message(f"cotal.{SPACE}.ep.{ENDPOINT}.{verb}.{OWNER}.{actor}", "_INBOX_x.1", b"", headers)


async def run_check(store: FakeStore, msg: Message, *, account: caller_checks.DataAccount = DATA, now: int = IAT + 10):
    with trio.fail_after(CEILING_S):
        return await check_caller_request(store, msg, space=SPACE, endpoint=ENDPOINT, surface=GOOD,  # type: ignore[arg-type]
                                          account=account, now=now)  # fmt: skip


async def test_a_good_caller_costs_one_intent_read_keyed_by_its_verified_tags():
    store = FakeStore(callers.render_intent(make_intent()))
    found = await run_check(store, request(caller_jwt()))
    assert (found.verb, found.intent) == ("invoke", make_intent())
    [(subject, body)] = store.requests
    assert subject == INTENT_READ
    assert json.loads(body)["next_by_subj"] == f"$KV.cotal_issued_{SPACE}.intent.v1.{OWNER}.{ACTOR}.{UID}"


REVOKED = dataclasses.replace(DATA, revocations={callers.parse_intent(callers.render_intent(make_intent())).user_key: IAT})


@pytest.mark.parametrize(("jwt", "kwargs", "code", "reason"), [
    (caller_jwt(signer=OTHER_SIGNER), {}, RefusalCode.BAD_CREDENTIAL, "its JWT is not signed by a current signing key"),
    (caller_jwt()[:-4] + "AAAA", {}, RefusalCode.BAD_CREDENTIAL, "its JWT's signature does not verify"),
    (caller_jwt(), {"account": REVOKED}, RefusalCode.BAD_CREDENTIAL, f"its user key was revoked at {IAT}"),
    (caller_jwt(), {"now": IAT + 86_400 * 2}, RefusalCode.BAD_CREDENTIAL, "its JWT is outside its time window"),
    (caller_jwt(principal=f"{OWNER}.other"), {}, RefusalCode.NOT_GRANTED, "the request is addressed as"),
    (caller_jwt(), {"verb": "delete"}, RefusalCode.FORBIDDEN, "delete is not describe or a verb of endpoint weather"),
    (None, {}, RefusalCode.BAD_CREDENTIAL, "the request carries no Cotal-Caller-Jwt header"),
], ids=["signer", "signature", "revoked", "window", "principal", "verb", "no-header"])  # fmt: skip
async def test_a_request_failing_a_check_that_needs_no_intent_reads_no_intent(jwt, kwargs, code, reason):
    store = FakeStore(callers.render_intent(make_intent()))
    verb = kwargs.pop("verb", "invoke")
    with pytest.raises(Refused) as refused:
        await run_check(store, request(jwt, verb=verb), **kwargs)
    assert (refused.value.code, store.requests) == (code, [])
    assert refused.value.detail.startswith(f"standalone caller refused: {reason}")


async def test_an_intent_bound_check_runs_after_the_read():
    store = FakeStore(callers.render_intent(make_intent(user_key=KeyPair.generate(Prefix.USER).public_key)))
    with pytest.raises(Refused, match="its JWT's user key is not its intent's"):
        await run_check(store, request(caller_jwt()))
    assert [s for s, _ in store.requests] == [INTENT_READ]
    with pytest.raises(Refused, match="has no issuance intent"):
        await run_check(FakeStore(None), request(caller_jwt()))


# -- the intent create's outcome (cotal auth mint --endpoint keeps or undoes its record by it) --------


async def test_an_intent_create_that_was_answered_with_a_refusal_did_not_happen():
    from cotal_trio.ops.callers import IntentExists, IntentNotCreated

    intent = make_intent()
    conflict = {"error": {"code": 400, "err_code": 10071, "description": "wrong last sequence: 1"}}
    with pytest.raises(IntentExists):
        await create_intent(FakeStore(ack=conflict), intent, now=IAT)  # type: ignore[arg-type]
    refused = {"error": {"code": 500, "err_code": 10077, "description": "maximum messages per subject exceeded"}}
    with pytest.raises(IntentExists):
        await create_intent(FakeStore(ack=refused), intent, now=IAT)  # type: ignore[arg-type]
    other = {"error": {"code": 503, "err_code": 10039, "description": "jetstream not enabled for account"}}
    with pytest.raises(IntentNotCreated, match="jetstream not enabled"):
        await create_intent(FakeStore(ack=other), intent, now=IAT)  # type: ignore[arg-type]


async def test_a_refusal_without_an_err_code_did_not_happen_either():
    """The broker answered no, naming no err_code: the create was refused, not unacknowledged
    (it once read ``exc.__cause__.err_code``, None here, and said the intent may exist)."""
    from cotal_trio.ops.callers import IntentNotCreated

    bare = {"error": {"code": 500, "description": "stream is sealed"}}
    with pytest.raises(IntentNotCreated, match="stream is sealed"):
        await create_intent(FakeStore(ack=bare), make_intent(), now=IAT)  # type: ignore[arg-type]


async def test_an_unacknowledged_intent_create_may_have_happened():
    from cotal_trio.core.errors import Unavailable
    from cotal_trio.ops.callers import IntentNotCreated, IntentUnsettled

    store = FakeStore(fail=Unavailable(f"request $KV.cotal_issued_{SPACE}.x: no answer within 10 s"))
    with pytest.raises(IntentUnsettled) as unsettled:
        await create_intent(store, make_intent(), now=IAT)  # type: ignore[arg-type]
    assert not isinstance(unsettled.value, IntentNotCreated)
    assert "may exist" in str(unsettled.value)
