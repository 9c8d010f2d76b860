"""The wire layout builders (core/wire.py; docs/wire-layout.md)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core import wire
from cotal_trio.core.errors import RefusalCode, Refused

OWNER = "u_rbxbyevw4etgpbzfupdhu2zxwe"
RUN = "r" * 26
GEN = "0123456789abcdef" * 2
TOKEN = "chk_" + "a" * 20
INSTANCE = "m" * 26

LAYOUT = [
    # (builder call, exact value)
    (lambda: wire.space_prefix("demo"), "cotal.demo"),
    (lambda: wire.inbox_subject("ibx0123456789"), "_INBOX_ibx0123456789.>"),
    (lambda: wire.channel_subject("demo", "team.*"), "cotal.demo.ch.team.*"),
    (lambda: wire.dm_subject("demo", OWNER, "cli"), f"cotal.demo.dm.{OWNER}.cli.>"),
    (lambda: wire.dm_send_subject("demo"), "cotal.demo.dm.*.*.>"),
    (lambda: wire.task_subject("demo", "coder"), "cotal.demo.task.coder.>"),
    (lambda: wire.chat_stream("demo"), wire.Stream("COTAL_CHAT_demo", "cotal.demo.ch.>")),
    (lambda: wire.dm_stream("demo"), wire.Stream("COTAL_DM_demo", "cotal.demo.dm.>")),
    (lambda: wire.task_stream("demo"), wire.Stream("COTAL_TASK_demo", "cotal.demo.task.>")),
    (lambda: wire.run_stream("demo"), wire.Stream("COTAL_RUN_demo", "cotal.demo.run.>")),
    (lambda: wire.dm_durable("demo", OWNER, "cli"),
     wire.Durable("COTAL_DM_demo", f"dm-{OWNER}-cli", f"cotal.demo.dm.{OWNER}.cli.>")),
    (lambda: wire.task_durable("demo", "coder"), wire.Durable("COTAL_TASK_demo", "task-coder", "cotal.demo.task.coder.>")),
    (lambda: wire.replay_durable("demo", RUN),
     wire.Durable("COTAL_RUN_demo", f"replay-{RUN}", f"cotal.demo.run.{RUN}.journal")),
    (lambda: wire.delivery_durable("demo", "dm"), wire.Durable("COTAL_DM_demo", "delivery-dm", "cotal.demo.dm.>")),
    (lambda: wire.delivery_durable("demo", "chat"), wire.Durable("COTAL_CHAT_demo", "delivery-chat", "cotal.demo.ch.>")),
    (lambda: wire.all_buckets("demo"),
     ("cotal_auth_demo", "cotal_records_demo", "cotal_sessions_demo", "cotal_issued_demo", "cotal_accepted_demo",
      "cotal_presence_demo", "cotal_channels_demo", "cotal_admission_demo")),
    (lambda: wire.channels_bucket("demo"), "cotal_channels_demo"),
    (lambda: wire.watch_durable("demo", "presence", OWNER, "cli"),
     wire.Durable("KV_cotal_presence_demo", f"watch-presence-{OWNER}-cli", "$KV.cotal_presence_demo.>")),
    (lambda: wire.watch_durable("demo", "channels", OWNER, "cli"),
     wire.Durable("KV_cotal_channels_demo", f"watch-channels-{OWNER}-cli", "$KV.cotal_channels_demo.>")),
    (lambda: wire.history_reader("demo", "chat", "ibx0123456789"),
     wire.Durable("COTAL_CHAT_demo", "hist__ibx0123456789", "cotal.demo.ch.>")),
    (lambda: wire.history_reader("demo", "dm", "ibx0123456789"),
     wire.Durable("COTAL_DM_demo", "hist__ibx0123456789", "cotal.demo.dm.*.*.>")),
    (lambda: wire.kv_stream("cotal_presence_demo"), "KV_cotal_presence_demo"),
    (lambda: wire.kv_subject("cotal_presence_demo", f"{OWNER}.cli"), f"$KV.cotal_presence_demo.{OWNER}.cli"),
    (lambda: wire.presence_key(OWNER, "cli"), f"{OWNER}.cli"),
    (lambda: wire.admission_keys(RUN), (f"admit.{RUN}", f"revoke.{RUN}")),
    (lambda: wire.ctl_spawn("demo"), "cotal.demo.ctl.spawn"),
    (lambda: wire.ctl_stop("demo", OWNER, "cli"), f"cotal.demo.ctl.stop.{OWNER}.cli.*"),
    (lambda: wire.ctl_stop("demo", OWNER, "cli", "kid"), f"cotal.demo.ctl.stop.{OWNER}.cli.kid"),
    (lambda: wire.ctl_despawn("demo", OWNER, "cli"), f"cotal.demo.ctl.despawn.{OWNER}.cli"),
    (lambda: wire.ctl_persona("demo"), "cotal.demo.ctl.persona"),
    (lambda: wire.ctl_turn("demo", OWNER, "cli"), f"cotal.demo.ctl.turn.{OWNER}.cli"),
    (lambda: [wire.ctl_run("demo", v) for v in wire.RUN_VERBS],
     ["cotal.demo.ctl.run.start", "cotal.demo.ctl.run.resume", "cotal.demo.ctl.run.answer", "cotal.demo.ctl.run.status",
      "cotal.demo.ctl.run.list"]),
    (lambda: wire.ctl_view("demo", "purge"), "cotal.demo.ctl.purge.>"),
    (lambda: wire.mgr_subject("demo", INSTANCE, "resolve-cwd"), f"cotal.demo.mgr.{INSTANCE}.resolve-cwd"),
    (lambda: wire.session_subject("demo", "S" * 22, "out"), f"cotal.demo.session.{'S' * 22}.out"),
    (lambda: wire.transfer_subject("demo", INSTANCE, "ab" * 32), f"cotal.demo.transfer.{INSTANCE}.{'ab' * 32}"),
    (lambda: wire.ep_subject("demo", "registry", "endpoints", OWNER, "cli"),
     f"cotal.demo.ep.registry.endpoints.{OWNER}.cli"),
    (lambda: wire.ep_v1_subject("demo", GEN, OWNER, "cli", "registry", "endpoints"),
     f"cotal.demo.ep.v1.{GEN}.{OWNER}.cli.registry.endpoints"),
    (lambda: wire.run_journal_subject("demo", RUN), f"cotal.demo.run.{RUN}.journal"),
    (lambda: wire.run_settle_subject("demo", RUN, TOKEN), f"cotal.demo.run.{RUN}.settle.{TOKEN}"),
    (lambda: wire.run_record_subject("demo", RUN, "driver.>"), f"$KV.cotal_records_demo.run.{RUN}.driver.>"),
    (lambda: wire.js_stream_create("COTAL_DM_demo"), "$JS.API.STREAM.CREATE.COTAL_DM_demo"),
    (lambda: wire.js_stream_info("COTAL_DM_demo"), "$JS.API.STREAM.INFO.COTAL_DM_demo"),
    (lambda: wire.js_stream_delete("COTAL_DM_demo"), "$JS.API.STREAM.DELETE.COTAL_DM_demo"),
    (lambda: wire.js_msg_get("KV_x"), "$JS.API.STREAM.MSG.GET.KV_x"),
    (lambda: wire.js_direct_get("KV_x"), "$JS.API.DIRECT.GET.KV_x"),
    (lambda: wire.js_direct_get("KV_x", "$KV.x.k"), "$JS.API.DIRECT.GET.KV_x.$KV.x.k"),
    (lambda: wire.js_consumer_create("COTAL_DM_demo", "*", "cotal.demo.dm.*.*.>"),
     "$JS.API.CONSUMER.CREATE.COTAL_DM_demo.*.cotal.demo.dm.*.*.>"),
    (lambda: wire.js_consumer_info("S", "d"), "$JS.API.CONSUMER.INFO.S.d"),
    (lambda: wire.js_consumer_next("S", "d"), "$JS.API.CONSUMER.MSG.NEXT.S.d"),
    (lambda: wire.js_consumer_delete("S", "*"), "$JS.API.CONSUMER.DELETE.S.*"),
    (lambda: wire.js_ack("S", "d"), "$JS.ACK.S.d.>"),
]  # fmt: skip


@pytest.mark.parametrize(("build", "value"), LAYOUT)
def test_layout(build, value):
    assert build() == value


def test_all_streams_in_order():
    assert [s.name for s in wire.all_streams("demo")] == ["COTAL_CHAT_demo", "COTAL_DM_demo", "COTAL_TASK_demo", "COTAL_RUN_demo"]


REFUSED = [
    lambda: wire.space_prefix("a.b"),
    lambda: wire.inbox_subject("short"),
    lambda: wire.channel_subject("demo", "a..b"),
    lambda: wire.channel_subject("demo", ">.a"),
    lambda: wire.dm_subject("demo", "local", "cli"),
    lambda: wire.dm_subject("demo", OWNER, "a.b"),
    lambda: wire.dm_subject("demo", OWNER, "*"),
    lambda: wire.task_subject("demo", "a.b"),
    lambda: wire.task_subject("demo", ">"),
    lambda: wire.dm_durable("demo", OWNER, "a-b"),
    lambda: wire.replay_durable("demo", "SHORT"),
    lambda: wire.delivery_durable("demo", "task"),
    lambda: wire.watch_durable("demo", "roster", OWNER, "cli"),
    lambda: wire.watch_durable("demo", "presence", OWNER, "c.li"),
    lambda: wire.history_reader("demo", "task", "ibx0123456789"),
    lambda: wire.history_reader("demo", "chat", "ibx.0123456789"),
    lambda: wire.history_reader("demo", "chat", "short"),
    lambda: wire.kv_stream("a.b"),
    lambda: wire.kv_subject("b", "a..b"),
    lambda: wire.kv_subject("b", "a b"),
    lambda: wire.admission_keys("r" * 25),
    lambda: wire.ctl_stop("demo", OWNER, "cli", "a.b"),
    lambda: wire.ctl_stop("demo", OWNER, "cli", ">"),
    lambda: wire.ctl_run("demo", "delete"),
    lambda: wire.ctl_view("demo", "god"),
    lambda: wire.mgr_subject("demo", INSTANCE, "kill"),
    lambda: wire.mgr_subject("demo", "a.b" + "c" * 24, "call"),
    lambda: wire.session_subject("demo", "x" * 20 + ".>", "in"),
    lambda: wire.session_subject("demo", "S" * 22, "sideways"),
    lambda: wire.transfer_subject("demo", INSTANCE, "AB" * 32),
    lambda: wire.ep_subject("demo", "v1", "endpoints", OWNER, "cli"),
    lambda: wire.ep_subject("demo", "a.b", "endpoints", OWNER, "cli"),
    lambda: wire.ep_subject("demo", "registry", "*", OWNER, "cli"),
    lambda: wire.ep_v1_subject("demo", GEN.upper(), OWNER, "cli", "registry", "endpoints"),
    lambda: wire.ep_v1_subject("demo", GEN[:-1], OWNER, "cli", "registry", "endpoints"),
    lambda: wire.run_settle_subject("demo", RUN, "short"),
    lambda: wire.run_settle_subject("demo", RUN, TOKEN + ".x"),
    lambda: wire.run_record_subject("demo", RUN, ">.x"),
    lambda: wire.js_stream_create("a.b"),
    lambda: wire.js_stream_create("*"),
    lambda: wire.js_consumer_create("S", "a.b", "x"),
    lambda: wire.js_consumer_create("S", "d", "x..y"),
    lambda: wire.js_consumer_next("S", "a b"),
    lambda: wire.js_ack("S", "*"),
    lambda: wire.check_run_id(None),
    lambda: wire.check_generation(7),
    lambda: wire.check_checkpoint_token(["x" * 20]),
]


@pytest.mark.parametrize("build", REFUSED)
def test_builders_refuse_bad_input(build):
    with pytest.raises(Refused) as info:
        build()
    assert info.value.code is RefusalCode.BAD_REQUEST


def test_legacy_and_issued_rails_are_disjoint():
    legacy = wire.ep_subject("demo", "registry", "endpoints", OWNER, "cli").split(".")
    issued = wire.ep_v1_subject("demo", GEN, OWNER, "cli", "registry", "endpoints").split(".")
    assert legacy[3] != "v1" and issued[3] == "v1" and len(legacy) != len(issued)


COVERS = [
    (">", "a", True), (">", "a.b.>", True), ("a.>", "a", False), ("a.>", "a.>", True), ("a.>", "a.*", True),
    ("a.*", "a.>", False), ("a.*", "a.b", True), ("a.*", "a.*", True), ("a.b", "a.*", False), ("a.*", "a.b.c", False),
    ("a.*.c", "a.b.c", True), ("a.*.>", "a.b", False), ("a.*.>", "a.b.c.d", True), ("a.b", "a.b", True),
    ("a.b", "a.b.c", False), ("a.b.c", "a.b", False), ("*", ">", False), ("*.>", ">", False),
]  # fmt: skip


@pytest.mark.parametrize(("outer", "inner", "expected"), COVERS)
def test_covers(outer, inner, expected):
    assert wire.covers(outer, inner) is expected


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


tokens = st.sampled_from(["a", "b", "c", "*"])
patterns = st.builds(
    lambda head, tail: ".".join(head + tail), st.lists(tokens, min_size=1, max_size=3), st.sampled_from([[], [">"]])
)
# Every literal subject of up to 5 tokens over a, b, c and a token no pattern names (z).
LITERALS = [".".join(t) for n in range(1, 6) for t in itertools.product("abcz", repeat=n)]


@given(patterns, patterns)
def test_covers_is_subset_of_matches(outer, inner):
    """``covers(o, i)`` exactly when every subject ``i`` matches is matched by ``o`` (patterns of
    at most 4 tokens, so subjects of up to 5 tokens decide it)."""
    subset = all(_matches(outer, s) for s in LITERALS if _matches(inner, s))
    assert wire.covers(outer, inner) is subset
