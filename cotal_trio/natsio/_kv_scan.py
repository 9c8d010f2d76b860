"""One filtered read of a KV bucket, seen from trio (DESIGN.md section 8; issue 15 item 1).

:func:`kv_entries`: the live entries whose keys match a pattern (``natkey.<owner>.<actor>.>``), so
retiring one principal's issuance rows (:mod:`cotal_trio.stores.lifecycle`) costs that principal's
rows, not the bucket's. The broker does the filtering: one ``STREAM.INFO`` with
``subjects_filter`` lists the matching keys (as :func:`~cotal_trio.natsio.kv_keys` does), then
each listed key is read once, a few reads in flight at a time. It needs no consumer and no
direct get (the auth bucket has ``allow_direct: false``), only the two requests the prune sweep
already makes.

Trio-flavoured; errors follow :mod:`._kv`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import trio

from cotal_trio.core.errors import Unavailable

from ._conn import Connection
from ._kv import _TOMBSTONE_OPS, KV_OPERATION, MARKER_REASON, KvEntry, _stream
from ._kv_keys import _subjects_page
from ._streams import last_message

__all__ = ["ENTRIES_IN_FLIGHT", "kv_entries"]

# kv_entries keeps at most this many reads in flight on the connection.
ENTRIES_IN_FLIGHT = 32
# A key pattern's token: a key token (nats-py's key characters, no dot), or a whole-token wildcard.
_PATTERN_TOKEN = re.compile(r"[-/_=a-zA-Z0-9]+|\*")


async def kv_entries(conn: Connection, bucket: str, pattern: str) -> list[KvEntry]:
    """Trio: the live entries of ``bucket`` whose keys match ``pattern``, sorted by key.

    One ``STREAM.INFO`` with ``subjects_filter`` ``$KV.<bucket>.<pattern>`` (one page per
    100 000 matching keys) lists the keys that hold a message; each is then read with one
    ``STREAM.MSG.GET`` ``last_by_subj`` (:func:`~cotal_trio.natsio.last_message`, a plain request:
    no nats-py JetStream context per read), ``ENTRIES_IN_FLIGHT`` at a time. So the requests made
    are ``1 + (keys matching)``, whatever else the bucket holds. A key whose last message is a
    delete, a purge or a server marker is left out.

    Args:
        pattern: a key with NATS wildcards as whole tokens: ``*`` one token, ``>`` (last) one
            or more (``"natkey.u_x.cli.>"``, ``"natkey.*"``).

    Raises:
        ValueError: an invalid bucket or pattern.
        Unavailable: the bucket is missing (:func:`~cotal_trio.natsio.is_bucket_missing`), or the
            broker or JetStream did not answer (the first failed read; the others are cancelled).
    """
    stream = _stream(bucket)
    tokens = pattern.split(".")
    wide = tokens[-1] == ">" and len(tokens) > 1
    if not all(_PATTERN_TOKEN.fullmatch(token) for token in (tokens[:-1] if wide else tokens)):
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

    async def reader(scope: trio.CancelScope, todo: Iterator[str]) -> None:
        for key in todo:  # the readers share one iterator: each key is read once
            try:
                last = await last_message(conn, stream, base + key)
            except Unavailable as exc:
                failed.append(exc)
                scope.cancel()
                return
            if last is not None and _live(last.headers):
                found[key] = KvEntry(key=key, value=last.data, revision=last.seq)

    todo = iter(keys)
    async with trio.open_nursery() as nursery:
        for _ in range(min(ENTRIES_IN_FLIGHT, len(keys))):
            nursery.start_soon(reader, nursery.cancel_scope, todo)
    if failed:
        raise failed[0]
    return [found[key] for key in keys if key in found]


def _live(headers: dict[str, str]) -> bool:
    """Not a delete, a purge or a server marker (the tombstones :mod:`._kv` reads as absent)."""
    names = {name.lower(): value for name, value in headers.items()}
    return names.get(KV_OPERATION.lower()) not in _TOMBSTONE_OPS and MARKER_REASON.lower() not in names
