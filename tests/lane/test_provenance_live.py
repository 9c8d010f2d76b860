"""Provenance on a real nats-server (DESIGN.md section 6 step 1): a request that is not sealed,
or not signed by the server it names, gets no reply at all; a good one gets a signed answer.

The operator-mode broker forbids every auth-account user to publish ``$SYS.REQ.USER.AUTH``, so
these requests are crafted by the test and sent through a plain nats-server, where the lane's
real responder is subscribed exactly as in production.
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
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.lane.callout.ports import AnswerPorts, ConnectPorts
from cotal_trio.lane.callout.responder import CALLOUT_QUEUE_GROUP, CALLOUT_SUBJECT, CalloutResponder
from cotal_trio.stores.issuance import issuance_store
from cotal_trio.natsio import open_connection, open_loop
from tests.support.provenance import KEYS, SERVER, SERVER_X, _ask, _no_rows, _request

pytestmark = pytest.mark.broker


async def test_only_provenant_requests_are_answered(plain_broker, nursery, caplog):
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
                assert await _ask(broker, *_request(seal=False)) is None
                assert await _ask(broker, *_request(KeyPair.generate(Prefix.SERVER))) is None
                assert await _ask(broker, _request()[0], {}) is None
                answer = await _ask(broker, *_request())
            lane.cancel_scope.cancel()
    assert answer is not None
    claims = natsjwt.verify(SERVER_X.open(answer, KEYS.xkey.public_key))
    assert claims["aud"] == SERVER.public_key and claims["iss"] == KEYS.auth_signer.public_key
    assert claims["nats"]["error"].startswith("no user token presented")
    messages = [r.getMessage() for r in caplog.records if r.name == "cotal.callout"]
    dropped = [m for m in messages if " outcome=dropped space=alpha " in m]
    assert len(dropped) == 3, messages
    assert "not sealed with an xkey" in dropped[0]
    assert 'reason="request issuer is not the server it names"' in dropped[1]
    assert 'reason="unsealed request (no Nats-Server-Xkey header)"' in dropped[2]
    assert responder.statistics().dropped == 3
    assert responder.statistics().answered["denied"] == 1
