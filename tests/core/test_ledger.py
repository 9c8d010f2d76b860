"""The actor ledger: rows, file codec and decisions (reference/upstream-notes.md 1.3).

The delegation envelope is tested in ``test_delegation.py``, with the row helpers from here.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.errors import CodecError, ConfigError, RefusalCode, Refused
from cotal_trio.core.ledger import (
    AGENT_EXCHANGE_REFUSAL,
    LedgerKind,
    LedgerRow,
    authorize_agent_exchange,
    authorize_connect,
    authorize_human_exchange,
    hash_actor_token,
    new_actor_token,
    parse_row,
    render_row,
)
from tests.support.ledger_rows import (
    GRANTED_AT,
    OTHER_OWNER,
    OWNER,
    TOKEN,
    TOKEN_HASH,
    UID,
    lookup_of,
    managed,
    row,
)

UID2 = "1" * 26


def bearer(**overrides) -> ValidatedBearer:
    fields = {
        "owner": OWNER, "actor": "cli", "scope": ("spawn",), "lifecycle_uid": UID, "parent": None,
        "view": None, "credential_id": None, "iat": 1_800_000_000, "exp": 1_800_000_600,
    }  # fmt: skip
    return ValidatedBearer(**{**fields, **overrides})


def file_bytes(**overrides) -> bytes:
    obj = {
        "ver": 1, "owner": OWNER, "actor": "cli", "scope": ["spawn"], "allowSubscribe": [">"],
        "allowPublish": ["team.*"], "lifecycleUid": UID, "grantedAt": GRANTED_AT,
    }  # fmt: skip
    obj = {k: v for k, v in {**obj, **overrides}.items() if v is not None}
    return json.dumps(obj).encode()


# --- row and codec ---------------------------------------------------------------------------


def test_kind_directories():
    assert LedgerKind.INTERACTIVE.directory == "actors"
    assert LedgerKind.MANAGED.directory == "managed-actors"
    assert LedgerKind("managed") is LedgerKind.MANAGED


def test_render_is_canonical():
    rendered = render_row(managed(parent=f"{OWNER}.cli", role="default", label="david laptop"))
    assert rendered == (
        "{\n"
        '  "actor": "alpha",\n'
        '  "allowPublish": [\n    ">"\n  ],\n'
        '  "allowSubscribe": [\n    ">"\n  ],\n'
        f'  "grantedAt": "{GRANTED_AT}",\n'
        '  "label": "david laptop",\n'
        f'  "lifecycleUid": "{UID}",\n'
        f'  "owner": "{OWNER}",\n'
        f'  "parent": "{OWNER}.cli",\n'
        '  "role": "default",\n'
        '  "scope": [\n    "spawn",\n    "role:default"\n  ],\n'
        f'  "tokenHash": "{TOKEN_HASH}",\n'
        '  "ver": 1\n'
        "}\n"
    ).encode()


def test_render_omits_unset_fields():
    assert set(json.loads(render_row(row()))) == {
        "ver", "owner", "actor", "scope", "allowSubscribe", "allowPublish", "lifecycleUid", "grantedAt",
    }  # fmt: skip


def test_parse_reads_the_file_shape():
    assert parse_row(file_bytes(), kind=LedgerKind.INTERACTIVE, owner=OWNER, actor="cli") == LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=OWNER, actor="cli", scope=("spawn",), allow_subscribe=(">",),
        allow_publish=("team.*",), lifecycle_uid=UID, granted_at=GRANTED_AT,
    )  # fmt: skip


@pytest.mark.parametrize("granted_at", ["2026-11-29T10:00:00Z", "2026-11-29T10:00:00.123456+00:00"])
def test_parse_accepts_utc_times(granted_at):
    parsed = parse_row(file_bytes(grantedAt=granted_at), kind=LedgerKind.INTERACTIVE, owner=OWNER, actor="cli")
    assert parsed.granted_at == granted_at


def test_parse_treats_null_optionals_as_absent():
    data = json.dumps({**json.loads(file_bytes()), "role": None, "label": None}).encode()
    assert parse_row(data, kind=LedgerKind.INTERACTIVE, owner=OWNER, actor="cli").role is None


CORRUPT = [
    # (bytes, kind, expected fragment)
    (b"{", LedgerKind.INTERACTIVE, "it is not UTF-8 JSON"),
    (b"\xff", LedgerKind.INTERACTIVE, "it is not UTF-8 JSON"),
    (b"[]", LedgerKind.INTERACTIVE, "it is not a JSON object"),
    (b"null", LedgerKind.INTERACTIVE, "it is not a JSON object"),
    (file_bytes(ver=2), LedgerKind.INTERACTIVE, "ver 2 is not understood"),
    (file_bytes(ver=True), LedgerKind.INTERACTIVE, "ver True is not understood"),
    (file_bytes(ver="1"), LedgerKind.INTERACTIVE, "is not understood"),
    (json.dumps({k: v for k, v in json.loads(file_bytes()).items() if k != "ver"}).encode(),
     LedgerKind.INTERACTIVE, "ver None is not understood"),
    (file_bytes(kind="managed"), LedgerKind.INTERACTIVE, "unknown keys kind"),
    (file_bytes(extra=1, zzz=2), LedgerKind.INTERACTIVE, "unknown keys extra, zzz"),
    (json.dumps({k: v for k, v in json.loads(file_bytes()).items() if k != "lifecycleUid"}).encode(),
     LedgerKind.INTERACTIVE, "lifecycleUid missing"),
    (json.dumps({k: v for k, v in json.loads(file_bytes()).items() if k != "scope"}).encode(),
     LedgerKind.INTERACTIVE, "scope missing"),
    (file_bytes(owner=OTHER_OWNER), LedgerKind.INTERACTIVE, "it names another principal than its file"),
    (file_bytes(actor="other"), LedgerKind.INTERACTIVE, "it names another principal than its file"),
    (file_bytes(owner="local"), LedgerKind.INTERACTIVE, "owner is not a derived owner"),
    (file_bytes(actor=7), LedgerKind.INTERACTIVE, "actor is not an actor name"),
    (file_bytes(scope="spawn"), LedgerKind.INTERACTIVE, "scope is not a list"),
    (file_bytes(scope=["a b"]), LedgerKind.INTERACTIVE, "scope has a malformed entry"),
    (file_bytes(scope=[1]), LedgerKind.INTERACTIVE, "scope has a malformed entry"),
    (file_bytes(allowPublish=["a..b"]), LedgerKind.INTERACTIVE, "allowPublish has a malformed entry"),
    (file_bytes(allowSubscribe=[">.a"]), LedgerKind.INTERACTIVE, "allowSubscribe has a malformed entry"),
    (file_bytes(role="a:b"), LedgerKind.INTERACTIVE, "role is not a role name"),
    (file_bytes(parent="cli"), LedgerKind.INTERACTIVE, "parent is not <owner>.<actor>"),
    (file_bytes(label="a\nb"), LedgerKind.INTERACTIVE, "label is not printable text"),
    (file_bytes(label=5), LedgerKind.INTERACTIVE, "label is not printable text"),
    (file_bytes(tokenHash=TOKEN_HASH), LedgerKind.INTERACTIVE, "tokenHash must not appear in an interactive row"),
    (file_bytes(), LedgerKind.MANAGED, "tokenHash must be 64 lowercase hex"),
    (file_bytes(tokenHash=TOKEN_HASH.upper()), LedgerKind.MANAGED, "tokenHash must be 64 lowercase hex"),
    (file_bytes(lifecycleUid="short"), LedgerKind.INTERACTIVE, "lifecycleUid is missing or malformed"),
    (file_bytes(grantedAt="2026-11-29"), LedgerKind.INTERACTIVE, "grantedAt is not an ISO-8601 UTC time"),
    (file_bytes(grantedAt="2026-11-29T10:00:00"), LedgerKind.INTERACTIVE, "grantedAt is not"),
    (file_bytes(grantedAt="2026-11-29T10:00:00+01:00"), LedgerKind.INTERACTIVE, "grantedAt is not"),
    (file_bytes(grantedAt="2026-13-29T10:00:00Z"), LedgerKind.INTERACTIVE, "grantedAt is not"),
    (file_bytes(grantedAt=1764410400), LedgerKind.INTERACTIVE, "grantedAt is not"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "kind", "fragment"), CORRUPT)
def test_parse_refuses_corrupt_rows(data, kind, fragment):
    with pytest.raises(CodecError) as info:
        parse_row(data, kind=kind, owner=OWNER, actor="cli")
    message = str(info.value)
    assert message.startswith(f"ledger row {OWNER}.cli is corrupt: ")
    assert fragment in message
    fix = "re-grant it with `cotal actor grant`" if kind is LedgerKind.INTERACTIVE else "respawn the agent"
    assert fix in message


def test_row_validates_on_construction():
    with pytest.raises(CodecError, match="tokenHash must be"):
        row(LedgerKind.MANAGED, token_hash=None)
    with pytest.raises(CodecError, match="scope has a malformed entry"):
        row(scope=["spawn"])  # a list is not a tuple: rows are immutable


owners = st.from_regex(r"u_[a-z2-7]{26}", fullmatch=True)
actors = st.from_regex(r"[A-Za-z0-9_]{1,10}", fullmatch=True)
tokens = st.from_regex(r"[A-Za-z0-9_:-]{1,10}", fullmatch=True)
channels = st.from_regex(r"([a-z0-9_-]{1,5}|\*)(\.([a-z0-9_-]{1,5}|\*)){0,2}(\.>)?|>", fullmatch=True)


@st.composite
def rows(draw) -> LedgerRow:
    kind = draw(st.sampled_from(LedgerKind))
    owner = draw(owners)
    return LedgerRow(
        kind=kind, owner=owner, actor=draw(actors), scope=tuple(draw(st.lists(tokens, max_size=4))),
        allow_subscribe=tuple(draw(st.lists(channels, max_size=3))),
        allow_publish=tuple(draw(st.lists(channels, max_size=3))),
        role=draw(st.none() | st.from_regex(r"[a-z-]{1,8}", fullmatch=True)),
        parent=draw(st.none() | actors.map(lambda a: f"{owner}.{a}")),
        label=draw(st.none() | st.text(min_size=1, max_size=20).filter(str.isprintable)),
        token_hash=draw(st.from_regex(r"[0-9a-f]{64}", fullmatch=True)) if kind is LedgerKind.MANAGED else None,
        lifecycle_uid=draw(st.from_regex(r"[a-z0-9]{26,32}", fullmatch=True)),
        granted_at=draw(st.sampled_from([GRANTED_AT, "2025-01-02T03:04:05Z", "2025-01-02T03:04:05.5+00:00"])),
    )  # fmt: skip


@given(rows())
def test_render_parse_round_trip(value):
    rendered = render_row(value)
    assert parse_row(rendered, kind=value.kind, owner=value.owner, actor=value.actor) == value
    assert render_row(parse_row(rendered, kind=value.kind, owner=value.owner, actor=value.actor)) == rendered
    assert rendered.endswith(b"}\n")


def test_actor_token_and_hash():
    assert new_actor_token(bytes(32)) == "A" * 43
    assert new_actor_token(b"\xff" * 32) == "_" * 42 + "8"
    assert hash_actor_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    token = new_actor_token(bytes(range(32)))
    assert hash_actor_token(token) == hashlib.sha256(token.encode()).hexdigest()


@pytest.mark.parametrize("random_bytes", [bytes(31), bytes(33), "x" * 32])
def test_actor_token_needs_32_bytes(random_bytes):
    with pytest.raises(ConfigError):
        new_actor_token(random_bytes)


# --- connect ---------------------------------------------------------------------------------


def test_connect_authorized_by_either_kind():
    assert authorize_connect(bearer(), row(), None) == row()
    agent = managed(actor="cli")
    assert authorize_connect(bearer(), None, agent) == agent
    assert authorize_connect(bearer(scope=()), row(), None) == row()
    assert authorize_connect(bearer(scope=("spawn", "role:default")), row(), None) == row()


CONNECT_REFUSALS = [
    (bearer(), row(), managed(actor="cli"), "has both an interactive and a managed ledger row"),
    (bearer(), None, None, '"cli" is not granted in this space'),
    (bearer(), row(actor="other"), None, "is not granted"),
    (bearer(), row(lifecycle_uid=UID2), None,
     "the actor was re-granted or revoked since this bearer was issued - exchange a fresh bearer"),
    (bearer(scope=("spawn", "admin")), row(), None, "bearer scope admin is no longer granted"),
]  # fmt: skip


@pytest.mark.parametrize(("token", "interactive", "agent", "fragment"), CONNECT_REFUSALS)
def test_connect_refusals(token, interactive, agent, fragment):
    with pytest.raises(Refused) as info:
        authorize_connect(token, interactive, agent)
    assert info.value.code is RefusalCode.NOT_GRANTED
    assert fragment in info.value.detail


def test_connect_not_granted_names_the_grant_command():
    with pytest.raises(Refused) as info:
        authorize_connect(bearer(), None, None)
    assert f"`cotal actor grant cli --owner {OWNER}`" in info.value.detail


# --- exchanges -------------------------------------------------------------------------------


def test_human_exchange():
    assert authorize_human_exchange(OWNER, "cli", row()) == row()


@pytest.mark.parametrize("interactive", [None, row(actor="other"), row(owner=OTHER_OWNER), managed(actor="cli")])
def test_human_exchange_refusal_sentence(interactive):
    with pytest.raises(Refused) as info:
        authorize_human_exchange(OWNER, "cli", interactive)
    assert info.value.code is RefusalCode.NOT_GRANTED
    assert info.value.detail == (
        'actor "cli" is not granted for this user - the mesh operator lets them in with '
        f"`cotal actor grant cli --owner {OWNER}` (or --sub <their IdP subject>)"
    )


def test_human_exchange_for_a_managed_actor_names_its_own_token():
    """A person asking for their managed agent's actor (POST /exchange, /service-endpoint-host)
    was told to `cotal actor grant` it, which refuses ("already granted as managed - revoke it
    first"); the sentence now names the agent's own credential."""
    with pytest.raises(Refused) as info:
        authorize_human_exchange(OWNER, "alpha", None, managed_row=managed())
    assert info.value.code is RefusalCode.NOT_GRANTED
    assert info.value.detail == (
        f'actor "alpha" is a managed agent of this user, not an interactive actor - it takes its '
        f"bearers with its own actor token (owner, actor and actorToken; `cotal agent-bearer --owner "
        f"{OWNER} --actor alpha --token-file <its token file>`)"
    )


def test_agent_exchange():
    agent = managed(parent=f"{OWNER}.cli")
    assert authorize_agent_exchange(OWNER, "alpha", TOKEN, agent, lookup_of(row())) == agent


AGENT_REFUSALS = [
    # (owner, actor, token, managed row, known rows)
    (OWNER, "alpha", "wrong", managed(), ()),
    (OWNER, "alpha", "", managed(), ()),
    (OWNER, "alpha", None, managed(), ()),
    (OWNER, "alpha", TOKEN, None, ()),
    (OWNER, "alpha", TOKEN, row(actor="alpha"), ()),
    (OWNER, "beta", TOKEN, managed(), ()),
    (OTHER_OWNER, "alpha", TOKEN, managed(), ()),
    (OWNER, "alpha", TOKEN, managed(parent=f"{OWNER}.cli"), ()),  # spawner no longer granted
    (OWNER, "alpha", TOKEN, managed(parent=f"{OWNER}.cli", scope=("spawn", "admin")), (row(),)),
]  # fmt: skip


@pytest.mark.parametrize(("owner", "actor", "token", "agent", "known"), AGENT_REFUSALS)
def test_agent_exchange_refusals_read_the_same(owner, actor, token, agent, known):
    with pytest.raises(Refused) as info:
        authorize_agent_exchange(owner, actor, token, agent, lookup_of(*known))
    assert info.value.code is RefusalCode.NOT_GRANTED
    assert info.value.detail == AGENT_EXCHANGE_REFUSAL
    assert AGENT_EXCHANGE_REFUSAL == (
        "agent exchange refused: unknown agent or wrong secret - "
        "check the actor token file and that the agent is still granted"
    )
