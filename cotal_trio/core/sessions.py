"""Chat sessions: the row a ``session-caller`` view is bound to (spec "Listener policy"; upstream-notes 3.2 act.session).

``/chat-session/open`` writes one row per session in the space's sessions store
``cotal_sessions_<space>`` under ``s.<sessionId>``; ``/chat-session/bearer`` and the callout read
it back (:func:`check_session_for`); ``/chat-session/retire`` deletes it. Row (version 1, closed)::

    {"ver": 1, "sessionId": "<43 base64url chars>", "endpoint": "<[A-Za-z0-9_-]{1,64}>",
     "owner": "u_…", "actor": "cli", "epoch": 1, "openedAt": 1767225600, "exp": 1767229200}

A session lives ``SESSION_TTL_S`` from ``openedAt`` (``exp``, unix seconds). The row is written
with a per-message TTL of ``exp - now + SESSION_GRACE_S`` (:func:`session_row_ttl_s`), so the store
drops it a minute after it stops being usable; a row read before that but past ``exp`` is expired
all the same (:func:`check_session_for` judges on ``exp``, never on the row's presence alone).

Pure and synchronous: :mod:`cotal_trio.stores.records` does the I/O; randomness and ``now`` come
in as values.
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass

from .errors import CodecError, RefusalCode, Refused
from .identity import is_actor, is_owner
from .rowcodec import decode_row, encode_row

__all__ = [
    "ROW_VERSION",
    "SESSION_GRACE_S",
    "SESSION_ID_RANDOM_BYTES",
    "SESSION_KEY_PREFIX",
    "SESSION_TTL_S",
    "ChatSession",
    "check_session_for",
    "is_endpoint",
    "is_session_id",
    "new_chat_session",
    "new_session_id",
    "parse_session_row",
    "render_session_row",
    "session_key",
    "session_row_ttl_s",
]

ROW_VERSION = 1
SESSION_KEY_PREFIX = "s."
# A session is usable this long after it is opened (seconds).
SESSION_TTL_S = 3600
# The stored row outlives its exp by this much (seconds), then the store drops it.
SESSION_GRACE_S = 60
SESSION_ID_RANDOM_BYTES = 32
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{22,128}")
_ENDPOINT = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KEYS = ("ver", "sessionId", "endpoint", "owner", "actor", "epoch", "openedAt", "exp")
_OPEN_AGAIN = "open a new one with /chat-session/open"


def is_session_id(value: object) -> bool:
    """True when ``value`` is a session id: 22 to 128 of ``[A-Za-z0-9_-]``."""
    return isinstance(value, str) and _SESSION_ID.fullmatch(value) is not None


def is_endpoint(value: object) -> bool:
    """True when ``value`` is a chat endpoint name: 1 to 64 of ``[A-Za-z0-9_-]``."""
    return isinstance(value, str) and _ENDPOINT.fullmatch(value) is not None


def _is_seconds(value: object) -> bool:
    return type(value) is int and value >= 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatSession:
    """One chat session (the key, ``s.<sessionId>``, is derived).

    Attributes:
        session_id: ``[A-Za-z0-9_-]{22,128}`` (:func:`new_session_id` mints 43 characters).
        endpoint: the chat endpoint, ``[A-Za-z0-9_-]{1,64}``.
        owner, actor: the principal the session belongs to.
        epoch: the endpoint's serving epoch the session was opened against, an int >= 1.
        opened_at, exp: unix seconds, ``exp > opened_at``.

    Raises:
        CodecError: a field breaks its grammar; the message names it.
    """

    session_id: str
    endpoint: str
    owner: str
    actor: str
    epoch: int
    opened_at: int
    exp: int

    def __post_init__(self) -> None:
        _require(is_session_id(self.session_id), "sessionId is not [A-Za-z0-9_-]{22,128}")
        _require(is_endpoint(self.endpoint), "endpoint is not [A-Za-z0-9_-]{1,64}")
        _require(is_owner(self.owner), "owner is not a derived owner")
        _require(is_actor(self.actor), "actor is not an actor name")
        _require(type(self.epoch) is int and self.epoch >= 1, "epoch must be an int >= 1")
        _require(_is_seconds(self.opened_at) and _is_seconds(self.exp), "openedAt and exp must be whole unix seconds")
        _require(self.exp > self.opened_at, "exp must be after openedAt")

    @property
    def key(self) -> str:
        """``s.<sessionId>``."""
        return session_key(self.session_id)


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise CodecError(f"chat session row: {problem}")


def session_key(session_id: str) -> str:
    """``s.<sessionId>`` (CodecError for a malformed id)."""
    _require(is_session_id(session_id), "sessionId is not [A-Za-z0-9_-]{22,128}")
    return SESSION_KEY_PREFIX + session_id


def new_session_id(random32: bytes) -> str:
    """A session id from 32 random bytes: base64url without padding (43 characters).

    Raises:
        ValueError: ``random32`` is not exactly 32 bytes (a caller bug).
    """
    if not isinstance(random32, bytes) or len(random32) != SESSION_ID_RANDOM_BYTES:
        raise ValueError(f"new_session_id needs exactly {SESSION_ID_RANDOM_BYTES} random bytes")
    return base64.urlsafe_b64encode(random32).rstrip(b"=").decode()


def new_chat_session(*, session_id: str, endpoint: str, owner: str, actor: str, epoch: int, now: int) -> ChatSession:
    """The session opened at ``now`` (unix seconds): ``exp = now + SESSION_TTL_S``.

    Raises:
        CodecError: a field breaks its grammar.
    """
    return ChatSession(
        session_id=session_id, endpoint=endpoint, owner=owner, actor=actor, epoch=epoch,
        opened_at=now, exp=now + SESSION_TTL_S,
    )


def render_session_row(row: ChatSession) -> bytes:
    """The row's stored bytes: compact JSON, keys in the documented order."""
    obj = {
        "ver": ROW_VERSION, "sessionId": row.session_id, "endpoint": row.endpoint, "owner": row.owner,
        "actor": row.actor, "epoch": row.epoch, "openedAt": row.opened_at, "exp": row.exp,
    }
    return encode_row(obj)


def parse_session_row(data: bytes) -> ChatSession:
    """Decode stored bytes.

    Raises:
        CodecError: not UTF-8 JSON, not an object with exactly the version-1 keys, or a field
            breaking its grammar.
    """
    obj = decode_row(data, what="chat session row", keys=_KEYS, version=ROW_VERSION)
    return ChatSession(
        session_id=obj["sessionId"], endpoint=obj["endpoint"], owner=obj["owner"], actor=obj["actor"],
        epoch=obj["epoch"], opened_at=obj["openedAt"], exp=obj["exp"],
    )


def session_row_ttl_s(row: ChatSession, *, now: float) -> int:
    """The row's per-message TTL written at ``now``: ``exp - now + SESSION_GRACE_S`` whole
    seconds, rounded up, at least 1."""
    return max(1, math.ceil(row.exp - now + SESSION_GRACE_S))


def check_session_for(row: ChatSession | None, *, owner: str, actor: str, now: float) -> ChatSession:
    """``row`` when it is usable by ``owner``/``actor`` at ``now`` (unix seconds).

    Raises:
        Refused: NOT_GRANTED when there is no row (retired, or dropped by the store), the row
            belongs to another principal, or ``now >= exp``; each sentence names
            ``/chat-session/open``.
    """
    if row is None:
        raise Refused(RefusalCode.NOT_GRANTED, f"the chat session is not open (retired or expired) - {_OPEN_AGAIN}")
    if (row.owner, row.actor) != (owner, actor):
        raise Refused(
            RefusalCode.NOT_GRANTED,
            f"chat session {row.session_id} was not opened by {actor} of owner {owner} - open your own with /chat-session/open",
        )
    if now >= row.exp:
        raise Refused(RefusalCode.NOT_GRANTED, f"chat session {row.session_id} expired at {row.exp} - {_OPEN_AGAIN}")
    return row
