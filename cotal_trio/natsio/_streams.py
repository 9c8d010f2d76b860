"""JetStream streams with an exact shape, read by subject, backed up and deleted, seen from trio.

What the issued-authority stores (:mod:`cotal_trio.stores.issued`) need beyond :mod:`._kv`:

* :class:`StreamShape` and :func:`ensure_stream`: create a stream with an exact configuration
  (file storage, no limits, ``discard: new``, the append-only flags ``deny_delete``/
  ``deny_purge``/``allow_rollup_hdrs: false``, ``allow_direct``, ``max_msgs_per_subject``,
  ``discard_new_per_subject``, ``allow_msg_ttl``) at the replica count asked for, or verify an
  existing one and refuse it (:class:`StreamDrift`) when any of those differs. An existing
  stream's shape is never changed: the broker cannot undo ``deny_delete`` anyway (err_code
  10052), and a store whose shape is wrong was written under other rules. Its replica count is
  the one thing changed, and only up (issue 17 item 1).
* :func:`first_message` / :func:`last_message`: the first (``next_by_subj`` from sequence 1) or
  last (``last_by_subj``) message on one subject, by ``$JS.API.STREAM.MSG.GET``, so they work
  whatever ``allow_direct`` is.
* :func:`publish_expecting`: a JetStream publish with ``Nats-TTL`` and
  ``Nats-Expected-Last-Subject-Sequence``; :class:`SubjectConflict` when the broker refuses it
  because the subject holds another message than expected (err_code 10071/10164) or already
  holds its one allowed message (``discard_new_per_subject``, err_code 10077).
* :func:`backup_stream` and :func:`delete_stream`.

Every call is one or more JetStream API requests made with :meth:`Connection.request` (JSON
bodies, no nats-py JetStream context), so a connection's permissions decide exactly what it can
reach. Every async function here is trio-flavoured and a checkpoint, bounded by the caller's
deadline (or natsio's 10 s cap). Errors: the typed errors of the JetStream client :mod:`._js`
(:class:`~cotal_trio.natsio.StreamNotFound` for a missing stream, all of them
:class:`~cotal_trio.core.errors.Unavailable`; :func:`~cotal_trio.natsio.is_bucket_missing` works
on them), ``ValueError`` for a malformed name.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from cotal_trio.core.errors import AuthServiceError, ConfigError

from ._conn import Connection
from ._js import StreamMessage, StreamNameInUse, StreamNotFound, SubjectFull, WrongLastSequence, js_api, js_msg_get, js_publish
from ._kv import EXPECTED_LAST_SUBJECT_SEQ, _ttl_headers, check_replicas, settled

__all__ = [
    "StreamDrift",
    "StreamMessage",
    "StreamShape",
    "SubjectConflict",
    "backup_stream",
    "delete_stream",
    "ensure_stream",
    "expecting_headers",
    "first_message",
    "last_message",
    "publish_expecting",
    "stream_config",
]

_STREAM_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")
# A stream's messages are read back one request each; this bounds a backup of a runaway stream.
MAX_BACKUP_MESSAGES = 1_000_000


class StreamDrift(ConfigError):
    """An existing stream's configuration differs from the shape asked for.

    Attributes:
        stream: the stream's name.
        differences: one ``"<field> is <have>, not <want>"`` per differing field.
    """

    def __init__(self, stream: str, differences: tuple[str, ...]) -> None:
        super().__init__(f"stream {stream} exists with another shape: {'; '.join(differences)}")
        self.stream = stream
        self.differences = differences


class SubjectConflict(AuthServiceError):
    """A publish was refused because ``subject`` holds another message than ``expected`` (its
    last subject sequence, 0 for none) or already holds the one message it may."""

    def __init__(self, subject: str, expected: int | None) -> None:
        super().__init__(f"{subject} already holds another message than the one expected ({expected})")
        self.subject = subject
        self.expected = expected


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamShape:
    """A stream's exact configuration: file storage, limits retention, no age, count or size
    limit, ``discard: new``, created with one replica (any count is accepted later), plus the
    flags below.

    Attributes:
        name: the stream name.
        subjects: the subjects it stores.
        allow_direct: allow ``$JS.API.DIRECT.GET``.
        max_msgs_per_subject: messages kept per subject, -1 for no limit.
        discard_new_per_subject: refuse a publish on a subject at its limit (write-once with 1).
        deny_delete, deny_purge: the broker refuses message deletes / purges.
        allow_rollup_hdrs: allow ``Nats-Rollup`` (which would purge a subject).
        allow_msg_ttl: allow per-message ``Nats-TTL``.

    Raises:
        ValueError: a malformed name, no subjects, or a limit below -1 or 0.
    """

    name: str
    subjects: tuple[str, ...]
    allow_direct: bool
    max_msgs_per_subject: int
    discard_new_per_subject: bool = False
    deny_delete: bool = True
    deny_purge: bool = True
    allow_rollup_hdrs: bool = False
    allow_msg_ttl: bool = True

    def __post_init__(self) -> None:
        _check_name(self.name)
        if not self.subjects or not isinstance(self.subjects, tuple):
            raise ValueError("a stream needs a tuple of subjects")
        if self.max_msgs_per_subject == 0 or self.max_msgs_per_subject < -1:
            raise ValueError(f"max_msgs_per_subject must be -1 or >= 1, got {self.max_msgs_per_subject}")

    def config(self) -> dict[str, Any]:
        """Sync: the ``STREAM.CREATE`` configuration, every field the shape fixes."""
        return {
            "name": self.name, "subjects": list(self.subjects), "storage": "file", "retention": "limits",
            "discard": "new", "discard_new_per_subject": self.discard_new_per_subject, "max_age": 0,
            "max_msgs": -1, "max_bytes": -1, "max_msg_size": -1, "max_consumers": -1,
            "max_msgs_per_subject": self.max_msgs_per_subject, "num_replicas": 1, "sealed": False,
            "allow_direct": self.allow_direct, "mirror_direct": False, "deny_delete": self.deny_delete,
            "deny_purge": self.deny_purge, "allow_rollup_hdrs": self.allow_rollup_hdrs,
            "allow_msg_ttl": self.allow_msg_ttl,
        }  # fmt: skip

    def drift(self, config: Mapping[str, Any]) -> tuple[str, ...]:
        """Sync: how an existing stream's ``config`` (as ``STREAM.INFO`` reports it) differs.

        Every field of :meth:`config` is compared; a field the broker left out reads as Go's zero
        value (the server omits ``false`` for some flags). Empty when the shape matches. The one
        exception is ``num_replicas``: any count of 1 or more matches, because replication is the
        operator's durability choice (a stream scaled to R3 on a cluster), not a shape a read
        relies on.
        """
        differences = []
        for field, want in self.config().items():
            have = config.get(field, _ZERO.get(type(want)))
            if field == "subjects":
                have, want = sorted(have or []), sorted(want)
            if field == "num_replicas" and isinstance(have, int) and have >= 1:
                continue  # the count is the space's `replicas` (ensure_stream), not a shape
            if have != want:
                differences.append(f"{field} is {json.dumps(have)}, not {json.dumps(want)}")
        # Fields that bring messages in from elsewhere or send them on: none of our streams has one.
        differences += [f"{field} is set" for field in _FOREIGN if config.get(field)]
        return tuple(differences)


_ZERO: dict[type, Any] = {bool: False, int: 0, str: "", list: []}
_FOREIGN = ("sources", "mirror", "republish", "subject_transform")


def _check_name(name: str) -> str:
    if not isinstance(name, str) or _STREAM_NAME.fullmatch(name) is None:
        raise ValueError(f"invalid stream name {name!r}: letters, digits, '_' and '-' only")
    return name


async def _api(conn: Connection, subject: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Trio: one JetStream API request; its JSON answer (:func:`~cotal_trio.natsio._js.js_api`)."""
    return await js_api(conn, subject, body)


async def stream_config(conn: Connection, name: str) -> dict[str, Any] | None:
    """Trio: the stream's configuration as the broker reports it, or None when it does not exist.

    Raises:
        ValueError: a malformed name.
        Unavailable: the broker or JetStream did not answer, or refused.
    """
    try:
        info = await _api(conn, f"$JS.API.STREAM.INFO.{_check_name(name)}")
    except StreamNotFound:
        return None
    return dict(info.get("config") or {})


async def ensure_stream(conn: Connection, shape: StreamShape, *, replicas: int = 1) -> int:
    """Trio: create the stream ``shape`` describes at ``replicas`` copies, or verify the existing
    one and scale it up to ``replicas`` (a ``STREAM.UPDATE`` of ``num_replicas`` alone, issue 17
    item 1); the stream's replica count now.

    A stream with more copies than ``replicas`` is left as it is (the count returned says so).
    Idempotent; two concurrent callers both succeed (the broker answers an identical create).

    Raises:
        StreamDrift: the stream exists and differs from ``shape`` (it is left as it is).
        NoPlacement: the broker cannot place ``replicas`` copies (a single node, too few nodes).
        ValueError: ``replicas`` is not a whole number from 1 to 5.
        Unavailable: the broker or JetStream did not answer, or refused.
    """
    check_replicas(replicas)
    config = await stream_config(conn, shape.name)
    if config is None:
        try:
            answer = await _api(conn, f"$JS.API.STREAM.CREATE.{shape.name}", {**shape.config(), "num_replicas": replicas})
            config = dict(answer.get("config") or {})
        except StreamNameInUse:  # someone made it meanwhile, another shape
            config = await stream_config(conn, shape.name) or {}
    differences = shape.drift(config)
    if differences:
        raise StreamDrift(shape.name, differences)
    return await _scaled_up(conn, shape.name, config, replicas)


async def _scaled_up(conn: Connection, name: str, config: Mapping[str, Any], replicas: int) -> int:
    """Trio: the stream's replica count after raising it to ``replicas`` when it has fewer.

    The update sends the broker's own configuration back with ``num_replicas`` changed, so no
    other field moves. Consumers that follow their stream's count (ours: no ``num_replicas``)
    are scaled with it by the broker.
    """
    have = config.get("num_replicas") or 1
    if have >= replicas:
        return int(have)
    answer = await _api(conn, f"$JS.API.STREAM.UPDATE.{name}", {**config, "num_replicas": replicas})
    await settled(conn, name, replicas)  # a write before the new copies settle goes unanswered
    return int((answer.get("config") or {}).get("num_replicas") or replicas)


async def delete_stream(conn: Connection, name: str) -> bool:
    """Trio: delete the stream and every message in it; False when it did not exist.

    ``deny_delete``/``deny_purge`` do not stop this: they are about messages, not the stream.

    Raises:
        ValueError: a malformed name.
        Unavailable: the broker or JetStream did not answer, or refused.
    """
    try:
        await _api(conn, f"$JS.API.STREAM.DELETE.{_check_name(name)}")
    except StreamNotFound:
        return False
    return True


async def _get(conn: Connection, stream: str, body: Mapping[str, Any]) -> StreamMessage | None:
    return await js_msg_get(conn, _check_name(stream), body)


async def first_message(conn: Connection, stream: str, subject: str) -> StreamMessage | None:
    """Trio: the first message stored on ``subject`` (``next_by_subj`` from sequence 1), or None.

    Raises:
        ValueError: a malformed stream name.
        Unavailable: the stream is missing, or the broker or JetStream did not answer.
    """
    return await _get(conn, stream, {"seq": 1, "next_by_subj": subject})


async def last_message(conn: Connection, stream: str, subject: str) -> StreamMessage | None:
    """Trio: the last message stored on ``subject`` (``last_by_subj``), or None.

    Raises:
        ValueError: a malformed stream name.
        Unavailable: the stream is missing, or the broker or JetStream did not answer.
    """
    return await _get(conn, stream, {"last_by_subj": subject})


def expecting_headers(*, expected_last_subject_seq: int | None, ttl_s: int | None) -> dict[str, str]:
    """Sync: the headers of a :func:`publish_expecting` (for a batch of
    :func:`~cotal_trio.natsio.js_publish_many`): ``Nats-TTL`` and
    ``Nats-Expected-Last-Subject-Sequence``, each only when given.

    Raises:
        ValueError: ``ttl_s`` below 1 or ``expected_last_subject_seq`` below 0.
    """
    headers = _ttl_headers(ttl_s)
    if expected_last_subject_seq is not None:
        if expected_last_subject_seq < 0:
            raise ValueError(f"expected_last_subject_seq must be >= 0, got {expected_last_subject_seq}")
        headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_last_subject_seq)
    return headers


async def publish_expecting(
    conn: Connection, subject: str, data: bytes, *, expected_last_subject_seq: int | None, ttl_s: int | None
) -> int:
    """Trio: a JetStream publish of ``data`` on ``subject``; returns its stream sequence.

    Args:
        expected_last_subject_seq: the subject's last sequence the broker must see (0: the
            subject holds no message), or None for no expectation.
        ttl_s: the message's ``Nats-TTL`` in whole seconds (>= 1), or None.

    Raises:
        SubjectConflict: the subject's last message is not the expected one, or it already holds
            the messages ``discard_new_per_subject`` allows.
        ValueError: ``ttl_s`` or ``expected_last_subject_seq`` out of range.
        Unavailable: no stream takes the subject, it refuses TTLs, or the broker did not answer.
    """
    headers = expecting_headers(expected_last_subject_seq=expected_last_subject_seq, ttl_s=ttl_s)
    try:
        return await js_publish(conn, subject, data, headers)
    except (WrongLastSequence, SubjectFull):
        raise SubjectConflict(subject, expected_last_subject_seq) from None


async def backup_stream(conn: Connection, name: str, folder: Path) -> int:
    """Trio: write the stream's configuration and every message into ``folder``; the count.

    Files (created, never overwritten): ``<name>.config.json``, the configuration as the broker
    reports it, and ``<name>.jsonl``, one JSON object per message in sequence order:
    ``{"seq", "subject", "headers": {name: value}, "data": <base64>, "time"}``. The messages are
    read one request each (``STREAM.MSG.GET`` ``next_by_subj: ">"``), so the stream needs no
    consumer and messages that expire meanwhile are simply not there.

    Raises:
        ConfigError: the stream does not exist, a backup file already exists, or it holds more
            than ``MAX_BACKUP_MESSAGES``.
        Unavailable: the broker or JetStream did not answer.
        OSError: the folder cannot be written.
    """
    config = await stream_config(conn, name)
    if config is None:
        raise ConfigError(f"stream {name} does not exist, so there is nothing to back up")
    lines: list[str] = []
    seq = 1
    while (msg := await _get(conn, name, {"seq": seq, "next_by_subj": ">"})) is not None:
        if len(lines) >= MAX_BACKUP_MESSAGES:
            raise ConfigError(f"stream {name} holds more than {MAX_BACKUP_MESSAGES} messages - back it up with the nats CLI")
        record = {"seq": msg.seq, "subject": msg.subject, "headers": msg.headers,
                  "data": base64.b64encode(msg.data).decode(), "time": msg.time}  # fmt: skip
        lines.append(json.dumps(record, separators=(",", ":")) + "\n")
        seq = msg.seq + 1
    await trio.to_thread.run_sync(_write_backup, folder, name, config, lines)
    return len(lines)


def _write_backup(folder: Path, name: str, config: dict[str, Any], lines: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with (folder / f"{name}.config.json").open("x") as out:
            json.dump(config, out, indent=2, sort_keys=True)
            out.write("\n")
        with (folder / f"{name}.jsonl").open("x") as out:
            out.writelines(lines)
    except FileExistsError as exc:
        raise ConfigError(f"{exc.filename} already exists - back up into an empty folder") from None
