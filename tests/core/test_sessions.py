"""Chat sessions (core/sessions.py): id minting, key, row codec, TTL, and the caller check."""

from __future__ import annotations

import json

import pytest

from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.sessions import (
    SESSION_TTL_S,
    ChatSession,
    check_session_for,
    is_endpoint,
    is_session_id,
    new_chat_session,
    new_session_id,
    parse_session_row,
    render_session_row,
    session_key,
    session_row_ttl_s,
)

OWNER = "u_" + "a" * 26
OTHER = "u_" + "b" * 26
NOW = 1_767_225_600
SID = new_session_id(bytes(range(32)))
ROW = new_chat_session(session_id=SID, endpoint="chat", owner=OWNER, actor="cli", epoch=1, now=NOW)
STORED = (
    '{"ver":1,"sessionId":"%s","endpoint":"chat","owner":"%s","actor":"cli","epoch":1,"openedAt":%d,"exp":%d}'
    % (SID, OWNER, NOW, NOW + 3600)
).encode()


def test_a_session_id_is_43_base64url_characters_without_padding():
    assert SID == "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
    assert new_session_id(b"\xff" * 32) == "_" * 42 + "8"
    assert len(SID) == 43 and is_session_id(SID)


@pytest.mark.parametrize("bad", [b"", b"x" * 31, b"x" * 33, "x" * 32])
def test_a_session_id_needs_exactly_32_random_bytes(bad):
    with pytest.raises(ValueError, match="exactly 32 random bytes"):
        new_session_id(bad)


@pytest.mark.parametrize(("value", "ok"), [("a" * 22, True), ("a" * 128, True), ("a" * 21, False), ("a" * 129, False), ("a+" * 11, False), (None, False)])
def test_session_id_grammar(value, ok):
    assert is_session_id(value) is ok


@pytest.mark.parametrize(("value", "ok"), [("chat", True), ("a-b_C9", True), ("e" * 64, True), ("", False), ("e" * 65, False), ("a.b", False)])
def test_endpoint_grammar(value, ok):
    assert is_endpoint(value) is ok


def test_key_and_a_new_session_lives_an_hour():
    assert session_key(SID) == f"s.{SID}" == ROW.key
    assert (ROW.opened_at, ROW.exp, SESSION_TTL_S) == (NOW, NOW + 3600, 3600)
    with pytest.raises(CodecError, match="sessionId"):
        session_key("short")


def test_the_row_is_compact_json_in_the_documented_order_and_round_trips():
    assert render_session_row(ROW) == STORED
    assert parse_session_row(STORED) == ROW


def _with(**changes) -> bytes:
    return json.dumps(json.loads(STORED) | changes).encode()


def _without(name: str) -> bytes:
    obj = json.loads(STORED)
    del obj[name]
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\xff\xfe", "it is not UTF-8 JSON"),
        (b"{", "it is not UTF-8 JSON"),
        (b'"row"', "keys must be exactly ver, sessionId, endpoint, owner, actor, epoch, openedAt, exp"),
        (_without("epoch"), "keys must be exactly"),
        (_with(label="x"), "keys must be exactly"),
        (_with(ver=0), "ver 0 is not understood"),
        (_with(sessionId="short"), "sessionId is not [A-Za-z0-9_-]{22,128}"),
        (_with(endpoint="a/b"), "endpoint is not [A-Za-z0-9_-]{1,64}"),
        (_with(owner="alice"), "owner is not a derived owner"),
        (_with(actor=""), "actor is not an actor name"),
        (_with(epoch=0), "epoch must be an int >= 1"),
        (_with(epoch="1"), "epoch must be an int >= 1"),
        (_with(openedAt=1.5), "openedAt and exp must be whole unix seconds"),
        (_with(exp=-1), "openedAt and exp must be whole unix seconds"),
        (_with(exp=NOW), "exp must be after openedAt"),
    ],
)
def test_malformed_rows_are_refused(data, problem):
    with pytest.raises(CodecError) as caught:
        parse_session_row(data)
    assert str(caught.value).startswith(f"chat session row: {problem}")


@pytest.mark.parametrize(
    ("now", "ttl"), [(NOW, 3660), (NOW + 0.5, 3660), (NOW + 3600, 60), (NOW + 3659, 1), (NOW + 4000, 1)]
)
def test_the_row_ttl_is_exp_minus_now_plus_60_at_least_1(now, ttl):
    assert session_row_ttl_s(ROW, now=now) == ttl


def test_the_caller_may_use_its_open_session():
    assert check_session_for(ROW, owner=OWNER, actor="cli", now=NOW + 3599) is ROW


@pytest.mark.parametrize(
    ("row", "owner", "actor", "now", "sentence"),
    [
        (None, OWNER, "cli", NOW, "the chat session is not open (retired or expired) - open a new one with /chat-session/open"),
        (ROW, OTHER, "cli", NOW, f"chat session {SID} was not opened by cli of owner {OTHER} - open your own with /chat-session/open"),
        (ROW, OWNER, "web", NOW, f"chat session {SID} was not opened by web of owner {OWNER} - open your own with /chat-session/open"),
        (ROW, OWNER, "cli", NOW + 3600, f"chat session {SID} expired at {NOW + 3600} - open a new one with /chat-session/open"),
    ],
    ids=["absent", "other-owner", "other-actor", "expired"],
)
def test_refusals_name_chat_session_open(row, owner, actor, now, sentence):
    with pytest.raises(Refused) as caught:
        check_session_for(row, owner=owner, actor=actor, now=now)
    assert (caught.value.code, caught.value.detail) == (RefusalCode.NOT_GRANTED, sentence)


def test_a_session_row_is_a_value():
    assert ChatSession(**{n: getattr(ROW, n) for n in ChatSession.__slots__}) == ROW
