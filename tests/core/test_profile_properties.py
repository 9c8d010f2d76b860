"""Properties of every profile over arbitrary valid inputs (issue 6 "Tests"; docs/wire-layout.md).

* No allow-list holds a wholesale grant (one covering ``$JS.>``, ``$JS.API.>``, a whole bucket
  ``$KV.<bucket>.>`` or a message get of a whole stream) unless ``profiles.WHOLESALE`` lists it for
  that profile; every listed one is granted; docs/wire-layout.md prints that constant.
* No grant reaches another space.
* DM confidentiality: no agent or observer grant creates, deletes or pulls a consumer on the DM
  stream other than binding the agent's own inbox, or subscribes to another principal's DMs.

The subject matching here is this file's own (NATS token rules), not ``core.wire.covers``.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cotal_trio.core.profiles import PROFILES, WHOLESALE, Permissions, profile_permissions
from cotal_trio.core.views import VIEWS, ServiceEndpointBinding, TransferTarget

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-layout.md"
FRESH = "zq9fresh"  # a token no grant names: it stands for "any" in probe subjects
BUCKETS = ("auth", "records", "sessions", "issued", "accepted", "presence", "admission")
STREAM_KINDS = ("CHAT", "DM", "TASK", "RUN")


def matches(pattern: str, subject: str) -> bool:
    """NATS matching of a literal ``subject`` by ``pattern`` (``*`` one token, final ``>`` the rest)."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def covers(grant: str, pattern: str) -> bool:
    """``grant`` matches every subject ``pattern`` matches: ``*`` stands for a fresh token, a
    final ``>`` for one and for two fresh tokens (enough, as no grant names the fresh token)."""
    stem = pattern.replace("*", FRESH)
    if not stem.endswith(".>"):
        return matches(grant, stem)
    return all(matches(grant, stem[:-1] + tail) for tail in (FRESH, f"{FRESH}.{FRESH}"))


def wholesale_probes(space: str) -> list[str]:
    streams = [f"COTAL_{kind}_{space}" for kind in STREAM_KINDS] + [f"KV_cotal_{b}_{space}" for b in BUCKETS] + [FRESH]
    probes = ["$JS.>", "$JS.API.>", *(f"$KV.cotal_{b}_{space}.>" for b in BUCKETS), f"$KV.{FRESH}.>"]
    for stream in streams:
        probes += [f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]
    return probes


def grants(permissions: Permissions) -> list[str]:
    return [*permissions.pub_allow, *permissions.sub_allow]


# -- arbitrary valid inputs ----------------------------------------------------------------------

spaces = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
owners = st.from_regex(r"u_[a-z2-7]{26}", fullmatch=True)
actors = st.from_regex(r"[A-Za-z0-9_]{1,12}", fullmatch=True)
nonces = st.from_regex(r"[A-Za-z0-9_-]{8,24}", fullmatch=True)
run_ids = st.from_regex(r"[a-z0-9]{26,32}", fullmatch=True)
tokens = st.from_regex(r"[A-Za-z0-9_-]{16,40}", fullmatch=True)
uids = st.from_regex(r"[a-z0-9]{26,32}", fullmatch=True)
channels = st.from_regex(r"([a-z0-9_-]{1,5}|\*)(\.([a-z0-9_-]{1,5}|\*)){0,2}(\.>)?|>", fullmatch=True)
scopes = st.lists(st.from_regex(r"[A-Za-z0-9_:-]{1,10}", fullmatch=True), max_size=3).map(tuple)


@st.composite
def agent_context(draw: st.DrawFn) -> dict:
    read = tuple(draw(st.lists(channels, max_size=4)))
    return {
        "owner": draw(owners), "actor": draw(actors), "allow_publish": tuple(draw(st.lists(channels, max_size=4))),
        "allow_subscribe": read, "subscribe": tuple(draw(st.lists(st.sampled_from(read), max_size=3))) if read else (),
        "role": draw(st.none() | st.from_regex(r"[A-Za-z0-9_-]{1,10}", fullmatch=True)),
        "capabilities": tuple(draw(st.lists(st.sampled_from(("spawn", "run")), unique=True))),
    }  # fmt: skip


@st.composite
def view_context(draw: st.DrawFn) -> dict:
    view = draw(st.sampled_from(VIEWS))
    context = {"view": view, "owner": draw(owners), "actor": draw(actors), "scope": draw(scopes)}
    if view == "manager-caller":
        context["manager_instance_id"] = draw(uids)
    elif view == "session-caller":
        context["session_id"] = draw(st.from_regex(r"[A-Za-z0-9_-]{22,40}", fullmatch=True))
    elif view == "transfer-writer":
        sha256_hex = draw(st.from_regex(r"[0-9a-f]{64}", fullmatch=True))
        context["transfer_writer"] = TransferTarget(instance_id=draw(uids), sha256_hex=sha256_hex)
    elif view == "service-host":
        endpoint = draw(st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True).filter(lambda e: e != "v1"))
        context["service_endpoint"] = ServiceEndpointBinding(endpoint=endpoint, instance_id=draw(uids))
    return context


@st.composite
def profiles(draw: st.DrawFn) -> tuple[str, str, dict]:
    """``(profile, space, context)`` for any profile of :data:`PROFILES` with valid inputs."""
    name, space = draw(st.sampled_from(PROFILES)), draw(spaces)
    context = {"space": space, "inbox_nonce": draw(nonces)}
    if name == "agent":
        context |= draw(agent_context())
    elif name == "view":
        context |= draw(view_context())
    elif name.startswith("run-"):
        context["run_id"] = draw(run_ids)
        if name == "run-operator" and draw(st.booleans()):
            context["checkpoint_token"] = draw(tokens)
    return name, space, context


# -- the properties ------------------------------------------------------------------------------


@settings(max_examples=400)
@given(profiles())
def test_no_wholesale_grant_unless_the_profile_row_lists_it(drawn):
    name, space, context = drawn
    permissions = profile_permissions(name, **context)
    listed = {grant.replace("<S>", space) for grant in WHOLESALE[name]}
    probes = wholesale_probes(space)
    for grant in grants(permissions):
        wholesale = [probe for probe in probes if covers(grant, probe)]
        assert not wholesale or grant in listed, (name, grant, wholesale)
    assert listed <= set(permissions.pub_allow), (name, listed - set(permissions.pub_allow))


@settings(max_examples=300)
@given(profiles(), spaces)
def test_no_grant_reaches_another_space(drawn, other):
    name, space, context = drawn
    if other == space:
        return
    probes = [
        f"cotal.{other}.ch.x", f"cotal.{other}.dm.a.b.c", f"cotal.{other}.ctl.spawn", f"cotal.{other}.run.r.journal",
        f"$KV.cotal_presence_{other}.a.b", f"$KV.cotal_admission_{other}.admit.r", f"$KV.cotal_issued_{other}.k",
        f"$JS.API.DIRECT.GET.KV_cotal_presence_{other}", f"$JS.API.STREAM.MSG.GET.KV_cotal_records_{other}",
        f"$JS.API.STREAM.CREATE.COTAL_DM_{other}", f"$JS.API.STREAM.DELETE.COTAL_CHAT_{other}",
        f"$JS.API.CONSUMER.CREATE.COTAL_DM_{other}.n.cotal.{other}.dm.a.b.>", f"$JS.ACK.COTAL_DM_{other}.d.1",
    ]  # fmt: skip
    for grant in grants(profile_permissions(name, **context)):
        assert not any(matches(grant, probe) for probe in probes), (name, grant)


@settings(max_examples=300)
@given(spaces, nonces, agent_context(), owners, actors)
def test_an_agent_binds_only_its_own_dm_inbox(space, nonce, context, other_owner, other_actor):
    owner, actor = context["owner"], context["actor"]
    if (other_owner, other_actor) == (owner, actor):
        return
    permissions = profile_permissions("agent", space=space, inbox_nonce=nonce, **context)
    dm = f"COTAL_DM_{space}"
    theirs, mine = f"dm-{other_owner}-{other_actor}", f"dm-{owner}-{actor}"
    forbidden_pub = [
        f"$JS.API.CONSUMER.CREATE.{dm}", f"$JS.API.CONSUMER.CREATE.{dm}.x",
        f"$JS.API.CONSUMER.CREATE.{dm}.x.cotal.{space}.dm.{other_owner}.{other_actor}.>",
        f"$JS.API.CONSUMER.CREATE.{dm}.{mine}.cotal.{space}.dm.{owner}.{actor}.>",
        f"$JS.API.CONSUMER.CREATE.{dm}.{theirs}.cotal.{space}.dm.{other_owner}.{other_actor}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{dm}.x", f"$JS.API.CONSUMER.DELETE.{dm}.{theirs}",
        f"$JS.API.CONSUMER.DELETE.{dm}.{mine}", f"$JS.API.CONSUMER.MSG.NEXT.{dm}.{theirs}",
        f"$JS.API.CONSUMER.INFO.{dm}.{theirs}", f"$JS.ACK.{dm}.{theirs}.1.2.3.4.0",
        f"$JS.API.STREAM.MSG.GET.{dm}", f"$JS.API.DIRECT.GET.{dm}", f"$JS.API.STREAM.PURGE.{dm}",
        f"$JS.API.STREAM.DELETE.{dm}", f"$JS.API.STREAM.UPDATE.{dm}",
    ]  # fmt: skip
    for grant in permissions.pub_allow:
        assert not any(matches(grant, probe) for probe in forbidden_pub), grant
    for grant in permissions.sub_allow:
        assert not matches(grant, f"cotal.{space}.dm.{other_owner}.{other_actor}.x"), grant
    assert f"$JS.API.CONSUMER.MSG.NEXT.{dm}.{mine}" in permissions.pub_allow


@settings(max_examples=100)
@given(spaces, nonces, owners, actors)
def test_an_observer_sees_no_dm_and_writes_nothing(space, nonce, owner, actor):
    permissions = profile_permissions("observer", space=space, inbox_nonce=nonce)
    for grant in permissions.sub_allow:
        assert not matches(grant, f"cotal.{space}.dm.{owner}.{actor}.x"), grant
    reader = f"COTAL_CHAT_{space}.hist__{nonce}"
    own_reader = {f"$JS.API.CONSUMER.{verb}.{reader}" for verb in ("INFO", "MSG.NEXT", "DELETE")}
    for grant in permissions.pub_allow:
        assert grant.startswith("$JS.API.DIRECT.GET.") or grant in own_reader or grant == "$SYS.REQ.USER.INFO", grant


@settings(max_examples=100)
@given(spaces, nonces, agent_context())
def test_agent_observer_and_admin_create_no_consumer_and_delete_none_but_their_history_readers(space, nonce, context):
    """Spec "Profiles": a create grant cannot bound a push consumer's deliver subject
    (docs/wire-layout.md "Watches and history readers"), so these profiles create no consumer in
    any form, the agent deletes none, and the observer and admin only their own ``hist__<nonce>``."""
    for name, extra in (("agent", context), ("observer", {}), ("admin", {})):
        permissions = profile_permissions(name, space=space, inbox_nonce=nonce, **extra)
        for grant in permissions.pub_allow:
            assert not grant.startswith(("$JS.API.CONSUMER.CREATE.", "$JS.API.CONSUMER.DURABLE.")), (name, grant)
            if ".CONSUMER.DELETE." in grant:
                assert name != "agent" and grant.endswith(f".hist__{nonce}"), (name, grant)


def test_the_doc_prints_the_wholesale_constant():
    text = DOC.read_text()
    for name in PROFILES:
        cell = ", ".join(f"`{grant}`" for grant in WHOLESALE[name]) or "none"
        assert f"| `{name}` | {cell} |" in text, name
