"""Issue 15 item 2 on a real nats-server: no request can kill the responder.

As in test_provenance_live, the requests are crafted by the test and sent through a plain
nats-server to the lane's real responder, subscribed as in production (the operator-mode broker
forbids any auth-account user to publish ``$SYS.REQ.USER.AUTH``). Each is signed by the broker
key it names and sealed to the space's xkey, so it reaches the JSON parser; inside it is JSON
nested 2,000 deep, 100,000 deep, or a 5,000-digit number. Before, each raised RecursionError or
ValueError out of ``core/natsjwt.py`` through the worker, the lane's nursery died and the next
valid request went unanswered. Now each is dropped with its line and the valid request right
after is answered.
"""

from __future__ import annotations

import logging
import time

import pytest
import trio

from cotal_trio.core import natsjwt
from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.bearer import BearerVerifier
from cotal_trio.core.jose import BearerKeySet, IssuerKey
from cotal_trio.core.callout import SERVER_XKEY_HEADER
from cotal_trio.lane.callout.ports import AnswerPorts, ConnectPorts
from cotal_trio.lane.callout.responder import CALLOUT_QUEUE_GROUP, CALLOUT_SUBJECT, CalloutResponder
from cotal_trio.stores.issuance import issuance_store
from cotal_trio.natsio import open_connection, open_loop
from tests.support.callout_requests import signed_with
from tests.support.provenance import KEYS, SERVER, SERVER_X, _ask, _no_rows, _request

pytestmark = pytest.mark.broker

ABSURD = [
    '{"nats":' + "[" * 2000 + "]" * 2000 + "}",
    '{"nats":' + "[" * 100_000,
    '{"iat":' + "9" * 5000 + "}",
]


def _absurd(claims_text: str) -> tuple[bytes, dict[str, str]]:
    token = signed_with(SERVER, claims_text).encode()
    return SERVER_X.seal(token, KEYS.xkey.public_key), {SERVER_XKEY_HEADER: SERVER_X.public_key}


async def test_absurd_requests_are_dropped_and_the_next_valid_one_is_answered(plain_broker, nursery, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    async with open_loop(), open_connection(plain_broker, name="callout") as service, open_connection(plain_broker, name="broker") as broker:
        responder = CalloutResponder(
            AnswerPorts(keys=KEYS, limits=CalloutLimits(), clock=time.time, publish=service.publish_nowait),
            ConnectPorts(
                verifier=BearerVerifier(BearerKeySet.from_keys([IssuerKey.generate(bytes(32))])), read_ledger=_no_rows,
                store=issuance_store(service, "alpha"),  # never reached: no request here gets past its bearer
            ),
        )
        async with trio.open_nursery() as lane:
            await lane.start(responder.run)
            await service.subscribe(CALLOUT_SUBJECT, queue=CALLOUT_QUEUE_GROUP, on_message=responder.on_message)
            await service.flush()
            with trio.fail_after(10):
                for text in ABSURD:
                    assert await _ask(broker, *_absurd(text)) is None
                answer = await _ask(broker, *_request())  # None if unanswered within _ask's 0.5 s
            lane.cancel_scope.cancel()
    assert answer is not None
    claims = natsjwt.verify(SERVER_X.open(answer, KEYS.xkey.public_key))
    assert claims["nats"]["error"].startswith("no user token presented")
    dropped = [r.getMessage() for r in caplog.records if " outcome=dropped space=alpha " in r.getMessage()]
    assert [m.split("reason=", 1)[1] for m in dropped] == [
        '"request is not a valid sealed authorization request: the JWT claims nests deeper than 64"',
        '"request is not a valid sealed authorization request: the JWT claims nests deeper than 64"',
        '"request is not a valid sealed authorization request: a JWT number has more than 20 digits"',
    ]
    assert responder.statistics().dropped == 3
