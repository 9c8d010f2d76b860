"""http/idp_client.py against a peer that is not an IdP (spec "IdP compatibility"; BRIEF
"never a traceback"): the IdP address pointing at a NATS port, a plausible wrong-port mistake.

The real nats-server speaks first with ``INFO {...}``, which http.client refuses as a bad status
line (an ``http.client.HTTPException``, not an ``OSError``): the login must end in one sentence
(Unavailable), not a traceback.
"""

from __future__ import annotations

import functools

import pytest
import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.http.idp_client import poll_device_token, request_device_code

pytestmark = pytest.mark.broker


async def test_an_idp_address_that_speaks_nats_is_unavailable_in_one_sentence(plain_broker):
    base = plain_broker.replace("nats://", "http://")
    with trio.fail_after(20), pytest.raises(Unavailable) as first:
        await trio.to_thread.run_sync(functools.partial(request_device_code, base, client_id="cotal-cli"))
    assert str(first.value).startswith(f"cannot reach the IdP at {base} (")
    assert str(first.value).endswith(") - check that it runs and retry")
    with trio.fail_after(20), pytest.raises(Unavailable):
        await trio.to_thread.run_sync(functools.partial(poll_device_token, base, device_code="d", client_id="cotal-cli"))


async def test_an_exchange_url_that_speaks_nats_is_unavailable_in_one_sentence(plain_broker):
    """The same mistake on the exchange client (http/client.py, ``cotal exchange --url``): one
    sentence naming the URL, not an http.client traceback."""
    from cotal_trio.http.client import post_exchange

    base = plain_broker.replace("nats://", "http://")
    with trio.fail_after(20), pytest.raises(Unavailable) as refused:
        await trio.to_thread.run_sync(functools.partial(post_exchange, base, None, {"idpToken": "x", "actor": "a"}))
    assert str(refused.value) == (
        f"cannot reach the auth service at {base} (its answer is not HTTP: BadStatusLine) - check that it is"
        " running and retry"
    )
