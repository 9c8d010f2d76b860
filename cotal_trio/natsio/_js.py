"""The one request-based JetStream client of natsio: API requests, publishes, typed errors.

Every JetStream call of natsio (:mod:`._kv`, :mod:`._kv_keys`, :mod:`._streams`, :mod:`._jsapi`)
goes through here, as plain requests on a :class:`~cotal_trio.natsio.Connection` (JSON bodies,
no nats-py ``JetStreamContext``), so a connection's permissions decide what it reaches and one
connection's requests leave in the order they were made.

* :func:`js_api`: one ``$JS.API`` request, its JSON answer.
* :func:`js_msg_get`: one stored message by ``$JS.API.STREAM.MSG.GET`` (so it works whatever
  ``allow_direct`` is), or None when there is none (err_code 10037).
* :func:`js_publish` / :func:`js_publish_many`: JetStream publishes, acknowledged in JetStream's
  JSON (``{"seq": n}``); ``js_publish_many`` sends a batch in one socket write and awaits the
  acks together (:meth:`~cotal_trio.natsio.Connection.request_many`), one round trip for the lot.

Errors (issue 14 item 3, issue 16): the broker's answers become typed errors in ONE place, the
table :data:`ERRORS` keyed by JetStream's ``err_code`` (nats-server errors.json), plus the four
rows of answers that carry no code. Callers catch the type and never read ``err_code`` or
``exc.__cause__``. Every one is an :class:`~cotal_trio.core.errors.Unavailable` except
:class:`WrongLastSequence` (the caller's compare-and-set lost, which is not the broker's fault);
a :class:`JetStreamError` carries ``err_code`` (None when the broker sent none) and is chained
``from`` nats-py's typed ``APIError`` for the log. This docstring's table is the code's table
(tests/natsio/test_js_live.py compares them):

========  ======================  ====================================================================
err_code  raised                  the broker's answer
========  ======================  ====================================================================
10005     NoPlacement             no suitable peers for placement (more replicas than the cluster can place)
10014     ConsumerNotFound        consumer not found (``CONSUMER.INFO`` of a durable that is not there)
10037     NoMessageFound          no message found (``STREAM.MSG.GET``: :func:`js_msg_get` answers None)
10058     StreamNameInUse         stream name already in use with a different configuration
10059     StreamNotFound          stream not found
10071     WrongLastSequence       wrong last sequence: the subject's last sequence is not the expected
10074     NoPlacement             replicas > 1 not supported in non-clustered mode (a single node)
10077     SubjectFull             maximum messages per subject exceeded (``discard_new_per_subject``)
10148     ConsumerExists          consumer already exists (action ``create``, another configuration)
10164     WrongLastSequence       wrong last sequence (the constant form of 10071)
other     JetStreamError          any other refusal, with the server's text
none      BucketMissing           a publish reached no stream (503) and no stream takes its subject
none      StoreUnreachable        a publish reached no stream, yet its stream exists (no leader)
none      Unavailable             no answer (no JetStream responder included), or not JSON
========  ======================  ====================================================================

A publish no stream took (the broker's 503 "no responders" to a ``$KV.`` or stream subject) is
:class:`BucketMissing` (a :class:`StreamNotFound`) when the stream does not exist. A clustered
stream without a leader (an election, a lost quorum) gets no responders too, so in that error
path only one more request asks (:func:`_no_stream`, bounded by :data:`PROBE_S`):
``$JS.API.STREAM.INFO.KV_<bucket>`` for a ``$KV.`` subject, else ``$JS.API.STREAM.NAMES``
filtered by the subject. A stream that exists (or any answer but 10059 / no stream) is
:class:`StoreUnreachable`, and so is a probe that gets no answer in time (a cluster that lost
quorum answers neither).

nats-py internals relied on (nats-py 2.16): ``nats.js.errors.APIError.from_error(error)`` raises
the typed error of a JetStream error object (it only builds the exception, for the chain).

Every async function here is trio-flavoured and a checkpoint, bounded by the caller's deadline
(or natsio's 10 s cap).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import nats.js.errors
import trio

from cotal_trio.core.errors import AuthServiceError, Unavailable

from ._conn import Connection, Message, NoResponders

__all__ = [
    "ERRORS",
    "BucketMissing",
    "ConsumerExists",
    "ConsumerNotFound",
    "JetStreamError",
    "NoMessageFound",
    "NoPlacement",
    "StreamNameInUse",
    "StreamMessage",
    "StoreUnreachable",
    "StreamNotFound",
    "SubjectFull",
    "WrongLastSequence",
    "js_api",
    "js_msg_get",
    "js_publish",
    "js_publish_many",
    "js_publishes_sent",
]

Publish = tuple[str, bytes, Mapping[str, str] | None]
"""One JetStream publish of :func:`js_publish_many`: ``(subject, data, headers or None)``."""


class JetStreamError(Unavailable):
    """JetStream refused a request; ``err_code`` is the server's (nats-server errors.json)."""

    def __init__(self, message: str, err_code: int | None = None) -> None:
        super().__init__(message)
        self.err_code = err_code


class StreamNotFound(JetStreamError):
    """The stream the request names does not exist (err_code 10059)."""


class StreamNameInUse(JetStreamError):
    """A ``STREAM.CREATE`` named a stream that exists with another configuration (err_code 10058):
    a concurrent creator made it first."""


class ConsumerNotFound(JetStreamError):
    """The consumer the request names does not exist on its stream (err_code 10014)."""


class ConsumerExists(JetStreamError):
    """A ``CONSUMER.CREATE`` with action ``create`` named a durable that exists with another
    configuration (err_code 10148)."""


class NoMessageFound(JetStreamError):
    """A ``STREAM.MSG.GET`` found no message to give (err_code 10037); :func:`js_msg_get`
    answers None for it."""


class NoPlacement(JetStreamError):
    """A ``STREAM.CREATE``/``UPDATE`` asked for more replicas than the broker can place: a single
    node refuses any count above 1 (err_code 10074), a cluster one above its nodes (err_code
    10005, measured on nats-server 2.15; a node that is down counts as missing too)."""


class BucketMissing(StreamNotFound):
    """No stream takes the subject a publish was sent on: the KV bucket (or stream) is missing."""


class StoreUnreachable(Unavailable):
    """No stream answered a publish, yet the stream that takes the subject exists: it has no leader
    (JetStream is electing one, or has lost quorum). Not a missing store: nothing to create."""


class SubjectFull(JetStreamError):
    """The subject already holds all the messages its ``discard_new_per_subject`` stream allows
    (err_code 10077): a write-once row that is written."""


class WrongLastSequence(AuthServiceError):
    """A publish's expectation failed: the subject's last message is not the expected one
    (err_code 10071/10164).

    Attributes:
        subject: the subject published on (None for an API request).
        err_code: the server's code.
    """

    def __init__(self, message: str, err_code: int | None = None, subject: str | None = None) -> None:
        super().__init__(message)
        self.err_code = err_code
        self.subject = subject


# The one table from JetStream's err_code to our error type (the module docstring's table, in
# its order); other codes are JetStreamError.
ERRORS: Mapping[int, type[JetStreamError] | type[WrongLastSequence]] = MappingProxyType({
    10005: NoPlacement,
    10014: ConsumerNotFound,
    10037: NoMessageFound,
    10058: StreamNameInUse,
    10059: StreamNotFound,
    10071: WrongLastSequence,
    10074: NoPlacement,
    10077: SubjectFull,
    10148: ConsumerExists,
    10164: WrongLastSequence,
})  # fmt: skip


# How long the one STREAM.INFO/NAMES request of a no-responders publish may take (seconds). A
# stream whose cluster has lost quorum gets no answer to STREAM.INFO either (measured on a 3-node
# nats-server cluster with two nodes killed), so no answer in time reads unreachable; a leader
# answers in milliseconds. Every natsio user that publishes is allowed the probe (a callout
# replica's store user: lane/service_users.py, lane/callout/authority.py).
PROBE_S = 0.5

UNREACHABLE = "the store is unreachable: no stream leader - JetStream is electing or has lost quorum"


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamMessage:
    """One stored message read back.

    Attributes:
        seq: its stream sequence (>= 1).
        subject: the subject it was published to.
        headers: its headers (names as stored), empty when it had none.
        data: its payload.
        time: the broker's RFC 3339 timestamp of the store.
    """

    seq: int
    subject: str
    headers: dict[str, str]
    data: bytes
    time: str


def _api_text(exc: nats.js.errors.APIError) -> str:
    if exc.description:
        return f"{exc.description} (err_code {exc.err_code})"
    if isinstance(exc, nats.js.errors.ServiceUnavailableError):
        return "no JetStream responder (JetStream off for this account?)"
    return str(exc)


def _refusal(what: str, error: Any, subject: str | None = None) -> Exception:
    """The typed error for JetStream's ``{"error": {...}}`` object, chained from nats-py's."""
    try:
        nats.js.errors.APIError.from_error(error)  # raises the matching subclass
    except nats.js.errors.APIError as api_error:
        cause = api_error
    except (KeyError, TypeError, AttributeError):  # not the error object JetStream sends
        cause = nats.js.errors.APIError(description=str(error)[:200])
    code = cause.err_code if isinstance(cause.err_code, int) else None
    kind = ERRORS.get(code, JetStreamError) if code is not None else JetStreamError
    text = f"{what}: {_api_text(cause)}"
    exc = kind(text, code, subject) if kind is WrongLastSequence else kind(text, code)  # type: ignore[call-arg]
    exc.__cause__ = cause
    return exc


def _json(what: str, reply: Message) -> dict[str, Any]:
    try:
        answer = json.loads(reply.data)
    except ValueError:
        raise Unavailable(f"{what}: JetStream answered something that is not JSON: {reply.data[:200]!r}") from None
    if not isinstance(answer, dict):
        raise Unavailable(f"{what}: JetStream answered something that is not an object")
    return answer


async def js_api(conn: Connection, subject: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Trio: one JetStream API request (``$JS.API.…``); its JSON answer (an object).

    Raises:
        StreamNotFound, JetStreamError, WrongLastSequence: JetStream refused it (:data:`ERRORS`).
        Unavailable: no answer (no JetStream responder included), or one that is not JSON.
    """
    what = f"request {subject}"
    payload = b"" if body is None else json.dumps(body).encode()
    try:
        reply = await conn.request(subject, payload)
    except NoResponders as exc:
        raise Unavailable(f"{what}: no JetStream responder (JetStream off for this account?)") from exc
    answer = _json(what, reply)
    if answer.get("error"):
        raise _refusal(what, answer["error"])
    return answer


def _ack(subject: str, reply: Message | Unavailable) -> int | Exception:
    """A publish's stored sequence, or the typed error its answer means."""
    what = f"publish {subject}"
    if isinstance(reply, NoResponders):
        no_stream = nats.js.errors.NoStreamResponseError()
        missing = BucketMissing(f"{what}: {no_stream} (no stream takes the subject)")
        missing.__cause__ = no_stream
        return missing
    if isinstance(reply, Exception):
        return reply
    try:
        ack = _json(what, reply)
        if "error" in ack:
            return _refusal(what, ack["error"], subject)
        return int(ack["seq"])
    except Unavailable as exc:
        return exc
    except (KeyError, TypeError, ValueError):
        return Unavailable(f"{what}: JetStream answered something that is not an ack: {reply.data[:200]!r}")


def _probe_of(subject: str) -> tuple[str, dict[str, Any] | None]:
    """The one request that tells whether a stream takes ``subject``."""
    parts = subject.split(".")
    if len(parts) >= 3 and parts[0] == "$KV" and parts[1]:
        return f"$JS.API.STREAM.INFO.KV_{parts[1]}", None
    return "$JS.API.STREAM.NAMES", {"subject": subject}


async def _no_stream(conn: Connection, subject: str, missing: BucketMissing) -> Exception:
    """Trio: a no-responders publish's error: ``missing`` when the stream does not exist, else
    :class:`StoreUnreachable` (module docstring)."""
    probe, body = _probe_of(subject)
    with trio.move_on_after(PROBE_S):
        try:
            answer = await js_api(conn, probe, body)
        except StreamNotFound:
            return missing
        except NoResponders as exc:  # JetStream itself did not answer: nothing here to create
            return _unreachable(subject, f"{probe} reached no JetStream responder", exc)
        except JetStreamError as exc:  # e.g. 10008, JetStream not available in the cluster
            return _unreachable(subject, str(exc), exc)
        except Unavailable as exc:  # no answer within natsio's cap, or not JSON: it could not tell
            return _unreachable(subject, str(exc), exc)
        if body is not None and not answer.get("streams"):
            return missing  # no stream takes the subject
        return _unreachable(subject, f"{probe} says the stream exists", None)
    return _unreachable(subject, f"{probe} did not answer within {PROBE_S:g} s either", None)


def _unreachable(subject: str, detail: str, cause: Exception | None) -> StoreUnreachable:
    exc = StoreUnreachable(f"publish {subject}: {UNREACHABLE} (no stream answered; {detail})")
    exc.__cause__ = cause
    return exc


async def _resolved(conn: Connection, subjects: Sequence[str], outcomes: list[int | Exception]) -> list[int | Exception]:
    """``outcomes`` with each no-responders :class:`BucketMissing` told apart (one probe per stream)."""
    seen: dict[tuple[str, str], Exception] = {}
    resolved = []
    for subject, outcome in zip(subjects, outcomes, strict=True):
        if type(outcome) is BucketMissing:
            probe, body = _probe_of(subject)
            key = (probe, "" if body is None else subject)
            if key not in seen:
                seen[key] = await _no_stream(conn, subject, outcome)
            # missing: this publish's own error (its subject); unreachable: the stream's one answer
            outcome = outcome if isinstance(seen[key], BucketMissing) else seen[key]
        resolved.append(outcome)
    return resolved


async def js_publish(conn: Connection, subject: str, data: bytes, headers: Mapping[str, str] | None = None) -> int:
    """Trio: one JetStream publish; its stream sequence.

    Sent with :meth:`Connection.request`: it leaves at once, in call order, and a caller's
    deadline cancels only the wait for the ack, with nothing left to settle on the asyncio side.

    Raises:
        WrongLastSequence: an expectation header failed (``Nats-Expected-Last-Subject-Sequence``).
        BucketMissing: no stream takes ``subject`` (told by one more request: module docstring).
        StoreUnreachable: no stream answered, but the stream exists (no leader).
        JetStreamError, Unavailable: any other refusal, or no answer.
    """
    try:
        reply: Message | Unavailable = await conn.request(subject, data, headers)
    except NoResponders as exc:
        reply = exc
    [outcome] = await _resolved(conn, [subject], [_ack(subject, reply)])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


async def js_publish_many(conn: Connection, publishes: Sequence[Publish]) -> list[int | Exception]:
    """Trio: JetStream publishes sent together (one socket write) and acknowledged together.

    The publishes leave in order; publishes on one stream are stored in that order. Each entry of
    the result is that publish's sequence, or the error :func:`js_publish` would have raised for
    it (nothing is raised for one publish's refusal: the caller decides what the lot means).

    Raises:
        Unavailable: the connection is closed before anything was sent.
        ValueError: a malformed subject or header.
    """
    replies = await conn.request_many(publishes)
    subjects = [subject for subject, _, _ in publishes]
    return await _resolved(conn, subjects, [_ack(subject, reply) for subject, reply in zip(subjects, replies, strict=True)])


@asynccontextmanager
async def js_publishes_sent(
    conn: Connection, publishes: Sequence[Publish]
) -> AsyncIterator[Callable[[], Awaitable[list[int | Exception]]]]:
    """Trio: :func:`js_publish_many` in two halves (:meth:`Connection.requests_sent`): the
    publishes are handed over on entry, and ``await acks()`` inside the block gives their
    outcomes as :func:`js_publish_many` does. Writes on another connection inside the block
    leave in the same scheduler pass: one round trip for both.

    Raises:
        As :func:`js_publish_many`, on entry.
    """
    async with conn.requests_sent(publishes) as replies:

        async def acks() -> list[int | Exception]:
            answered = await replies()
            subjects = [subject for subject, _, _ in publishes]
            return await _resolved(
                conn, subjects, [_ack(subject, reply) for subject, reply in zip(subjects, answered, strict=True)]
            )

        yield acks


def _headers(hdrs: str | None) -> dict[str, str]:
    """The headers of a ``STREAM.MSG.GET`` answer (base64 of ``NATS/1.0\\r\\nName: value...``)."""
    if not hdrs:
        return {}
    lines = base64.b64decode(hdrs).decode("utf-8", "replace").split("\r\n")[1:]
    pairs = (line.split(":", 1) for line in lines if ":" in line)
    return {name.strip(): value.strip() for name, value in pairs}


async def js_msg_get(conn: Connection, stream: str, body: Mapping[str, Any]) -> StreamMessage | None:
    """Trio: one ``$JS.API.STREAM.MSG.GET.<stream>`` (``body``: ``{"last_by_subj": s}``,
    ``{"seq": n, "next_by_subj": s}``, ...); the message, or None when there is none.

    Raises:
        StreamNotFound: the stream does not exist.
        JetStreamError, Unavailable: another refusal, no answer, or an answer without a message.
    """
    try:
        answer = await js_api(conn, f"$JS.API.STREAM.MSG.GET.{stream}", body)
    except NoMessageFound:
        return None
    msg = answer.get("message") or {}
    try:
        return StreamMessage(
            seq=int(msg["seq"]), subject=str(msg["subject"]), headers=_headers(msg.get("hdrs")),
            data=base64.b64decode(msg.get("data") or ""), time=str(msg.get("time", "")),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise Unavailable(f"get from {stream}: JetStream answered a message without seq or subject") from exc
