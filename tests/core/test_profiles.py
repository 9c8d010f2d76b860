"""The permission profiles (core/profiles.py; docs/wire-layout.md) and the re-exported subject builders."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.profiles import (
    PROFILES,
    WHOLESALE,
    Permissions,
    agent_permissions,
    channel_subject,
    dm_subject,
    inbox_subject,
    profile_permissions,
    space_prefix,
    view_permissions,
)
from cotal_trio.core.views import VIEWS, ServiceEndpointBinding, TransferTarget

OWNER = "u_rbxbyevw4etgpbzfupdhu2zxwe"
NONCE = "ibx0123456789abcdef"


def agent(**overrides) -> Permissions:
    fields = {
        "space": "demo", "owner": OWNER, "actor": "cli", "allow_publish": ("team.*",),
        "allow_subscribe": (">",), "inbox_nonce": NONCE,
    }  # fmt: skip
    return agent_permissions(**{**fields, **overrides})


def test_subject_builders():
    assert space_prefix("demo") == "cotal.demo"
    assert channel_subject("demo", "team.alerts") == "cotal.demo.ch.team.alerts"
    assert dm_subject("demo", OWNER, "cli") == f"cotal.demo.dm.{OWNER}.cli.>"
    assert inbox_subject(NONCE) == f"_INBOX_{NONCE}.>"


# A DM names its sender after the recipient (docs/wire-layout.md): an agent sends only as itself.
DM_SEND = [f"cotal.demo.dm.*.*.{OWNER}.cli", f"cotal.demo.dm.*.*.{OWNER}.cli.>"]
DM_BIND = [
    f"$JS.API.CONSUMER.INFO.COTAL_DM_demo.dm-{OWNER}-cli", f"$JS.API.CONSUMER.MSG.NEXT.COTAL_DM_demo.dm-{OWNER}-cli",
    f"$JS.ACK.COTAL_DM_demo.dm-{OWNER}-cli.>",
]
PRESENCE_READ = ["$JS.API.DIRECT.GET.KV_cotal_presence_demo", "$JS.API.DIRECT.GET.KV_cotal_presence_demo.>"]
SELF_CONTROL = [f"cotal.demo.ctl.despawn.{OWNER}.cli", f"cotal.demo.ctl.turn.{OWNER}.cli"]
SPAWN = ["cotal.demo.ctl.spawn", f"cotal.demo.ctl.stop.{OWNER}.cli.*", "cotal.demo.ctl.persona"]
RUN_VERBS = [f"cotal.demo.ctl.run.{verb}" for verb in ("start", "resume", "answer", "status", "list")]
# Its two watch readers (spec "Profiles", agent row): info and pull of the pre-created pull
# readers, never a create or a delete (docs/wire-layout.md "Watches and history readers").
WATCHES = [
    f"$JS.API.CONSUMER.{verb}.KV_cotal_{bucket}_demo.watch-{bucket}-{OWNER}-cli"
    for bucket in ("presence", "channels") for verb in ("INFO", "MSG.NEXT")
]
AGENT_TAIL = [*DM_BIND, *WATCHES, *PRESENCE_READ, f"$KV.cotal_presence_demo.{OWNER}.cli", "$SYS.REQ.USER.INFO"]


def test_agent_profile():
    assert agent().to_nats() == {
        "pub": {"allow": ["cotal.demo.ch.team.*", *DM_SEND, *SELF_CONTROL, *AGENT_TAIL]},
        "sub": {"allow": ["cotal.demo.ch.>", f"cotal.demo.dm.{OWNER}.cli.>", f"_INBOX_{NONCE}.>"]},
    }


def test_empty_allow_publish_means_no_channel_publish():
    permissions = agent(allow_publish=(), allow_subscribe=())
    assert permissions.pub_allow == (*DM_SEND, *SELF_CONTROL, *AGENT_TAIL)
    assert permissions.sub_allow == (f"cotal.demo.dm.{OWNER}.cli.>", f"_INBOX_{NONCE}.>")
    assert not any(".ch." in s for s in permissions.pub_allow + permissions.sub_allow)


def test_agent_role_binds_its_task_queue():
    task = ["$JS.API.CONSUMER.INFO.COTAL_TASK_demo.task-coder", "$JS.API.CONSUMER.MSG.NEXT.COTAL_TASK_demo.task-coder",
            "$JS.ACK.COTAL_TASK_demo.task-coder.>"]  # fmt: skip
    assert agent(role="coder").pub_allow == ("cotal.demo.ch.team.*", *DM_SEND, *SELF_CONTROL, *DM_BIND,
                                             *task, *AGENT_TAIL[len(DM_BIND):])  # fmt: skip


@pytest.mark.parametrize(
    ("capabilities", "added"),
    [((), []), (("spawn",), SPAWN), (("run",), [*SPAWN, *RUN_VERBS]), (("run", "spawn"), [*SPAWN, *RUN_VERBS])],
)
def test_capabilities_add_exactly_their_control_subjects(capabilities, added):
    base = agent()
    granted = agent(capabilities=capabilities)
    assert granted.sub_allow == base.sub_allow
    assert [s for s in granted.pub_allow if s not in base.pub_allow] == added
    assert granted.pub_allow == (*base.pub_allow[:5], *added, *base.pub_allow[5:])  # after channel, DM send, own control


def test_boot_subscribe_must_lie_within_allow_subscribe():
    assert agent(allow_subscribe=("team.>",), subscribe=("team.*", "team.a.b")) == agent(allow_subscribe=("team.>",))
    with pytest.raises(Refused, match="team.> does not cover ops") as info:
        agent(allow_subscribe=("team.>",), subscribe=("ops",))
    assert info.value.code is RefusalCode.BAD_REQUEST


def test_agent_profile_removes_duplicates_in_order():
    permissions = agent(allow_publish=("a", "b", "a"), allow_subscribe=("x", "x"))
    assert permissions.pub_allow[:2] == ("cotal.demo.ch.a", "cotal.demo.ch.b")
    assert permissions.sub_allow[0] == "cotal.demo.ch.x" and permissions.sub_allow.count("cotal.demo.ch.x") == 1


@pytest.mark.parametrize(
    "overrides",
    [
        {"space": "a.b"},
        {"space": ""},
        {"owner": "local"},
        {"actor": "a.b"},
        {"inbox_nonce": "short"},
        {"inbox_nonce": "has.dots.in.it"},
        {"allow_publish": ("a..b",)},
        {"allow_publish": (">.a",)},
        {"allow_subscribe": ("",)},
        {"allow_subscribe": ("a b",)},
        {"role": "a.b"},
        {"role": ""},
        {"capabilities": ("admin",)},
        {"capabilities": ("spawn.>",)},
        {"subscribe": ("a..b",)},
        {"subscribe": ("x",), "allow_subscribe": ()},
    ],
)
def test_agent_profile_refuses_bad_input(overrides):
    for _ in range(2):  # the memo of the lists never remembers a refusal: the second call refuses too
        with pytest.raises(Refused) as info:
            agent(**overrides)
        assert info.value.code is RefusalCode.BAD_REQUEST


def test_agent_profile_memo_changes_only_the_inbox_and_lists_equal_tuples():
    first = agent(allow_publish=("a", "b"), inbox_nonce="n" * 22)
    second = agent(allow_publish=("a", "b"), inbox_nonce="m" * 22)
    assert first.pub_allow == second.pub_allow
    assert (first.sub_allow[:-1], first.sub_allow[-1], second.sub_allow[-1]) == (
        second.sub_allow[:-1], "_INBOX_" + "n" * 22 + ".>", "_INBOX_" + "m" * 22 + ".>"
    )
    assert agent(allow_publish=["a", "b"], inbox_nonce="n" * 22) == first  # a list is not memoized, same profile
    assert agent(allow_publish=("a", "c"), inbox_nonce="n" * 22).pub_allow[1] == "cotal.demo.ch.c"
    assert agent(allow_publish=("a", "b"), inbox_nonce="n" * 22) is first  # the re-check of one connect


def test_to_nats_omits_empty_lists():
    permissions = Permissions(pub_deny=(">",), sub_allow=("a.b",), sub_deny=("a.b.c",))
    assert permissions.to_nats() == {"pub": {"deny": [">"]}, "sub": {"allow": ["a.b"], "deny": ["a.b.c"]}}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"pub_allow": ("a",)},  # sub says nothing: NATS would allow every subscription
        {"sub_deny": (">",)},
        {"pub_allow": ("a..b",), "sub_deny": (">",)},
        {"pub_allow": ("a b",), "sub_deny": (">",)},
        {"pub_allow": (">.a",), "sub_deny": (">",)},
        {"pub_allow": ["a"], "sub_deny": (">",)},
        {"pub_allow": ("",), "sub_deny": (">",)},
    ],
)
def test_permissions_refuse(fields):
    with pytest.raises(CodecError):
        Permissions(**fields)


channels = st.from_regex(r"([a-z0-9_-]{1,5}|\*)(\.([a-z0-9_-]{1,5}|\*)){0,2}(\.>)?|>", fullmatch=True)


@given(st.lists(channels, max_size=4), st.lists(channels, max_size=4))
def test_every_agent_subject_stays_in_the_space_or_its_own_inbox(pub, sub):
    permissions = agent(allow_publish=tuple(pub), allow_subscribe=tuple(sub))
    for subject in permissions.pub_allow:
        assert subject.startswith("cotal.demo.") or subject in AGENT_TAIL
    for subject in permissions.sub_allow:
        assert subject.startswith(("cotal.demo.ch.", f"cotal.demo.dm.{OWNER}.cli.", f"_INBOX_{NONCE}."))
    assert permissions.to_nats()["pub"]["allow"] == list(permissions.pub_allow)


# --- view profiles (docs/views.md; spec "Listener policy") -----------------------------

INSTANCE = "m" * 26
SESSION_ID = "S" * 43
HEX = "9f" * 32
TARGET = TransferTarget(instance_id="t" * 28, sha256_hex=HEX)
SERVICE = ServiceEndpointBinding(endpoint="search", instance_id=INSTANCE)
INBOX = f"_INBOX_{NONCE}.>"
INFO = "$SYS.REQ.USER.INFO"


def view(name, **overrides) -> Permissions:
    fields = {"space": "demo", "owner": OWNER, "actor": "cli", "scope": (), "inbox_nonce": NONCE}
    return view_permissions(name, **{**fields, **overrides})


VIEW_PROFILES = [
    # (view, extra arguments, pub allow, sub allow)
    ("admin", {"scope": ("admin",)}, [INFO], ["cotal.demo.>", INBOX]),
    ("purger", {"scope": ("admin",)}, ["cotal.demo.ctl.purge.>", INFO], [INBOX]),
    ("channel-writer", {"scope": ("admin",)},
     ["cotal.demo.ctl.channels.set", "cotal.demo.ctl.channels.defaults", INFO], [INBOX]),
    ("channel-purger", {"scope": ("admin",)}, ["cotal.demo.ctl.channels.delete", INFO], [INBOX]),
    ("deployer", {"scope": ("spawn",)}, ["cotal.demo.ctl.deploy.>", INFO], [INBOX]),
    ("manager-service", {"scope": ("supervise",)}, ["cotal.demo.ctl.manager.>", INFO], [INBOX]),
    ("manager-caller", {"manager_instance_id": INSTANCE}, [f"cotal.demo.mgr.{INSTANCE}.call", INFO], [INBOX]),
    ("manager-caller", {"manager_instance_id": INSTANCE, "scope": ("run", "role:x")},
     [f"cotal.demo.mgr.{INSTANCE}.call", INFO], [INBOX]),
    ("manager-caller", {"manager_instance_id": INSTANCE, "scope": ("spawn",)},
     [f"cotal.demo.mgr.{INSTANCE}.call", f"cotal.demo.mgr.{INSTANCE}.status", f"cotal.demo.mgr.{INSTANCE}.models",
      f"cotal.demo.mgr.{INSTANCE}.resolve-cwd", INFO], [INBOX]),
    ("session-caller", {"session_id": SESSION_ID},
     [f"cotal.demo.session.{SESSION_ID}.in", INFO], [f"cotal.demo.session.{SESSION_ID}.out", INBOX]),
    ("transfer-writer", {"transfer_writer": TARGET, "scope": ("admin",)},
     [f"cotal.demo.transfer.{'t' * 28}.{HEX}", INFO], [INBOX]),
    ("service-host", {"service_endpoint": SERVICE, "scope": ("service-endpoint",)},
     [INFO], ["cotal.demo.ep.search.*.*.*", "cotal.demo.ep.v1.*.*.*.search.*", INBOX]),
]  # fmt: skip
# Only a service host answers the calls it receives (docs/http-api.md "Service endpoints").
RESP = {"service-host": {"max": 1, "ttl": 0}}


@pytest.mark.parametrize(("name", "extra", "pub", "sub"), VIEW_PROFILES)
def test_view_profile(name, extra, pub, sub):
    expected = {"pub": {"allow": pub}, "sub": {"allow": sub}}
    if name in RESP:
        expected["resp"] = RESP[name]
    assert view(name, **extra).to_nats() == expected


def test_a_service_host_of_an_endpoint_named_v1_is_refused():
    with pytest.raises(Refused) as info:
        view("service-host", service_endpoint=ServiceEndpointBinding(endpoint="v1", instance_id=INSTANCE))
    assert "may not be named v1" in info.value.detail


def test_every_view_has_a_profile():
    assert {row[0] for row in VIEW_PROFILES} == set(VIEWS)


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("manager-caller", {}),
        ("session-caller", {}),
        ("transfer-writer", {}),
        ("admin", {"manager_instance_id": INSTANCE}),
        ("manager-caller", {"manager_instance_id": INSTANCE, "session_id": SESSION_ID}),
        ("channel-writer", {"transfer_writer": TARGET}),
    ],
)
def test_view_profile_refuses_a_binding_that_does_not_pair(name, extra):
    with pytest.raises(TypeError, match="view_permissions"):
        view(name, **extra)


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("god", {}),
        (None, {}),
        ("admin", {"space": "a.b"}),
        ("admin", {"owner": "local"}),
        ("admin", {"actor": "a.b"}),
        ("admin", {"inbox_nonce": "short"}),
        ("admin", {"scope": ("a b",)}),
        ("manager-caller", {"manager_instance_id": "a.b" + "c" * 24}),
        ("session-caller", {"session_id": "x" * 20 + ".>"}),
    ],
)
def test_view_profile_refuses_bad_input(name, overrides):
    with pytest.raises(Refused) as info:
        view(name, **overrides)
    assert info.value.code is RefusalCode.BAD_REQUEST


# --- every other profile (docs/wire-layout.md) ------------------------------------------

RUN = "r" * 26
TOKEN = "chk_" + "a" * 20
INBOX_ONLY = [INBOX]
STREAMS = ["COTAL_CHAT_demo", "COTAL_DM_demo", "COTAL_TASK_demo", "COTAL_RUN_demo"]
KV_STREAMS = [
    f"KV_cotal_{b}_demo" for b in ("auth", "records", "sessions", "issued", "accepted", "presence", "channels", "admission")
]


def hist(stream: str) -> list[str]:
    """Info, pull and delete of the credential's own history reader on ``stream`` (spec "Profiles")."""
    return [f"$JS.API.CONSUMER.{verb}.{stream}.hist__{NONCE}" for verb in ("INFO", "MSG.NEXT", "DELETE")]


ADMISSION = "cotal_admission_demo"
OP = f"op-{NONCE}"

PROFILE_TABLE = [
    # (profile, context beyond space and inbox_nonce, pub allow, sub allow)
    ("observer", {}, [*PRESENCE_READ, *hist("COTAL_CHAT_demo"), INFO], ["cotal.demo.ch.>", INBOX]),
    ("admin", {}, [*PRESENCE_READ, *hist("COTAL_CHAT_demo"), *hist("COTAL_DM_demo"), INFO], ["cotal.demo.>", INBOX]),
    ("provisioner", {}, [
        *(f"$JS.API.STREAM.{verb}.{stream}" for stream in [
            *STREAMS, "KV_cotal_presence_demo", "KV_cotal_channels_demo", "KV_cotal_admission_demo",
        ] for verb in ("CREATE", "INFO")),
        "$JS.API.CONSUMER.CREATE.COTAL_DM_demo.*.cotal.demo.dm.*.*.>",
        "$JS.API.CONSUMER.CREATE.COTAL_TASK_demo.*.cotal.demo.task.*.>",
        "$JS.API.CONSUMER.CREATE.COTAL_RUN_demo.*.cotal.demo.run.*.journal",
        "$JS.API.CONSUMER.CREATE.COTAL_CHAT_demo.delivery-chat.cotal.demo.ch.>",
        "$JS.API.CONSUMER.CREATE.COTAL_DM_demo.delivery-dm.cotal.demo.dm.>",
        "$JS.API.CONSUMER.CREATE.KV_cotal_presence_demo.*.$KV.cotal_presence_demo.>",
        "$JS.API.CONSUMER.CREATE.KV_cotal_channels_demo.*.$KV.cotal_channels_demo.>",
        "$JS.API.CONSUMER.CREATE.COTAL_CHAT_demo.*.cotal.demo.ch.>",
        *(f"$JS.API.CONSUMER.INFO.{stream}.*" for stream in [*STREAMS, "KV_cotal_presence_demo", "KV_cotal_channels_demo"]),
        INFO,
    ], INBOX_ONLY),
    ("teardown", {}, [
        *(f"$JS.API.STREAM.DELETE.{stream}" for stream in [*STREAMS, *KV_STREAMS]),
        "$JS.API.CONSUMER.DELETE.COTAL_DM_demo.*", "$JS.API.CONSUMER.DELETE.COTAL_TASK_demo.*",
        "$JS.API.CONSUMER.DELETE.COTAL_RUN_demo.*", INFO,
    ], INBOX_ONLY),
    ("delivery", {}, [
        "$JS.API.CONSUMER.INFO.COTAL_CHAT_demo.delivery-chat", "$JS.API.CONSUMER.MSG.NEXT.COTAL_CHAT_demo.delivery-chat",
        "$JS.ACK.COTAL_CHAT_demo.delivery-chat.>",
        "$JS.API.CONSUMER.INFO.COTAL_DM_demo.delivery-dm", "$JS.API.CONSUMER.MSG.NEXT.COTAL_DM_demo.delivery-dm",
        "$JS.ACK.COTAL_DM_demo.delivery-dm.>", *PRESENCE_READ, INFO,
    ], INBOX_ONLY),
    ("run-driver", {"run_id": RUN}, [
        f"cotal.demo.run.{RUN}.journal", f"$JS.API.CONSUMER.INFO.COTAL_RUN_demo.replay-{RUN}",
        f"$JS.API.CONSUMER.MSG.NEXT.COTAL_RUN_demo.replay-{RUN}", f"$JS.ACK.COTAL_RUN_demo.replay-{RUN}.>",
        f"$KV.cotal_records_demo.run.{RUN}.driver.>", INFO,
    ], INBOX_ONLY),
    ("run-mediator", {"run_id": RUN}, [
        "$JS.API.STREAM.MSG.GET.COTAL_RUN_demo", "$JS.API.STREAM.MSG.GET.KV_cotal_records_demo",
        f"$KV.cotal_records_demo.run.{RUN}.effect.>", INFO,
    ], INBOX_ONLY),
    ("run-operator", {"run_id": RUN}, [
        f"$JS.API.CONSUMER.CREATE.KV_cotal_records_demo.{OP}.$KV.cotal_records_demo.run.{RUN}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.KV_cotal_records_demo.{OP}", f"$JS.API.CONSUMER.DELETE.KV_cotal_records_demo.{OP}",
        f"$JS.API.CONSUMER.CREATE.COTAL_RUN_demo.{OP}.cotal.demo.run.{RUN}.journal",
        f"$JS.API.CONSUMER.MSG.NEXT.COTAL_RUN_demo.{OP}", f"$JS.API.CONSUMER.DELETE.COTAL_RUN_demo.{OP}",
        f"$JS.API.DIRECT.GET.KV_{ADMISSION}.$KV.{ADMISSION}.admit.{RUN}",
        f"$JS.API.DIRECT.GET.KV_{ADMISSION}.$KV.{ADMISSION}.revoke.{RUN}", INFO,
    ], INBOX_ONLY),
    ("run-operator", {"run_id": RUN, "checkpoint_token": TOKEN}, [
        f"$KV.cotal_records_demo.run.{RUN}.answer.{TOKEN}", f"cotal.demo.run.{RUN}.settle.{TOKEN}", INFO,
    ], INBOX_ONLY),
    ("issuer", {}, [
        "$KV.cotal_issued_demo.>", "$KV.cotal_accepted_demo.>", "$JS.API.STREAM.MSG.GET.KV_cotal_issued_demo",
        "$JS.API.STREAM.MSG.GET.KV_cotal_accepted_demo", "$JS.API.DIRECT.GET.KV_cotal_accepted_demo", "$JS.API.DIRECT.GET.KV_cotal_accepted_demo.>",
        "$JS.API.STREAM.INFO.KV_cotal_issued_demo", "$JS.API.STREAM.INFO.KV_cotal_accepted_demo", INFO,
    ], INBOX_ONLY),
    ("run-admitter", {"run_id": RUN}, [
        f"$KV.{ADMISSION}.admit.{RUN}", f"$KV.{ADMISSION}.revoke.{RUN}",
        f"$JS.API.DIRECT.GET.KV_{ADMISSION}.$KV.{ADMISSION}.admit.{RUN}",
        f"$JS.API.DIRECT.GET.KV_{ADMISSION}.$KV.{ADMISSION}.revoke.{RUN}", INFO,
    ], INBOX_ONLY),
]  # fmt: skip


@pytest.mark.parametrize(("name", "extra", "pub", "sub"), PROFILE_TABLE)
def test_profile(name, extra, pub, sub):
    permissions = profile_permissions(name, space="demo", inbox_nonce=NONCE, **extra)
    assert permissions.to_nats() == {"pub": {"allow": pub}, "sub": {"allow": sub}}


def test_every_profile_is_dispatched():
    assert set(PROFILES) == {row[0] for row in PROFILE_TABLE} | {"agent", "view"}
    assert set(WHOLESALE) == set(PROFILES)


def test_dispatch_builds_the_agent_and_the_views():
    context = {"space": "demo", "owner": OWNER, "actor": "cli", "inbox_nonce": NONCE}
    assert profile_permissions("agent", allow_publish=("team.*",), allow_subscribe=(">",), **context) == agent()
    assert profile_permissions("view", view="admin", scope=("admin",), **context) == view("admin", scope=("admin",))


@pytest.mark.parametrize(
    ("name", "context"),
    [
        ("god", {}),
        (None, {}),
        ("observer", {"space": "a.b"}),
        ("admin", {"inbox_nonce": "short"}),
        ("run-driver", {"run_id": "R" * 26}),
        ("run-mediator", {"run_id": "r" * 25}),
        ("run-operator", {"run_id": RUN, "checkpoint_token": "short"}),
        ("run-admitter", {"run_id": "a.b" + "c" * 24}),
        ("run-admitter", {"run_id": None}),
    ],
)
def test_profiles_refuse_bad_input(name, context):
    with pytest.raises(Refused) as info:
        profile_permissions(name, **{"space": "demo", "inbox_nonce": NONCE, **context})
    assert info.value.code is RefusalCode.BAD_REQUEST


def test_no_operator_side_profile_reads_every_dm_and_deletes_streams():
    """Spec "Profiles": the operator-side creds are split so no one connection can read every DM
    and delete every stream. Reading every DM needs a DM consumer (create or bind) or a
    subscription on the DM subjects; deleting needs STREAM.DELETE."""
    for name in ("provisioner", "teardown", "delivery"):
        permissions = profile_permissions(name, space="demo", inbox_nonce=NONCE)
        deletes = any(".STREAM.DELETE." in s or ".CONSUMER.DELETE." in s for s in permissions.pub_allow)
        reads_dm = any(s.startswith(("$JS.API.CONSUMER.CREATE.COTAL_DM_", "$JS.API.CONSUMER.MSG.NEXT.COTAL_DM_"))
                       for s in permissions.pub_allow) or any(".dm." in s for s in permissions.sub_allow)  # fmt: skip
        assert not (deletes and reads_dm), name


@given(
    st.lists(channels, max_size=4),
    st.lists(channels, max_size=4),
    st.from_regex(r"[A-Za-z0-9_-]{8,40}", fullmatch=True),
)
def test_a_fresh_nonce_profile_is_what_the_checked_constructor_builds(pub, sub, nonce):
    # A fresh inbox nonce's agent profile is built from lists checked once per principal, with
    # only its inbox subject checked (issue 14): it must be exactly the profile the checking
    # constructor accepts, and the same as a list-input call, which takes the unmemoized path.
    memoized = agent(allow_publish=tuple(pub), allow_subscribe=tuple(sub), inbox_nonce=nonce)
    unmemoized = agent(allow_publish=list(pub), allow_subscribe=list(sub), inbox_nonce=nonce)
    assert memoized == unmemoized
    assert Permissions(pub_allow=memoized.pub_allow, sub_allow=memoized.sub_allow) == memoized
    assert memoized.sub_allow[-1] == f"_INBOX_{nonce}.>"


@pytest.mark.parametrize("fields", [{"pub_allow": (), "sub_allow": ("a",)}, {"pub_allow": ("a",), "sub_allow": ()}])
def test_checked_permissions_still_refuse_an_empty_direction(fields):
    with pytest.raises(CodecError):
        Permissions.of_checked(**fields)
