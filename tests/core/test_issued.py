"""Issued authority's pure model (core/issued.py): generations and horizons, keys, the ceiling,
canonical JSON and the rows."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.issued import (
    INSTRUMENT_HORIZON_S,
    ROW_GRACE_S,
    STATIC_AGENT_HORIZON_S,
    Accepted,
    Attempt,
    Ceiling,
    Evidence,
    IssuedRef,
    Rule,
    Source,
    SourceRow,
    accepted_bucket,
    accepted_key,
    attempt_key,
    bysource_key,
    _emit,
    canonical_json,
    digest_of,
    ceiling_from_native,
    check_live,
    connection_accepted_token,
    evidence_digest,
    evidence_key,
    horizon_of,
    instrument_horizon,
    issued_bucket,
    manager_caller_horizon,
    new_generation,
    parse_accepted,
    parse_attempt,
    parse_evidence,
    parse_source_row,
    ref_from_key,
    render_accepted,
    render_attempt,
    render_evidence,
    render_source_row,
    row_ttl_s,
    source_hash,
    static_agent_horizon,
)
from cotal_trio.core.profiles import agent_permissions

NOW = 1_800_000_000
HORIZON = NOW + 3
RANDOM = bytes(range(1, 13))
GENERATION = new_generation(HORIZON, RANDOM)
OWNER = "u_" + "a" * 26
UID = "b" * 26
REF = IssuedRef(space="alpha", owner=OWNER, actor="cli", uid=UID, generation=GENERATION)
SOURCE = Source(space="alpha", bucket="cotal_auth_alpha", key=f"cred.{OWNER}.cli")
CEILING = ceiling_from_native({"pub": {"allow": ["cotal.alpha.ch.team.>"]}, "sub": {"allow": ["_INBOX_x.>"], "deny": ["a.b"]}})
EVIDENCE = Evidence(ref=REF, sources=(SOURCE,), permissions=CEILING)


# -- generations and horizons -------------------------------------------------------------------


def test_a_generation_is_the_horizon_in_8_hex_then_24_random_hex():
    assert GENERATION == "6b49d203" + "0102030405060708090a0b0c"
    assert int("6b49d203", 16) == HORIZON
    assert horizon_of(GENERATION) == HORIZON and REF.horizon == HORIZON


@given(st.integers(min_value=1, max_value=2**32 - 1), st.binary(min_size=12, max_size=12))
def test_the_horizon_round_trips_big_endian(horizon, random12):
    generation = new_generation(horizon, random12)
    assert len(generation) == 32 and generation == generation.lower()
    assert horizon_of(generation) == horizon
    assert bytes.fromhex(generation[:8]) == horizon.to_bytes(4, "big")


@pytest.mark.parametrize(("horizon", "random12"), [(0, RANDOM), (2**32, RANDOM), (-1, RANDOM), (NOW, b"short"), (True, RANDOM)])
def test_new_generation_refuses_out_of_range(horizon, random12):
    with pytest.raises(ValueError):
        new_generation(horizon, random12)


@pytest.mark.parametrize("bad", ["", "A" * 32, "0" * 31, "0" * 33, "g" * 32, 5])
def test_horizon_of_refuses_a_malformed_generation(bad):
    with pytest.raises(CodecError, match="32 lowercase hex"):
        horizon_of(bad)


def test_check_live_refuses_at_and_after_the_horizon_and_passes_before():
    assert check_live(GENERATION, now=HORIZON - 0.001) == HORIZON
    for now in (HORIZON, HORIZON + 1, HORIZON + 10**6):
        with pytest.raises(Refused) as refused:
            check_live(GENERATION, now=now)
        assert refused.value.code is RefusalCode.NOT_GRANTED
        assert refused.value.detail == (
            f"issued generation {GENERATION} reached its horizon (unix {HORIZON}) and authorizes nothing"
            " - connect with a freshly issued credential (respawn a static agent)"
        )
    with pytest.raises(Refused, match="malformed"):
        check_live("nope", now=NOW)


def test_row_ttl_is_horizon_plus_60_minus_now_at_least_one_second():
    assert ROW_GRACE_S == 60
    assert row_ttl_s(GENERATION, now=NOW) == 63
    assert row_ttl_s(GENERATION, now=NOW + 0.5) == 63  # rounded up: never removed early
    assert row_ttl_s(GENERATION, now=HORIZON + 59.5) == 1
    assert row_ttl_s(GENERATION, now=HORIZON + 600) == 1
    assert row_ttl_s(GENERATION, now=NOW, grace_s=1) == 4


def test_the_horizons_the_spec_lists():
    assert manager_caller_horizon(NOW + 900) == NOW + 900  # the bearer's expiry
    assert INSTRUMENT_HORIZON_S == 300 and instrument_horizon(NOW + 0.7) == NOW + 300
    assert STATIC_AGENT_HORIZON_S == 2_592_000 and static_agent_horizon(NOW) == NOW + 2_592_000


# -- keys ---------------------------------------------------------------------------------------


def test_the_keys_of_upstream_notes_9_1():
    tail = f"{OWNER}.cli.{UID}.{GENERATION}"
    assert (issued_bucket("alpha"), accepted_bucket("alpha")) == ("cotal_issued_alpha", "cotal_accepted_alpha")
    assert evidence_key(REF) == f"v1.{tail}"
    assert attempt_key(REF) == f"attempt.v1.{tail}"
    expected_hash = hashlib.sha256(b'[1,"alpha","cotal_auth_alpha","cred.%s.cli"]' % OWNER.encode()).hexdigest()
    assert source_hash(SOURCE) == expected_hash
    assert bysource_key(SOURCE, REF) == f"bysource.v1.{expected_hash}.{tail}"
    assert accepted_key("0" * 32) == "accepted.v1." + "0" * 32
    for key in (evidence_key(REF), attempt_key(REF), bysource_key(SOURCE, REF)):
        assert ref_from_key("alpha", key) == REF


@pytest.mark.parametrize("key", ["v1.a.b", "other.v1.x", f"attempt.v1.{OWNER}.cli.{UID}", "bysource.v1.h.x"])
def test_ref_from_key_refuses_other_keys(key):
    with pytest.raises(CodecError):
        ref_from_key("alpha", key)


@pytest.mark.parametrize("token", ["0" * 31, "A" * 32, "0" * 33, "x.y"])
def test_an_accepted_token_is_32_lowercase_hex(token):
    with pytest.raises(CodecError, match="token"):
        accepted_key(token)


def test_the_older_connection_token():
    assert connection_accepted_token("c1") == hashlib.sha256(b"cotal.accepted.v1\0c1").hexdigest()[:32]


@pytest.mark.parametrize(
    "field", [{"space": "a.b"}, {"owner": "x.y"}, {"actor": ""}, {"uid": "SHORT"}, {"generation": "0" * 31}]
)
def test_a_ref_validates_every_field(field):
    with pytest.raises(CodecError, match="issued reference"):
        IssuedRef(**{**REF.to_json(), **field})


# -- the ceiling --------------------------------------------------------------------------------


def test_import_reads_empty_or_omitted_allow_as_all():
    ceiling = ceiling_from_native({"pub": {"deny": [">"]}, "sub": {}})
    assert ceiling.publish == Rule(mode="all", deny=(">",))
    assert ceiling.subscribe == Rule(mode="all")
    assert ceiling_from_native({}) == Ceiling(publish=Rule(mode="all"), subscribe=Rule(mode="all"))
    assert ceiling_from_native({"pub": {"allow": []}, "sub": {"allow": None}}).publish.mode == "all"


def test_the_ceiling_is_a_set_in_canonical_order():
    one = ceiling_from_native({"pub": {"allow": ["b.>", "a.*", "b.>"]}, "sub": {"allow": ["x"], "deny": ["z", "y"]}})
    two = ceiling_from_native({"pub": {"allow": ["a.*", "b.>"]}, "sub": {"allow": ["x"], "deny": ["y", "z"]}})
    assert one == two and one.canonical() == two.canonical()
    assert one.canonical() == (
        b'{"publish":{"allow":{"mode":"patterns","patterns":["a.*","b.>"]},"deny":[]},'
        b'"subscribe":{"allow":{"mode":"patterns","patterns":["x"]},"deny":["y","z"]}}'
    )
    assert Rule(mode="none").to_json() == {"allow": {"mode": "none"}, "deny": []}


def test_a_profile_imports_and_a_changed_scope_changes_the_bytes():
    narrow = agent_permissions(space="alpha", owner=OWNER, actor="cli", inbox_nonce="ibx12345678", allow_publish=("team.>",), allow_subscribe=("team.>",))
    wide = agent_permissions(space="alpha", owner=OWNER, actor="cli", inbox_nonce="ibx12345678", allow_publish=("team.>", "ops"), allow_subscribe=("team.>",))
    assert ceiling_from_native(narrow.to_nats()).canonical() == ceiling_from_native(narrow.to_nats()).canonical()
    assert ceiling_from_native(narrow.to_nats()).canonical() != ceiling_from_native(wide.to_nats()).canonical()


@pytest.mark.parametrize(
    "fragment", [{"pub": {"allow": ["a..b"]}}, {"pub": {"allow": ["a.>.b"]}}, {"sub": {"deny": ["a b"]}}, {"pub": "x"}, {"pub": {"allow": "a"}}]
)
def test_import_refuses_what_is_not_a_nats_subject_list(fragment):
    with pytest.raises(CodecError):
        ceiling_from_native(fragment)


def test_a_rule_needs_patterns_exactly_for_mode_patterns():
    with pytest.raises(CodecError):
        Rule(mode="patterns")
    with pytest.raises(CodecError):
        Rule(mode="all", patterns=("a",))
    with pytest.raises(CodecError):
        Rule(mode="some")  # type: ignore[arg-type]


# -- canonical JSON -----------------------------------------------------------------------------


def test_canonical_json_rfc_8785_for_our_types():
    assert canonical_json({"b": [1, True, None], "a": "x\u00e9\n\x01\"\\/"}) == '{"a":"xé\\n\\u0001\\"\\\\/","b":[1,true,null]}'.encode()
    # Member names sort by UTF-16 code units: U+FB01 (one unit) after U+1F600 (a surrogate pair).
    assert canonical_json({"\ufb01": 1, "\U0001f600": 2}) == '{"\U0001f600":2,"\ufb01":1}'.encode()
    assert canonical_json(-(2**53 - 1)) == b"-9007199254740991"


@pytest.mark.parametrize("bad", [1.5, 2**53, {1: "a"}, {"a": object()}, "\ud800"])
def test_canonical_json_refuses_other_values(bad):
    with pytest.raises(CodecError):
        canonical_json(bad)


@given(st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53 - 1), 2**53 - 1) | st.text(st.characters(exclude_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
))
def test_canonical_json_is_json_and_a_fixed_point(value):
    data = canonical_json(value)
    assert json.loads(data) == value
    assert canonical_json(json.loads(data)) == data


@given(st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53 - 1), 2**53 - 1) | st.text(st.characters(exclude_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
))
def test_canonical_json_renders_as_the_exact_rfc_8785_walk(value):
    """Issue 14 item 4: the C-encoder rendering is byte for byte the member-by-member walk."""
    parts: list[str] = []
    _emit(value, parts)
    assert canonical_json(value) == "".join(parts).encode()


def test_evidence_is_rendered_once_for_its_write_and_its_digest():
    rendered = render_evidence(EVIDENCE)
    assert rendered == canonical_json(EVIDENCE.to_json())  # the rows' own renderer is canonical_json
    assert digest_of(rendered) == evidence_digest(EVIDENCE) == "sha256:" + hashlib.sha256(rendered).hexdigest()


# -- rows ---------------------------------------------------------------------------------------


def test_evidence_is_stored_as_canonical_json():
    stored = render_evidence(EVIDENCE)
    assert stored == (
        b'{"permissions":{"publish":{"allow":{"mode":"patterns","patterns":["cotal.alpha.ch.team.>"]},"deny":[]},'
        b'"subscribe":{"allow":{"mode":"patterns","patterns":["_INBOX_x.>"]},"deny":["a.b"]}},'
        b'"ref":{"actor":"cli","generation":"%s","owner":"%s","space":"alpha","uid":"%s"},'
        b'"sources":[{"bucket":"cotal_auth_alpha","key":"cred.%s.cli","space":"alpha"}],"version":1}'
        % (GENERATION.encode(), OWNER.encode(), UID.encode(), OWNER.encode())
    )
    assert parse_evidence(stored) == EVIDENCE
    assert evidence_digest(EVIDENCE) == "sha256:" + hashlib.sha256(stored).hexdigest()


def test_expires_at_is_required_without_sources_and_stored_when_given():
    with pytest.raises(CodecError, match="expiresAt is required"):
        Evidence(ref=REF, sources=(), permissions=CEILING)
    bare = Evidence(ref=REF, sources=(), permissions=CEILING, expires_at=HORIZON)
    assert b'"expiresAt":%d' % HORIZON in render_evidence(bare)
    assert parse_evidence(render_evidence(bare)) == bare


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        render_evidence(EVIDENCE).replace(b'"version":1', b'"version":2'),
        render_evidence(EVIDENCE).replace(b"}", b', "x":1}', 1),
        json.dumps(EVIDENCE.to_json()).encode(),  # same content, not canonical
        render_evidence(EVIDENCE).replace(b'"deny":[]', b'"deny":["z","a"]', 1),  # canonical JSON, unsorted set
    ],
)
def test_evidence_that_is_not_exactly_version_1_canonical_is_refused(data):
    with pytest.raises(CodecError, match="evidence"):
        parse_evidence(data)


def test_attempt_source_and_accepted_rows():
    digest = evidence_digest(EVIDENCE)
    attempt = Attempt(state="prepared", digest=digest)
    assert render_attempt(attempt) == b'{"digest":"%s","state":"prepared","version":1}' % digest.encode()
    assert parse_attempt(render_attempt(attempt)) == attempt
    row = SourceRow(source=SOURCE, ref=REF)
    assert parse_source_row(render_source_row(row)) == row
    assert render_source_row(row).startswith(b'{"ref":{"actor":"cli",')
    accepted = Accepted(ref=REF)
    assert render_accepted(accepted).endswith(b',"version":1}')
    assert parse_accepted(render_accepted(accepted)) == accepted


@pytest.mark.parametrize("attempt", [{"state": "done", "digest": "sha256:" + "0" * 64}, {"state": "active", "digest": "md5:00"}])
def test_an_attempt_has_a_known_state_and_a_sha256_digest(attempt):
    with pytest.raises(CodecError, match="attempt row"):
        Attempt(**attempt)
