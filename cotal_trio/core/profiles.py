"""The permission profiles: every credential's NATS allow-lists (spec credential-authority "Profiles").

Each profile of the spec's table has one builder here, and :func:`profile_permissions` dispatches
on the profile's name. Every builder takes its subjects, streams, buckets and durables from
``core/wire.py`` (the single source of the layout; ``space_prefix``, ``channel_subject``,
``dm_subject``, ``inbox_subject`` and ``USER_INFO_SUBJECT`` are re-exported from there for older
callers), checks every input against its grammar, and returns :class:`Permissions` with allow
lists only: everything else is denied. docs/wire-layout.md lists each profile's exact lists.

Every profile may publish ``$SYS.REQ.USER.INFO`` (listed last) and subscribe to its own reply
inbox ``_INBOX_<nonce>.>`` (listed last), ``<nonce>`` being the connection's ``name``.

**Wholesale grants.** A grant that reaches a whole class of JetStream objects rather than named
ones: one covering ``$JS.>`` or ``$JS.API.>``, a whole bucket ``$KV.<bucket>.>``, or a message
read of a whole stream (``$JS.API.STREAM.MSG.GET.<stream>``, ``$JS.API.DIRECT.GET.<stream>``
or its ``.>`` form). :data:`WHOLESALE` names, per profile, the only ones it holds;
``tests/core/test_profile_properties.py`` checks every profile against it for arbitrary inputs,
and docs/wire-layout.md prints it.

Pure and synchronous.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from cotal_trio.core import wire
from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.identity import (
    check_actor,
    check_channel_pattern,
    check_inbox_nonce,
    check_lifecycle_uid,
    check_owner,
    check_role,
    check_scope_token,
    check_space,
)
from cotal_trio.core.views import (
    ServiceEndpointBinding,
    TransferTarget,
    binding_mismatch,
    check_view,
    is_session_id,
)
from cotal_trio.core.wire import USER_INFO_SUBJECT, Durable, channel_subject, dm_subject, inbox_subject, space_prefix

__all__ = [
    "CAPABILITIES",
    "PROFILES",
    "USER_INFO_SUBJECT",
    "WHOLESALE",
    "Permissions",
    "admin_permissions",
    "agent_permissions",
    "channel_subject",
    "delivery_permissions",
    "dm_subject",
    "inbox_subject",
    "issuer_permissions",
    "observer_permissions",
    "profile_permissions",
    "provisioner_permissions",
    "run_admitter_permissions",
    "run_driver_permissions",
    "run_mediator_permissions",
    "run_operator_permissions",
    "space_prefix",
    "teardown_permissions",
    "view_permissions",
]

CAPABILITIES = ("spawn", "run")
"""An agent's declared control-plane capabilities (spec "Capabilities")."""

_PRESENCE_READ = ("$JS.API.DIRECT.GET.KV_cotal_presence_<S>", "$JS.API.DIRECT.GET.KV_cotal_presence_<S>.>")
WHOLESALE: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "agent": _PRESENCE_READ,
    "observer": _PRESENCE_READ,
    "admin": _PRESENCE_READ,
    "provisioner": (),
    "teardown": (),
    "delivery": _PRESENCE_READ,
    "run-driver": (),
    "run-mediator": ("$JS.API.STREAM.MSG.GET.COTAL_RUN_<S>", "$JS.API.STREAM.MSG.GET.KV_cotal_records_<S>"),
    "run-operator": (),
    "issuer": (
        "$KV.cotal_issued_<S>.>", "$KV.cotal_accepted_<S>.>", "$JS.API.STREAM.MSG.GET.KV_cotal_issued_<S>",
        "$JS.API.STREAM.MSG.GET.KV_cotal_accepted_<S>", "$JS.API.DIRECT.GET.KV_cotal_accepted_<S>",
        "$JS.API.DIRECT.GET.KV_cotal_accepted_<S>.>",
    ),
    "run-admitter": (),
    "view": (),
})  # fmt: skip
"""Per profile, the only wholesale grants it holds, ``<S>`` standing for the space (module docstring).

The presence bucket is the space's public roster: the spec has agents read it "on demand with a
Direct Get of the presence bucket". The mediator's leader reads and the issuer's stores are their
jobs. No profile holds ``$JS.>``, ``$JS.API.>`` or a wildcard over streams or buckets.
"""


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
        resp_max: allow this many replies to each request the user received (NATS ``resp``,
            on the request's reply subject only, within the broker's default two minutes), or
            None for none beyond ``pub_allow``.

    Raises:
        CodecError: a subject is malformed, a direction has neither allow nor deny entries, or
            ``resp_max`` is not a whole number >= 1.
    """

    pub_allow: tuple[str, ...] = ()
    pub_deny: tuple[str, ...] = ()
    sub_allow: tuple[str, ...] = ()
    sub_deny: tuple[str, ...] = ()
    resp_max: int | None = None

    def __post_init__(self) -> None:
        for name in ("pub_allow", "pub_deny", "sub_allow", "sub_deny"):
            _check_subjects(name, getattr(self, name))
        if not (self.pub_allow or self.pub_deny) or not (self.sub_allow or self.sub_deny):
            raise CodecError("each direction needs allow or deny entries; an empty one would allow everything")
        if self.resp_max is not None and (type(self.resp_max) is not int or self.resp_max < 1):
            raise CodecError("resp_max must be a whole number >= 1, or None")

    @classmethod
    def of_checked(cls, *, pub_allow: tuple[str, ...], sub_allow: tuple[str, ...]) -> Permissions:
        """Allow-only permissions of subjects the caller has already checked as this class
        checks them (each a NATS subject pattern), built without checking them again: the
        callout's hot path builds them per connection from lists checked once (issue 14).

        Raises:
            CodecError: a direction is empty (an empty allow list would allow everything).
        """
        if not pub_allow or not sub_allow:
            raise CodecError("each direction needs allow or deny entries; an empty one would allow everything")
        made = object.__new__(cls)
        for name, value in (
            ("pub_allow", pub_allow), ("pub_deny", ()), ("sub_allow", sub_allow), ("sub_deny", ()), ("resp_max", None),
        ):  # fmt: skip
            object.__setattr__(made, name, value)
        return made

    def to_nats(self) -> dict[str, Any]:
        """The NATS user JWT fragment ``{"pub": {"allow", "deny"}, "sub": {...}}``, plus
        ``"resp": {"max": n, "ttl": 0}`` with :attr:`resp_max` (ttl 0: the broker's default).

        Empty lists are omitted; lists keep their order.
        """
        fragment: dict[str, Any] = {
            "pub": _direction(self.pub_allow, self.pub_deny),
            "sub": _direction(self.sub_allow, self.sub_deny),
        }
        if self.resp_max is not None:
            fragment["resp"] = {"max": self.resp_max, "ttl": 0}
        return fragment


def _unique(subjects: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(subjects))


def _bind(durable: Durable) -> list[str]:
    """Binding one pre-created durable: its info, its pull requests and the acks of its deliveries."""
    return [
        wire.js_consumer_info(durable.stream, durable.name), wire.js_consumer_next(durable.stream, durable.name),
        wire.js_ack(durable.stream, durable.name),
    ]  # fmt: skip


def _read(durable: Durable, *, delete: bool = False) -> list[str]:
    """Reading one pre-created ``ack_policy: none`` reader: its info and its pull requests, and
    with ``delete`` its delete (no acks: it takes none)."""
    subjects = [wire.js_consumer_info(durable.stream, durable.name), wire.js_consumer_next(durable.stream, durable.name)]
    return [*subjects, wire.js_consumer_delete(durable.stream, durable.name)] if delete else subjects


def _presence_read(space: str) -> list[str]:
    """Direct get of the presence bucket: one key (``.<subject>`` form) or a batch (body form)."""
    stream = wire.kv_stream(wire.presence_bucket(space))
    return [wire.js_direct_get(stream), wire.js_direct_get(stream, ">")]


def _profile(space: str, inbox_nonce: str, pub: Sequence[str], sub: Sequence[str] = ()) -> Permissions:
    """``pub`` + ``$SYS.REQ.USER.INFO`` and ``sub`` + the inbox, duplicates removed in order."""
    check_space(space)
    return Permissions(
        pub_allow=_unique([*pub, USER_INFO_SUBJECT]), sub_allow=_unique([*sub, inbox_subject(inbox_nonce)])
    )


def _check_patterns(name: str, patterns: object) -> tuple[str, ...]:
    if not isinstance(patterns, (tuple, list)):
        raise Refused(RefusalCode.BAD_REQUEST, f"{name} must be a sequence of channel patterns")
    return tuple(check_channel_pattern(p) for p in patterns)


def _capability_subjects(space: str, owner: str, actor: str, capabilities: object) -> list[str]:
    """The control subjects ``capabilities`` add (spec "Capabilities"): ``spawn`` adds spawn,
    stop of its own children and persona; ``run`` adds those and the five run commands."""
    if not isinstance(capabilities, (tuple, list)) or not set(capabilities) <= set(CAPABILITIES):
        raise Refused(RefusalCode.BAD_REQUEST, "capabilities are a sequence of spawn and run")
    if not capabilities:
        return []
    subjects = [wire.ctl_spawn(space), wire.ctl_stop(space, owner, actor), wire.ctl_persona(space)]
    if "run" in capabilities:
        subjects += [wire.ctl_run(space, verb) for verb in wire.RUN_VERBS]
    return subjects


def agent_permissions(
    *,
    space: str,
    owner: str,
    actor: str,
    allow_publish: tuple[str, ...],
    allow_subscribe: tuple[str, ...],
    inbox_nonce: str,
    subscribe: tuple[str, ...] = (),
    role: str | None = None,
    capabilities: tuple[str, ...] = (),
    inbox_uid: str | None = None,
) -> Permissions:
    """The agent profile of principal ``<owner>.<actor>`` (``S`` = ``space``; docs/wire-layout.md).

    ``pub.allow``, in order: each ``cotal.S.ch.<p>`` of ``allow_publish`` (posting is
    default-deny: none when empty); a DM to anyone, sent as itself ``cotal.S.dm.*.*.<o>.<a>[.>]``; its own
    ``cotal.S.ctl.despawn.<owner>.<actor>`` and ``cotal.S.ctl.turn.<owner>.<actor>``; the
    capability subjects; the bind of its DM inbox durable ``dm-<owner>-<actor>`` (consumer info,
    pull, acks; never a create or delete) and, with ``role``, of its role's task queue
    ``task-<role>``; its two watch readers ``watch-presence-<owner>-<actor>`` and
    ``watch-channels-<owner>-<actor>`` (consumer info and pull: the provisioner creates them
    pull-only, and the agent creates and deletes no consumer on those streams, spec "Profiles");
    presence: direct get of the bucket and a put of its own key
    ``<owner>.<actor>``; ``$SYS.REQ.USER.INFO``. ``sub.allow``: each ``cotal.S.ch.<p>`` of
    ``allow_subscribe``, its DM subjects ``cotal.S.dm.<owner>.<actor>.>``, ``_INBOX_<nonce>.>``.

    Args:
        space: the space name.
        owner, actor: the principal (from the validated bearer).
        allow_publish: the ``allowPublish`` channel patterns (the post ACL).
        allow_subscribe: the ``allowSubscribe`` channel patterns (the read ACL).
        inbox_nonce: the connection's ``name``; grants ``_INBOX_<nonce>.>``.
        subscribe: the channels it reads at boot; each must lie within ``allow_subscribe``
            (it adds no subject).
        role: its role, whose task queue it binds, or None.
        capabilities: a tuple of :data:`CAPABILITIES`: ``spawn`` adds ``cotal.S.ctl.spawn``,
            ``cotal.S.ctl.stop.<owner>.<actor>.*`` and ``cotal.S.ctl.persona``; ``run`` adds
            those and ``cotal.S.ctl.run.<verb>`` for start, resume, answer, status and list.
        inbox_uid: a static agent's lifecycle UID: its DM inbox durable is then
            ``dm-<owner>-<actor>-<uid>`` (:func:`~cotal_trio.core.wire.dm_durable`; spec
            "Provisioning": a new incarnation does not reuse the old bind-only inboxes).

    Raises:
        Refused: BAD_REQUEST when an input breaks its grammar, a capability is unknown, or a
            ``subscribe`` channel lies outside ``allow_subscribe`` (the sentence names both).
    """
    args = (space, owner, actor, allow_publish, allow_subscribe, subscribe, role, capabilities, inbox_uid)
    # The callout builds this twice per agent connect (the recalled rows, then the re-check),
    # and only the nonce differs between connects: the lists are memoized per principal and
    # ACL (hashable inputs only; a Refused is raised again, never remembered).
    if not _hashable(args):
        return _profile(space, inbox_nonce, *_agent_lists(*args))
    # and the profile per nonce too: the re-check of the same connect builds the same one
    return _profile_memo(space, inbox_nonce, *_agent_lists_memo(*args))


def _hashable(args: tuple[object, ...]) -> bool:
    return all(isinstance(a, str) or a is None or (isinstance(a, tuple) and all(isinstance(x, str) for x in a)) for a in args)


def _agent_lists(
    space: str, owner: str, actor: str, allow_publish: object, allow_subscribe: object, subscribe: object,
    role: str | None, capabilities: object, inbox_uid: str | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """:func:`agent_permissions`' ``pub`` and ``sub`` lists before :func:`_profile`; same Refused."""
    publish, read = _check_patterns("allow_publish", allow_publish), _check_patterns("allow_subscribe", allow_subscribe)
    for channel in _check_patterns("subscribe", subscribe):
        if not any(wire.covers(allowed, channel) for allowed in read):
            acl = ", ".join(read) or "nothing"
            sentence = f"allowSubscribe {acl} does not cover {channel} - widen allowSubscribe or drop {channel} from subscribe"
            raise Refused(RefusalCode.BAD_REQUEST, sentence)
    control = [wire.ctl_despawn(space, owner, actor), wire.ctl_turn(space, owner, actor)]
    control += _capability_subjects(space, owner, actor, capabilities)
    inboxes = _bind(wire.dm_durable(space, owner, actor, inbox_uid))
    if role is not None:
        inboxes += _bind(wire.task_durable(space, check_role(role)))
    inboxes += [s for kind in ("presence", "channels") for s in _read(wire.watch_durable(space, kind, owner, actor))]
    presence = [*_presence_read(space), wire.kv_subject(wire.presence_bucket(space), wire.presence_key(owner, actor))]
    pub = (*(channel_subject(space, p) for p in publish), *wire.dm_sender_subjects(space, owner, actor), *control,
           *inboxes, *presence)  # fmt: skip
    return pub, (*(channel_subject(space, p) for p in read), dm_subject(space, owner, actor))


_agent_lists_memo = functools.lru_cache(maxsize=4096)(_agent_lists)


@functools.lru_cache(maxsize=4096)
def _checked_lists(space: str, pub: tuple[str, ...], sub: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """:func:`_profile`'s lists but the inbox, every subject checked: once per principal and ACL
    (the lists a memoized :func:`_agent_lists` gives), not once per connection."""
    check_space(space)
    pub_allow, sub_base = _unique([*pub, USER_INFO_SUBJECT]), _unique(list(sub))
    _check_subjects("pub_allow", pub_allow)
    _check_subjects("sub_allow", sub_base)
    return pub_allow, sub_base


@functools.lru_cache(maxsize=256)  # the re-check of the same connect builds the same one
def _profile_memo(space: str, inbox_nonce: str, pub: tuple[str, ...], sub: tuple[str, ...]) -> Permissions:
    """:func:`_profile` of memoized lists: only the connection's inbox subject is checked here,
    the rest were once (:func:`_checked_lists`), so a fresh nonce costs no walk over every
    subject (84 -> 17 us a connect here, issue 14). Permissions is frozen: safe to share."""
    pub_allow, sub_base = _checked_lists(space, pub, sub)
    inbox = inbox_subject(inbox_nonce)
    _check_subjects("sub_allow", (inbox,))
    return Permissions.of_checked(pub_allow=pub_allow, sub_allow=_unique([*sub_base, inbox]))


def observer_permissions(*, space: str, inbox_nonce: str) -> Permissions:
    """Read-only chat and presence (what ``cotal console`` runs); DMs invisible.

    ``pub.allow``: direct get of the presence bucket; info, pull and delete of its history
    reader ``hist__<nonce>`` on ``COTAL_CHAT_S`` (spec "Profiles": its only consumer deletes
    name its own history readers; the provisioner creates the reader pull-only, and the
    observer creates none: a create grant cannot bound a push consumer's deliver subject);
    ``$SYS.REQ.USER.INFO``. ``sub.allow``: ``cotal.S.ch.>``, ``_INBOX_<nonce>.>``. It publishes
    nothing that writes.

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    reader = _read(wire.history_reader(space, "chat", inbox_nonce), delete=True)
    return _profile(space, inbox_nonce, [*_presence_read(space), *reader], [channel_subject(space, ">")])


def admin_permissions(*, space: str, inbox_nonce: str) -> Permissions:
    """The elevated read-only god view: everything of the space live, DMs included; writes nothing.

    ``pub.allow``: direct get of the presence bucket; info, pull and delete of its history
    readers ``hist__<nonce>`` on ``COTAL_CHAT_S`` and ``COTAL_DM_S`` (spec "Profiles": it deletes
    its own history readers on CHAT and DM and no other consumer; it creates none);
    ``$SYS.REQ.USER.INFO``. ``sub.allow``: ``cotal.S.>``, ``_INBOX_<nonce>.>``.

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    readers = [s for kind in ("chat", "dm") for s in _read(wire.history_reader(space, kind, inbox_nonce), delete=True)]
    return _profile(space, inbox_nonce, [*_presence_read(space), *readers], [f"{space_prefix(space)}.>"])


def provisioner_permissions(*, space: str, inbox_nonce: str) -> Permissions:
    """The operator-side provisioner: creates the space's message streams, the presence and
    admission buckets, and the bind-only durables (``stores/streams.py``). Deletes nothing.

    ``pub.allow``: ``STREAM.CREATE`` and ``STREAM.INFO`` of ``COTAL_{CHAT,DM,TASK,RUN}_S``,
    ``KV_cotal_presence_S``, ``KV_cotal_channels_S`` and ``KV_cotal_admission_S``; consumer
    creates only in the form with the filter in the subject, filters pinned to a DM inbox
    (``dm.*.*.>``), a task queue (``task.*.>``), a run journal (``run.*.journal``), the two
    delivery durables, a whole-bucket watch reader on the presence and registry buckets
    (``$KV.<bucket>.>``) or a chat history reader (``cotal.S.ch.>``; a DM history reader's filter
    is the DM inbox form's); consumer info on those six streams; ``$SYS.REQ.USER.INFO``.
    ``sub.allow``: ``_INBOX_<nonce>.>``.

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    chat, dm, task, run = wire.all_streams(space)
    watched = [wire.presence_bucket(space), wire.channels_bucket(space)]
    streams = [*(s.name for s in wire.all_streams(space))]
    streams += [*(wire.kv_stream(b) for b in watched), wire.kv_stream(wire.admission_bucket(space))]
    prefix = space_prefix(space)
    delivery = [wire.delivery_durable(space, kind) for kind in ("chat", "dm")]
    return _profile(space, inbox_nonce, [
        *(api(name) for name in streams for api in (wire.js_stream_create, wire.js_stream_info)),
        wire.js_consumer_create(dm.name, "*", wire.dm_send_subject(space)),
        wire.js_consumer_create(task.name, "*", f"{prefix}.task.*.>"),
        wire.js_consumer_create(run.name, "*", f"{prefix}.run.*.journal"),
        *(wire.js_consumer_create(d.stream, d.name, d.filter_subject) for d in delivery),
        *(wire.js_consumer_create(wire.kv_stream(b), "*", wire.kv_subject(b, ">")) for b in watched),
        wire.js_consumer_create(chat.name, "*", chat.subject),
        *(wire.js_consumer_info(s, "*") for s in (chat.name, dm.name, task.name, run.name, *map(wire.kv_stream, watched))),
    ])  # fmt: skip


def teardown_permissions(*, space: str, inbox_nonce: str) -> Permissions:
    """The operator-side teardown: deletes the space's streams and buckets, and one principal's,
    role's or run's durable. Reads nothing and creates nothing.

    ``pub.allow``: ``STREAM.DELETE`` of the four message streams and the eight KV streams,
    ``CONSUMER.DELETE`` of any durable on the DM, task and run streams,
    ``$SYS.REQ.USER.INFO``. ``sub.allow``: ``_INBOX_<nonce>.>``.

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    _, dm, task, run = wire.all_streams(space)
    streams = [*(s.name for s in wire.all_streams(space)), *(wire.kv_stream(b) for b in wire.all_buckets(space))]
    return _profile(space, inbox_nonce, [
        *(wire.js_stream_delete(name) for name in streams), *(wire.js_consumer_delete(s.name, "*") for s in (dm, task, run)),
    ])  # fmt: skip


def delivery_permissions(*, space: str, inbox_nonce: str) -> Permissions:
    """The delivery daemon: binds its two fan-out durables (``delivery-chat``, ``delivery-dm``)
    and reads presence. Creates and deletes nothing.

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    durables = [wire.delivery_durable(space, kind) for kind in ("chat", "dm")]
    return _profile(space, inbox_nonce, [*(s for d in durables for s in _bind(d)), *_presence_read(space)])


def run_driver_permissions(*, space: str, run_id: str, inbox_nonce: str) -> Permissions:
    """One workflow run's driver: appends to its journal ``cotal.S.run.<runId>.journal``, binds
    its replay durable ``replay-<runId>``, writes its records ``run.<runId>.driver.>`` in the
    records store. Store reads and effects go through the host.

    Raises:
        Refused: BAD_REQUEST for a bad space, run id or nonce.
    """
    return _profile(space, inbox_nonce, [
        wire.run_journal_subject(space, run_id), *_bind(wire.replay_durable(space, run_id)),
        wire.run_record_subject(space, run_id, "driver.>"),
    ])  # fmt: skip


def run_mediator_permissions(*, space: str, run_id: str, inbox_nonce: str) -> Permissions:
    """The hosting process's connection for one run's effects and leader reads: leader reads
    (``STREAM.MSG.GET``) of the run stream and the records store, and the run's effect records
    ``run.<runId>.effect.>``. Never handed to the driver.

    Raises:
        Refused: BAD_REQUEST for a bad space, run id or nonce.
    """
    return _profile(space, inbox_nonce, [
        wire.js_msg_get(wire.run_stream(space).name), wire.js_msg_get(wire.kv_stream(wire.records_bucket(space))),
        wire.run_record_subject(space, run_id, "effect.>"),
    ])  # fmt: skip


def run_operator_permissions(
    *, space: str, run_id: str, inbox_nonce: str, checkpoint_token: str | None = None
) -> Permissions:
    """One served run read, or (with ``checkpoint_token``) the answering half of one pause.

    A read holds the records walk and the run's replay, each through its own consumer
    ``op-<nonce>`` whose create pins the filter (``$KV.cotal_records_S.run.<runId>.>``, the
    run's journal; pull and delete of that consumer, ``ack_policy`` none), and the direct get of
    the run's two admission keys. The answering half holds that pause's answer record
    ``run.<runId>.answer.<token>`` and its settle ``cotal.S.run.<runId>.settle.<token>`` alone.

    Raises:
        Refused: BAD_REQUEST for a bad space, run id, token or nonce.
    """
    if checkpoint_token is not None:
        return _profile(space, inbox_nonce, [
            wire.run_record_subject(space, run_id, f"answer.{wire.check_checkpoint_token(checkpoint_token)}"),
            wire.run_settle_subject(space, run_id, checkpoint_token),
        ])  # fmt: skip
    name = f"op-{check_inbox_nonce(inbox_nonce)}"
    records = wire.kv_stream(wire.records_bucket(space))
    walks = [
        (records, wire.run_record_subject(space, run_id, ">")),
        (wire.run_stream(space).name, wire.run_journal_subject(space, run_id)),
    ]
    pub = [s for stream, f in walks for s in (
        wire.js_consumer_create(stream, name, f), wire.js_consumer_next(stream, name), wire.js_consumer_delete(stream, name),
    )]  # fmt: skip
    return _profile(space, inbox_nonce, [*pub, *_admission_reads(space, run_id)])


def _admission_reads(space: str, run_id: str) -> list[str]:
    bucket = wire.admission_bucket(space)
    return [wire.js_direct_get(wire.kv_stream(bucket), wire.kv_subject(bucket, key)) for key in wire.admission_keys(run_id)]


def issuer_permissions(*, space: str, inbox_nonce: str) -> Permissions:
    """One issuance window: writes to the issued and accepted stores, the first-message reads of
    evidence (``STREAM.MSG.GET``: the issued store has no direct get), the reads of accepted rows
    (``STREAM.MSG.GET``, as :class:`~cotal_trio.stores.issued.IssuedStores` reads a key's first
    message, and direct get), and ``STREAM.INFO`` of both for the shape check. What the auth
    service's and each replica's own issuer session holds (spec "Profiles", issuer row).

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    issued, accepted = wire.issued_bucket(space), wire.accepted_bucket(space)
    return _profile(space, inbox_nonce, [
        wire.kv_subject(issued, ">"), wire.kv_subject(accepted, ">"), wire.js_msg_get(wire.kv_stream(issued)),
        wire.js_msg_get(wire.kv_stream(accepted)), wire.js_direct_get(wire.kv_stream(accepted)), wire.js_direct_get(wire.kv_stream(accepted), ">"),
        wire.js_stream_info(wire.kv_stream(issued)), wire.js_stream_info(wire.kv_stream(accepted)),
    ])  # fmt: skip


def run_admitter_permissions(*, space: str, run_id: str, inbox_nonce: str) -> Permissions:
    """One run's admission record or revocation marker: writes and direct gets of the two exact
    keys ``admit.<runId>`` and ``revoke.<runId>`` of the admission store, nothing else. The
    store is write-once (``stores/streams.py``), so a write is a create: no overwrite, no delete,
    no purge.

    Raises:
        Refused: BAD_REQUEST for a bad space, run id or nonce.
    """
    bucket = wire.admission_bucket(space)
    writes = [wire.kv_subject(bucket, key) for key in wire.admission_keys(run_id)]
    return _profile(space, inbox_nonce, [*writes, *_admission_reads(space, run_id)])


# The control areas (``wire.CONTROL_AREAS``) each control view may publish to.
_CONTROL_PUBLISH = {
    "purger": ("purge",),
    "channel-writer": ("channels-set", "channels-defaults"),
    "channel-purger": ("channels-delete",),
    "deployer": ("deploy",),
    "manager-service": ("manager",),
}
# What a manager-caller bearer whose scope holds `spawn` may also ask its manager: what a
# host-local launch there needs (spec "Listener policy").
_MANAGER_READS = ("status", "models", "resolve-cwd")


def _view_subjects(
    view: str, space: str, *, scope: tuple[str, ...], manager_instance_id: str | None, session_id: str | None,
    transfer_writer: TransferTarget | None, service_endpoint: ServiceEndpointBinding | None = None,
) -> tuple[list[str], list[str]]:
    """``(publish, subscribe)`` subjects of ``view`` beyond the user-info request and the inbox."""
    if view == "service-host":
        assert service_endpoint is not None  # binding_mismatch checked it
        return [], wire.ep_host_subjects(space, service_endpoint.endpoint)
    if view == "admin":
        return [], [f"{space_prefix(space)}.>"]
    if view in _CONTROL_PUBLISH:
        return [wire.ctl_view(space, area) for area in _CONTROL_PUBLISH[view]], []
    if view == "manager-caller":
        assert manager_instance_id is not None  # binding_mismatch checked it
        methods = ("call", *_MANAGER_READS) if "spawn" in scope else ("call",)
        return [wire.mgr_subject(space, manager_instance_id, method) for method in methods], []
    if view == "session-caller":
        assert session_id is not None
        return [wire.session_subject(space, session_id, "in")], [wire.session_subject(space, session_id, "out")]
    assert transfer_writer is not None  # transfer-writer, the last view; binding_mismatch checked it
    return [wire.transfer_subject(space, transfer_writer.instance_id, transfer_writer.sha256_hex)], []


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
    service_endpoint: ServiceEndpointBinding | None = None,
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
    * ``transfer-writer``: ``cotal.S.transfer.<instanceId>.<hex>``;
    * ``service-host``: nothing more; it answers each call it receives once on the call's reply
      subject (``resp`` max 1, :attr:`Permissions.resp_max`), the only view with ``resp``.

    ``sub.allow``, before ``_INBOX_<nonce>.>`` (every view): ``cotal.S.>`` for ``admin``,
    ``cotal.S.session.<sessionId>.out`` for ``session-caller``, for ``service-host`` the calls to
    its endpoint ``E`` on both rails, ``cotal.S.ep.E.*.*.*`` and ``cotal.S.ep.v1.*.*.*.E.*``
    (:func:`~cotal_trio.core.wire.ep_host_subjects`), nothing more for the rest. No deny lists,
    no channel or DM subjects.

    Args:
        view: one of ``core.views.VIEWS``.
        space: the space name.
        owner, actor: the principal (from the validated bearer; checked, not in any subject).
        scope: the bearer's ``act.scope``.
        inbox_nonce: the connection's ``name``; grants ``_INBOX_<nonce>.>``.
        manager_instance_id: the bearer's ``act.managerInstanceId``; given iff ``manager-caller``.
        session_id: the bearer's ``act.session.sessionId``; given iff ``session-caller``.
        transfer_writer: the bearer's ``act.transferWriter``; given iff ``transfer-writer``.
        service_endpoint: the bearer's ``act.serviceEndpoint``; given iff ``service-host``.

    Raises:
        Refused: BAD_REQUEST for an unknown view, or a space, owner, actor, nonce, scope token,
            manager instance id or session id breaking its grammar.
        TypeError: a binding is given without its view or missing with it (a caller bug: a
            validated bearer always pairs them).
    """
    check_view(view)
    problem = binding_mismatch(
        view, manager_instance_id=manager_instance_id, session=session_id, transfer_writer=transfer_writer,
        service_endpoint=service_endpoint,
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
    if service_endpoint is not None and not isinstance(service_endpoint, ServiceEndpointBinding):
        raise TypeError("view_permissions: service_endpoint must be a ServiceEndpointBinding")
    pub, sub = _view_subjects(
        view, space, scope=scope, manager_instance_id=manager_instance_id, session_id=session_id,
        transfer_writer=transfer_writer, service_endpoint=service_endpoint,
    )  # fmt: skip
    return Permissions(
        pub_allow=_unique([*pub, USER_INFO_SUBJECT]), sub_allow=_unique([*sub, inbox_subject(inbox_nonce)]),
        resp_max=1 if view == "service-host" else None,
    )


def _view_profile(*, view: str, **context: Any) -> Permissions:
    return view_permissions(view, **context)


_BUILDERS: Mapping[str, Callable[..., Permissions]] = MappingProxyType({
    "agent": agent_permissions,
    "observer": observer_permissions,
    "admin": admin_permissions,
    "provisioner": provisioner_permissions,
    "teardown": teardown_permissions,
    "delivery": delivery_permissions,
    "run-driver": run_driver_permissions,
    "run-mediator": run_mediator_permissions,
    "run-operator": run_operator_permissions,
    "issuer": issuer_permissions,
    "run-admitter": run_admitter_permissions,
    "view": _view_profile,
})  # fmt: skip

PROFILES: tuple[str, ...] = tuple(_BUILDERS)
"""Every profile :func:`profile_permissions` builds, in the order of docs/wire-layout.md."""


def profile_permissions(name: str, **context: Any) -> Permissions:
    """The permissions of profile ``name`` (one of :data:`PROFILES`), built from ``context``.

    ``context`` is the builder's keyword arguments: ``space`` and ``inbox_nonce`` for every
    profile; ``owner``, ``actor``, ``allow_publish``, ``allow_subscribe`` and optionally
    ``subscribe``, ``role``, ``capabilities`` for ``agent``; ``run_id`` for the run profiles
    (``checkpoint_token`` for the answering half of ``run-operator``); for ``view``, ``view``
    and :func:`view_permissions`' arguments.

    Raises:
        Refused: BAD_REQUEST for an unknown profile or an input that breaks its grammar.
        TypeError: a missing or unexpected context argument (a caller bug).
    """
    if not isinstance(name, str) or name not in _BUILDERS:
        raise Refused(RefusalCode.BAD_REQUEST, f"a profile is one of {', '.join(PROFILES)}")
    return _BUILDERS[name](**context)
