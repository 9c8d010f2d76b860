"""Issue 6 items 1-2 on a real nats-server: what each profile can and cannot do.

The ``stack`` fixture runs ``run_up`` for space ``alpha``. Agents connect through the callout
(the agent profile it mints), other profiles connect as users minted directly with the space's
data-account service signing key and ``profile_permissions``. The provisioner (itself a minted
``provisioner`` user) creates the streams, buckets and bind-only durables first. A refusal is
the broker's ``Permissions Violation`` naming the subject, reported on the connection.
"""

from __future__ import annotations

import json

import pytest
import trio

from cotal_trio.core import wire
from cotal_trio.core.errors import Unavailable
from cotal_trio.stores.streams import (
    ensure_dm_inbox,
)
from cotal_trio.natsio import (
    ConsumerDrift,
    Message,
    SubjectConflict,
    ack,
    consumer_info,
    consumer_names,
    ensure_consumer,
    kv_delete,
    kv_put,
    publish_expecting,
    pull_next,
)

from tests.support.stack import SPACE, Stack, client
from tests.support.profiles import (
    ADMISSION,
    CEILING_S,
    DM,
    OTHER_RUN,
    PRESENCE,
    RUN,
    minted,
    nonce_of,
    provision,
    refused,
    refused_subscription,
)

pytestmark = pytest.mark.broker


async def agent(stack: Stack, sub: str, **grant):
    """``(row, bearer)`` of a granted interactive agent ``<owner of sub>.cli``."""
    row = stack.grant(sub, "cli", **grant)
    return row, await stack.bearer(sub, "cli")


async def test_an_agent_publishes_to_its_channels_and_receives_a_dm_through_its_inbox(stack):
    alice, alice_bearer = await agent(stack, "alice", publish=("team.news",), subscribe=("team.>",))
    bob, bob_bearer = await agent(stack, "bob")
    inbox = wire.dm_durable(SPACE, alice.owner, "cli")
    with trio.fail_after(CEILING_S):
        await provision(stack, [(alice.owner, "cli"), (bob.owner, "cli")])
        async with client(stack, alice_bearer) as mine, client(stack, bob_bearer) as theirs:
            received: list[Message] = []
            await mine.subscribe(f"cotal.{SPACE}.ch.team.>", on_message=received.append)
            await mine.request(f"cotal.{SPACE}.ch.team.news", b"posted")  # stored in CHAT: a JetStream ack
            await refused(mine, f"cotal.{SPACE}.ch.ops")
            errors = mine.error_count
            sent = f"cotal.{SPACE}.dm.{alice.owner}.cli.{bob.owner}.cli"  # to alice, as bob
            ack_answer = json.loads((await theirs.request(sent, b"psst")).data)
            assert ack_answer["stream"] == DM
            await refused(theirs, f"cotal.{SPACE}.dm.{alice.owner}.cli.{alice.owner}.other")  # as someone else
            msg = await pull_next(mine, inbox.stream, inbox.name, expires_s=2)
            assert msg is not None and (msg.subject, msg.data) == (sent, b"psst")
            await ack(mine, msg)
            await mine.flush()
            info = await consumer_info(mine, inbox.stream, inbox.name)
            assert mine.error_count == errors, mine.last_error
    assert [m.data for m in received] == [b"posted"]
    assert (info["delivered"]["consumer_seq"], info["num_ack_pending"]) == (1, 0)


async def test_an_agent_cannot_create_delete_or_pull_a_consumer_on_another_inbox(stack):
    alice, alice_bearer = await agent(stack, "alice")
    bob, bob_bearer = await agent(stack, "bob")
    mine, theirs = wire.dm_durable(SPACE, alice.owner, "cli"), wire.dm_durable(SPACE, bob.owner, "cli")
    bob_filter = f"cotal.{SPACE}.dm.{bob.owner}.cli.>"
    body = json.dumps({"stream_name": DM, "config": {"filter_subject": bob_filter, "ack_policy": "none"}}).encode()
    with trio.fail_after(CEILING_S):
        await provision(stack, [(alice.owner, "cli"), (bob.owner, "cli")])
        async with client(stack, alice_bearer) as conn:
            for subject in (
                f"$JS.API.CONSUMER.CREATE.{DM}", f"$JS.API.CONSUMER.CREATE.{DM}.sneak",
                f"$JS.API.CONSUMER.CREATE.{DM}.sneak.{bob_filter}", f"$JS.API.CONSUMER.DURABLE.CREATE.{DM}.sneak",
                f"$JS.API.CONSUMER.CREATE.{DM}.{theirs.name}.{bob_filter}",  # re-point bob's durable
                f"$JS.API.CONSUMER.CREATE.{DM}.{mine.name}.{mine.filter_subject}",  # or its own
            ):  # fmt: skip
                await refused(conn, subject, body)
            for subject in (
                f"$JS.API.CONSUMER.MSG.NEXT.{DM}.{theirs.name}", f"$JS.API.CONSUMER.INFO.{DM}.{theirs.name}",
                f"$JS.API.CONSUMER.DELETE.{DM}.{theirs.name}", f"$JS.API.CONSUMER.DELETE.{DM}.{mine.name}",
                f"$JS.API.STREAM.MSG.GET.{DM}", f"$JS.API.DIRECT.GET.{DM}", f"$JS.API.STREAM.PURGE.{DM}",
                f"$JS.API.STREAM.DELETE.{DM}", f"$JS.API.STREAM.UPDATE.{DM}",
            ):  # fmt: skip
                await refused(conn, subject)
            await refused_subscription(conn, bob_filter)
        async with client(stack, bob_bearer) as bobs:
            await bobs.request(f"cotal.{SPACE}.dm.{bob.owner}.cli.{bob.owner}.cli", b"for bob only")  # a note to self
            delivered = await pull_next(bobs, theirs.stream, theirs.name, expires_s=2)
        async with minted(stack, None) as root:
            names = await consumer_names(root, DM)
            bobs_config = (await consumer_info(root, DM, theirs.name))["config"]
    assert names == sorted([mine.name, theirs.name])
    assert "deliver_subject" not in bobs_config and bobs_config["filter_subject"] == bob_filter
    assert delivered is not None and delivered.data == b"for bob only"


async def test_presence_is_read_by_direct_get_and_written_on_the_own_key_only(stack):
    alice, alice_bearer = await agent(stack, "alice")
    bob, bob_bearer = await agent(stack, "bob")
    bob_key = wire.kv_subject(PRESENCE, wire.presence_key(bob.owner, "cli"))
    with trio.fail_after(CEILING_S):
        await provision(stack)
        async with client(stack, bob_bearer) as bobs:
            await kv_put(bobs, PRESENCE, wire.presence_key(bob.owner, "cli"), b"online")
        async with client(stack, alice_bearer) as conn:
            await kv_put(conn, PRESENCE, wire.presence_key(alice.owner, "cli"), b"here")
            by_subject = await conn.request(f"$JS.API.DIRECT.GET.KV_{PRESENCE}.{bob_key}", b"")
            by_body = await conn.request(f"$JS.API.DIRECT.GET.KV_{PRESENCE}", json.dumps({"last_by_subj": bob_key}).encode())
            await refused(conn, bob_key, b"forged")
            await refused(conn, f"$JS.API.STREAM.PURGE.KV_{PRESENCE}")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.KV_{PRESENCE}")
            await refused_subscription(conn, f"$KV.{PRESENCE}.>")
    assert by_subject.data == by_body.data == b"online"


async def test_a_role_binds_its_task_queue_and_capabilities_add_their_control_subjects(stack):
    owner = stack.owner("carol")
    queue = wire.task_durable(SPACE, "coder")
    context = {"owner": owner, "actor": "cli", "allow_publish": (), "allow_subscribe": (), "role": "coder",
               "capabilities": ("spawn",)}  # fmt: skip
    with trio.fail_after(CEILING_S):
        await provision(stack, [(owner, "cli")], roles=("coder", "tester"))
        async with minted(stack, None) as root, minted(stack, "agent", **context) as conn:
            control: list[Message] = []
            await root.subscribe(f"cotal.{SPACE}.ctl.>", on_message=control.append)
            await root.flush()
            await root.request(f"cotal.{SPACE}.task.coder.t1", b"build it")
            task = await pull_next(conn, queue.stream, queue.name, expires_s=2)
            assert task is not None
            await ack(conn, task)
            await conn.publish(f"cotal.{SPACE}.ctl.spawn", b"child")
            await conn.publish(f"cotal.{SPACE}.ctl.stop.{owner}.cli.child", b"stop")
            await conn.flush()
            await refused(conn, f"$JS.API.CONSUMER.MSG.NEXT.COTAL_TASK_{SPACE}.task-tester")
            await refused(conn, f"cotal.{SPACE}.ctl.run.start")
            await refused(conn, f"cotal.{SPACE}.ctl.stop.{stack.owner('dave')}.cli.child")
            await root.flush()
    assert (task.subject, task.data) == (f"cotal.{SPACE}.task.coder.t1", b"build it")
    assert [m.subject for m in control] == [f"cotal.{SPACE}.ctl.spawn", f"cotal.{SPACE}.ctl.stop.{owner}.cli.child"]


async def test_an_observer_reads_chat_and_presence_but_cannot_publish_nor_read_dms(stack):
    owner = stack.owner("alice")
    inbox = wire.dm_durable(SPACE, owner, "cli")
    with trio.fail_after(CEILING_S):
        await provision(stack, [(owner, "cli")])
        async with minted(stack, None) as root, minted(stack, "observer") as conn:
            chat: list[Message] = []
            await conn.subscribe(f"cotal.{SPACE}.ch.>", on_message=chat.append)
            await conn.flush()
            await root.request(f"cotal.{SPACE}.ch.team.news", b"hello")
            await kv_put(root, PRESENCE, wire.presence_key(owner, "cli"), b"online")
            roster = await conn.request(f"$JS.API.DIRECT.GET.KV_{PRESENCE}.$KV.{PRESENCE}.{owner}.cli", b"")
            await refused(conn, f"cotal.{SPACE}.ch.team.news", b"no")
            await refused(conn, f"cotal.{SPACE}.dm.{owner}.cli.x", b"no")
            await refused(conn, wire.kv_subject(PRESENCE, wire.presence_key(owner, "cli")), b"no")
            await refused_subscription(conn, f"cotal.{SPACE}.dm.>")
            await refused(conn, f"$JS.API.CONSUMER.MSG.NEXT.{DM}.{inbox.name}")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{DM}")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.{DM}")
            # No consumer create on chat either, not even a history reader of its own name: a
            # created consumer may push to any deliver subject, so a create would let it write
            # (its reader is the provisioner's: tests/lane/test_watches_live.py). It deletes only that.
            await refused(conn, f"$JS.API.CONSUMER.CREATE.COTAL_CHAT_{SPACE}.hist__{nonce_of(conn)}.cotal.{SPACE}.ch.>")
            await refused(conn, f"$JS.API.CONSUMER.DELETE.COTAL_CHAT_{SPACE}.delivery-chat")
            await root.flush()
    assert [m.data for m in chat] == [b"hello"]
    assert roster.data == b"online"


async def test_a_run_admitter_creates_its_two_keys_and_nothing_else(stack):
    admit, revoke = (wire.kv_subject(ADMISSION, key) for key in wire.admission_keys(RUN))
    stream = f"KV_{ADMISSION}"
    with trio.fail_after(CEILING_S):
        await provision(stack)
        async with minted(stack, "run-admitter", run_id=RUN) as conn:
            for subject in (admit, revoke):
                assert await publish_expecting(conn, subject, b"v1", expected_last_subject_seq=0, ttl_s=60) >= 1
            with pytest.raises(SubjectConflict):  # a put over it: the store is write-once
                await publish_expecting(conn, admit, b"v2", expected_last_subject_seq=None, ttl_s=None)
            with pytest.raises(Unavailable, match="err_code 10077"):  # a delete marker is a second message too
                await kv_delete(conn, ADMISSION, f"admit.{RUN}")
            own = await conn.request(f"$JS.API.DIRECT.GET.{stream}.{admit}", b"")
            await refused(conn, wire.kv_subject(ADMISSION, f"admit.{OTHER_RUN}"), b"x")
            await refused(conn, wire.kv_subject(ADMISSION, "third"), b"x")
            await refused(conn, f"$JS.API.STREAM.PURGE.{stream}")
            await refused(conn, f"$JS.API.STREAM.MSG.DELETE.{stream}")
            await refused(conn, f"$JS.API.DIRECT.GET.{stream}.$KV.{ADMISSION}.admit.{OTHER_RUN}")
            await refused(conn, f"$JS.API.DIRECT.GET.{stream}")
            await refused(conn, f"$JS.API.STREAM.MSG.GET.{stream}")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{stream}")
            await refused(conn, f"$JS.API.CONSUMER.CREATE.{stream}.x.{admit}")
    assert own.data == b"v1"


async def test_provisioning_is_idempotent_and_refuses_a_drifted_durable(stack):
    owner = stack.owner("alice")
    with trio.fail_after(CEILING_S):
        await provision(stack, [(owner, "cli")], roles=("coder",))
        await provision(stack, [(owner, "cli")], roles=("coder",))
        async with minted(stack, None) as root:
            odd = wire.dm_durable(SPACE, stack.owner("bob"), "cli")
            await ensure_consumer(root, odd.stream, odd.name, odd.filter_subject, {"ack_policy": "none"})
            names = await consumer_names(root, DM)
        async with minted(stack, "provisioner") as conn:
            with pytest.raises(ConsumerDrift, match='ack_policy is "none", not "explicit"'):
                await ensure_dm_inbox(conn, SPACE, stack.owner("bob"), "cli")
    assert names == sorted([wire.dm_durable(SPACE, owner, "cli").name, odd.name])


async def test_a_durable_that_pushes_the_inbox_elsewhere_is_refused(stack):
    # Only the fields sent were compared: a push consumer of the same name passed as the inbox.
    carol = stack.owner("carol")
    durable = wire.dm_durable(SPACE, carol, "cli")
    config = {
        "durable_name": durable.name, "name": durable.name, "filter_subject": durable.filter_subject,
        "deliver_subject": "elsewhere.inbox", "ack_policy": "explicit", "deliver_policy": "all",
        "ack_wait": 30_000_000_000, "max_deliver": -1, "max_ack_pending": 1000,
    }  # fmt: skip
    with trio.fail_after(CEILING_S):
        async with minted(stack, None) as root:
            await provision(stack, [])  # the streams
            created = json.loads((await root.request(
                f"$JS.API.CONSUMER.CREATE.{durable.stream}.{durable.name}.{durable.filter_subject}",
                json.dumps({"stream_name": durable.stream, "config": config, "action": "create"}).encode(),
            )).data)  # fmt: skip
            assert created.get("config", {}).get("deliver_subject") == "elsewhere.inbox", created
            with pytest.raises(ConsumerDrift, match='deliver_subject is "elsewhere.inbox", not unset'):
                await ensure_dm_inbox(root, SPACE, carol, "cli")
