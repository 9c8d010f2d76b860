"""natsio: nats-py under trio-asyncio, the only asyncio-flavoured package (DESIGN.md section 3).

Beside it, :func:`open_native_connection` (``_native.py``) speaks the NATS client protocol on
trio sockets, with no asyncio and no ``open_loop``: the callout lane's hot path (its callout,
store and issuer connections on ``nats://`` seeds, issue 14). It offers the calls of
:class:`Connection` that the lane and the JetStream client use (``subscribe``, ``publish``,
``publish_nowait``, ``request``, ``request_many``, ``requests_sent``, ``flush``, ``closed``).

Everything exported here is trio-flavoured: callers never see asyncio, nats-py or trio-asyncio
types, and each function's docstring states its flavour ("sync" for the few plain calls).

Usage, one lane::

    async with open_loop(), open_connection(url, creds=text) as conn:
        send, receive = trio.open_memory_channel(64)
        sub = await conn.subscribe(subject, queue="callout", on_message=send_nowait_or_shed)
        await conn.flush()
        ...
        conn.publish_nowait(msg.reply, answer)      # reply path: no bridge crossing

How a call crosses the bridge (every async method of :class:`Connection`):

* The nats-py coroutine runs as an asyncio task on the lane's loop, started by a synchronous
  call; trio waits on a ``trio.Event`` set by the task's done-callback. Trio never awaits an
  asyncio future through ``aio_as_trio``: cancelling such an await crashed trio-asyncio 0.16
  with ``TrioInternalError`` (reference nats-operator-mode.md pitfall P12).
* The asyncio side is bounded by the caller's trio deadline (``current_effective_deadline() -
  current_time()``), capped at 10 s (5 s for connect) when there is none or it is later. nats-py
  gets that bound as its own ``timeout``. There are no ``timeout=`` parameters (STYLE 12).
* If the caller's deadline is what expires, the caller sees its own cancellation (``Cancelled``
  caught by its ``move_on_after``, or ``TooSlowError`` from ``fail_after``). If the cap expires,
  :class:`~cotal_trio.core.errors.Unavailable` is raised.
* If the caller is cancelled, the asyncio task is cancelled and its end awaited in a shielded,
  bounded scope, so no asyncio work outlives the call; then ``Cancelled`` propagates.
* nats-py errors become ``Unavailable`` (broker's fault) or ``ValueError`` (a malformed subject,
  header or payload: our bug), chained ``from`` the original (STYLE 19); JetStream's answers
  become the typed errors of the one table in ``_js.py`` (:data:`ERRORS`), which callers catch
  by type.
* Subscriptions use nats-py callbacks that call ``on_message`` synchronously; never
  ``async for`` over ``aio_as_trio(sub.messages)``. ``error_cb``/``closed_cb`` become
  :attr:`Connection.last_error` and the :attr:`Connection.closed` event; logs go to the
  ``cotal.natsio`` logger.
* Connections are built with ``nats.aio.client.Client()`` (``nats.connect()`` leaks the socket
  of a refused connect) and closed in a shielded, bounded ``finally`` inside the lane's loop.
"""

from ._conn import Connection, Message, NoResponders, Subscription, open_connection
from ._native import (
    CalloutConnection,
    NativeConnection,
    NativeStatistics,
    NativeSubscription,
    open_native_connection,
    speaks_native,
)
from ._js import (
    ERRORS,
    Publish,
    BucketMissing,
    ConsumerExists,
    ConsumerNotFound,
    JetStreamError,
    NoMessageFound,
    NoPlacement,
    StreamNameInUse,
    StoreUnreachable,
    StreamNotFound,
    SubjectFull,
    WrongLastSequence,
    js_api,
    js_msg_get,
    js_publish,
    js_publish_many,
    js_publishes_sent,
)
from ._jsapi import ConsumerDrift, ack, consumer_info, consumer_names, ensure_consumer, pull_next
from ._kv import (
    REPLICAS_RANGE,
    KeyExists,
    KvEntry,
    WrongRevision,
    check_replicas,
    delete_bucket,
    ensure_bucket,
    kv_create,
    kv_delete,
    kv_get,
    kv_put,
    kv_update,
)
from ._kv_keys import is_bucket_missing, kv_delete_expiring, kv_keys
from ._kv_scan import ENTRIES_IN_FLIGHT, kv_entries
from ._loop import open_loop
from ._js import StreamMessage
from ._streams import (
    StreamDrift,
    StreamShape,
    SubjectConflict,
    backup_stream,
    delete_stream,
    ensure_stream,
    expecting_headers,
    first_message,
    last_message,
    publish_expecting,
    stream_config,
)

__all__ = [
    "ERRORS",
    "Publish",
    "BucketMissing",
    "ConsumerExists",
    "ConsumerNotFound",
    "JetStreamError",
    "NoMessageFound",
    "NoPlacement",
    "StreamNameInUse",
    "StoreUnreachable",
    "StreamNotFound",
    "SubjectFull",
    "WrongLastSequence",
    "js_api",
    "js_msg_get",
    "js_publish",
    "js_publish_many",
    "js_publishes_sent",
    "CalloutConnection",
    "Connection",
    "NativeConnection",
    "NativeStatistics",
    "NativeSubscription",
    "open_native_connection",
    "speaks_native",
    "KeyExists",
    "KvEntry",
    "Message",
    "NoResponders",
    "Subscription",
    "WrongRevision",
    "REPLICAS_RANGE",
    "check_replicas",
    "delete_bucket",
    "ensure_bucket",
    "is_bucket_missing",
    "kv_create",
    "kv_delete",
    "kv_delete_expiring",
    "ENTRIES_IN_FLIGHT",
    "kv_entries",
    "kv_get",
    "kv_keys",
    "kv_put",
    "kv_update",
    "open_connection",
    "open_loop",
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
    "ConsumerDrift",
    "ack",
    "consumer_info",
    "consumer_names",
    "ensure_consumer",
    "pull_next",
]
