"""Identity grammars, owner derivation and lifecycle UIDs (reference/upstream-notes.md 1.1-1.2)."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core.errors import ConfigError, RefusalCode, Refused
from cotal_trio.core.identity import (
    check_actor,
    check_channel_pattern,
    check_inbox_nonce,
    check_lifecycle_uid,
    check_owner,
    check_principal,
    check_role,
    check_scope_token,
    check_space,
    derive_owner,
    mint_lifecycle_uid,
    principal,
    split_principal,
)
from tests.support.identity import LONE_SURROGATE_VECTORS, _base32_lower_nopad

OWNER = "u_rbxbyevw4etgpbzfupdhu2zxwe"

GRAMMAR_CASES = [
    # (check, value, accepted)
    (check_actor, "cli", True),
    (check_actor, "Agent_07", True),
    (check_actor, "_", True),
    (check_actor, "a" * 64, True),
    (check_actor, "a" * 65, False),  # a ledger file name must fit (a 300-char actor was ENAMETOOLONG)
    (check_actor, "", False),
    (check_actor, "a.b", False),
    (check_actor, "a-b", False),
    (check_actor, "a*", False),
    (check_actor, "a>", False),
    (check_actor, "é", False),
    (check_actor, "cli\n", False),
    (check_actor, " cli", False),
    (check_actor, 7, False),
    (check_actor, None, False),
    (check_owner, OWNER, True),
    (check_owner, "u_" + "a" * 26, True),
    (check_owner, "u_" + "a" * 25, False),
    (check_owner, "u_" + "a" * 27, False),
    (check_owner, "u_" + "A" * 26, False),
    (check_owner, "u_" + "1" * 26, False),
    (check_owner, "u_" + "8" * 26, False),
    (check_owner, "local", False),
    (check_owner, "x_" + "a" * 26, False),
    (check_owner, OWNER + "\n", False),
    (check_lifecycle_uid, "0" * 26, True),
    (check_lifecycle_uid, "a1" * 16, True),
    (check_lifecycle_uid, "a" * 25, False),
    (check_lifecycle_uid, "a" * 33, False),
    (check_lifecycle_uid, "A" * 26, False),
    (check_lifecycle_uid, "a" * 25 + "-", False),
    (check_inbox_nonce, "ibx0123456789abcdef", True),
    (check_inbox_nonce, "abc-_DEF", True),
    (check_inbox_nonce, "a" * 120, True),
    (check_inbox_nonce, "a" * 7, False),
    (check_inbox_nonce, "a" * 121, False),
    (check_inbox_nonce, "abcdefg.h", False),
    (check_inbox_nonce, "abcdefg>h", False),
    (check_scope_token, "spawn", True),
    (check_scope_token, "role:default", True),
    (check_scope_token, "a-b_c:D9", True),
    (check_scope_token, "", False),
    (check_scope_token, "a b", False),
    (check_scope_token, "a.b", False),
    (check_role, "default", True),
    (check_role, "front-end_2", True),
    (check_role, "a:b", False),
    (check_role, "", False),
    (check_channel_pattern, "general", True),
    (check_channel_pattern, "team.alerts", True),
    (check_channel_pattern, "team.*", True),
    (check_channel_pattern, "*", True),
    (check_channel_pattern, ">", True),
    (check_channel_pattern, "team.>", True),
    (check_channel_pattern, "a-b.c_d.*.>", True),
    (check_channel_pattern, "", False),
    (check_channel_pattern, "team.", False),
    (check_channel_pattern, ".team", False),
    (check_channel_pattern, "a..b", False),
    (check_channel_pattern, ">.a", False),
    (check_channel_pattern, "a.>.b", False),
    (check_channel_pattern, "a*", False),
    (check_channel_pattern, "a b", False),
    (check_channel_pattern, "a.**", False),
    (check_space, "demo", True),
    (check_space, "a", True),
    (check_space, "A-b_9", True),
    (check_space, "s" * 64, True),
    (check_space, "s" * 65, False),
    (check_space, "", False),
    (check_space, "a.b", False),
    (check_space, "a b", False),
    (check_principal, f"{OWNER}.cli", True),
    (check_principal, f"{OWNER}.cli.x", False),
    (check_principal, "local.cli", False),
    (check_principal, OWNER, False),
]


@pytest.mark.parametrize(("check", "value", "accepted"), GRAMMAR_CASES)
def test_grammar(check, value, accepted):
    if accepted:
        assert check(value) == value
    else:
        with pytest.raises(Refused) as info:
            check(value)
        assert info.value.code is RefusalCode.BAD_REQUEST
        assert info.value.detail  # a sentence naming the rule


def test_refusal_sentences_name_the_rule():
    with pytest.raises(Refused, match="letters, digits and _"):
        check_actor("a.b")
    with pytest.raises(Refused, match="1 to 64 letters, digits and _"):
        check_actor("x" * 300)
    with pytest.raises(Refused, match="u_ followed by 26"):
        check_owner("local")
    with pytest.raises(Refused, match="1 to 64"):
        check_space("a.b")


def test_derive_owner_known_answer():
    secret = bytes([0x01] * 32)
    # Step 1: the JSON array of [issuer, sub], as JavaScript JSON.stringify writes it.
    message = b'cotal-owner-v1:["https://idp.example","alice"]'
    # Step 2: HMAC-SHA256 keyed with the raw secret bytes.
    mac = hmac.new(secret, message, hashlib.sha256).digest()
    assert mac.hex() == "886e1c12b6e126678725a3c67a6b37b130da539e6b99d8342748b568a3bff93d"
    # Step 3: "u_" + lowercase unpadded base32 of the first 16 bytes.
    expected = "u_" + _base32_lower_nopad(mac[:16])
    assert expected == "u_rbxbyevw4etgpbzfupdhu2zxwe"
    assert derive_owner(secret, "https://idp.example", "alice") == expected


def test_derive_owner_json_escapes_like_javascript():
    secret = bytes(range(32))
    # JSON.stringify keeps "/" and non-ASCII as-is and escapes quote and backslash.
    sub = 'é/"q"\\'
    message = 'cotal-owner-v1:["https://idp.example","é/\\"q\\"\\\\"]'.encode()
    mac = hmac.new(secret, message, hashlib.sha256).digest()
    assert derive_owner(secret, "https://idp.example", sub) == "u_" + _base32_lower_nopad(mac[:16])


def test_derive_owner_separates_issuer_and_subject():
    secret = bytes(32)
    assert derive_owner(secret, "https://a", "b:c") != derive_owner(secret, "https://a:b", "c")
    assert derive_owner(secret, "https://a", "b") != derive_owner(bytes(31) + b"\x01", "https://a", "b")


@pytest.mark.parametrize(
    ("secret", "issuer", "sub"),
    [
        (bytes(31), "https://idp.example", "alice"),
        ("x" * 32, "https://idp.example", "alice"),
        (bytes(32), "", "alice"),
        (bytes(32), "https://idp.example", ""),
    ],
)
def test_derive_owner_refuses_bad_input(secret, issuer, sub):
    with pytest.raises(ConfigError):
        derive_owner(secret, issuer, sub)


@given(st.binary(min_size=32, max_size=64), st.text(min_size=1), st.text(min_size=1))
def test_derive_owner_is_a_derived_owner(secret, issuer, sub):
    owner = derive_owner(secret, issuer, sub)
    assert check_owner(owner) == owner
    assert derive_owner(secret, issuer, sub) == owner


def test_mint_lifecycle_uid_known_answers():
    assert mint_lifecycle_uid(bytes(20)) == "0" * 26
    assert mint_lifecycle_uid(bytes(19) + b"\x01") == "0" * 25 + "1"
    assert mint_lifecycle_uid(bytes(19) + b"\x24") == "0" * 24 + "10"  # 36 -> "10"
    assert mint_lifecycle_uid(b"\xff" * 20) == "twj4yidkw7a8pn4g709kzmfoaol3x8f"


@given(st.binary(min_size=20, max_size=20))
def test_mint_lifecycle_uid_is_base36_of_the_bytes(random20):
    uid = mint_lifecycle_uid(random20)
    assert check_lifecycle_uid(uid) == uid
    assert 26 <= len(uid) <= 31
    assert int(uid, 36) == int.from_bytes(random20, "big")


@pytest.mark.parametrize("random_bytes", [bytes(19), bytes(21), b"", "x" * 20])
def test_mint_lifecycle_uid_needs_20_bytes(random_bytes):
    with pytest.raises(ConfigError):
        mint_lifecycle_uid(random_bytes)


def test_principal_round_trip():
    assert principal(OWNER, "cli") == f"{OWNER}.cli"
    assert split_principal(f"{OWNER}.cli") == (OWNER, "cli")
    with pytest.raises(Refused):
        split_principal("cli")


@pytest.mark.parametrize(("sub", "external", "mac16"), LONE_SURROGATE_VECTORS)
def test_derive_owner_escapes_lone_surrogates_as_javascript_does(sub, external, mac16):
    secret = bytes(range(32, 64))
    message = f"cotal-owner-v1:{external}".encode()
    assert hmac.new(secret, message, hashlib.sha256).digest()[:16].hex() == mac16
    assert derive_owner(secret, "https://idp.example", sub) == "u_" + _base32_lower_nopad(bytes.fromhex(mac16))


def test_a_surrogate_pair_derives_as_the_character_it_forms():
    secret = bytes(range(32, 64))
    assert derive_owner(secret, "https://idp.example", "\ud83d\ude00") == derive_owner(
        secret, "https://idp.example", "\U0001f600"
    )


@given(
    st.binary(min_size=32, max_size=64),
    st.text(st.characters(categories=("L", "N", "P", "Cs", "Cc")), min_size=1),
    st.text(st.characters(categories=("L", "N", "P", "Cs", "Cc")), min_size=1),
)
def test_any_str_derives_an_owner(secret, issuer, sub):
    # st.text() leaves surrogates out by default; here they are in (issue 15 item 6)
    assert check_owner(derive_owner(secret, issuer, sub))
