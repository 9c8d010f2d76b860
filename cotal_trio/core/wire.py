"""The wire layout of a space: every subject, stream, KV bucket and durable, one builder each.

The single source of the layout (issue 6 item 1; spec credential-authority "Profiles": profiles
are "built from the same subject/stream/durable builders as the wire layout, so ACLs cannot
drift from it"). ``core/profiles.py`` builds every permission profile from these, and
``stores/streams.py`` creates the streams, buckets and durables they name. The table, with
``S`` the space, is in docs/wire-layout.md.

Every builder checks its inputs against their grammars (``core/identity.py``, plus the few
defined here) and raises ``Refused(BAD_REQUEST, <sentence>)`` on a bad one, so a malformed name
can never widen a subject: a ``.``, ``*`` or ``>`` smuggled into an owner, actor, role or run id
is refused, never placed in a subject. Wildcards appear only where a builder's docstring says so.

Pure and synchronous.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.identity import (
    check_actor,
    check_channel_pattern,
    check_inbox_nonce,
    check_lifecycle_uid,
    check_owner,
    check_role,
    check_space,
)
from cotal_trio.core.sessions import is_endpoint, is_session_id

__all__ = [
    "CONTROL_AREAS",
    "RUN_VERBS",
    "USER_INFO_SUBJECT",
    "Durable",
    "Stream",
    "accepted_bucket",
    "admission_bucket",
    "admission_keys",
    "all_buckets",
    "all_streams",
    "auth_bucket",
    "channel_subject",
    "chat_stream",
    "check_checkpoint_token",
    "check_generation",
    "channels_bucket",
    "check_run_id",
    "covers",
    "ctl_despawn",
    "ctl_persona",
    "ctl_run",
    "ctl_spawn",
    "ctl_stop",
    "ctl_turn",
    "ctl_view",
    "delivery_durable",
    "dm_durable",
    "dm_send_subject",
    "dm_sender_subjects",
    "dm_stream",
    "dm_subject",
    "ep_host_subjects",
    "ep_subject",
    "ep_v1_subject",
    "history_reader",
    "inbox_subject",
    "is_generation",
    "is_subject",
    "issued_bucket",
    "js_ack",
    "js_consumer_create",
    "js_consumer_delete",
    "js_consumer_info",
    "js_consumer_next",
    "js_direct_get",
    "js_msg_get",
    "js_stream_create",
    "js_stream_delete",
    "js_stream_info",
    "kv_stream",
    "kv_subject",
    "mgr_subject",
    "presence_bucket",
    "presence_key",
    "records_bucket",
    "replay_durable",
    "run_journal_subject",
    "run_record_subject",
    "run_settle_subject",
    "run_stream",
    "session_subject",
    "sessions_bucket",
    "space_prefix",
    "task_durable",
    "task_stream",
    "task_subject",
    "transfer_subject",
    "watch_durable",
]

USER_INFO_SUBJECT = "$SYS.REQ.USER.INFO"
"""The broker's "who am I" request; no system account needed (spec "Provisioning")."""

RUN_VERBS = ("start", "resume", "answer", "status", "list")
"""The manager's workflow-run commands, ``cotal.<S>.ctl.run.<verb>`` (spec "Capabilities")."""

CONTROL_AREAS = {
    "purge": "purge.>",
    "channels-set": "channels.set",
    "channels-defaults": "channels.defaults",
    "channels-delete": "channels.delete",
    "deploy": "deploy.>",
    "manager": "manager.>",
}
"""The views' control subjects after ``cotal.<S>.ctl.`` (docs/views.md), by area name."""

_GENERATION = re.compile(r"[0-9a-f]{32}")
_RUN_ID = re.compile(r"[a-z0-9]{26,32}")
_CHECKPOINT = re.compile(r"[A-Za-z0-9_-]{16,128}")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")  # a JetStream stream or consumer name
_HEX64 = re.compile(r"[0-9a-f]{64}")
# JetStream subject tokens in a grant: no whitespace, no empty token; ">" only last.
_SUBJECT = re.compile(r"[^\s.]+(?:\.[^\s.]+)*")


def _refuse(sentence: str) -> Refused:
    return Refused(RefusalCode.BAD_REQUEST, sentence)


def _matching(value: object, pattern: re.Pattern[str], sentence: str) -> str:
    """``value`` when it is a string ``pattern`` matches whole, else Refused BAD_REQUEST ``sentence``."""
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise _refuse(sentence)
    return value


def is_generation(value: object) -> bool:
    """True when ``value`` is an issued generation: 32 lowercase hex digits (docs/issued-authority.md)."""
    return isinstance(value, str) and _GENERATION.fullmatch(value) is not None


def is_subject(value: object) -> bool:
    """True when ``value`` is a NATS subject or pattern: non-empty tokens without whitespace,
    ``>`` only as the last token."""
    return isinstance(value, str) and _SUBJECT.fullmatch(value) is not None and ">" not in value.split(".")[:-1]


def check_run_id(value: object) -> str:
    """Return ``value`` if it is a workflow run id: 26 to 32 of ``[a-z0-9]`` (a lifecycle token).

    Raises:
        Refused: BAD_REQUEST otherwise.
    """
    return _matching(value, _RUN_ID, "a run id is 26 to 32 characters of a-z and 0-9")


def check_generation(value: object) -> str:
    """Return ``value`` if it is an issued generation (:func:`is_generation`).

    Raises:
        Refused: BAD_REQUEST otherwise.
    """
    return _matching(value, _GENERATION, "a generation is 32 lowercase hex characters")


def check_checkpoint_token(value: object) -> str:
    """Return ``value`` if it is a run checkpoint token: 16 to 128 of ``[A-Za-z0-9_-]``.

    Raises:
        Refused: BAD_REQUEST otherwise.
    """
    return _matching(value, _CHECKPOINT, "a checkpoint token is 16 to 128 characters of letters, digits, _ and -")


def _check_name(value: object, what: str, *, wildcard: bool = False) -> str:
    if wildcard and value == "*":
        return "*"
    return _matching(value, _NAME, f"a {what} is 1 to 255 characters of letters, digits, _ and -")


def _check_subject(value: object, what: str) -> str:
    if not is_subject(value):
        raise _refuse(f"a {what} is dot-separated non-empty tokens without spaces, > only last")
    return value  # type: ignore[return-value]


def covers(outer: str, inner: str) -> bool:
    """True when every subject matching pattern ``inner`` also matches pattern ``outer``.

    NATS token rules: ``*`` is one token, a final ``>`` one or more. Used to check that an
    agent's boot ``subscribe`` channels lie within its ``allowSubscribe`` (spec "Profiles").
    """
    outer_tokens, inner_tokens = outer.split("."), inner.split(".")
    for index, token in enumerate(outer_tokens):
        if token == ">":
            return index < len(inner_tokens)
        if index >= len(inner_tokens) or inner_tokens[index] == ">":
            return False
        if token != "*" and token != inner_tokens[index]:
            return False
    return len(outer_tokens) == len(inner_tokens)


# -- roots, chat, DMs, tasks -------------------------------------------------------------------


def space_prefix(space: str) -> str:
    """``cotal.<space>``: the root of every subject of the space."""
    return f"cotal.{check_space(space)}"


def inbox_subject(nonce: str) -> str:
    """``_INBOX_<nonce>.>``: the reply inbox of the connection named ``nonce``."""
    return f"_INBOX_{check_inbox_nonce(nonce)}.>"


def channel_subject(space: str, channel: str) -> str:
    """``cotal.<space>.ch.<channel>``; ``channel`` may be a pattern with ``*`` and a final ``>``."""
    return f"{space_prefix(space)}.ch.{check_channel_pattern(channel)}"


def dm_subject(space: str, owner: str, actor: str) -> str:
    """``cotal.<space>.dm.<owner>.<actor>.>``: every DM subject of one principal (its inbox)."""
    return f"{space_prefix(space)}.dm.{check_owner(owner)}.{check_actor(actor)}.>"


def dm_sender_subjects(space: str, owner: str, actor: str) -> tuple[str, str]:
    """``cotal.<space>.dm.*.*.<owner>.<actor>`` and ``...<owner>.<actor>.>``: a DM to any principal
    sent AS ``<owner>.<actor>`` (the two tokens after the recipient name the sender, so an agent
    cannot send a DM that claims another sender)."""
    check_owner(owner)
    check_actor(actor)
    base = f"{space_prefix(space)}.dm.*.*.{owner}.{actor}"
    return base, f"{base}.>"


def dm_send_subject(space: str) -> str:
    """``cotal.<space>.dm.*.*.>``: a DM to any principal (the tokens after it are the sender's)."""
    return f"{space_prefix(space)}.dm.*.*.>"


def task_subject(space: str, role: str) -> str:
    """``cotal.<space>.task.<role>.>``: every task of one role's queue."""
    return f"{space_prefix(space)}.task.{check_role(role)}.>"


# -- streams and durables ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stream:
    """A JetStream stream of the layout: its ``name`` and the one ``subject`` pattern it stores."""

    name: str
    subject: str


@dataclass(frozen=True, slots=True)
class Durable:
    """A bind-only durable: its ``stream``, its ``name`` and its ``filter_subject``.

    The provisioner creates it (``stores/streams.py``); the profile that reads it gets only
    ``CONSUMER.INFO``, ``CONSUMER.MSG.NEXT`` and the acks of this one name, never a create.
    """

    stream: str
    name: str
    filter_subject: str


def chat_stream(space: str) -> Stream:
    """``COTAL_CHAT_<space>`` storing ``cotal.<space>.ch.>``."""
    return Stream(f"COTAL_CHAT_{check_space(space)}", f"{space_prefix(space)}.ch.>")


def dm_stream(space: str) -> Stream:
    """``COTAL_DM_<space>`` storing ``cotal.<space>.dm.>``."""
    return Stream(f"COTAL_DM_{check_space(space)}", f"{space_prefix(space)}.dm.>")


def task_stream(space: str) -> Stream:
    """``COTAL_TASK_<space>`` storing ``cotal.<space>.task.>`` (a work queue)."""
    return Stream(f"COTAL_TASK_{check_space(space)}", f"{space_prefix(space)}.task.>")


def run_stream(space: str) -> Stream:
    """``COTAL_RUN_<space>`` storing ``cotal.<space>.run.>`` (workflow run journals)."""
    return Stream(f"COTAL_RUN_{check_space(space)}", f"{space_prefix(space)}.run.>")


def all_streams(space: str) -> tuple[Stream, ...]:
    """The space's message streams: chat, DM, task, run (KV streams: :func:`all_buckets`)."""
    return (chat_stream(space), dm_stream(space), task_stream(space), run_stream(space))


def dm_durable(space: str, owner: str, actor: str, uid: str | None = None) -> Durable:
    """The DM inbox ``dm-<owner>-<actor>`` on the DM stream, filtered to the principal's DMs; with
    ``uid`` (a static agent's lifecycle UID, spec "Provisioning") ``dm-<owner>-<actor>-<uid>``, so
    a new incarnation of the principal (``cotal auth mint --identity``) never binds the old inbox.

    Owners, actors and lifecycle UIDs hold no ``-``, so the name is unambiguous.
    """
    name = f"dm-{check_owner(owner)}-{check_actor(actor)}" + ("" if uid is None else f"-{check_lifecycle_uid(uid)}")
    return Durable(dm_stream(space).name, name, dm_subject(space, owner, actor))


def task_durable(space: str, role: str) -> Durable:
    """The task queue ``task-<role>`` on the task stream, filtered to ``cotal.<S>.task.<role>.>``."""
    return Durable(task_stream(space).name, f"task-{check_role(role)}", task_subject(space, role))


def replay_durable(space: str, run_id: str) -> Durable:
    """A run's replay durable ``replay-<runId>`` on the run stream, filtered to its journal."""
    return Durable(run_stream(space).name, f"replay-{check_run_id(run_id)}", run_journal_subject(space, run_id))


def watch_durable(space: str, kind: str, owner: str, actor: str) -> Durable:
    """A principal's watch reader ``watch-<kind>-<owner>-<actor>`` on the presence (``kind``
    ``presence``) or channel-registry (``channels``) bucket's stream, filtered to the whole bucket.

    Spec "Profiles" (agent row: its channel-registry and presence watches). The provisioner
    creates it pull-only; the agent binds it (info, pull) and never creates or deletes a consumer
    on those streams: a create grant cannot bound a push consumer's deliver subject
    (docs/wire-layout.md "Watches and history readers").
    """
    buckets = {"presence": presence_bucket, "channels": channels_bucket}
    if kind not in buckets:
        raise _refuse("a watch is of presence or channels")
    bucket = buckets[kind](space)
    return Durable(kv_stream(bucket), f"watch-{kind}-{check_owner(owner)}-{check_actor(actor)}", kv_subject(bucket, ">"))


def history_reader(space: str, kind: str, inbox_nonce: str) -> Durable:
    """A credential's history reader ``hist__<nonce>`` on the chat (``kind`` ``chat``, filter
    ``cotal.<S>.ch.>``) or DM (``dm``, filter ``cotal.<S>.dm.*.*.>``: every DM) stream;
    ``<nonce>`` is the credential's inbox nonce.

    Spec "Profiles" (observer and admin rows: their own ``hist__`` history readers). The
    provisioner creates it pull-only; the observer (chat) or admin (chat and DM) binds and may
    delete it, and creates none (docs/wire-layout.md "Watches and history readers").
    """
    if kind not in ("chat", "dm"):
        raise _refuse("a history reader is on chat or dm")
    name = f"hist__{check_inbox_nonce(inbox_nonce)}"
    if kind == "chat":
        return Durable(chat_stream(space).name, name, chat_stream(space).subject)
    # every DM, in the filter the provisioner's DM-inbox create already covers (no wider grant)
    return Durable(dm_stream(space).name, name, dm_send_subject(space))


def delivery_durable(space: str, kind: str) -> Durable:
    """The delivery daemon's fan-out durable ``delivery-<kind>``: ``chat`` or ``dm``, whole stream."""
    streams = {"chat": chat_stream, "dm": dm_stream}
    if kind not in streams:
        raise _refuse("a delivery durable is for chat or dm")
    stream = streams[kind](space)
    return Durable(stream.name, f"delivery-{kind}", stream.subject)


# -- KV buckets ----------------------------------------------------------------------------------


def auth_bucket(space: str) -> str:
    """``cotal_auth_<space>``: the plane claim and the callout's issuance rows."""
    return f"cotal_auth_{check_space(space)}"


def records_bucket(space: str) -> str:
    """``cotal_records_<space>``: manager instances, lifecycle records, consents, run records."""
    return f"cotal_records_{check_space(space)}"


def sessions_bucket(space: str) -> str:
    """``cotal_sessions_<space>``: chat sessions."""
    return f"cotal_sessions_{check_space(space)}"


def issued_bucket(space: str) -> str:
    """``cotal_issued_<space>``: issued-authority evidence (append-only)."""
    return f"cotal_issued_{check_space(space)}"


def accepted_bucket(space: str) -> str:
    """``cotal_accepted_<space>``: accepted rows (write-once)."""
    return f"cotal_accepted_{check_space(space)}"


def presence_bucket(space: str) -> str:
    """``cotal_presence_<space>``: the roster, key ``<owner>.<actor>``, read by direct get."""
    return f"cotal_presence_{check_space(space)}"


def channels_bucket(space: str) -> str:
    """``cotal_channels_<space>``: the channel registry (privileged-written; agents watch it)."""
    return f"cotal_channels_{check_space(space)}"


def admission_bucket(space: str) -> str:
    """``cotal_admission_<space>``: run admissions and revocations (write-once)."""
    return f"cotal_admission_{check_space(space)}"


def all_buckets(space: str) -> tuple[str, ...]:
    """Every KV bucket of the space, in the order of docs/wire-layout.md."""
    return (
        auth_bucket(space), records_bucket(space), sessions_bucket(space), issued_bucket(space),
        accepted_bucket(space), presence_bucket(space), channels_bucket(space), admission_bucket(space),
    )  # fmt: skip


def kv_stream(bucket: str) -> str:
    """``KV_<bucket>``: the stream behind a KV bucket."""
    return f"KV_{_check_name(bucket, 'bucket name')}"


def kv_subject(bucket: str, key: str) -> str:
    """``$KV.<bucket>.<key>``: where a key's values are published; ``key`` may be a pattern."""
    return f"$KV.{_check_name(bucket, 'bucket name')}.{_check_subject(key, 'KV key')}"


def presence_key(owner: str, actor: str) -> str:
    """``<owner>.<actor>``: a principal's presence key."""
    return f"{check_owner(owner)}.{check_actor(actor)}"


def admission_keys(run_id: str) -> tuple[str, str]:
    """``(admit.<runId>, revoke.<runId>)``: one run's admission record and revocation marker."""
    return f"admit.{check_run_id(run_id)}", f"revoke.{run_id}"


# -- control, views, endpoint rails, runs ------------------------------------------------------


def ctl_spawn(space: str) -> str:
    """``cotal.<space>.ctl.spawn`` (capability ``spawn``)."""
    return f"{space_prefix(space)}.ctl.spawn"


def ctl_stop(space: str, owner: str, actor: str, child: str = "*") -> str:
    """``cotal.<space>.ctl.stop.<owner>.<actor>.<child>``: stop a child of ``<owner>.<actor>``.

    ``child`` is an actor, or ``*`` (the default) for every child of that parent.
    """
    child = child if child == "*" else check_actor(child)
    return f"{space_prefix(space)}.ctl.stop.{check_owner(owner)}.{check_actor(actor)}.{child}"


def ctl_despawn(space: str, owner: str, actor: str) -> str:
    """``cotal.<space>.ctl.despawn.<owner>.<actor>``: the principal despawns itself."""
    return f"{space_prefix(space)}.ctl.despawn.{check_owner(owner)}.{check_actor(actor)}"


def ctl_persona(space: str) -> str:
    """``cotal.<space>.ctl.persona`` (capability ``spawn``)."""
    return f"{space_prefix(space)}.ctl.persona"


def ctl_turn(space: str, owner: str, actor: str) -> str:
    """``cotal.<space>.ctl.turn.<owner>.<actor>``: pull or yield the run turns addressed to it."""
    return f"{space_prefix(space)}.ctl.turn.{check_owner(owner)}.{check_actor(actor)}"


def ctl_run(space: str, verb: str) -> str:
    """``cotal.<space>.ctl.run.<verb>``, ``verb`` one of :data:`RUN_VERBS` (capability ``run``)."""
    if verb not in RUN_VERBS:
        raise _refuse(f"a run verb is one of {', '.join(RUN_VERBS)}")
    return f"{space_prefix(space)}.ctl.run.{verb}"


def ctl_view(space: str, area: str) -> str:
    """``cotal.<space>.ctl.<...>`` of one view control ``area`` (:data:`CONTROL_AREAS`)."""
    if area not in CONTROL_AREAS:
        raise _refuse(f"a control area is one of {', '.join(CONTROL_AREAS)}")
    return f"{space_prefix(space)}.ctl.{CONTROL_AREAS[area]}"


def mgr_subject(space: str, instance_id: str, method: str) -> str:
    """``cotal.<space>.mgr.<instanceId>.<method>``: a call to one manager instance."""
    if method not in ("call", "status", "models", "resolve-cwd"):
        raise _refuse("a manager method is call, status, models or resolve-cwd")
    return f"{space_prefix(space)}.mgr.{check_lifecycle_uid(instance_id)}.{method}"


def session_subject(space: str, session_id: str, direction: str) -> str:
    """``cotal.<space>.session.<sessionId>.in|out``: one chat session, into or out of it."""
    if not is_session_id(session_id):
        raise _refuse("a chat session id is 22 to 128 characters of A-Za-z0-9_-")
    if direction not in ("in", "out"):
        raise _refuse("a session direction is in or out")
    return f"{space_prefix(space)}.session.{session_id}.{direction}"


def transfer_subject(space: str, instance_id: str, sha256_hex: str) -> str:
    """``cotal.<space>.transfer.<instanceId>.<hex>``: one transcript object."""
    if not isinstance(sha256_hex, str) or _HEX64.fullmatch(sha256_hex) is None:
        raise _refuse("a transcript object is named by 64 lowercase hex characters")
    return f"{space_prefix(space)}.transfer.{check_lifecycle_uid(instance_id)}.{sha256_hex}"


def _check_endpoint_token(value: object, what: str) -> str:
    if not is_endpoint(value):
        raise _refuse(f"an endpoint {what} is 1 to 64 characters of letters, digits, _ and -")
    return value  # type: ignore[return-value]


def ep_subject(space: str, endpoint: str, verb: str, owner: str, actor: str) -> str:
    """``cotal.<space>.ep.<endpoint>.<verb>.<owner>.<actor>``: the legacy endpoint rail.

    An endpoint named ``v1`` is refused: the ``ep.v1`` rail and this one stay disjoint (spec
    "Issued authority").
    """
    if _check_endpoint_token(endpoint, "name") == "v1":
        raise _refuse("an endpoint may not be named v1: that name is the issued rail (ep.v1)")
    return f"{space_prefix(space)}.ep.{endpoint}.{_check_endpoint_token(verb, 'verb')}.{check_owner(owner)}.{check_actor(actor)}"


def ep_v1_subject(space: str, generation: str, owner: str, actor: str, endpoint: str, verb: str) -> str:
    """``cotal.<space>.ep.v1.<generation>.<owner>.<actor>.<endpoint>.<verb>``: the issued rail."""
    return (
        f"{space_prefix(space)}.ep.v1.{check_generation(generation)}.{check_owner(owner)}.{check_actor(actor)}"
        f".{_check_endpoint_token(endpoint, 'name')}.{_check_endpoint_token(verb, 'verb')}"
    )


def ep_host_subjects(space: str, endpoint: str) -> list[str]:
    """What a service endpoint's host receives: every call to ``endpoint`` on both rails.

    ``cotal.<space>.ep.<endpoint>.*.*.*`` (the legacy rail: any verb, any sender) and
    ``cotal.<space>.ep.v1.*.*.*.<endpoint>.*`` (the issued rail: any generation, any sender, any
    verb); docs/http-api.md "Service endpoints".

    Raises:
        Refused: BAD_REQUEST for an endpoint outside ``[A-Za-z0-9_-]{1,64}`` or named ``v1``.
    """
    if _check_endpoint_token(endpoint, "name") == "v1":
        raise _refuse("an endpoint may not be named v1: that name is the issued rail (ep.v1)")
    prefix = space_prefix(space)
    return [f"{prefix}.ep.{endpoint}.*.*.*", f"{prefix}.ep.v1.*.*.*.{endpoint}.*"]


def run_journal_subject(space: str, run_id: str) -> str:
    """``cotal.<space>.run.<runId>.journal``: one run's journal (stored in the run stream)."""
    return f"{space_prefix(space)}.run.{check_run_id(run_id)}.journal"


def run_settle_subject(space: str, run_id: str, token: str) -> str:
    """``cotal.<space>.run.<runId>.settle.<token>``: settles one paused checkpoint."""
    return f"{space_prefix(space)}.run.{check_run_id(run_id)}.settle.{check_checkpoint_token(token)}"


def run_record_subject(space: str, run_id: str, part: str) -> str:
    """``$KV.cotal_records_<space>.run.<runId>.<part>``: a run's records (``part`` may be a pattern)."""
    return kv_subject(records_bucket(space), f"run.{check_run_id(run_id)}.{_check_subject(part, 'record key')}")


# -- the JetStream API (nats-server 2.15; measured in tests/lane/test_profiles_live.py) ---------


def js_stream_create(stream: str) -> str:
    """``$JS.API.STREAM.CREATE.<stream>``."""
    return f"$JS.API.STREAM.CREATE.{_check_name(stream, 'stream name')}"


def js_stream_info(stream: str) -> str:
    """``$JS.API.STREAM.INFO.<stream>``."""
    return f"$JS.API.STREAM.INFO.{_check_name(stream, 'stream name')}"


def js_stream_delete(stream: str) -> str:
    """``$JS.API.STREAM.DELETE.<stream>``."""
    return f"$JS.API.STREAM.DELETE.{_check_name(stream, 'stream name')}"


def js_msg_get(stream: str) -> str:
    """``$JS.API.STREAM.MSG.GET.<stream>``: a leader read of ANY message of the stream (wholesale)."""
    return f"$JS.API.STREAM.MSG.GET.{_check_name(stream, 'stream name')}"


def js_direct_get(stream: str, subject: str | None = None) -> str:
    """``$JS.API.DIRECT.GET.<stream>`` (any message, chosen in the body: wholesale), or with
    ``subject`` ``$JS.API.DIRECT.GET.<stream>.<subject>`` (the last message on that subject;
    ``subject`` may be a pattern, which a grant then allows for every key it matches)."""
    base = f"$JS.API.DIRECT.GET.{_check_name(stream, 'stream name')}"
    return base if subject is None else f"{base}.{_check_subject(subject, 'subject')}"


def js_consumer_create(stream: str, name: str, filter_subject: str) -> str:
    """``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``: the only create form with the filter
    in the subject (the broker refuses a body whose filter differs: err_code 10131), so a grant
    on it pins the filter. ``name`` may be ``*``. The other forms (``CONSUMER.CREATE.<stream>``,
    ``CONSUMER.CREATE.<stream>.<name>``, ``CONSUMER.DURABLE.CREATE.<stream>.<name>``) take any
    filter in the body and are granted to no profile."""
    name = _check_name(name, "consumer name", wildcard=True)
    return f"$JS.API.CONSUMER.CREATE.{_check_name(stream, 'stream name')}.{name}.{_check_subject(filter_subject, 'filter')}"


def _consumer_api(verb: str, stream: str, name: str) -> str:
    stream = _check_name(stream, "stream name")
    return f"$JS.API.CONSUMER.{verb}.{stream}.{_check_name(name, 'consumer name', wildcard=True)}"


def js_consumer_info(stream: str, name: str) -> str:
    """``$JS.API.CONSUMER.INFO.<stream>.<name>`` (``name`` may be ``*``)."""
    return _consumer_api("INFO", stream, name)


def js_consumer_next(stream: str, name: str) -> str:
    """``$JS.API.CONSUMER.MSG.NEXT.<stream>.<name>``: a pull request on one consumer."""
    return _consumer_api("MSG.NEXT", stream, name)


def js_consumer_delete(stream: str, name: str) -> str:
    """``$JS.API.CONSUMER.DELETE.<stream>.<name>`` (``name`` may be ``*``)."""
    return _consumer_api("DELETE", stream, name)


def js_ack(stream: str, name: str) -> str:
    """``$JS.ACK.<stream>.<name>.>``: the acks of one consumer's deliveries (the reply subject
    nats-server 2.15 puts on them: ``$JS.ACK.<stream>.<name>.<n>.<sseq>.<cseq>.<ts>.<pending>``)."""
    return f"$JS.ACK.{_check_name(stream, 'stream name')}.{_check_name(name, 'consumer name')}.>"
