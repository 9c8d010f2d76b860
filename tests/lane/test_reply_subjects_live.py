"""Reply subjects on a real nats-server: the broker answers onto whatever reply a requester names.

Spec credential-authority "Profiles" (the agent row: "publishes as itself", "reads ... its own
DM/task inboxes") and "DM confidentiality"; docs/wire-layout.md "Reply subjects: a known hole".
A DM's sender is the two subject tokens after the recipient (``cotal.S.dm.<o>.<a>.<sender o>.<sender
a>``, ``wire.dm_subject``), and the agent profile lets an agent publish only DMs naming itself. But
nats-server (2.15.1 measured) publishes the answer to a request, a JetStream API answer
(``DIRECT.GET``, ``CONSUMER.MSG.NEXT``), a stream's publish ack, an ack's reply or
``$SYS.REQ.USER.INFO``'s, onto the reply subject the requester chose, in the requester's
account, with no check of the requester's publish permissions; a stream whose subjects cover
that reply stores it. So an agent writes, one request at a time, a message under a subject it
may not publish, with content it chooses (its own presence value), and copies what it may read
(a pulled DM or watch record, under that message's own subject) into any stream.

These tests assert the right value (nothing lands) and are ``xfail(strict=True)`` while the hole
is open: they start failing, and must lose the mark, once a mitigation closes it. The options
measured against them are in docs/wire-layout.md.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from cotal_trio.core import wire
from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.natsio import Connection, Message, js_api, js_msg_get, open_connection, open_loop, pull_next
from tests.support.profiles import CEILING_S, PRESENCE, RUN, minted, provision
from tests.support.stack import SPACE, Stack, client

pytestmark = pytest.mark.broker

HOLE = (
    "nats-server answers a request onto the requester's reply subject without checking its publish "
    "permissions, and a stream covering that subject stores the answer (docs/wire-layout.md "
    "'Reply subjects: a known hole')"
)
# Only a failed assertion of the right value is the expected failure (pytest-trio hands it over
# in an exception group); a broken setup fails the test.
hole = pytest.mark.xfail(strict=True, raises=pytest.RaisesGroup(AssertionError, flatten_subgroups=True), reason=HOLE)
FORGED_BODY = b'{"text": "from a3, honestly"}'


async def agents(stack: Stack) -> tuple[tuple[str, str], tuple[str, str], tuple[str, str], str, str]:
    """Agent A (``alice.cli``, who posts to ``team.news``), the recipient ``bob.cli`` and a third
    principal ``carol.cli`` whom A names as the sender: ``(a1, a2, a3, a1's bearer, a2's bearer)``.
    The exchange provisions A's and bob's DM inboxes with their bearers."""
    stack.grant("alice", "cli", publish=("team.news",))
    stack.grant("bob", "cli")
    alice_bearer = await stack.bearer("alice", "cli")
    bob_bearer = await stack.bearer("bob", "cli")
    a1, a2, a3 = ((stack.owner(sub), "cli") for sub in ("alice", "bob", "carol"))
    return a1, a2, a3, alice_bearer, bob_bearer


def forged_dm(to: tuple[str, str], sender: tuple[str, str]) -> str:
    """The DM subject to ``to`` whose sender tokens name ``sender`` (not the requester)."""
    return f"cotal.{SPACE}.dm.{to[0]}.{to[1]}.{sender[0]}.{sender[1]}"


async def with_reply(conn: Connection, subject: str, payload: bytes, reply: str) -> None:
    """Publish ``subject`` with the reply subject ``reply`` (any string: the broker checks only
    ``subject`` against the publisher's permissions), and wait for the broker to have it."""
    conn.publish_nowait(subject, payload, reply=reply)
    await conn.flush()


async def own_presence(conn: Connection, me: tuple[str, str], value: bytes) -> str:
    """Put ``value`` as the agent's own presence (its one writable key) and return the direct
    get subject that reads it back (``$JS.API.DIRECT.GET.KV_cotal_presence_S.$KV...``)."""
    key = wire.kv_subject(PRESENCE, wire.presence_key(*me))
    ack = json.loads((await conn.request(key, value)).data)
    assert ack.get("stream") == wire.kv_stream(PRESENCE), ack
    return wire.js_direct_get(wire.kv_stream(PRESENCE), key)


@hole
async def test_a_direct_get_answered_onto_another_principals_dm_subject_is_not_a_dm_from_a3(stack: Stack):
    """The measured finding, exactly: agent A (owner o, actor a1) direct-gets its own presence
    value with the reply ``cotal.S.dm.<bob>.<a2>.<carol>.<a3>``; COTAL_DM_S stores the answer
    as a DM to bob whose sender tokens name carol, and bob's inbox durable delivers it (and his
    live DM subscription receives it). Right value: COTAL_DM_S has nothing on that subject, bob's
    inbox and his live subscription nothing."""
    a1, a2, a3, alice_bearer, bob_bearer = await agents(stack)
    forged = forged_dm(a2, a3)
    inbox = wire.dm_durable(SPACE, *a2)
    with trio.fail_after(CEILING_S):
        async with client(stack, alice_bearer) as alice, client(stack, bob_bearer) as bob, minted(stack, None) as root:
            live: list[Message] = []
            await bob.subscribe(wire.dm_subject(SPACE, *a2), on_message=live.append)  # bob's live DMs
            await bob.flush()
            get = await own_presence(alice, a1, FORGED_BODY)
            errors = alice.error_count
            await with_reply(alice, get, b"", forged)
            await trio.sleep(0.2)  # the broker's answer is asynchronous to the request
            assert alice.error_count == errors, alice.last_error  # the request itself was allowed
            stored = await js_msg_get(root, wire.dm_stream(SPACE).name, {"last_by_subj": forged})
            delivered = await pull_next(bob, inbox.stream, inbox.name, expires_s=1)
    assert stored is None, (stored.subject, stored.data, stored.headers)
    assert delivered is None, (delivered.subject, delivered.data, delivered.headers)
    assert live == [], [(m.subject, m.data) for m in live]


async def stream_messages(root: Connection, stream: str) -> list[tuple[str, bytes]]:
    """Every message of ``stream``: ``[(subject, data)]`` in sequence order."""
    state = json.loads((await root.request(wire.js_stream_info(stream), b"")).data)["state"]
    found = []
    for seq in range(state["first_seq"], state["last_seq"] + 1) if state["messages"] else ():
        stored = await js_msg_get(root, stream, {"seq": seq})
        if stored is not None:
            found.append((stored.subject, stored.data))
    return found


async def test_a_pull_answered_onto_another_dm_subject_keeps_the_messages_own_subject(stack: Stack):
    """A pull (``CONSUMER.MSG.NEXT``) is answered onto the reply subject but the delivery keeps
    the message's own subject (docs/wire-layout.md, "pulled message"), so a pull of A's own DM
    inbox with the reply naming bob and carol does not forge carol's DM to bob: bob's inbox has
    nothing and COTAL_DM_S has nothing under the reply subject."""
    a1, a2, a3, alice_bearer, bob_bearer = await agents(stack)
    forged = forged_dm(a2, a3)
    mine, theirs = wire.dm_durable(SPACE, *a1), wire.dm_durable(SPACE, *a2)
    with trio.fail_after(CEILING_S):
        async with client(stack, alice_bearer) as alice, client(stack, bob_bearer) as bob, minted(stack, None) as root:
            await root.request(f"cotal.{SPACE}.dm.{a1[0]}.{a1[1]}.{a1[0]}.other", b"for alice only")
            errors = alice.error_count
            pull = json.dumps({"batch": 1, "no_wait": True}).encode()
            await with_reply(alice, wire.js_consumer_next(mine.stream, mine.name), pull, forged)
            await trio.sleep(0.2)
            assert alice.error_count == errors, alice.last_error
            stored = await js_msg_get(root, wire.dm_stream(SPACE).name, {"last_by_subj": forged})
            delivered = await pull_next(bob, theirs.stream, theirs.name, expires_s=1)
    assert stored is None and delivered is None


@hole
async def test_a_pull_answered_onto_a_stream_subject_is_stored_by_no_stream(stack: Stack):
    """But the stream covering the reply subject stores the delivery, under the message's own
    subject even when that lies outside the stream's subjects: a pull of A's presence watch with
    the reply a DM subject put bob's presence record (``$KV.cotal_presence_S.<bob>.cli``) into
    COTAL_DM_S, and a pull of its inbox a second copy of its DM (measured on 2.15.1). So any
    agent grows any stream, one copy per request (``discard: new``, no limits: a disk filler).
    Right value: COTAL_DM_S holds only what was sent to it."""
    a1, a2, a3, alice_bearer, _bob_bearer = await agents(stack)
    forged = forged_dm(a2, a3)
    mine, watch = wire.dm_durable(SPACE, *a1), wire.watch_durable(SPACE, "presence", *a1)
    dm = f"cotal.{SPACE}.dm.{a1[0]}.{a1[1]}.{a1[0]}.other"
    with trio.fail_after(CEILING_S):
        async with client(stack, alice_bearer) as alice, minted(stack, None) as root:
            await root.request(dm, b"for alice only")
            await root.request(wire.kv_subject(PRESENCE, wire.presence_key(*a2)), b"bob online")
            pull = json.dumps({"batch": 1, "no_wait": True}).encode()
            for durable in (mine, watch):
                await with_reply(alice, wire.js_consumer_next(durable.stream, durable.name), pull, forged)
            await trio.sleep(0.3)
            stored = await stream_messages(root, wire.dm_stream(SPACE).name)
    assert stored == [(dm, b"for alice only")]


async def test_a_direct_get_answer_can_be_stripped_of_the_headers_a_receiver_would_check(stack: Stack):
    """Why the receiver cannot tell such a DM by its headers (docs/wire-layout.md, option d): a
    direct get's answer carries ``Nats-Stream``, ``Nats-Subject``, ``Nats-Sequence`` and
    ``Nats-Time-Stamp``, but with ``{"no_hdr": true}`` in the body it carries none, only the
    value the agent wrote."""
    a1, *_rest, alice_bearer, _bob_bearer = await agents(stack)
    with trio.fail_after(CEILING_S):
        async with client(stack, alice_bearer) as alice:
            get = await own_presence(alice, a1, FORGED_BODY)
            plain = await alice.request(get, b"")
            bare = await alice.request(get, json.dumps({"no_hdr": True}).encode())
    assert plain.data == bare.data == FORGED_BODY
    assert {"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp"} <= set(plain.headers or {})
    assert bare.headers is None


def targets(a1: tuple[str, str]) -> dict[str, tuple[str, str]]:
    """Per stream of the space (``wire.all_streams``, ``wire.all_buckets``): a subject it stores
    that agent ``a1`` may not publish, and the stream."""
    found = {
        "chat": (f"cotal.{SPACE}.ch.ops.news", wire.chat_stream(SPACE).name),  # a channel A may not post to
        "task": (f"cotal.{SPACE}.task.coder.forged", wire.task_stream(SPACE).name),
        "run": (wire.run_journal_subject(SPACE, RUN), wire.run_stream(SPACE).name),
    }
    keys = {wire.presence_bucket(SPACE): wire.presence_key(a1[0], "other"),  # another principal's presence
            wire.admission_bucket(SPACE): wire.admission_keys(RUN)[0]}  # fmt: skip
    for bucket in wire.all_buckets(SPACE):
        found[bucket] = (wire.kv_subject(bucket, keys.get(bucket, "forged.key")), wire.kv_stream(bucket))
    return found


@hole
async def test_a_direct_get_answered_onto_any_stream_subject_is_stored_by_no_stream(stack: Stack):
    """The same request with the reply set, in turn, to a subject of each stream and bucket of
    the space (chat, task, run, and every KV bucket: auth, records, sessions, issued, accepted,
    presence, channel registry, admission). Right value: none stores it. Measured on 2.15.1:
    every one does (the assertion lists them)."""
    a1, _a2, _a3, alice_bearer, _bob_bearer = await agents(stack)
    with trio.fail_after(CEILING_S):
        await provision(stack)  # the task and run streams, the admission store
        async with client(stack, alice_bearer) as alice, minted(stack, None) as root:
            get = await own_presence(alice, a1, FORGED_BODY)
            errors = alice.error_count
            wanted = targets(a1)
            for subject, _stream in wanted.values():
                await with_reply(alice, get, b"", subject)
            await trio.sleep(0.3)
            assert alice.error_count == errors, alice.last_error
            written = []
            for what, (subject, stream) in wanted.items():
                stored = await js_msg_get(root, stream, {"last_by_subj": subject})
                if stored is not None and stored.data == FORGED_BODY:
                    written.append(what)
    assert written == [], f"written by a direct get's answer: {written}"


@hole
async def test_no_answer_the_agent_can_ask_for_lands_as_a_dm(stack: Stack):
    """Why taking every ``$JS.API`` request away from the agent would not close the hole: the
    answers it keeps asking for land too. Each with its own forged sender (``a3``, ``a4``, ...):
    the publish ack of a chat post (``{"stream": "COTAL_CHAT_S", "seq": n}``), the publish ack of
    its own DM, the reply to an ack of a DM it pulled (an empty message), and the answer of
    ``$SYS.REQ.USER.INFO`` (its user info). Right value: none lands in COTAL_DM_S."""
    a1, a2, _a3, alice_bearer, _bob_bearer = await agents(stack)
    kinds = ("chat ack", "dm ack", "ack reply", "user info")
    forged = {kind: forged_dm(a2, (a1[0], f"forged{n}")) for n, kind in enumerate(kinds)}
    mine = wire.dm_durable(SPACE, *a1)
    with trio.fail_after(CEILING_S):
        async with client(stack, alice_bearer) as alice, minted(stack, None) as root:
            await root.request(f"cotal.{SPACE}.dm.{a1[0]}.{a1[1]}.{a1[0]}.other", b"for alice only")
            errors = alice.error_count
            await with_reply(alice, f"cotal.{SPACE}.ch.team.news", b"a post", forged["chat ack"])
            await with_reply(alice, f"cotal.{SPACE}.dm.{a2[0]}.{a2[1]}.{a1[0]}.{a1[1]}", b"hi", forged["dm ack"])
            msg = await pull_next(alice, mine.stream, mine.name, expires_s=2)
            assert msg is not None and msg.reply, msg
            await with_reply(alice, msg.reply, b"+ACK", forged["ack reply"])
            await with_reply(alice, wire.USER_INFO_SUBJECT, b"", forged["user info"])
            await trio.sleep(0.3)
            assert alice.error_count == errors, alice.last_error
            landed = {}
            for kind, subject in forged.items():
                stored = await js_msg_get(root, wire.dm_stream(SPACE).name, {"last_by_subj": subject})
                if stored is not None:
                    landed[kind] = stored.data[:60]
    assert landed == {}, f"landed in COTAL_DM_S as DMs with forged senders: {landed}"


# Option (c), measured: the streams in an account the agents are not in. A config-file broker
# (no operator: the import and export semantics are the same), account DATA holding COTAL_DM_S
# and the presence bucket and exporting as services the DM subjects and the two JetStream reads
# an agent makes; account AGENT importing them, with no JetStream of its own.
DM_SUBJECTS = f"cotal.{SPACE}.dm.>"
PRESENCE_GET = f"$JS.API.DIRECT.GET.KV_{PRESENCE}.>"
INBOX_PULL = f"$JS.API.CONSUMER.MSG.NEXT.COTAL_DM_{SPACE}.*"
SPLIT_CONFIG = """listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{store}" }}
accounts {{
  DATA {{
    jetstream: enabled
    users [{{user: data, password: data}}]
    exports [{{service: "{dm}"}}, {{service: "{get}"}}, {{service: "{pull}"}}]
  }}
  AGENT {{
    users [
      {{user: alice, password: alice, permissions: {{
        publish: {{allow: ["cotal.{space}.dm.*.*.alice.cli", "{get}", "{pull}"]}},
        subscribe: {{allow: ["_INBOX.>", "cotal.{space}.dm.alice.cli.>"]}}}}}}
      {{user: bob, password: bob, permissions: {{
        publish: {{allow: ["cotal.{space}.dm.*.*.bob.cli"]}}, subscribe: {{allow: ["_INBOX.>", "cotal.{space}.dm.bob.cli.>"]}}}}}}
    ]
    imports [
      {{service: {{account: DATA, subject: "{dm}"}}}}
      {{service: {{account: DATA, subject: "{get}"}}}}
      {{service: {{account: DATA, subject: "{pull}"}}}}
    ]
  }}
}}
"""


@pytest.fixture
async def split_broker(nursery: trio.Nursery, tmp_path, nats_server_bin: str) -> str:
    """A nats-server with the DATA/AGENT split above; its URL without credentials."""
    port = free_port()
    config = tmp_path / "split.conf"
    config.write_text(SPLIT_CONFIG.format(
        port=port, store=tmp_path / "js", space=SPACE, dm=DM_SUBJECTS, get=PRESENCE_GET, pull=INBOX_PULL,
    ))  # fmt: skip
    start = functools.partial(run_nats_server, config, executable=nats_server_bin, log_path=tmp_path / "split.log", port=port)
    with trio.fail_after(15):
        await nursery.start(start)
    return f"127.0.0.1:{port}"


@asynccontextmanager
async def user(address: str, name: str) -> AsyncIterator[Connection]:
    """A connection of the config user ``name`` (its password is its name)."""
    async with open_loop(), open_connection(f"nats://{name}:{name}@{address}", reconnect=False) as conn:
        yield conn


async def test_an_account_split_keeps_the_answers_an_agent_asks_for_out_of_the_streams(split_broker: str):
    """Measured for option (c): with the streams in DATA and the agents in AGENT, every answer
    the single-account tests above store lands in no stream of DATA. The JetStream answers go to
    the broker's own ``_R_.`` reply in DATA (no stream of ours covers it) and back to AGENT under
    the reply the agent named, where no stream is; a DM sent through the import still gets its
    publish ack back. What the split does not close: the answer still reaches a live subscriber
    of that subject in AGENT, so bob's live DM subscription receives a DM naming carol with A's
    chosen bytes (the live reads of the agent profile, chat and DMs, need the same fix)."""
    dm_stream, presence = f"COTAL_DM_{SPACE}", f"KV_{PRESENCE}"
    forged = f"cotal.{SPACE}.dm.bob.cli.carol.cli"
    with trio.fail_after(CEILING_S):
        async with user(split_broker, "data") as data, user(split_broker, "alice") as alice, user(split_broker, "bob") as bob:
            await js_api(data, wire.js_stream_create(dm_stream), {"name": dm_stream, "subjects": [DM_SUBJECTS]})
            await js_api(data, wire.js_stream_create(presence), {"name": presence, "subjects": [f"$KV.{PRESENCE}.>"], "allow_direct": True})
            inbox = f"{wire.js_consumer_create(dm_stream, 'dm-alice-cli', f'cotal.{SPACE}.dm.alice.cli.>')}"
            await js_api(data, inbox, {"stream_name": dm_stream, "config": {
                "name": "dm-alice-cli", "durable_name": "dm-alice-cli", "filter_subject": f"cotal.{SPACE}.dm.alice.cli.>",
                "ack_policy": "explicit"}})  # fmt: skip
            await data.request(f"$KV.{PRESENCE}.alice.cli", FORGED_BODY)
            await data.request(f"cotal.{SPACE}.dm.alice.cli.dave.cli", b"for alice only")
            live: list[Message] = []
            await bob.subscribe(f"cotal.{SPACE}.dm.bob.cli.>", on_message=live.append)
            await bob.flush()
            sent = json.loads((await alice.request(f"cotal.{SPACE}.dm.bob.cli.alice.cli", b"a real dm")).data)
            got = await alice.request(f"$JS.API.DIRECT.GET.{presence}.$KV.{PRESENCE}.alice.cli", b"")
            errors = alice.error_count
            get = f"$JS.API.DIRECT.GET.{presence}.$KV.{PRESENCE}.alice.cli"
            await with_reply(alice, get, b"", forged)
            await with_reply(alice, get, json.dumps({"no_hdr": True}).encode(), forged)
            pull = json.dumps({"batch": 1, "no_wait": True}).encode()
            await with_reply(alice, f"$JS.API.CONSUMER.MSG.NEXT.{dm_stream}.dm-alice-cli", pull, forged)
            await with_reply(alice, f"cotal.{SPACE}.dm.bob.cli.alice.cli", b"a second real dm", forged)  # its ack
            await trio.sleep(0.3)
            assert alice.error_count == errors, alice.last_error
            stored = await stream_messages(data, dm_stream)
    assert sent["stream"] == dm_stream and got.data == FORGED_BODY  # the imports serve the agent
    assert stored == [
        (f"cotal.{SPACE}.dm.alice.cli.dave.cli", b"for alice only"),
        (f"cotal.{SPACE}.dm.bob.cli.alice.cli", b"a real dm"),
        (f"cotal.{SPACE}.dm.bob.cli.alice.cli", b"a second real dm"),
    ]
    assert [m.data for m in live if m.subject == forged][:2] == [FORGED_BODY, FORGED_BODY]


async def test_no_ack_stops_only_the_publish_ack_row(plain_broker: str):
    """Measured for option (a): ``no_ack: true``, the one stream setting about answers, on a
    plain broker. A post whose reply is a DM subject then stores nothing there (no publish ack is
    sent), but a direct get's answer onto it is stored all the same: no setting refuses it."""
    dm_stream, chat_stream, presence = f"COTAL_DM_{SPACE}", f"COTAL_CHAT_{SPACE}", f"KV_{PRESENCE}"
    forged = f"cotal.{SPACE}.dm.bob.cli.carol.cli"
    with trio.fail_after(CEILING_S):
        async with open_loop(), open_connection(plain_broker, reconnect=False) as conn:
            for name, subjects, extra in ((dm_stream, DM_SUBJECTS, {"no_ack": True}),
                                          (chat_stream, f"cotal.{SPACE}.ch.>", {"no_ack": True}),
                                          (presence, f"$KV.{PRESENCE}.>", {"allow_direct": True})):  # fmt: skip
                await js_api(conn, wire.js_stream_create(name), {"name": name, "subjects": [subjects], **extra})
            await conn.request(f"$KV.{PRESENCE}.alice.cli", FORGED_BODY)
            await with_reply(conn, f"cotal.{SPACE}.ch.team.news", b"a post", forged)
            await with_reply(conn, f"$JS.API.DIRECT.GET.{presence}.$KV.{PRESENCE}.alice.cli", b"", forged)
            await trio.sleep(0.3)
            stored = await stream_messages(conn, dm_stream)
            posts = await stream_messages(conn, chat_stream)
    assert posts == [(f"cotal.{SPACE}.ch.team.news", b"a post")]
    assert stored == [(forged, FORGED_BODY)]
