"""natsio's one JetStream client (natsio/_js.py; issue 14 item 3) on a real nats-server: the
broker's refusals arrive as the typed errors of one table, with their err_code, and a batch of
publishes is acknowledged per publish."""

from __future__ import annotations

import re

import pytest
import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.natsio import (
    ERRORS,
    BucketMissing,
    ConsumerExists,
    ConsumerNotFound,
    JetStreamError,
    NoMessageFound,
    NoPlacement,
    StreamNameInUse,
    StreamNotFound,
    StreamShape,
    SubjectFull,
    WrongLastSequence,
    _js,
    ensure_bucket,
    ensure_consumer,
    ensure_stream,
    js_api,
    js_msg_get,
    js_publish,
    js_publish_many,
    open_connection,
    open_loop,
)

pytestmark = pytest.mark.broker

CEILING_S = 20


def test_the_table_maps_each_code_once():
    assert ERRORS == {
        10005: NoPlacement, 10014: ConsumerNotFound, 10037: NoMessageFound, 10058: StreamNameInUse,
        10059: StreamNotFound, 10071: WrongLastSequence, 10074: NoPlacement, 10077: SubjectFull, 10148: ConsumerExists, 10164: WrongLastSequence,
    }  # fmt: skip
    assert all(issubclass(kind, JetStreamError) for kind in ERRORS.values() if kind is not WrongLastSequence)
    assert issubclass(SubjectFull, JetStreamError)
    assert issubclass(BucketMissing, StreamNotFound) and issubclass(StreamNotFound, Unavailable)
    assert not issubclass(WrongLastSequence, Unavailable)  # the caller's lost compare-and-set


def test_the_docstring_table_is_the_codes_table():
    """Issue 16: natsio/_js.py's docstring table lists exactly :data:`ERRORS`, row for row."""
    rows = re.findall(r"^(\d{5})\s+(\w+)\s", _js.__doc__ or "", flags=re.MULTILINE)
    assert [(int(code), name) for code, name in rows] == [(code, kind.__name__) for code, kind in ERRORS.items()]


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
            with pytest.raises(ConsumerNotFound) as consumer:
                await js_api(conn, "$JS.API.CONSUMER.INFO.KV_typed.nobody")
            assert consumer.value.err_code == 10014 and not isinstance(consumer.value, StreamNotFound)
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


WRITE_ONCE = StreamShape(
    name="ONCE", subjects=("once.>",), allow_direct=False, max_msgs_per_subject=1, discard_new_per_subject=True
)
DURABLE = {"ack_policy": "explicit", "deliver_policy": "all"}


async def test_each_code_of_the_table_is_what_the_broker_answers(plain_broker: str) -> None:
    """Every row of :data:`ERRORS` the broker produces on demand, from a real nats-server, and a
    code outside the table as the plain :class:`JetStreamError` (issue 16)."""
    with trio.fail_after(CEILING_S):
        async with open_loop(), open_connection(plain_broker) as conn:
            await ensure_stream(conn, WRITE_ONCE)
            await js_publish(conn, "once.a", b"1")
            with pytest.raises(SubjectFull) as full:
                await js_publish(conn, "once.a", b"2")
            assert full.value.err_code == 10077
            with pytest.raises(StreamNameInUse) as in_use:
                await js_api(conn, "$JS.API.STREAM.CREATE.ONCE", {**WRITE_ONCE.config(), "subjects": ["twice.>"]})
            assert in_use.value.err_code == 10058
            with pytest.raises(NoMessageFound) as none:
                await js_api(conn, "$JS.API.STREAM.MSG.GET.ONCE", {"last_by_subj": "once.b"})
            assert none.value.err_code == 10037
            assert await js_msg_get(conn, "ONCE", {"last_by_subj": "once.b"}) is None
            await ensure_consumer(conn, "ONCE", "reader", "once.a", DURABLE)
            body = {"stream_name": "ONCE", "action": "create", "config": {
                **DURABLE, "name": "reader", "durable_name": "reader", "filter_subject": "once.a", "max_deliver": 7}}
            with pytest.raises(ConsumerExists) as exists:
                await js_api(conn, "$JS.API.CONSUMER.CREATE.ONCE.reader.once.a", body)
            assert exists.value.err_code == 10148
            with pytest.raises(JetStreamError) as other:
                await js_api(conn, "$JS.API.STREAM.MSG.DELETE.ONCE", {"seq": 1})  # deny_delete
            assert type(other.value) is JetStreamError and other.value.err_code == 10057
