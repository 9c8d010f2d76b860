"""The one codec of the small JSON rows kept in the space's stores (issuance rows, manager
instances, chat sessions, lifecycle records): compact UTF-8 JSON objects with exactly a known
set of keys, ``ver`` first among them.

Pure and synchronous.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import CodecError

__all__ = ["decode_row", "encode_row"]


def encode_row(obj: Mapping[str, Any]) -> bytes:
    """``obj`` as compact UTF-8 JSON (no spaces), in the mapping's order."""
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_row(data: bytes, *, what: str, keys: Sequence[str], version: int) -> dict[str, Any]:
    """The JSON object in ``data`` once it has exactly ``keys`` and ``ver == version``.

    The caller builds its value type from the object, which checks each field's grammar.

    Args:
        data: the stored bytes.
        what: the row's name in errors (``"issuance row"``).
        keys: the exact key set (``ver`` among them).
        version: the one ``ver`` understood.

    Raises:
        CodecError: ``<what>: it is not UTF-8 JSON``, ``<what>: keys must be exactly ...`` or
            ``<what>: ver <v> is not understood``.
    """
    try:
        obj: Any = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CodecError(f"{what}: it is not UTF-8 JSON") from None
    if not (isinstance(obj, dict) and sorted(obj) == sorted(keys)):
        raise CodecError(f"{what}: keys must be exactly {', '.join(keys)}")
    if not (type(obj["ver"]) is int and obj["ver"] == version):
        raise CodecError(f"{what}: ver {obj['ver']!r} is not understood")
    return obj
