"""The HTTP edge: closed route tables, and the one place an error becomes an answer.

STYLE practice 18; DESIGN 7. Every error body is JSON ``{"error": "<sentence that names the
fix>"}``; never a traceback, never exception text, never CORS headers. :func:`install_edge`
gives an app its closed, exact-match route table and registers :func:`answer_error` as its
handler for every ``Exception``, so route handlers just raise:

==========================================  ======  =================================================
raised                                      status  body sentence
==========================================  ======  =================================================
:class:`RateLimited` (connect limits)        429     ``RateLimited.body()`` + ``Retry-After: <n>``
:class:`Refused` (by :data:`REFUSAL_STATUS`)  4xx   ``Refused.detail`` (written for the caller)
:class:`Rejected`                           its own  its own (Origin, media type, method of a route)
werkzeug ``NotFound``                       404     the face's ``unknown path - ...`` sentence
werkzeug ``MethodNotAllowed``               405     :data:`UNKNOWN_METHOD` (a method no route takes)
werkzeug ``RequestEntityTooLarge``          413     :data:`BODY_TOO_LARGE`
other werkzeug ``HTTPException``            its own  a fixed sentence per status
:class:`Unavailable`                        503     generic; detail logged
anything else                               500     :data:`INTERNAL_ERROR`; logged with traceback
==========================================  ======  =================================================
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

from quart import Quart, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from cotal_trio.core.errors import RateLimited, RefusalCode, Refused, Unavailable

__all__ = [
    "BODY_TOO_LARGE",
    "INTERNAL_ERROR",
    "Handler",
    "LOGGER",
    "MAX_BODY_BYTES",
    "REFUSAL_STATUS",
    "ROUTES_CONFIG",
    "Rejected",
    "answer_error",
    "error_body",
    "install_edge",
]

LOGGER = logging.getLogger("cotal.http")

Handler = Callable[[], Awaitable[Any]]
"""A route handler: no arguments (it reads quart's ``request``), returns a quart view value."""

# Methods the catch-all rules accept, so that the closed table (not werkzeug) answers 405.
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

# The app.config key holding an app's route table, {path: (method, ...)} (install_edge).
ROUTES_CONFIG = "COTAL_ROUTES"

# Largest request body either face reads (DESIGN 7: 64 KiB, else 413).
MAX_BODY_BYTES = 65536
BODY_TOO_LARGE = f"request body too large (maximum {MAX_BODY_BYTES} bytes)"
INTERNAL_ERROR = "internal error - see the auth service log"
UNKNOWN_METHOD = "unsupported HTTP method - use GET or POST as the route expects"
UNAVAILABLE = "a dependency of the auth service is unavailable - retry shortly"

# Refusal code -> HTTP status; the only such table (STYLE practice 18).
REFUSAL_STATUS: Mapping[RefusalCode, int] = MappingProxyType(
    {
        RefusalCode.BAD_REQUEST: 400,
        RefusalCode.BAD_CAPABILITY: 401,
        RefusalCode.BAD_CREDENTIAL: 401,
        RefusalCode.NOT_GRANTED: 401,
        RefusalCode.FORBIDDEN: 403,
        RefusalCode.NOT_FOUND: 404,
        RefusalCode.CONFLICT: 409,
        RefusalCode.PRECONDITION_FAILED: 412,
        RefusalCode.RATE_LIMITED: 429,
    }
)

# Sentences for HTTP-layer errors werkzeug or quart raise on their own (bad framing, timeouts).
_HTTP_SENTENCES: Mapping[int, str] = MappingProxyType(
    {
        400: "the request could not be read - send a well-formed HTTP request",
        408: "the request body arrived too slowly - retry",
        413: BODY_TOO_LARGE,
    }
)
_HTTP_FALLBACK = "the request was refused by the HTTP layer - check the method, path and headers"


class Rejected(Exception):
    """A transport-level rejection that is not a credential refusal (wrong media type, Origin).

    Attributes:
        status: the HTTP status to answer.
        sentence: the ``error`` sentence; it names the fix and is safe to show.
        headers: extra response headers (``Allow`` on a 405).
        fields: extra members of the JSON error body beside ``error`` (a host door's ``outcome``).
    """

    def __init__(
        self, status: int, sentence: str, headers: Mapping[str, str] | None = None, *,
        fields: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(sentence)
        self.status = status
        self.sentence = sentence
        self.headers = dict(headers or {})
        self.fields = dict(fields or {})


def error_body(sentence: str) -> dict[str, str]:
    """The JSON error body ``{"error": sentence}``."""
    return {"error": sentence}


def answer_error(error: Exception, *, unknown_path: str) -> tuple[dict[str, object], int, dict[str, str]]:
    """Map any exception raised while handling a request to ``(body, status, headers)``.

    Args:
        error: what the handler (or routing) raised.
        unknown_path: the face's 404 sentence (it lists the face's routes).

    Logs an :class:`Unavailable` at warning and any unexpected exception at error with its
    traceback on ``cotal.http``; neither text reaches the client.
    """
    if isinstance(error, RateLimited):  # spec "Connect limits": the typed 429
        return error.body(), REFUSAL_STATUS[error.code], {"Retry-After": str(error.retry_after_s)}
    if isinstance(error, Refused):
        return {**error.fields, **error_body(error.detail)}, REFUSAL_STATUS[error.code], {}
    if isinstance(error, Rejected):
        return {**error.fields, **error_body(error.sentence)}, error.status, error.headers
    if isinstance(error, NotFound):
        return error_body(unknown_path), 404, {}
    if isinstance(error, MethodNotAllowed):
        return error_body(UNKNOWN_METHOD), 405, {}
    if isinstance(error, RequestEntityTooLarge):
        return error_body(BODY_TOO_LARGE), 413, {}
    if isinstance(error, HTTPException) and error.code is not None and error.code < 500:
        return error_body(_HTTP_SENTENCES.get(error.code, _HTTP_FALLBACK)), error.code, {}
    if isinstance(error, Unavailable):
        LOGGER.warning("auth-service: a dependency is unavailable: %s", error)
        return error_body(UNAVAILABLE), 503, {"Retry-After": "5"}
    LOGGER.error("auth-service: unexpected error while handling a request", exc_info=error)
    return error_body(INTERNAL_ERROR), 500, {}


def _handler_for(routes: Mapping[str, Mapping[str, Handler]], path: str, method: str) -> Handler:
    """The handler of ``method path`` in a closed table (``HEAD`` is served as ``GET``).

    Raises:
        NotFound: the path is not in the table (answered with the face's 404 sentence).
        Rejected: 405 naming the methods the path answers, with an ``Allow`` header.
    """
    methods = routes.get(path)
    if methods is None:
        raise NotFound()
    handler = methods.get("GET" if method == "HEAD" else method)
    if handler is None:
        allowed = ", ".join(sorted(methods))
        raise Rejected(405, f"{method} is not served on {path} - use {allowed} {path}", {"Allow": allowed})
    return handler


def install_edge(app: Quart, *, routes: Mapping[str, Mapping[str, Handler]], unknown_path: str) -> None:
    """Give ``app`` a closed, exact-match route table and the one error edge.

    Routing: ``routes`` maps an exact decoded path to ``{method: handler}``; the request path is
    looked up as is (no slash merging, no trailing-slash or case folding; the query string is
    not part of it). werkzeug's rule matching is not used for this, because it folds ``//x``
    into ``/x``. Errors: :func:`answer_error` handles every ``Exception``.

    Also sets the body limit (``MAX_CONTENT_LENGTH``: quart stops buffering a body past
    :data:`MAX_BODY_BYTES` and refuses a too-long ``Content-Length`` before reading it).

    Args:
        app: a fresh quart(-trio) app.
        routes: ``{"/path": {"GET": handler}}``; handlers take no arguments and return what a
            quart view returns. Copied, so later changes to the caller's dict do not apply.
        unknown_path: the face's 404 sentence (it lists the face's routes).

    The table's paths and methods are kept in ``app.config[ROUTES_CONFIG]`` as
    ``{path: (method, ...)}`` (read by the test that every route is documented, issue 7 item 5).
    """
    table = {path: dict(methods) for path, methods in routes.items()}
    app.config[ROUTES_CONFIG] = {path: tuple(sorted(methods)) for path, methods in table.items()}
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["PROPAGATE_EXCEPTIONS"] = False

    async def dispatch(**_path: str) -> Any:
        # The ASGI path as sent (percent-decoded); quart's request.path folds leading slashes.
        return await _handler_for(table, request.scope["path"], request.method)()

    async def on_error(error: Exception) -> Any:
        return answer_error(error, unknown_path=unknown_path)

    for rule, endpoint in (("/", "root"), ("/<path:_path>", "any")):
        app.add_url_rule(rule, endpoint, dispatch, methods=_METHODS, provide_automatic_options=False)
    app.register_error_handler(Exception, on_error)
