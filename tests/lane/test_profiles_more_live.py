"""Issue 6 items 1-2 on a real nats-server, continued: the profiles ``test_profiles_live.py`` does
not exercise (admin, teardown, delivery, run-driver, run-mediator, run-operator, issuer).

Each test mints the profile with ``minted`` (a data-account user holding ``profile_permissions``),
does one or two things docs/wire-layout.md grants it and checks the real values, then tries the
closest things it does not grant and expects the broker's ``Permissions Violation``.
"""

from __future__ import annotations

import json

import pytest
import trio

from cotal_trio.core import wire
from cotal_trio.stores.streams import ensure_delivery_durables, ensure_replay
from cotal_trio.natsio import (
    Message,
    ack,
    consumer_info,
    consumer_names,
    ensure_consumer,
    first_message,
    kv_put,
    last_message,
    pull_next,
    stream_config,
)

from tests.support.stack import SPACE
from tests.support.profiles import (
    ADMISSION,
    CEILING_S,
    DM,
    OTHER_RUN,
    PRESENCE,
    RUN,
    js,
    minted,
    nonce_of,
    provision,
    refused,
    refused_subscription,
)

pytestmark = pytest.mark.broker

CHAT = f"COTAL_CHAT_{SPACE}"
TASK = f"COTAL_TASK_{SPACE}"
RUN_STREAM = f"COTAL_RUN_{SPACE}"
RECORDS = f"cotal_records_{SPACE}"
ISSUED = f"cotal_issued_{SPACE}"
ACCEPTED = f"cotal_accepted_{SPACE}"
AUTH = f"cotal_auth_{SPACE}"
TOKEN = "tok_" + "a" * 20
OTHER_TOKEN = "tok_" + "b" * 20


async def test_an_admin_reads_dms_and_chat_live_but_publishes_nothing_that_writes(stack):
    alice, bob = stack.owner("alice"), stack.owner("bob")
    inbox = wire.dm_durable(SPACE, alice, "cli")
    dm = f"cotal.{SPACE}.dm.{alice}.cli.{bob}.cli"
    with trio.fail_after(CEILING_S):
        await provision(stack, [(alice, "cli")])
        async with minted(stack, None) as root, minted(stack, "admin") as conn:
            seen: list[Message] = []
            await conn.subscribe(f"cotal.{SPACE}.>", on_message=seen.append)
            await conn.flush()
            await root.request(f"cotal.{SPACE}.ch.team.news", b"hello")
            stored = json.loads((await root.request(dm, b"secret")).data)
            await kv_put(root, PRESENCE, wire.presence_key(alice, "cli"), b"online")
            roster = await conn.request(f"$JS.API.DIRECT.GET.KV_{PRESENCE}.$KV.{PRESENCE}.{alice}.cli", b"")
            await refused(conn, f"cotal.{SPACE}.ch.team.news", b"no")
            await refused(conn, f"cotal.{SPACE}.dm.{alice}.cli.{bob}.cli", b"forged")
            await refused(conn, wire.kv_subject(PRESENCE, wire.presence_key(alice, "cli")), b"no")
            await refused(conn, f"cotal.{SPACE}.ctl.spawn", b"no")
            await refused(conn, f"$JS.API.CONSUMER.MSG.NEXT.{DM}.{inbox.name}")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{DM}.sneak.{inbox.filter_subject}")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.{DM}")
            await refused(conn, f"$JS.API.STREAM.DELETE.{DM}")
            await refused(conn, f"$JS.API.STREAM.PURGE.{DM}")
            await refused_subscription(conn, "cotal.beta.>")
            await refused_subscription(conn, f"$KV.{PRESENCE}.>")
            await refused_subscription(conn, "_INBOX_someoneelse.>")
            await root.flush()
            await conn.flush()
    assert stored["stream"] == DM
    mine = [(m.subject, m.data) for m in seen if m.subject.startswith((f"cotal.{SPACE}.ch.", f"cotal.{SPACE}.dm."))]
    assert mine == [(f"cotal.{SPACE}.ch.team.news", b"hello"), (dm, b"secret")]
    assert roster.data == b"online"


async def test_teardown_deletes_streams_and_durables_but_cannot_read_a_dm(stack):
    alice, bob = stack.owner("alice"), stack.owner("bob")
    inbox = wire.dm_durable(SPACE, alice, "cli")
    replay = wire.replay_durable(SPACE, RUN)
    with trio.fail_after(CEILING_S):
        await provision(stack, [(alice, "cli")], roles=("coder",))
        async with minted(stack, "provisioner") as prov:
            await ensure_replay(prov, SPACE, RUN)
            await ensure_delivery_durables(prov, SPACE)
        async with minted(stack, None) as root, minted(stack, "teardown") as conn:
            await root.request(f"cotal.{SPACE}.dm.{alice}.cli.{bob}.cli", b"secret")
            dropped_queue = await js(conn, f"$JS.API.CONSUMER.DELETE.{TASK}.task-coder")
            dropped_replay = await js(conn, f"$JS.API.CONSUMER.DELETE.{RUN_STREAM}.{replay.name}")
            dropped_stream = await js(conn, f"$JS.API.STREAM.DELETE.{RUN_STREAM}")
            await refused(conn, f"$JS.API.CONSUMER.MSG.NEXT.{DM}.{inbox.name}")
            await refused(conn, f"$JS.API.CONSUMER.INFO.{DM}.{inbox.name}")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{DM}.sneak.{inbox.filter_subject}")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{DM}")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.{DM}")
            await refused(conn, f"$JS.API.DIRECT.GET.{DM}")
            await refused(conn, f"$JS.API.STREAM.PURGE.{DM}")
            await refused(conn, f"$JS.API.STREAM.CREATE.{DM}")
            await refused(conn, f"$JS.API.CONSUMER.DELETE.{CHAT}.delivery-chat")
            await refused(conn, f"cotal.{SPACE}.dm.{alice}.cli.{bob}.cli", b"forged")
            await refused_subscription(conn, f"cotal.{SPACE}.dm.>")
            await conn.flush()
            run_after = await stream_config(root, RUN_STREAM)
            tasks_after = await consumer_names(root, TASK)
            dms_after = await consumer_names(root, DM)
            chat_after = await consumer_names(root, CHAT)
    assert (dropped_queue.get("success"), dropped_replay.get("success"), dropped_stream.get("success")) == (True,) * 3
    assert run_after is None and tasks_after == []
    assert dms_after == sorted([inbox.name, "delivery-dm"]) and chat_after == ["delivery-chat"]


async def test_delivery_binds_its_two_fan_out_durables_only(stack):
    alice, bob = stack.owner("alice"), stack.owner("bob")
    inbox = wire.dm_durable(SPACE, alice, "cli")
    dm = f"cotal.{SPACE}.dm.{alice}.cli.{bob}.cli"
    with trio.fail_after(CEILING_S):
        await provision(stack, [(alice, "cli")])
        async with minted(stack, "provisioner") as prov:
            chat_durable, dm_durable = await ensure_delivery_durables(prov, SPACE)
        async with minted(stack, None) as root, minted(stack, "delivery") as conn:
            await root.request(f"cotal.{SPACE}.ch.team.news", b"hello")
            await root.request(dm, b"psst")
            chat_msg = await pull_next(conn, CHAT, chat_durable.name, expires_s=2)
            assert chat_msg is not None
            await ack(conn, chat_msg)
            dm_msg = await pull_next(conn, DM, dm_durable.name, expires_s=2)
            assert dm_msg is not None
            await ack(conn, dm_msg)
            await conn.flush()
            info = await consumer_info(conn, DM, dm_durable.name)
            errors = conn.error_count
            await refused(conn, f"$JS.API.CONSUMER.MSG.NEXT.{DM}.{inbox.name}")
            await refused(conn, f"$JS.API.CONSUMER.INFO.{DM}.{inbox.name}")
            await refused(conn, f"$JS.ACK.{DM}.{inbox.name}.1.1.1.1.0", b"+ACK")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{DM}.sneak.{inbox.filter_subject}")
            await refused(conn, f"$JS.API.CONSUMER.DELETE.{DM}.{dm_durable.name}")
            await refused(conn, f"$JS.API.CONSUMER.MSG.NEXT.{TASK}.task-coder")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.{DM}")
            await refused(conn, f"cotal.{SPACE}.ch.team.news", b"echo")
            await refused(conn, wire.kv_subject(PRESENCE, wire.presence_key(alice, "cli")), b"no")
            await refused_subscription(conn, f"cotal.{SPACE}.dm.>")
            inbox_after = await consumer_info(root, DM, inbox.name)
    assert errors == 0
    assert (chat_msg.subject, chat_msg.data) == (f"cotal.{SPACE}.ch.team.news", b"hello")
    assert (dm_msg.subject, dm_msg.data) == (dm, b"psst")
    assert (info["delivered"]["consumer_seq"], info["num_ack_pending"]) == (1, 0)
    assert inbox_after["delivered"]["consumer_seq"] == 0


async def test_a_run_driver_writes_its_journal_and_records_and_is_refused_another_run(stack):
    journal = wire.run_journal_subject(SPACE, RUN)
    replay, other_replay = wire.replay_durable(SPACE, RUN), wire.replay_durable(SPACE, OTHER_RUN)
    with trio.fail_after(CEILING_S):
        await provision(stack)
        async with minted(stack, "provisioner") as prov:
            await ensure_replay(prov, SPACE, RUN)
            await ensure_replay(prov, SPACE, OTHER_RUN)
        async with minted(stack, None) as root, minted(stack, "run-driver", run_id=RUN) as conn:
            appended = json.loads((await conn.request(journal, b"step-1")).data)
            entry = await pull_next(conn, RUN_STREAM, replay.name, expires_s=2)
            assert entry is not None
            await ack(conn, entry)
            revision = await kv_put(conn, RECORDS, f"run.{RUN}.driver.state", b"s1")
            await conn.flush()
            errors = conn.error_count
            await refused(conn, wire.run_journal_subject(SPACE, OTHER_RUN), b"x")
            await refused(conn, f"$JS.API.CONSUMER.MSG.NEXT.{RUN_STREAM}.{other_replay.name}")
            await refused(conn, f"$JS.API.CONSUMER.INFO.{RUN_STREAM}.{other_replay.name}")
            await refused(conn, wire.run_record_subject(SPACE, OTHER_RUN, "driver.state"), b"x")
            await refused(conn, wire.run_record_subject(SPACE, RUN, "effect.e1"), b"x")
            await refused(conn, wire.run_record_subject(SPACE, RUN, f"answer.{TOKEN}"), b"x")
            await refused(conn, wire.run_settle_subject(SPACE, RUN, TOKEN), b"x")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{RUN_STREAM}.mine.{journal}")
            await refused(conn, f"$JS.API.CONSUMER.DELETE.{RUN_STREAM}.{replay.name}")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.{RUN_STREAM}")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.KV_{RECORDS}")
            await refused(conn, wire.kv_subject(ADMISSION, f"admit.{RUN}"), b"x")
            stored = await last_message(root, f"KV_{RECORDS}", f"$KV.{RECORDS}.run.{RUN}.driver.state")
            other_info = await consumer_info(root, RUN_STREAM, other_replay.name)
    assert errors == 0
    assert appended["stream"] == RUN_STREAM
    assert (entry.subject, entry.data) == (journal, b"step-1")
    assert revision >= 1 and stored is not None and (stored.seq, stored.data) == (revision, b"s1")
    assert other_info["delivered"]["consumer_seq"] == 0


async def test_a_run_mediator_reads_by_leader_get_and_writes_its_run_effects_only(stack):
    journal = wire.run_journal_subject(SPACE, RUN)
    with trio.fail_after(CEILING_S):
        await provision(stack)
        async with minted(stack, None) as root, minted(stack, "run-mediator", run_id=RUN) as conn:
            await root.request(journal, b"step-1")
            await kv_put(root, RECORDS, f"run.{RUN}.driver.state", b"s1")
            read_journal = await last_message(conn, RUN_STREAM, journal)
            read_record = await first_message(conn, f"KV_{RECORDS}", f"$KV.{RECORDS}.run.{RUN}.driver.state")
            revision = await kv_put(conn, RECORDS, f"run.{RUN}.effect.e1", b"done")
            await conn.flush()
            errors = conn.error_count
            await refused(conn, wire.run_record_subject(SPACE, OTHER_RUN, "effect.e1"), b"x")
            await refused(conn, wire.run_record_subject(SPACE, RUN, "driver.state"), b"forged")
            await refused(conn, wire.run_record_subject(SPACE, RUN, f"answer.{TOKEN}"), b"x")
            await refused(conn, journal, b"forged")
            await refused(conn, wire.run_settle_subject(SPACE, RUN, TOKEN), b"x")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.{DM}")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.KV_{AUTH}")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.KV_{ISSUED}")
            await refused(conn, f"$JS.API.DIRECT.GET.KV_{RECORDS}")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{RUN_STREAM}.sneak.{journal}")
            await refused(conn, f"$JS.API.STREAM.PURGE.{RUN_STREAM}")
            stored = await last_message(root, f"KV_{RECORDS}", f"$KV.{RECORDS}.run.{RUN}.effect.e1")
    assert errors == 0
    assert read_journal is not None and (read_journal.subject, read_journal.data) == (journal, b"step-1")
    assert read_record is not None and read_record.data == b"s1"
    assert stored is not None and (stored.seq, stored.data) == (revision, b"done")


async def test_a_run_operator_reads_its_run_through_its_own_consumers(stack):
    journal = wire.run_journal_subject(SPACE, RUN)
    admit = wire.kv_subject(ADMISSION, f"admit.{RUN}")
    records_stream = f"KV_{RECORDS}"
    walk = {"ack_policy": "none", "deliver_policy": "all"}
    with trio.fail_after(CEILING_S):
        await provision(stack)
        async with minted(stack, None) as root, minted(stack, "run-operator", run_id=RUN) as conn:
            name = f"op-{nonce_of(conn)}"
            await root.request(journal, b"step-1")
            await kv_put(root, RECORDS, f"run.{RUN}.driver.state", b"s1")
            await kv_put(root, RECORDS, f"run.{OTHER_RUN}.driver.state", b"theirs")
            await root.request(admit, b"admitted")
            await ensure_consumer(conn, records_stream, name, f"$KV.{RECORDS}.run.{RUN}.>", walk)
            record = await pull_next(conn, records_stream, name, expires_s=2)
            after_record = await pull_next(conn, records_stream, name, expires_s=1)
            dropped_walk = await js(conn, f"$JS.API.CONSUMER.DELETE.{records_stream}.{name}")
            await ensure_consumer(conn, RUN_STREAM, name, journal, walk)
            entry = await pull_next(conn, RUN_STREAM, name, expires_s=2)
            dropped_replay = await js(conn, f"$JS.API.CONSUMER.DELETE.{RUN_STREAM}.{name}")
            admission = await conn.request(f"$JS.API.DIRECT.GET.KV_{ADMISSION}.{admit}", b"")
            errors = conn.error_count
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{records_stream}.{name}.$KV.{RECORDS}.run.{OTHER_RUN}.>")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{records_stream}.{name}.$KV.{RECORDS}.>")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{records_stream}.op-someoneelse.$KV.{RECORDS}.run.{RUN}.>")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{records_stream}.{name}")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{RUN_STREAM}.{name}.{wire.run_journal_subject(SPACE, OTHER_RUN)}")
            await refused(conn, f"$JS.API.CONSUMER.MSG.NEXT.{RUN_STREAM}.{wire.replay_durable(SPACE, RUN).name}")
            await refused(conn, f"$JS.API.DIRECT.GET.KV_{ADMISSION}.$KV.{ADMISSION}.admit.{OTHER_RUN}")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.{records_stream}")
            await refused(conn, wire.run_record_subject(SPACE, RUN, f"answer.{TOKEN}"), b"x")
            await refused(conn, wire.run_settle_subject(SPACE, RUN, TOKEN), b"x")
            left = await consumer_names(root, records_stream), await consumer_names(root, RUN_STREAM)
    assert errors == 0
    assert record is not None and (record.subject, record.data) == (f"$KV.{RECORDS}.run.{RUN}.driver.state", b"s1")
    assert after_record is None  # the other run's record is outside the pinned filter
    assert entry is not None and (entry.subject, entry.data) == (journal, b"step-1")
    assert dropped_walk.get("success") is True and dropped_replay.get("success") is True
    assert admission.data == b"admitted"
    assert left == ([], [])


async def test_a_run_operator_answering_half_holds_one_checkpoint_only(stack):
    settle = wire.run_settle_subject(SPACE, RUN, TOKEN)
    context = {"run_id": RUN, "checkpoint_token": TOKEN}
    with trio.fail_after(CEILING_S):
        await provision(stack)
        async with minted(stack, None) as root, minted(stack, "run-operator", **context) as conn:
            revision = await kv_put(conn, RECORDS, f"run.{RUN}.answer.{TOKEN}", b"yes")
            settled = json.loads((await conn.request(settle, b"settled")).data)
            errors = conn.error_count
            await refused(conn, wire.run_record_subject(SPACE, RUN, f"answer.{OTHER_TOKEN}"), b"x")
            await refused(conn, wire.run_settle_subject(SPACE, RUN, OTHER_TOKEN), b"x")
            await refused(conn, wire.run_record_subject(SPACE, OTHER_RUN, f"answer.{TOKEN}"), b"x")
            await refused(conn, wire.run_settle_subject(SPACE, OTHER_RUN, TOKEN), b"x")
            await refused(conn, wire.run_journal_subject(SPACE, RUN), b"x")
            await refused(conn, wire.run_record_subject(SPACE, RUN, "driver.state"), b"x")
            name = f"op-{nonce_of(conn)}"
            await refused(conn, f"$JS.API.CONSUMER.CREATE.KV_{RECORDS}.{name}.$KV.{RECORDS}.run.{RUN}.>")
            await refused(conn, f"$JS.API.DIRECT.GET.KV_{ADMISSION}.$KV.{ADMISSION}.admit.{RUN}")
            stored = await last_message(root, f"KV_{RECORDS}", f"$KV.{RECORDS}.run.{RUN}.answer.{TOKEN}")
            journal = await last_message(root, RUN_STREAM, settle)
    assert errors == 0
    assert stored is not None and (stored.seq, stored.data) == (revision, b"yes")
    assert settled["stream"] == RUN_STREAM
    assert journal is not None and (journal.seq, journal.data) == (settled["seq"], b"settled")


async def test_an_issuer_writes_the_issued_and_accepted_stores_only(stack):
    evidence = f"$KV.{ISSUED}.ev.g1"
    row = f"$KV.{ACCEPTED}.row.g1"
    with trio.fail_after(CEILING_S):
        await provision(stack)
        async with minted(stack, None) as root, minted(stack, "issuer") as conn:
            first = await kv_put(conn, ISSUED, "ev.g1", b"evidence-1")
            await kv_put(conn, ISSUED, "ev.g1", b"evidence-2")
            read_evidence = await first_message(conn, f"KV_{ISSUED}", evidence)
            accepted = await kv_put(conn, ACCEPTED, "row.g1", b"accepted")
            read_row = await conn.request(f"$JS.API.DIRECT.GET.KV_{ACCEPTED}.{row}", b"")
            first_row = await first_message(conn, f"KV_{ACCEPTED}", row)  # how IssuedStores reads it
            issued_info = await js(conn, f"$JS.API.STREAM.INFO.KV_{ISSUED}")
            accepted_info = await js(conn, f"$JS.API.STREAM.INFO.KV_{ACCEPTED}")
            errors = conn.error_count
            await refused(conn, f"$KV.{RECORDS}.run.{RUN}.driver.state", b"x")
            await refused(conn, f"$KV.{AUTH}.plane", b"x")
            await refused(conn, f"$KV.{ADMISSION}.admit.{RUN}", b"x")
            await refused(conn, f"$KV.{PRESENCE}.{stack.owner('alice')}.cli", b"x")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.KV_{RECORDS}")
            await refused(conn, f"$JS.API.DIRECT.GET.KV_{ISSUED}")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.KV_{AUTH}")
            await refused(conn, f"$JS.API.STREAM.PURGE.KV_{ISSUED}")
            await refused(conn, f"$JS.API.STREAM.DELETE.KV_{ACCEPTED}")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.KV_{ISSUED}.sneak.$KV.{ISSUED}.>")
            await refused(conn, f"cotal.{SPACE}.ch.team.news", b"x")
            stored_row = await last_message(root, f"KV_{ACCEPTED}", row)
    assert errors == 0
    assert read_evidence is not None and (read_evidence.seq, read_evidence.data) == (first, b"evidence-1")
    assert read_row.data == b"accepted"
    assert first_row is not None and (first_row.seq, first_row.data) == (accepted, b"accepted")
    assert stored_row is not None and (stored_row.seq, stored_row.data) == (accepted, b"accepted")
    assert (issued_info["config"]["name"], accepted_info["config"]["name"]) == (f"KV_{ISSUED}", f"KV_{ACCEPTED}")
