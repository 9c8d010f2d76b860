"""JetStream KV on a :class:`~cotal_trio.natsio.Connection`, seen from trio (DESIGN.md section 8).

Flavours: every public function here is trio-flavoured; the nested ``async def op(js)``
coroutines are asyncio-flavoured and run on the lane's loop through :func:`run_aio` (bounded by
the caller's trio deadline, no ``timeout=`` parameters).

Why not nats-py's ``KeyValue``: it has no TTL on put/update, and it misreads the markers the
server leaves when a bucket has subject delete markers (``Nats-Marker-Reason``): ``get()``
returns a marker as a value and ``create()`` then fails (reference stack-prototype.md section 4
and pitfall 11). So writes are plain JetStream publishes with the KV headers and reads fetch the
last message on the key's subject (``$JS.API.STREAM.MSG.GET.KV_<bucket>`` with
``last_by_subj``, whatever ``allow_direct`` is) and look at its headers themselves; buckets are
made with ``STREAM.INFO``/``CREATE``/``UPDATE``/``DELETE`` requests, at the replica count asked
for (an existing one is scaled up to it, never down). Every call goes through the
request-based JetStream client :mod:`._js` (typed errors: a missing bucket is
:class:`~cotal_trio.natsio.BucketMissing` / :class:`~cotal_trio.natsio.StreamNotFound`). A key
whose last message is a delete, a purge or a server marker is absent.

nats-py internals relied on (nats-py 2.16; re-check on upgrade): ``api.StreamConfig`` for the
bucket's configuration, whose ``as_dict`` converts ``max_age``, ``duplicate_window`` and
``subject_delete_marker_ttl`` from seconds and ``from_response`` back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import trio
from nats.js import api

from cotal_trio.core.errors import AuthServiceError, ConfigError

from ._conn import Connection
from ._js import StreamNameInUse, StreamNotFound, WrongLastSequence, js_api, js_msg_get, js_publish

__all__ = [
    "REPLICAS_RANGE",
    "KeyExists",
    "KvEntry",
    "WrongRevision",
    "check_replicas",
    "delete_bucket",
    "ensure_bucket",
    "kv_create",
    "kv_delete",
    "kv_get",
    "kv_put",
    "kv_update",
    "settled",
]

# KV wire headers (ADR-8, ADR-43).
KV_OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"  # placed by the server itself (MaxAge, Purge, Remove)
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
MSG_TTL = "Nats-TTL"  # whole seconds; nats-server 2.11+
_TOMBSTONE_OPS = frozenset({"DEL", "PURGE"})
# nats-py's KV limits: history is a per-subject message count the server caps at 64.
MAX_HISTORY = 64
# kv_create reads the key again after each conflict; a marker can expire between the read and
# the retry, so a few rounds are allowed before calling it a concurrent creator.
CREATE_ATTEMPTS = 3
# Key and bucket grammars of nats-py's KV (``VALID_KEY_RE``, ``VALID_BUCKET_RE``).
# JetStream's replica counts: a stream keeps 1 to 5 copies (more than 1 needs a cluster).
REPLICAS_RANGE = range(1, 6)
# How long a stream just scaled up may take to elect its leader and bring its new copies current
# (seconds), and how often that is asked (settled()).
SETTLE_S = 10.0
SETTLE_POLL_S = 0.1
_BUCKET_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
_KEY_RE = re.compile(r"^[-/_=\.a-zA-Z0-9]+$")


class KeyExists(AuthServiceError):
    """:func:`kv_create` found a live value under the key (``key`` attribute)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} already has a value")
        self.key = key


class WrongRevision(AuthServiceError):
    """A compare-and-set named a revision that is no longer the key's last (``key`` attribute)."""

    def __init__(self, key: str, revision: int) -> None:
        super().__init__(f"key {key!r} is no longer at revision {revision}")
        self.key = key
        self.revision = revision


@dataclass(frozen=True, slots=True, kw_only=True)
class KvEntry:
    """A live value read from a bucket.

    Attributes:
        key: the key, without the ``$KV.<bucket>.`` prefix.
        value: the stored bytes (possibly empty).
        revision: the stream sequence of the message, the ``last_revision`` for a CAS (>= 1).
    """

    key: str
    value: bytes
    revision: int

    def __post_init__(self) -> None:
        if self.revision < 1:
            raise ValueError(f"KvEntry.revision must be >= 1, got {self.revision}")


@dataclass(frozen=True, slots=True)
class _Last:
    """The last message on a key's subject: live value or tombstone."""

    seq: int
    value: bytes
    live: bool


# -- validation --------------------------------------------------------------------------------


def _stream(bucket: str) -> str:
    if not _BUCKET_RE.match(bucket):
        raise ValueError(f"invalid bucket name {bucket!r}: letters, digits, '_' and '-' only")
    return f"KV_{bucket}"


def _subject(bucket: str, key: str) -> str:
    _stream(bucket)
    if not _KEY_RE.match(key) or key.startswith(".") or key.endswith(".") or ".." in key:
        raise ValueError(f"invalid key {key!r}: letters, digits and -/_=. in non-empty tokens")
    return f"$KV.{bucket}.{key}"


def _ttl_headers(ttl_s: int | None) -> dict[str, str]:
    """The ``Nats-TTL`` header for ``ttl_s`` whole seconds (>= 1), or none."""
    if ttl_s is None:
        return {}
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s < 1:
        # The server rejects "0" (err_code 10165) and the header has 1 s resolution.
        raise ValueError(f"ttl_s must be a whole number of seconds >= 1, got {ttl_s!r}")
    return {MSG_TTL: str(ttl_s)}


# -- the bridge --------------------------------------------------------------------------------


async def _last(conn: Connection, bucket: str, subject: str) -> _Last | None:
    """Trio: the last message on ``subject`` in the bucket's stream, or None when there is none.

    Raises:
        StreamNotFound: the bucket is missing. Unavailable: the broker did not answer.
    """
    msg = await js_msg_get(conn, f"KV_{bucket}", {"last_by_subj": subject})
    if msg is None:
        return None
    headers = {k.lower(): v for k, v in msg.headers.items()}
    tombstone = headers.get(KV_OPERATION.lower()) in _TOMBSTONE_OPS or MARKER_REASON.lower() in headers
    return _Last(seq=msg.seq, value=msg.data, live=not tombstone)


# -- buckets -----------------------------------------------------------------------------------


def check_replicas(replicas: int) -> int:
    """Sync: ``replicas`` when it is a whole number in :data:`REPLICAS_RANGE` (JetStream's 1..5).

    Raises:
        ValueError: anything else.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas not in REPLICAS_RANGE:
        raise ValueError(f"replicas must be a whole number from 1 to 5, got {replicas!r}")
    return replicas



def _bucket_config(
    bucket: str,
    history: int,
    allow_msg_ttl: bool,
    direct: bool,
    max_age_s: float | None,
    marker_ttl_s: int | None,
) -> api.StreamConfig:
    """The KV stream nats-py's ``create_key_value`` would build, with ``allow_msg_ttl`` our own."""
    if not 1 <= history <= MAX_HISTORY:
        raise ValueError(f"history must be 1..{MAX_HISTORY}, got {history}")
    if max_age_s is not None and not max_age_s > 0:
        raise ValueError(f"max_age_s must be > 0 or None, got {max_age_s}")
    if marker_ttl_s is not None and (not isinstance(marker_ttl_s, int) or marker_ttl_s < 1):
        raise ValueError(f"marker_ttl_s must be whole seconds >= 1 or None, got {marker_ttl_s!r}")
    if marker_ttl_s is not None and not allow_msg_ttl:
        raise ValueError("marker_ttl_s needs allow_msg_ttl=True (markers carry a Nats-TTL)")
    return api.StreamConfig(
        name=_stream(bucket),
        subjects=[f"$KV.{bucket}.>"],
        allow_direct=direct,
        allow_rollup_hdrs=False,  # a user allowed one key could otherwise purge every key
        allow_msg_ttl=allow_msg_ttl,
        deny_delete=True,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=min(max_age_s or 120.0, 120.0),
        max_age=max_age_s,
        max_bytes=-1,
        max_consumers=-1,
        max_msg_size=-1,
        max_msgs=-1,
        max_msgs_per_subject=history,
        num_replicas=1,
        storage=api.StorageType.FILE,
        subject_delete_marker_ttl=marker_ttl_s,
    )


def _check_shape(bucket: str, have: api.StreamConfig, want: api.StreamConfig) -> None:
    """Raise ConfigError when an existing stream differs from ``want`` in a way reads rely on."""
    if f"$KV.{bucket}.>" not in (have.subjects or []) or (have.max_msgs_per_subject or 0) < 1:
        raise ConfigError(
            f"stream KV_{bucket} exists but is not a KV bucket; delete it or choose another name."
        )
    for field in ("allow_direct", "allow_msg_ttl"):
        had, wanted = bool(getattr(have, field)), bool(getattr(want, field))
        if had != wanted:
            raise ConfigError(
                f"KV bucket {bucket} exists with {field}={had} where {wanted} is needed;"
                f" delete the bucket (its rows are lost) or recreate it with {field}={wanted}."
            )


async def ensure_bucket(
    conn: Connection,
    bucket: str,
    *,
    history: int = 1,
    allow_msg_ttl: bool = True,
    direct: bool = False,
    max_age_s: float | None = None,
    marker_ttl_s: int | None = None,
    replicas: int = 1,
) -> int:
    """Trio: create the KV bucket ``bucket`` (stream ``KV_<bucket>``) at ``replicas`` copies, or
    verify the existing one and scale it up to ``replicas`` (issue 17 item 1); the bucket's
    replica count now (more than ``replicas`` when it had more: left as it is).

    An existing bucket is accepted when it is a KV stream with the same ``allow_direct`` and
    ``allow_msg_ttl``; other differences (history, max age, marker TTL) are left as they are.
    Rollup headers are refused on every bucket (``allow_rollup_hdrs: false``): a user allowed to
    publish one key could otherwise purge them all with ``Nats-Rollup: all``; an existing bucket
    that allows them is updated in place.
    Idempotent; two concurrent callers both succeed.

    Args:
        history: values kept per key (1..64).
        allow_msg_ttl: allow per-message TTL (``ttl_s`` on writes).
        direct: allow direct get (reads here use ``STREAM.MSG.GET`` either way).
        max_age_s: the bucket-wide max age in seconds, None for none.
        marker_ttl_s: when set, the server leaves a delete marker (``Nats-Marker-Reason``)
            for this many seconds when a key's last value ages out; needs ``allow_msg_ttl``.
        replicas: the copies JetStream keeps (1..5; more than 1 needs a cluster).

    Raises:
        ConfigError: the existing stream differs in a way that matters (the message names it).
        NoPlacement: the broker cannot place ``replicas`` copies (a single node, too few nodes).
        ValueError: an invalid bucket name or option.
        Unavailable: the broker or JetStream did not answer, or refused (server text).
    """
    want = _bucket_config(bucket, history, allow_msg_ttl, direct, max_age_s, marker_ttl_s)
    want.num_replicas = check_replicas(replicas)
    have = await _ensure(conn, want)
    _check_shape(bucket, have, want)
    if (have.num_replicas or 1) >= replicas:
        return have.num_replicas or 1
    have.num_replicas = replicas  # the broker's own configuration back, one field changed
    answer = await js_api(conn, f"$JS.API.STREAM.UPDATE.{want.name}", have.as_dict())
    await settled(conn, want.name, replicas)
    return api.StreamConfig.from_response(answer.get("config") or {}).num_replicas or replicas


async def settled(conn: Connection, stream: str, replicas: int) -> bool:
    """Trio: wait until a stream just scaled to ``replicas`` has a leader and every other copy is
    current (``STREAM.INFO``'s ``cluster``), polled every ``SETTLE_POLL_S`` for at most
    ``SETTLE_S``; True when it did. A publish sent while the new peer set forms goes unanswered
    (measured: 10 s without an ack on a 3-node nats-server 2.15 cluster right after R1 -> R3),
    so the scaling caller waits here before it writes.

    Raises:
        Unavailable: the broker or JetStream did not answer, or refused.
    """
    with trio.move_on_after(SETTLE_S):
        while True:
            cluster = (await js_api(conn, f"$JS.API.STREAM.INFO.{stream}")).get("cluster") or {}
            peers = [p for p in cluster.get("replicas") or [] if isinstance(p, dict)]
            if cluster.get("leader") and len(peers) >= replicas - 1 and all(p.get("current") for p in peers):
                return True
            await trio.sleep(SETTLE_POLL_S)
    return False


async def _ensure(conn: Connection, want: api.StreamConfig) -> api.StreamConfig:
    """Trio: the existing stream's configuration (rollups refused in place), else a new one's."""
    info = f"$JS.API.STREAM.INFO.{want.name}"
    try:
        have = api.StreamConfig.from_response((await js_api(conn, info)).get("config") or {})
        if have.allow_rollup_hdrs:  # made before rollups were refused: tighten it in place
            have.allow_rollup_hdrs = False
            answer = await js_api(conn, f"$JS.API.STREAM.UPDATE.{want.name}", have.as_dict())
            have = api.StreamConfig.from_response(answer.get("config") or {})
        return have
    except StreamNotFound:
        pass
    try:
        answer = await js_api(conn, f"$JS.API.STREAM.CREATE.{want.name}", want.as_dict())
    except StreamNameInUse:  # created meanwhile by someone else
        answer = await js_api(conn, info)
    return api.StreamConfig.from_response(answer.get("config") or {})



async def delete_bucket(conn: Connection, bucket: str) -> None:
    """Trio: delete the bucket and every value in it; a missing bucket is not an error.

    Raises:
        ValueError: an invalid bucket name.
        Unavailable: the broker or JetStream did not answer, or refused.
    """
    stream = _stream(bucket)
    try:
        await js_api(conn, f"$JS.API.STREAM.DELETE.{stream}")
    except StreamNotFound:
        pass



# -- keys --------------------------------------------------------------------------------------


async def kv_get(conn: Connection, bucket: str, key: str) -> KvEntry | None:
    """Trio: the live value of ``key``, or None when it is missing, deleted, purged or expired.

    One request (``STREAM.MSG.GET`` ``last_by_subj``); a delete/purge (``KV-Operation``) or a
    server marker (``Nats-Marker-Reason``) reads as None.

    Raises:
        ValueError: an invalid bucket or key.
        Unavailable: the bucket is missing, or the broker/JetStream did not answer.
    """
    last = await _last(conn, bucket, _subject(bucket, key))
    if last is None or not last.live:
        return None
    return KvEntry(key=key, value=last.value, revision=last.seq)


async def kv_create(
    conn: Connection, bucket: str, key: str, value: bytes, *, ttl_s: int | None = None
) -> int:
    """Trio: store ``value`` under ``key`` only if it has no live value; returns the revision.

    Succeeds when the key is missing or its last message is a delete, purge or server marker:
    the publish expects that message's sequence (``Nats-Expected-Last-Subject-Sequence``, 0 for
    none), so a concurrent creator makes exactly one of us win.

    Args:
        ttl_s: the value expires after this many whole seconds (>= 1), or never.

    Raises:
        KeyExists: the key has a live value (or concurrent writers kept changing it).
        ValueError: an invalid bucket, key or ``ttl_s``.
        Unavailable: the bucket is missing, refuses TTLs, or the broker did not answer.
    """
    subject = _subject(bucket, key)
    headers = _ttl_headers(ttl_s)
    expected = 0
    for _ in range(CREATE_ATTEMPTS):
        expect = {EXPECTED_LAST_SUBJECT_SEQ: str(expected)}
        try:
            return await js_publish(conn, subject, value, headers | expect)
        except WrongLastSequence:
            pass
        last = await _last(conn, bucket, subject)
        if last is not None and last.live:
            raise KeyExists(key)
        expected = 0 if last is None else last.seq
    raise KeyExists(key)


async def kv_update(
    conn: Connection,
    bucket: str,
    key: str,
    value: bytes,
    *,
    last_revision: int,
    ttl_s: int | None = None,
) -> int:
    """Trio: compare-and-set: store ``value`` if ``key`` is still at ``last_revision``.

    Returns the new revision.

    Raises:
        WrongRevision: the key's last message is not ``last_revision`` (changed, deleted, expired).
        ValueError: an invalid bucket, key, ``ttl_s``, or ``last_revision`` < 1.
        Unavailable: the bucket is missing, or the broker did not answer.
    """
    if last_revision < 1:
        raise ValueError(f"last_revision must be >= 1, got {last_revision} (use kv_create)")
    subject = _subject(bucket, key)
    headers = {**_ttl_headers(ttl_s), EXPECTED_LAST_SUBJECT_SEQ: str(last_revision)}
    try:
        return await js_publish(conn, subject, value, headers)
    except WrongLastSequence as exc:
        raise WrongRevision(key, last_revision) from exc


async def kv_put(
    conn: Connection, bucket: str, key: str, value: bytes, *, ttl_s: int | None = None
) -> int:
    """Trio: store ``value`` under ``key`` unconditionally; returns the revision.

    Raises:
        ValueError: an invalid bucket, key or ``ttl_s``.
        Unavailable: the bucket is missing, refuses TTLs, or the broker did not answer.
    """
    return await js_publish(conn, _subject(bucket, key), value, _ttl_headers(ttl_s))


async def kv_delete(
    conn: Connection, bucket: str, key: str, *, last_revision: int | None = None
) -> None:
    """Trio: delete ``key`` (a ``KV-Operation: DEL`` marker); deleting a missing key is fine.

    With ``last_revision``, only if the key is still at that revision.

    Raises:
        WrongRevision: ``last_revision`` was given and is not the key's last message.
        ValueError: an invalid bucket or key, or ``last_revision`` < 1.
        Unavailable: the bucket is missing, or the broker did not answer.
    """
    subject = _subject(bucket, key)
    headers = {KV_OPERATION: "DEL"}
    if last_revision is not None:
        if last_revision < 1:
            raise ValueError(f"last_revision must be >= 1, got {last_revision}")
        headers[EXPECTED_LAST_SUBJECT_SEQ] = str(last_revision)
    try:
        await js_publish(conn, subject, b"", headers)
    except WrongLastSequence as exc:
        raise WrongRevision(key, last_revision or 0) from exc
