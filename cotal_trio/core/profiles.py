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
``cotal.S.ctl.<area>...``              control requests: ``purge.>``, ``channels.set``,
                                       ``channels.defaults``, ``channels.delete``,
                                       ``deploy.>``, ``manager.>``
``cotal.S.mgr.<instanceId>.<method>``  calls to one manager instance (``call``, ``status``,
                                       ``models``, ``resolve-cwd``)
``cotal.S.session.<sessionId>.in|out`` one chat session, into and out of it
``cotal.S.transfer.<instanceId>.<hex>`` one transcript object, named by its SHA-256
=====================================  ====================================================

The **agent** profile (spec credential-authority "Profiles"): publish to the ledger row's
``allowPublish`` channels (empty: no channel publish; posting is default-deny), send a DM to
any principal, ask ``$SYS.REQ.USER.INFO``; subscribe to the row's ``allowSubscribe`` channels,
its own DM subjects and its own reply inbox.

A **view** profile (:func:`view_permissions`; ``core/views.py``; spec "Listener policy")
replaces the agent profile for a bearer that names a view: no channels and no DMs, only the
view's own subjects, plus ``$SYS.REQ.USER.INFO`` and the connection's reply inbox.

Pure and synchronous.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.identity import (
    check_actor,
    check_channel_pattern,
    check_inbox_nonce,
    check_lifecycle_uid,
    check_owner,
    check_scope_token,
    check_space,
)
from cotal_trio.core.views import TransferTarget, binding_mismatch, check_view, is_session_id

__all__ = [
    "USER_INFO_SUBJECT",
    "Permissions",
    "agent_permissions",
    "channel_subject",
    "dm_subject",
    "inbox_subject",
    "space_prefix",
    "view_permissions",
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


# Control subjects (after ``cotal.<space>.``) each control view may publish to.
_CONTROL_PUBLISH = {
    "purger": ("ctl.purge.>",),
    "channel-writer": ("ctl.channels.set", "ctl.channels.defaults"),
    "channel-purger": ("ctl.channels.delete",),
    "deployer": ("ctl.deploy.>",),
    "manager-service": ("ctl.manager.>",),
}
# What a manager-caller bearer whose scope holds `spawn` may also ask its manager: what a
# host-local launch there needs (spec "Listener policy").
_MANAGER_READS = ("status", "models", "resolve-cwd")


def _view_subjects(
    view: str, space: str, *, scope: tuple[str, ...], manager_instance_id: str | None, session_id: str | None,
    transfer_writer: TransferTarget | None,
) -> tuple[list[str], list[str]]:
    """``(publish, subscribe)`` subjects of ``view`` beyond the user-info request and the inbox."""
    prefix = space_prefix(space)
    if view == "admin":
        return [], [f"{prefix}.>"]
    if view in _CONTROL_PUBLISH:
        return [f"{prefix}.{subject}" for subject in _CONTROL_PUBLISH[view]], []
    if view == "manager-caller":
        methods = ("call", *_MANAGER_READS) if "spawn" in scope else ("call",)
        return [f"{prefix}.mgr.{manager_instance_id}.{method}" for method in methods], []
    if view == "session-caller":
        return [f"{prefix}.session.{session_id}.in"], [f"{prefix}.session.{session_id}.out"]
    assert transfer_writer is not None  # transfer-writer, the last view; binding_mismatch checked it
    return [f"{prefix}.transfer.{transfer_writer.instance_id}.{transfer_writer.sha256_hex}"], []


def view_permissions(
    view: str,
    *,
    space: str,
    owner: str,
    actor: str,
    scope: tuple[str, ...],
    inbox_nonce: str,
    manager_instance_id: str | None = None,
    session_id: str | None = None,
    transfer_writer: TransferTarget | None = None,
) -> Permissions:
    """The permission profile of a bearer with ``view`` (module docstring; ``S`` = ``space``).

    ``pub.allow``, before ``$SYS.REQ.USER.INFO`` (every view):

    * ``admin``: nothing more (a read-only god view);
    * ``purger``: ``cotal.S.ctl.purge.>``;
    * ``channel-writer``: ``cotal.S.ctl.channels.set``, ``cotal.S.ctl.channels.defaults``;
    * ``channel-purger``: ``cotal.S.ctl.channels.delete``;
    * ``deployer``: ``cotal.S.ctl.deploy.>``;
    * ``manager-service``: ``cotal.S.ctl.manager.>``;
    * ``manager-caller``: ``cotal.S.mgr.<instanceId>.call``, and when ``spawn`` is in ``scope``
      also ``.status``, ``.models``, ``.resolve-cwd`` of that instance;
    * ``session-caller``: ``cotal.S.session.<sessionId>.in``;
    * ``transfer-writer``: ``cotal.S.transfer.<instanceId>.<hex>``.

    ``sub.allow``, before ``_INBOX_<nonce>.>`` (every view): ``cotal.S.>`` for ``admin``,
    ``cotal.S.session.<sessionId>.out`` for ``session-caller``, nothing more for the rest. No
    deny lists, no channel or DM subjects.

    Args:
        view: one of ``core.views.VIEWS``.
        space: the space name.
        owner, actor: the principal (from the validated bearer; checked, not in any subject).
        scope: the bearer's ``act.scope``.
        inbox_nonce: the connection's ``name``; grants ``_INBOX_<nonce>.>``.
        manager_instance_id: the bearer's ``act.managerInstanceId``; given iff ``manager-caller``.
        session_id: the bearer's ``act.session.sessionId``; given iff ``session-caller``.
        transfer_writer: the bearer's ``act.transferWriter``; given iff ``transfer-writer``.

    Raises:
        Refused: BAD_REQUEST for an unknown view, or a space, owner, actor, nonce, scope token,
            manager instance id or session id breaking its grammar.
        TypeError: a binding is given without its view or missing with it (a caller bug: a
            validated bearer always pairs them).
    """
    check_view(view)
    problem = binding_mismatch(
        view, manager_instance_id=manager_instance_id, session=session_id, transfer_writer=transfer_writer
    )
    if problem is not None:
        raise TypeError(f"view_permissions: {problem}")
    check_space(space)
    check_owner(owner)
    check_actor(actor)
    check_inbox_nonce(inbox_nonce)
    for token in scope:
        check_scope_token(token)
    if manager_instance_id is not None:
        check_lifecycle_uid(manager_instance_id)
    if session_id is not None and not is_session_id(session_id):
        raise Refused(RefusalCode.BAD_REQUEST, "a chat session id is 22 to 128 characters of A-Za-z0-9_-")
    if transfer_writer is not None and not isinstance(transfer_writer, TransferTarget):
        raise TypeError("view_permissions: transfer_writer must be a TransferTarget")
    pub, sub = _view_subjects(
        view, space, scope=scope, manager_instance_id=manager_instance_id, session_id=session_id,
        transfer_writer=transfer_writer,
    )  # fmt: skip
    return Permissions(pub_allow=_unique([*pub, USER_INFO_SUBJECT]), sub_allow=_unique([*sub, inbox_subject(inbox_nonce)]))
