"""Subject layout and the permission profiles minted into callout user JWTs (DESIGN 6 step 7).

Subject layout (ours). Everything of space ``S`` lives under ``cotal.S.``:

=====================================  ====================================================
subject                                what travels on it
=====================================  ====================================================
``cotal.S.ch.<channel>``               channel messages; ``<channel>`` may span several
                                       dot segments (``team.alerts``)
``cotal.S.dm.<owner>.<actor>.>``       direct messages to principal ``<owner>.<actor>``;
                                       the tokens after it are the sender's choice
``_INBOX_<nonce>.>``                   replies to a connection whose ``name`` is ``<nonce>``
``$SYS.REQ.USER.INFO``                 the broker's "who am I" request (no system account
                                       needed; spec credential-authority "Provisioning")
=====================================  ====================================================

The **agent** profile (spec credential-authority "Profiles"): publish to the ledger row's
``allowPublish`` channels (empty: no channel publish; posting is default-deny), send a DM to
any principal, ask ``$SYS.REQ.USER.INFO``; subscribe to the row's ``allowSubscribe`` channels,
its own DM subjects and its own reply inbox.

Pure and synchronous.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cotal_trio.core.errors import CodecError
from cotal_trio.core.identity import (
    check_actor,
    check_channel_pattern,
    check_inbox_nonce,
    check_owner,
    check_space,
)

__all__ = [
    "USER_INFO_SUBJECT",
    "Permissions",
    "agent_permissions",
    "channel_subject",
    "dm_subject",
    "inbox_subject",
    "space_prefix",
]

USER_INFO_SUBJECT = "$SYS.REQ.USER.INFO"


def space_prefix(space: str) -> str:
    """``cotal.<space>``: the root of every subject of the space."""
    return f"cotal.{space}"


def channel_subject(space: str, channel: str) -> str:
    """``cotal.<space>.ch.<channel>`` (``channel`` may be a pattern with ``*``/``>``)."""
    return f"cotal.{space}.ch.{channel}"


def dm_subject(space: str, owner: str, actor: str) -> str:
    """``cotal.<space>.dm.<owner>.<actor>.>``: every DM subject of one principal."""
    return f"cotal.{space}.dm.{owner}.{actor}.>"


def inbox_subject(nonce: str) -> str:
    """``_INBOX_<nonce>.>``: the reply inbox of the connection named ``nonce``."""
    return f"_INBOX_{nonce}.>"


# Non-empty dot-separated tokens without whitespace; ">" only as the whole last token. A regex,
# because this runs for every subject of every minted user (the callout's hot path).
_SUBJECT_PATTERN = re.compile(r"[^\s.]+(?:\.[^\s.]+)*")


def _is_subject_pattern(subject: object) -> bool:
    if not isinstance(subject, str) or _SUBJECT_PATTERN.fullmatch(subject) is None:
        return False
    return ">" not in subject.split(".")[:-1]


def _check_subjects(name: str, subjects: object) -> None:
    if not isinstance(subjects, tuple) or not all(_is_subject_pattern(s) for s in subjects):
        raise CodecError(f"{name} must be a tuple of NATS subjects (no empty tokens, > only last)")


def _direction(allow: tuple[str, ...], deny: tuple[str, ...]) -> dict[str, list[str]]:
    block: dict[str, list[str]] = {}
    if allow:
        block["allow"] = list(allow)
    if deny:
        block["deny"] = list(deny)
    return block


@dataclass(frozen=True, slots=True, kw_only=True)
class Permissions:
    """Publish and subscribe permissions of a NATS user.

    NATS reads an empty allow list as "no allow restriction", so each direction must say
    something: a non-empty allow list (everything else denied) or a non-empty deny list (use
    ``(">",)`` to deny all). A direction with neither would let the user do anything.

    Attributes:
        pub_allow, pub_deny, sub_allow, sub_deny: tuples of NATS subjects or patterns.

    Raises:
        CodecError: a subject is malformed, or a direction has neither allow nor deny entries.
    """

    pub_allow: tuple[str, ...] = ()
    pub_deny: tuple[str, ...] = ()
    sub_allow: tuple[str, ...] = ()
    sub_deny: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("pub_allow", "pub_deny", "sub_allow", "sub_deny"):
            _check_subjects(name, getattr(self, name))
        if not (self.pub_allow or self.pub_deny) or not (self.sub_allow or self.sub_deny):
            raise CodecError("each direction needs allow or deny entries; an empty one would allow everything")

    def to_nats(self) -> dict[str, Any]:
        """The NATS user JWT fragment ``{"pub": {"allow", "deny"}, "sub": {...}}``.

        Empty lists are omitted; lists keep their order.
        """
        return {
            "pub": _direction(self.pub_allow, self.pub_deny),
            "sub": _direction(self.sub_allow, self.sub_deny),
        }


def _unique(subjects: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(subjects))


def agent_permissions(
    *,
    space: str,
    owner: str,
    actor: str,
    allow_publish: tuple[str, ...],
    allow_subscribe: tuple[str, ...],
    inbox_nonce: str,
) -> Permissions:
    """The agent profile of principal ``<owner>.<actor>`` (module docstring for the layout).

    Args:
        space: the space name.
        owner, actor: the principal (from the validated bearer).
        allow_publish: the ledger row's ``allowPublish`` channel patterns.
        allow_subscribe: the ledger row's ``allowSubscribe`` channel patterns.
        inbox_nonce: the connection's ``name``; grants ``_INBOX_<nonce>.>``.

    Returns:
        ``pub.allow``: each ``cotal.<space>.ch.<p>``, ``cotal.<space>.dm.*.*.>``,
        ``$SYS.REQ.USER.INFO``; ``sub.allow``: each ``cotal.<space>.ch.<p>``, the own
        ``cotal.<space>.dm.<owner>.<actor>.>`` and ``_INBOX_<nonce>.>``. Duplicates removed,
        order kept; no deny lists.

    Raises:
        Refused: BAD_REQUEST when the space, owner, actor, nonce or a channel pattern breaks its
            grammar (``core/identity.py``).
    """
    check_space(space)
    check_owner(owner)
    check_actor(actor)
    check_inbox_nonce(inbox_nonce)
    for pattern in (*allow_publish, *allow_subscribe):
        check_channel_pattern(pattern)
    pub = [channel_subject(space, p) for p in allow_publish]
    sub = [channel_subject(space, p) for p in allow_subscribe]
    return Permissions(
        pub_allow=_unique([*pub, f"cotal.{space}.dm.*.*.>", USER_INFO_SUBJECT]),
        sub_allow=_unique([*sub, dm_subject(space, owner, actor), inbox_subject(inbox_nonce)]),
    )
