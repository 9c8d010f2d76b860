"""Identity grammars, owner derivation and lifecycle UIDs.

Pure and synchronous. Everything here is a value check or a value computation; nothing reads a
clock, a file or a random source (randomness comes in as bytes).

Grammars (reference/upstream-notes.md 1.1, the wire SPEC sections 2-3):

=====================  ======================================  ==========================
name                   pattern                                 used for
=====================  ======================================  ==========================
actor (any owner)      ``[A-Za-z0-9_]{1,64}``                  actor names, dev owners
derived owner          ``u_[a-z2-7]{26}``                      owners of a user-auth space
lifecycle UID          ``[a-z0-9]{26,32}``                     one incarnation of an actor
inbox nonce            ``[A-Za-z0-9_-]{8,120}``                reply inbox ``_INBOX_<nonce>``
scope token            ``[A-Za-z0-9_:-]+``                     ``spawn``, ``role:default``...
role                   ``[A-Za-z0-9_-]+``                      ``role`` of a ledger row
channel pattern        dot segments ``[A-Za-z0-9_-]+``, ``*``  ledger channel ACL entries
                       or a final ``>``
space                  ``[A-Za-z0-9_-]{1,64}``                 account and KV bucket names
=====================  ======================================  ==========================

Each ``check_*`` returns its argument unchanged or raises
``Refused(RefusalCode.BAD_REQUEST, <sentence naming the rule>)``; each ``is_*`` is the matching
predicate, for callers that refuse with their own code and sentence.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re

from cotal_trio.core.errors import ConfigError, RefusalCode, Refused

__all__ = [
    "DERIVATION_CONTEXT",
    "LIFECYCLE_UID_RANDOM_BYTES",
    "MIN_OWNER_SECRET_BYTES",
    "check_actor",
    "check_channel_pattern",
    "check_inbox_nonce",
    "check_lifecycle_uid",
    "check_owner",
    "check_principal",
    "check_role",
    "check_scope_token",
    "check_space",
    "derive_owner",
    "is_actor",
    "is_channel_pattern",
    "is_inbox_nonce",
    "is_lifecycle_uid",
    "is_owner",
    "is_principal",
    "is_role",
    "is_scope_token",
    "is_space",
    "mint_lifecycle_uid",
    "principal",
    "split_principal",
]

# Owner derivation constants (upstream-notes 1.2). Changing either re-keys every owner.
DERIVATION_CONTEXT = "cotal-owner-v1"
MIN_OWNER_SECRET_BYTES = 32
# A lifecycle UID is minted from this many CSPRNG bytes (upstream-notes 1.1).
LIFECYCLE_UID_RANDOM_BYTES = 20
_LIFECYCLE_UID_MIN_CHARS = 26

_ACTOR = re.compile(r"[A-Za-z0-9_]{1,64}")  # bounded: it names ledger files and subjects
_OWNER = re.compile(r"u_[a-z2-7]{26}")
_LIFECYCLE_UID = re.compile(r"[a-z0-9]{26,32}")
_INBOX_NONCE = re.compile(r"[A-Za-z0-9_-]{8,120}")
_SCOPE_TOKEN = re.compile(r"[A-Za-z0-9_:-]+")
_ROLE = re.compile(r"[A-Za-z0-9_-]+")
_CHANNEL_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
_SPACE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # a UTF-16 surrogate (JSON can carry one escaped)


def _full(pattern: re.Pattern[str], value: object) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def is_actor(value: object) -> bool:
    """True when ``value`` is an actor (or any owner) token: ``[A-Za-z0-9_]{1,64}``."""
    return _full(_ACTOR, value)


def is_owner(value: object) -> bool:
    """True when ``value`` is a derived owner: ``u_`` + 26 lowercase base32 characters."""
    return _full(_OWNER, value)


def is_lifecycle_uid(value: object) -> bool:
    """True when ``value`` is a lifecycle UID: 26 to 32 of ``[a-z0-9]``."""
    return _full(_LIFECYCLE_UID, value)


def is_inbox_nonce(value: object) -> bool:
    """True when ``value`` is an inbox nonce: 8 to 120 of ``[A-Za-z0-9_-]``."""
    return _full(_INBOX_NONCE, value)


def is_scope_token(value: object) -> bool:
    """True when ``value`` is a scope token: ``[A-Za-z0-9_:-]+``."""
    return _full(_SCOPE_TOKEN, value)


def is_role(value: object) -> bool:
    """True when ``value`` is a role name: ``[A-Za-z0-9_-]+``."""
    return _full(_ROLE, value)


def is_space(value: object) -> bool:
    """True when ``value`` is a space name: 1 to 64 of ``[A-Za-z0-9_-]``."""
    return _full(_SPACE, value)


def is_channel_pattern(value: object) -> bool:
    """True when ``value`` is a channel pattern.

    Dot-separated segments, each ``[A-Za-z0-9_-]+`` or ``*``; the last segment may be ``>``.
    """
    if not isinstance(value, str):
        return False
    segments = value.split(".")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "*" or (segment == ">" and last):
            continue
        if _CHANNEL_SEGMENT.fullmatch(segment) is None:
            return False
    return True


def is_principal(value: object) -> bool:
    """True when ``value`` is ``<derived owner>.<actor>`` (a ``parent`` reference)."""
    if not isinstance(value, str) or value.count(".") != 1:
        return False
    owner, actor = value.split(".")
    return is_owner(owner) and is_actor(actor)


def _refuse(sentence: str) -> Refused:
    return Refused(RefusalCode.BAD_REQUEST, sentence)


def check_actor(value: object) -> str:
    """Return ``value`` if it is an actor token (upstream-notes 1.1).

    Raises:
        Refused: BAD_REQUEST when it is not 1 to 64 letters, digits and ``_``.
    """
    if not is_actor(value):
        raise _refuse("an actor name is 1 to 64 letters, digits and _ (no dots, dashes or spaces)")
    return value  # type: ignore[return-value]


def check_owner(value: object) -> str:
    """Return ``value`` if it is a derived owner token (upstream-notes 1.1; SPEC section 2).

    Raises:
        Refused: BAD_REQUEST when it is not ``u_`` followed by 26 characters of ``a-z2-7``.
    """
    if not is_owner(value):
        raise _refuse(
            "an owner is u_ followed by 26 characters a-z and 2-7 - "
            "copy it from the `cotal actor grant` output or `cotal actor list`"
        )
    return value  # type: ignore[return-value]


def check_lifecycle_uid(value: object) -> str:
    """Return ``value`` if it is a lifecycle UID (upstream-notes 1.1).

    Raises:
        Refused: BAD_REQUEST when it is not 26 to 32 characters of ``a-z0-9``.
    """
    if not is_lifecycle_uid(value):
        raise _refuse("a lifecycle UID is 26 to 32 characters of a-z and 0-9")
    return value  # type: ignore[return-value]


def check_inbox_nonce(value: object) -> str:
    """Return ``value`` if it is an inbox nonce (upstream-notes 1.1 ``assertInboxConnId``).

    Raises:
        Refused: BAD_REQUEST when it is not 8 to 120 characters of ``A-Za-z0-9_-``; the client
            sets it as its connection ``name``.
    """
    if not is_inbox_nonce(value):
        raise _refuse(
            "the connection name must be an inbox nonce of 8 to 120 characters "
            "(letters, digits, _ and -) - connect with name=<nonce> and inbox prefix _INBOX_<nonce>"
        )
    return value  # type: ignore[return-value]


def check_scope_token(value: object) -> str:
    """Return ``value`` if it is a scope token (upstream-notes 1.3).

    Raises:
        Refused: BAD_REQUEST when it is not a non-empty string of letters, digits, ``_:-``.
    """
    if not is_scope_token(value):
        raise _refuse("a scope token uses only letters, digits, _, : and - (for example role:default)")
    return value  # type: ignore[return-value]


def check_role(value: object) -> str:
    """Return ``value`` if it is a role name (upstream-notes 1.3).

    Raises:
        Refused: BAD_REQUEST when it is not a non-empty string of letters, digits, ``_`` and ``-``.
    """
    if not is_role(value):
        raise _refuse("a role name uses only letters, digits, _ and -")
    return value  # type: ignore[return-value]


def check_channel_pattern(value: object) -> str:
    """Return ``value`` if it is a channel pattern (upstream-notes 1.3 ``assertValidChannel``).

    Raises:
        Refused: BAD_REQUEST when a dot segment is empty or not ``[A-Za-z0-9_-]+``/``*``, or
            when ``>`` appears anywhere but as the last segment.
    """
    if not is_channel_pattern(value):
        raise _refuse(
            "a channel pattern is dot-separated segments of letters, digits, _ and -, "
            "or * for one segment, or a final > for the rest (for example team.* or ops.>)"
        )
    return value  # type: ignore[return-value]


def check_space(value: object) -> str:
    """Return ``value`` if it is a space name (it becomes part of account and bucket names).

    Raises:
        Refused: BAD_REQUEST when it is not 1 to 64 characters of letters, digits, ``_``, ``-``.
    """
    if not is_space(value):
        raise _refuse("a space name is 1 to 64 characters of letters, digits, _ and -")
    return value  # type: ignore[return-value]


def check_principal(value: object) -> str:
    """Return ``value`` if it is ``<derived owner>.<actor>`` (a ledger or bearer ``parent``).

    Raises:
        Refused: BAD_REQUEST otherwise.
    """
    if not is_principal(value):
        raise _refuse("a principal is <owner>.<actor>, for example u_<26 chars>.cli")
    return value  # type: ignore[return-value]


def principal(owner: str, actor: str) -> str:
    """The dot form ``<owner>.<actor>`` used in subjects, KV keys and ledger file names."""
    return f"{owner}.{actor}"


def split_principal(value: str) -> tuple[str, str]:
    """Split ``<owner>.<actor>`` into ``(owner, actor)``.

    Raises:
        Refused: BAD_REQUEST when ``value`` is not a principal (see :func:`check_principal`).
    """
    owner, actor = check_principal(value).split(".")
    return owner, actor


def _json_stringify(values: list[str]) -> str:
    """JavaScript ``JSON.stringify`` of a list of strings (ES2019 well-formed JSON.stringify).

    ``json.dumps(..., ensure_ascii=False)`` escapes what JSON.stringify escapes except one thing:
    a str may hold surrogates (a JWT's JSON can carry ``"\\ud800"``), which JavaScript, whose
    strings are UTF-16, reads as code units. A high and low surrogate side by side are one
    character there (written as that character), and a lone one is written as a lowercase
    ``\\uXXXX`` escape, so the result always encodes to UTF-8.
    """
    text = json.dumps(values, separators=(",", ":"), ensure_ascii=False)
    if _SURROGATE.search(text) is None:
        return text
    text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")  # pairs join
    return _SURROGATE.sub(lambda lone: f"\\u{ord(lone.group()):04x}", text)


def derive_owner(secret: bytes, idp_issuer: str, sub: str) -> str:
    """Derive the opaque per-space owner of an IdP subject (spec "Bridge contract" step 2).

    ``u_`` + lowercase unpadded base32 of the first 16 bytes of
    ``HMAC-SHA256(secret, "cotal-owner-v1:" + JSON([idp_issuer, sub]))`` (upstream-notes 1.2).
    The JSON encoding is frozen: it matches JavaScript ``JSON.stringify`` for two strings,
    including one that holds a lone surrogate (written ``\\ud800``, as JSON.stringify does; issue
    15 item 6), so every str an IdP token can carry has an owner.

    Args:
        secret: the space's owner secret, raw bytes, at least 32.
        idp_issuer: the pinned IdP issuer string (not read from a token).
        sub: the IdP subject.

    Returns:
        A derived owner, ``u_`` + 26 characters.

    Raises:
        ConfigError: the secret is not bytes of at least 32, or issuer or subject is empty.
    """
    if not isinstance(secret, bytes) or len(secret) < MIN_OWNER_SECRET_BYTES:
        raise ConfigError("the owner secret must be at least 32 bytes - regenerate the space's secrets")
    if not idp_issuer or not sub:
        raise ConfigError("owner derivation needs a non-empty IdP issuer and subject")
    message = f"{DERIVATION_CONTEXT}:{_json_stringify([idp_issuer, sub])}".encode()
    mac = hmac.new(secret, message, hashlib.sha256).digest()
    return "u_" + base64.b32encode(mac[:16]).decode("ascii").rstrip("=").lower()


def mint_lifecycle_uid(random20: bytes) -> str:
    """Mint a lifecycle UID from 20 random bytes (upstream-notes 1.1 ``mintLifecycleUid``).

    The bytes are read as a big-endian integer, written in lowercase base36 and left-padded with
    ``0`` to 26 characters (the result has 26 to 31 characters).

    Raises:
        ConfigError: ``random20`` is not exactly 20 bytes (a caller bug).
    """
    if not isinstance(random20, bytes) or len(random20) != LIFECYCLE_UID_RANDOM_BYTES:
        raise ConfigError("mint_lifecycle_uid needs exactly 20 random bytes")
    number = int.from_bytes(random20, "big")
    digits = []
    while number:
        number, remainder = divmod(number, 36)
        digits.append(_BASE36[remainder])
    return "".join(reversed(digits)).rjust(_LIFECYCLE_UID_MIN_CHARS, "0")
