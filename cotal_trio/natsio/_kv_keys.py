"""KV key listing and self-expiring deletes, seen from trio (DESIGN.md section 8).

What the issuance rows (:mod:`cotal_trio.lanes.issuance`) need beyond :mod:`._kv`:

* :func:`kv_keys`: the keys under a prefix, for the full service's prune sweep. nats-py's
  ``KeyValue.keys()`` runs a watcher (an ordered consumer); this asks the stream instead
  (``$JS.API.STREAM.INFO.KV_<bucket>`` with ``subjects_filter``, paged by ``offset``): one
  request per 100 000 keys, no consumer.
* :func:`kv_entries`: the live entries whose keys match a pattern (``natkey.<owner>.<actor>.>``),
  for retiring one principal's issuance rows: one subject-filtered listing, then one read per
  key it lists, a few in flight at once, so the cost is that principal's rows, not the bucket's.
* :func:`kv_delete_expiring`: a compare-and-set delete whose marker carries a ``Nats-TTL``, so
  the key leaves nothing behind once the marker expires; with ``last_revision=0`` it lands only
  on a key that has no message at all, which fences off a create still in flight on the same
  connection (a stream stores one connection's publishes in order, and that create expects
  sequence 0).
* :func:`is_bucket_missing`: whether a KV error means the bucket's stream does not exist.

Every async function here is trio-flavoured; errors follow :mod:`._kv` (``Unavailable`` chained
from nats-py's error).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import nats.js.errors
import trio

from cotal_trio.core.errors import Unavailable

from ._conn import Connection
from ._kv import (
    _STREAM_NOT_FOUND,
    _TOMBSTONE_OPS,
    EXPECTED_LAST_SUBJECT_SEQ,
    KV_OPERATION,
    MARKER_REASON,
    KvEntry,
    WrongRevision,
    _api_text,
    _Conflict,
    _publish,
    _stream,
    _subject,
    _ttl_headers,
)
from ._streams import last_message

__all__ = ["ENTRIES_IN_FLIGHT", "is_bucket_missing", "kv_delete_expiring", "kv_entries", "kv_keys"]

# kv_entries keeps at most this many reads in flight on the connection.
ENTRIES_IN_FLIGHT = 32
# A key pattern's token: a key token (nats-py's key characters, no dot), or a whole-token wildcard.
_PATTERN_TOKEN = re.compile(r"[-/_=a-zA-Z0-9]+|\*")


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


async def kv_entries(conn: Connection, bucket: str, pattern: str) -> list[KvEntry]:
    """Trio: the live entries of ``bucket`` whose keys match ``pattern``, sorted by key.

    One ``STREAM.INFO`` with ``subjects_filter`` ``$KV.<bucket>.<pattern>`` (one page per
    100 000 matching keys) lists the keys that hold a message; each is then read with one
    ``STREAM.MSG.GET`` ``last_by_subj`` (:func:`~cotal_trio.natsio.last_message`: a plain
    request, no nats-py JetStream context), ``ENTRIES_IN_FLIGHT`` at a time. So the requests made
    are ``1 + (keys matching)``, whatever else the bucket holds: the broker does the filtering.
    A key whose last message is a delete, a purge or a server marker is left out.

    Args:
        pattern: a key with NATS wildcards as whole tokens: ``*`` one token, ``>`` (last) one
            or more (``"natkey.u_x.cli.>"``, ``"natkey.*"``).

    Raises:
        ValueError: an invalid bucket or pattern.
        Unavailable: the bucket is missing (:func:`is_bucket_missing`), or the broker or
            JetStream did not answer (the first failed read; the others are cancelled).
    """
    stream = _stream(bucket)
    tokens = pattern.split(".")
    last_ok = tokens[-1] == ">" and len(tokens) > 1
    if not all(_PATTERN_TOKEN.fullmatch(t) for t in (tokens[:-1] if last_ok else tokens)):
        raise ValueError(f"invalid key pattern {pattern!r}: key tokens, '*' tokens, and '>' only as the last token")
    base = f"$KV.{bucket}."
    keys: list[str] = []
    while True:
        page, total = await _subjects_page(conn, stream, base + pattern, offset=len(keys))
        keys.extend(subject[len(base):] for subject in page)
        if not page or len(keys) >= total:
            break
    keys.sort()
    found: dict[str, KvEntry] = {}
    failed: list[Unavailable] = []
    todo = iter(keys)

    async def reader(scope: trio.CancelScope, todo: Iterator[str]) -> None:
        for key in todo:  # the workers share one iterator: each key is read once
            try:
                last = await last_message(conn, stream, base + key)
            except Unavailable as exc:
                failed.append(exc)
                scope.cancel()
                return
            if last is not None and not _tombstone(last.headers):
                found[key] = KvEntry(key=key, value=last.data, revision=last.seq)

    async with trio.open_nursery() as nursery:
        for _ in range(min(ENTRIES_IN_FLIGHT, len(keys))):
            nursery.start_soon(reader, nursery.cancel_scope, todo)
    if failed:
        raise failed[0]
    return [found[key] for key in keys if key in found]


def _tombstone(headers: dict[str, str]) -> bool:
    """A delete, a purge or a server marker (as :mod:`._kv` reads them): no live value."""
    names = {name.lower(): value for name, value in headers.items()}
    return names.get(KV_OPERATION.lower()) in _TOMBSTONE_OPS or MARKER_REASON.lower() in names


async def _subjects_page(conn: Connection, stream: str, subjects: str, *, offset: int) -> tuple[list[str], int]:
    """One ``STREAM.INFO`` page: (subjects with a message, total matching subjects)."""
    what = f"list subjects {subjects}"
    request = json.dumps({"subjects_filter": subjects, "offset": offset}).encode()
    body = json.loads((await conn.request(f"$JS.API.STREAM.INFO.{stream}", request)).data)
    if body.get("error"):
        try:
            nats.js.errors.APIError.from_error(body["error"])  # raises the typed error
        except nats.js.errors.APIError as exc:
            raise Unavailable(f"{what}: {_api_text(exc)}") from exc
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
        return await _publish(conn, _subject(bucket, key), b"", headers)
    except _Conflict as exc:
        raise WrongRevision(key, last_revision) from exc.__cause__


def is_bucket_missing(exc: BaseException) -> bool:
    """Sync: True when ``exc``, raised by a natsio KV function, means the bucket does not exist.

    That is a publish no stream answered (nats-py's ``NoStreamResponseError``) or JetStream's
    "stream not found" (err_code 10059) on a read.
    """
    cause = exc.__cause__
    return isinstance(cause, nats.js.errors.NoStreamResponseError) or getattr(cause, "err_code", None) == _STREAM_NOT_FOUND
