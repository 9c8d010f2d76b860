"""Subject layout and the agent permission profile."""

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
)

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
