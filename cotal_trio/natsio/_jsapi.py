"""JetStream consumers, seen from trio: create a durable with its filter pinned, read it, pull, ack.

What the space's wire layout (:mod:`cotal_trio.stores.streams`, issue 6 items 1-2) needs beyond
:mod:`._streams`: the provisioner pre-creates bind-only durables, and a principal binds one (its
info, its pull requests, its acks) without ever creating or deleting a consumer.

* :func:`ensure_consumer` creates a durable with ``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``,
  the one create form whose subject carries the filter (the broker refuses a body whose filter
  differs, err_code 10131), so a grant on that subject pins the filter; an existing durable with
  another configuration is refused (:class:`ConsumerDrift`), never changed.
* :func:`consumer_info`, :func:`consumer_names`.
* :func:`pull_next` (one ``CONSUMER.MSG.NEXT`` request) and :func:`ack`.

Every call is a JetStream API request made with :meth:`Connection.request` (JSON bodies, no
nats-py JetStream context), so the connection's permissions decide what it reaches; a request
its permissions refuse gets no answer (the broker reports a permissions violation on the
connection) and waits out the caller's deadline or natsio's 10 s cap. Every async function here
is trio-flavoured and a checkpoint. Errors: the JetStream client's typed errors (:mod:`._js`, all
:class:`~cotal_trio.core.errors.Unavailable`), ``ValueError`` for a malformed name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import trio

from cotal_trio.core.errors import ConfigError, Unavailable

from ._conn import Connection, Message
from ._js import ConsumerExists, ConsumerNotFound
from ._js import js_api as _api

__all__ = ["ConsumerDrift", "ack", "consumer_info", "consumer_names", "ensure_consumer", "pull_next"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")
# A pull request's status answers (nats-server): no message now (404), request expired (408).
_NO_MESSAGES = frozenset({"404", "408"})
# The broker answers a pull at its expiry at the latest; this much more is allowed. Seconds.
PULL_SLACK_S = 1.0
# Bound on removing a pull's inbox subscription in its cleanup. Seconds.
_UNSUBSCRIBE_S = 2.0


class ConsumerDrift(ConfigError):
    """An existing durable's configuration differs from the one asked for.

    Attributes:
        stream, name: the durable.
        differences: one ``"<field> is <have>, not <want>"`` per differing field.
    """

    def __init__(self, stream: str, name: str, differences: tuple[str, ...]) -> None:
        super().__init__(
            f"consumer {name} on stream {stream} exists with another configuration: {'; '.join(differences)}"
            " - delete it (its position is lost) and provision again"
        )
        self.stream = stream
        self.name = name
        self.differences = differences


def _check(name: str, what: str) -> str:
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ValueError(f"invalid {what} {name!r}: letters, digits, '_' and '-' only")
    return name


# Fields a bind-only pull durable must not carry, whatever the caller sent: a deliver subject
# would push the inbox elsewhere, more filters widen it, headers_only hides the bodies.
_FORBIDDEN = ("deliver_subject", "deliver_group", "filter_subjects", "headers_only", "inactive_threshold")


def _drift(have: Mapping[str, Any], want: Mapping[str, Any]) -> tuple[str, ...]:
    differences = [
        f"{field} is {json.dumps(have.get(field))}, not {json.dumps(value)}"
        for field, value in want.items()
        if have.get(field) != value
    ]
    differences += [f"{field} is {json.dumps(have[field])}, not unset" for field in _FORBIDDEN if have.get(field)]
    return tuple(differences)


async def consumer_info(conn: Connection, stream: str, name: str) -> dict[str, Any] | None:
    """Trio: the consumer's ``CONSUMER.INFO`` answer, or None when it does not exist.

    Raises:
        ValueError: a malformed name.
        Unavailable: the stream is missing, or the broker or JetStream did not answer.
    """
    subject = f"$JS.API.CONSUMER.INFO.{_check(stream, 'stream name')}.{_check(name, 'consumer name')}"
    try:
        return await _api(conn, subject)
    except ConsumerNotFound:
        return None


async def consumer_names(conn: Connection, stream: str) -> list[str]:
    """Trio: the names of the stream's consumers (``CONSUMER.NAMES``, first page of 1024), sorted.

    Raises:
        ValueError: a malformed stream name.
        Unavailable: the stream is missing, or the broker or JetStream did not answer.
    """
    answer = await _api(conn, f"$JS.API.CONSUMER.NAMES.{_check(stream, 'stream name')}", {"offset": 0})
    return sorted(answer.get("consumers") or [])


async def ensure_consumer(
    conn: Connection, stream: str, name: str, filter_subject: str, config: Mapping[str, Any]
) -> dict[str, Any]:
    """Trio: create the durable ``name`` on ``stream`` filtered to ``filter_subject``, or verify it.

    ``config`` holds the other fields (``ack_policy``, ``deliver_policy``, ...); ``name``,
    ``durable_name`` and ``filter_subject`` are set here. Idempotent: the broker answers an
    identical create with the existing consumer. Returns the consumer's configuration.

    Raises:
        ConsumerDrift: the durable exists with another configuration (it is left as it is).
        ValueError: a malformed stream or consumer name.
        Unavailable: the stream is missing, or the broker or JetStream did not answer, or refused.
    """
    want = {**config, "name": _check(name, "consumer name"), "durable_name": name, "filter_subject": filter_subject}
    subject = f"$JS.API.CONSUMER.CREATE.{_check(stream, 'stream name')}.{name}.{filter_subject}"
    try:
        answer = await _api(conn, subject, {"stream_name": stream, "config": want, "action": "create"})
    except ConsumerExists:  # action "create" on an existing consumer with another configuration
        answer = await consumer_info(conn, stream, name) or {}
    have = dict(answer.get("config") or {})
    differences = _drift(have, want)
    if differences:
        raise ConsumerDrift(stream, name, differences)
    return have


async def pull_next(conn: Connection, stream: str, name: str, *, expires_s: float) -> Message | None:
    """Trio: one ``CONSUMER.MSG.NEXT`` (batch 1) on a pull consumer: the next message, or None
    when none arrived within ``expires_s`` seconds (the broker's 404/408 status answer).

    The broker delivers the message to the request's reply inbox but under the message's own
    subject, so it comes in on a subscription of its own (one fresh inbox under the
    connection's inbox prefix, removed before returning), not through :meth:`Connection.request`.
    The message's ``reply`` is its ack subject (:func:`ack`). Bounded by the caller's deadline;
    a delivery that arrives after the wait is redelivered once its ack wait passes.

    Raises:
        ValueError: a malformed name, or ``expires_s`` not above 0.
        Unavailable: the consumer or stream is missing (the broker's error status), no answer
            within ``expires_s`` + ``PULL_SLACK_S`` (a refused request gets none), or the
            connection is closed.
    """
    if not expires_s > 0:
        raise ValueError(f"expires_s must be > 0, got {expires_s}")
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{_check(stream, 'stream name')}.{_check(name, 'consumer name')}"
    inbox = conn._nc.new_inbox()
    arrived: list[Message] = []
    answered = trio.Event()

    def on_message(msg: Message) -> None:
        arrived.append(msg)
        answered.set()

    sub = await conn.subscribe(inbox, on_message=on_message)
    try:
        conn.publish_nowait(subject, json.dumps({"batch": 1, "expires": int(expires_s * 1e9)}).encode(), reply=inbox)
        with trio.move_on_after(expires_s + PULL_SLACK_S):
            await answered.wait()
    finally:
        with trio.move_on_after(_UNSUBSCRIBE_S, shield=True):
            await sub.unsubscribe()
    if not arrived:
        raise Unavailable(f"pull from {name} on {stream}: no answer within {expires_s + PULL_SLACK_S:g} s")
    msg = arrived[0]
    status = (msg.headers or {}).get("Status")
    if status in _NO_MESSAGES:
        return None
    if status is not None:
        description = (msg.headers or {}).get("Description", "")
        raise Unavailable(f"pull from {name} on {stream}: status {status} {description}".rstrip())
    return msg


async def ack(conn: Connection, msg: Message) -> None:
    """Trio: acknowledge ``msg`` (a :func:`pull_next` delivery) on its ack subject.

    Raises:
        ValueError: the message has no ack subject.
        Unavailable: the connection is closed.
    """
    if not msg.reply:
        raise ValueError("the message has no ack subject (not a JetStream delivery)")
    await conn.publish(msg.reply, b"+ACK")
