"""A publish no stream answered is told apart: a missing store, or one without a stream leader
(natsio/_js.py; issue 17 item 2). The probe answers below are the ones a live nats-server 2.x sent
(captured with ensure_bucket("there") on a single server); a clustered stream without a leader
answers STREAM.INFO with its config too (it exists), which is the case this unit test stands for
(a 3-node cluster losing quorum is not run here)."""

from __future__ import annotations

import json

import pytest

from cotal_trio.stores.issuance import _bucket_errors
from cotal_trio.natsio import BucketMissing, Message, NoResponders, StoreUnreachable, is_bucket_missing, js_publish, js_publish_many

EXISTS = (
    '{"type":"io.nats.jetstream.api.v1.stream_info_response","total":0,"offset":0,"limit":0,"config":'
    '{"name":"KV_there","subjects":["$KV.there.\\u003e"],"retention":"limits","num_replicas":3}}'
)
NOT_FOUND = (
    '{"type":"io.nats.jetstream.api.v1.stream_info_response","error":{"code":404,"err_code":10059,'
    '"description":"stream not found"},"total":0,"offset":0,"limit":0}'
)
NAMES_NONE = '{"type":"io.nats.jetstream.api.v1.stream_names_response","total":0,"offset":0,"limit":1024,"streams":null}'
NAMES_ONE = '{"type":"io.nats.jetstream.api.v1.stream_names_response","total":1,"offset":0,"limit":1024,"streams":["RUN"]}'


class NoStreamBroker:
    """Every publish gets the broker's no-responders status; the probe gets ``answers[subject]``."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers, self.probes = answers, []

    async def request(self, subject, data, headers=None):
        if not subject.startswith("$JS.API."):
            raise NoResponders(f"request {subject}: no responders")
        self.probes.append((subject, data))
        return Message(subject=subject, reply=None, data=self.answers[subject].encode(), headers=None)

    async def request_many(self, publishes):
        return [NoResponders(f"request {subject}: no responders") for subject, _, _ in publishes]


async def test_a_missing_bucket_still_reads_missing():
    broker = NoStreamBroker({"$JS.API.STREAM.INFO.KV_nothing": NOT_FOUND})
    with pytest.raises(BucketMissing) as missing:
        await js_publish(broker, "$KV.nothing.k", b"v")  # type: ignore[arg-type]
    assert is_bucket_missing(missing.value)
    assert broker.probes == [("$JS.API.STREAM.INFO.KV_nothing", b"")]


async def test_a_stream_that_exists_without_a_leader_is_unreachable_not_missing():
    broker = NoStreamBroker({"$JS.API.STREAM.INFO.KV_there": EXISTS})
    with pytest.raises(StoreUnreachable) as unreachable:
        await js_publish(broker, "$KV.there.k", b"v")  # type: ignore[arg-type]
    assert str(unreachable.value) == (
        "publish $KV.there.k: the store is unreachable: no stream leader - JetStream is electing or has lost "
        "quorum (no stream answered; $JS.API.STREAM.INFO.KV_there says the stream exists)"
    )
    assert not is_bucket_missing(unreachable.value)
    # issuance's sentence follows: not "start the full auth service once"
    with pytest.raises(StoreUnreachable):
        with _bucket_errors("there"):
            await js_publish(broker, "$KV.there.k", b"v")  # type: ignore[arg-type]


async def test_a_stream_subject_is_asked_by_stream_names_and_a_batch_asks_once():
    broker = NoStreamBroker({"$JS.API.STREAM.NAMES": NAMES_ONE})
    outcomes = await js_publish_many(broker, [("run.a", b"1", None), ("run.a", b"2", None)])  # type: ignore[arg-type]
    assert all(isinstance(o, StoreUnreachable) for o in outcomes)
    assert broker.probes == [("$JS.API.STREAM.NAMES", json.dumps({"subject": "run.a"}).encode())]
    broker = NoStreamBroker({"$JS.API.STREAM.NAMES": NAMES_NONE})
    [outcome] = await js_publish_many(broker, [("run.b", b"1", None)])  # type: ignore[arg-type]
    assert type(outcome) is BucketMissing
