"""KV key listing and self-expiring deletes, seen from trio (DESIGN.md section 8).

What the issuance rows (:mod:`cotal_trio.stores.issuance`) need beyond :mod:`._kv`:

* :func:`kv_keys`: the keys under a prefix, for the full service's prune sweep. nats-py's
  ``KeyValue.keys()`` runs a watcher (an ordered consumer); this asks the stream instead
  (``$JS.API.STREAM.INFO.KV_<bucket>`` with ``subjects_filter``, paged by ``offset``): one
  request per 100 000 keys, no consumer.
* :func:`kv_delete_expiring`: a compare-and-set delete whose marker carries a ``Nats-TTL``, so
  the key leaves nothing behind once the marker expires; with ``last_revision=0`` it lands only
  on a key that has no message at all, which fences off a create still in flight on the same
  connection (a stream stores one connection's publishes in order, and that create expects
  sequence 0).
* :func:`is_bucket_missing`: whether a KV error means the bucket's stream does not exist.

Every async function here is trio-flavoured; errors follow :mod:`._kv` (the typed errors of
:mod:`._js`).
"""

from __future__ import annotations

from ._conn import Connection
from ._js import StreamNotFound, WrongLastSequence, js_api, js_publish
from ._kv import EXPECTED_LAST_SUBJECT_SEQ, KV_OPERATION, WrongRevision, _stream, _subject, _ttl_headers

__all__ = ["is_bucket_missing", "kv_delete_expiring", "kv_keys"]


async def kv_keys(conn: Connection, bucket: str, *, prefix: str = "") -> list[str]:
    """Trio: the keys of ``bucket`` that start with ``prefix`` and hold any message, sorted.

    A key whose last message is a delete, a purge or a server marker is listed too (it still
    holds that message); read it with :func:`~cotal_trio.natsio.kv_get` to tell.

    Args:
        prefix: ``""`` for every key, else whole key tokens ending in ``.`` (``"natkey."``).

    Raises:
        ValueError: an invalid bucket, or a prefix that does not end in ``.``.
        Unavailable: the bucket is missing (:func:`is_bucket_missing`), or the broker or
            JetStream did not answer.
    """
    stream = _stream(bucket)
    if prefix and (not prefix.endswith(".") or prefix.startswith(".")):
        raise ValueError(f"prefix must be whole key tokens ending in '.', got {prefix!r}")
    base = f"$KV.{bucket}."
    keys: list[str] = []
    while True:
        page, total = await _subjects_page(conn, stream, f"{base}{prefix}>", offset=len(keys))
        keys.extend(subject[len(base):] for subject in page)
        if not page or len(keys) >= total:
            return sorted(keys)


async def _subjects_page(conn: Connection, stream: str, subjects: str, *, offset: int) -> tuple[list[str], int]:
    """One ``STREAM.INFO`` page: (subjects with a message, total matching subjects)."""
    body = await js_api(conn, f"$JS.API.STREAM.INFO.{stream}", {"subjects_filter": subjects, "offset": offset})
    page = list((body.get("state") or {}).get("subjects") or {})
    return page, int(body.get("total") or len(page))  # "total" only when the server pages


async def kv_delete_expiring(
    conn: Connection, bucket: str, key: str, *, last_revision: int, ttl_s: int
) -> int:
    """Trio: delete ``key`` with a marker that expires after ``ttl_s``; returns its revision.

    Compare-and-set: only if the key's last message is ``last_revision``, where 0 means the key
    has no message at all. Once the marker's TTL ends the key holds no message.

    Raises:
        WrongRevision: the key's last message is not ``last_revision``.
        ValueError: an invalid bucket or key, ``ttl_s`` below 1, or ``last_revision`` below 0.
        Unavailable: the bucket is missing or refuses TTLs, or the broker did not answer.
    """
    if last_revision < 0:
        raise ValueError(f"last_revision must be >= 0, got {last_revision}")
    headers = {KV_OPERATION: "DEL", EXPECTED_LAST_SUBJECT_SEQ: str(last_revision), **_ttl_headers(ttl_s)}
    try:
        return await js_publish(conn, _subject(bucket, key), b"", headers)
    except WrongLastSequence as exc:
        raise WrongRevision(key, last_revision) from exc


def is_bucket_missing(exc: BaseException) -> bool:
    """Sync: True when ``exc``, raised by a natsio KV or stream function, means the bucket (its
    stream) does not exist: a publish no stream answered (:class:`BucketMissing`) or JetStream's
    "stream not found" on a request (:class:`StreamNotFound`, its base). A stream that exists but
    has no leader (:class:`~cotal_trio.natsio.StoreUnreachable`: an election, a lost quorum) is
    not missing: False, so no caller says to create the store.

    Also True for such an error re-raised by a caller ``from`` it (one level of ``__cause__``).
    """
    return isinstance(exc, StreamNotFound) or isinstance(exc.__cause__, StreamNotFound)
