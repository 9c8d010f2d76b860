"""Subject layout, the agent permission profile and the view profiles."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.profiles import (
    Permissions,
    agent_permissions,
    channel_subject,
    dm_subject,
    inbox_subject,
    space_prefix,
    view_permissions,
)
from cotal_trio.core.views import VIEWS, TransferTarget

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


def test_agent_profile():
    assert agent().to_nats() == {
        "pub": {"allow": ["cotal.demo.ch.team.*", "cotal.demo.dm.*.*.>", "$SYS.REQ.USER.INFO"]},
        "sub": {"allow": ["cotal.demo.ch.>", f"cotal.demo.dm.{OWNER}.cli.>", f"_INBOX_{NONCE}.>"]},
    }


def test_empty_allow_publish_means_no_channel_publish():
    permissions = agent(allow_publish=(), allow_subscribe=())
    assert permissions.pub_allow == ("cotal.demo.dm.*.*.>", "$SYS.REQ.USER.INFO")
    assert permissions.sub_allow == (f"cotal.demo.dm.{OWNER}.cli.>", f"_INBOX_{NONCE}.>")
    assert not any(".ch." in s for s in permissions.pub_allow + permissions.sub_allow)


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
    ],
)
def test_agent_profile_refuses_bad_input(overrides):
    with pytest.raises(Refused) as info:
        agent(**overrides)
    assert info.value.code is RefusalCode.BAD_REQUEST


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
        assert subject.startswith("cotal.demo.") or subject == "$SYS.REQ.USER.INFO"
    for subject in permissions.sub_allow:
        assert subject.startswith(("cotal.demo.ch.", f"cotal.demo.dm.{OWNER}.cli.", f"_INBOX_{NONCE}."))
    assert permissions.to_nats()["pub"]["allow"] == list(permissions.pub_allow)


# --- view profiles (docs/views.md; spec "Listener policy") -----------------------------

INSTANCE = "m" * 26
SESSION_ID = "S" * 43
HEX = "9f" * 32
TARGET = TransferTarget(instance_id="t" * 28, sha256_hex=HEX)
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
]  # fmt: skip


@pytest.mark.parametrize(("name", "extra", "pub", "sub"), VIEW_PROFILES)
def test_view_profile(name, extra, pub, sub):
    assert view(name, **extra).to_nats() == {"pub": {"allow": pub}, "sub": {"allow": sub}}


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
