"""natsio's one JetStream client (natsio/_js.py; issue 14 item 3) on a real nats-server: the
broker's refusals arrive as the typed errors of one table, with their err_code, and a batch of
publishes is acknowledged per publish."""

from __future__ import annotations

import pytest
import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.natsio import (
    ERRORS,
    BucketMissing,
    JetStreamError,
    StreamNotFound,
    SubjectFull,
    WrongLastSequence,
    ensure_bucket,
    js_api,
    js_publish,
    js_publish_many,
    open_connection,
    open_loop,
)

pytestmark = pytest.mark.broker

CEILING_S = 20


def test_the_table_maps_each_code_once():
    assert ERRORS == {10059: StreamNotFound, 10071: WrongLastSequence, 10164: WrongLastSequence, 10077: SubjectFull}
    assert issubclass(SubjectFull, JetStreamError)
    assert issubclass(BucketMissing, StreamNotFound) and issubclass(StreamNotFound, Unavailable)
    assert not issubclass(WrongLastSequence, Unavailable)  # the caller's lost compare-and-set


async def test_refusals_are_typed_with_their_err_code(plain_broker: str) -> None:
    with trio.fail_after(CEILING_S):
        async with open_loop(), open_connection(plain_broker) as conn:
            with pytest.raises(StreamNotFound) as missing:
                await js_api(conn, "$JS.API.STREAM.INFO.KV_nothing")
            assert missing.value.err_code == 10059
            with pytest.raises(BucketMissing):
                await js_publish(conn, "$KV.nothing.k", b"v")
            await ensure_bucket(conn, "typed")
            first = await js_publish(conn, "$KV.typed.k", b"v", {"Nats-Expected-Last-Subject-Sequence": "0"})
            with pytest.raises(WrongLastSequence) as lost:
                await js_publish(conn, "$KV.typed.k", b"w", {"Nats-Expected-Last-Subject-Sequence": "0"})
            assert lost.value.err_code in (10071, 10164) and lost.value.subject == "$KV.typed.k"
            with pytest.raises(JetStreamError) as other:
                await js_api(conn, "$JS.API.CONSUMER.INFO.KV_typed.nobody")
            assert other.value.err_code == 10014 and not isinstance(other.value, StreamNotFound)
            outcomes = await js_publish_many(conn, [
                ("$KV.typed.a", b"1", None),
                ("$KV.typed.k", b"x", {"Nats-Expected-Last-Subject-Sequence": str(first)}),
                ("$KV.typed.k", b"y", {"Nats-Expected-Last-Subject-Sequence": str(first)}),  # lost to the one before
                ("$KV.nothing.k", b"z", None),
            ])  # fmt: skip
    assert isinstance(outcomes[0], int) and outcomes[1] == outcomes[0] + 1
    assert isinstance(outcomes[2], WrongLastSequence) and isinstance(outcomes[3], BucketMissing)


async def test_read_admission_reads_a_missing_plane_bucket_as_none_by_its_type(plain_broker: str) -> None:
    """lane/service_endpoints.py catches StreamNotFound (issue 14 item 3: no `__cause__.err_code`)."""
    from cotal_trio.lane.service_endpoints import read_admission

    with trio.fail_after(CEILING_S):
        async with open_loop(), open_connection(plain_broker) as conn:
            assert await read_admission(conn, "nobody") is None
