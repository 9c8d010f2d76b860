"""The transport pre-checks and the JSON body every face and host door reads (DESIGN 7;
upstream-notes 3.5 pre-checks 2, 3 and 5).

:func:`check_transport` refuses an ``Origin`` header (403) and a media type other than JSON (415);
:func:`read_json_body` reads at most :data:`~cotal_trio.http.errors.MAX_BODY_BYTES` (413) and
decodes strict JSON (400). Both run inside a quart request context.
"""

from __future__ import annotations

import json

from quart import request
from werkzeug.datastructures import Headers

from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.http.errors import BODY_TOO_LARGE, MAX_BODY_BYTES, Rejected

__all__ = ["BROWSER_ORIGIN", "NOT_JSON", "NOT_JSON_MEDIA", "check_transport", "read_json_body"]

BROWSER_ORIGIN = "browser-origin requests are not served here"
NOT_JSON_MEDIA = "send the exchange body as JSON with Content-Type: application/json"
NOT_JSON = "request body is not valid JSON"


def check_transport(headers: Headers) -> None:
    """Origin (403) then media type (415) (upstream-notes 3.5 pre-checks 2 and 3).

    Raises:
        Rejected: 403 for any ``Origin`` header (no browser may drive an exchange face); 415
            when ``Content-Type`` does not start with ``application/json``.
    """
    if "Origin" in headers:
        raise Rejected(403, BROWSER_ORIGIN)
    if not headers.get("Content-Type", "").strip().lower().startswith("application/json"):
        raise Rejected(415, NOT_JSON_MEDIA)


async def _read_body() -> bytes:
    """The request body, at most :data:`MAX_BODY_BYTES`.

    A ``Content-Length`` over the limit is refused before any byte is read; a chunked body is
    refused as soon as it passes the limit (quart's ``MAX_CONTENT_LENGTH``, set by the edge).

    Raises:
        Rejected: 413.
    """
    declared = request.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        raise Rejected(413, BODY_TOO_LARGE)
    return await request.get_data(cache=False, as_text=False)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _decode_json(raw: bytes) -> object:
    """Strict UTF-8 JSON (RFC 8259: no ``NaN``/``Infinity``), any value.

    Raises:
        Refused: BAD_REQUEST :data:`NOT_JSON`; not counted as a refused exchange.
    """
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Refused(RefusalCode.BAD_REQUEST, NOT_JSON) from None


async def read_json_body() -> object:
    """The current request's body as a JSON value of any type (the caller checks the shape).

    A checkpoint (it awaits the body). Runs inside a quart request context.

    Raises:
        Rejected: 413, the body (declared or received) is over :data:`MAX_BODY_BYTES`.
        Refused: BAD_REQUEST :data:`NOT_JSON` for bytes that are not strict UTF-8 JSON; the
            caller does not count it against a refusal budget (spec "Proxy attribution":
            malformed JSON keeps its named 400).
    """
    return _decode_json(await _read_body())
