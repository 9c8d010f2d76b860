"""The loopback face: one space's token exchange on 127.0.0.1 (DESIGN 7; upstream-notes 3.5, 4.1).

Closed, exact-match route table (anything else is a JSON 404, a wrong method a JSON 405):

=================  ==========================================================================
``GET /health``    ``{"ok": true, "issuer": "urn:cotal:auth:<space>"}``
``GET /jwks``      ``{"keys": [<public JWK>]}`` with ``Cache-Control: max-age=300``
``POST /exchange`` a bearer for an IdP token (human) or an actor token (agent)
=================  ==========================================================================

``POST /exchange`` pre-checks, in order (upstream-notes 3.5): an ``Origin`` header is 403 (no
browser may drive this face); ``Content-Type`` must start with ``application/json`` (415);
``Authorization: Bearer <capability>`` must match (401; its own 30-per-60-s window, then 429);
the body is at most 65536 bytes (413); it must be JSON (400). Then the exchange itself
(``faces.py``, shared with the public face). Every refusal from the body on counts against one
shared refused-exchange window (spec "Listener policy": 30 per rolling 60 s); once it is full a
refusal answers 429 instead of its reason, while a valid credential still mints.

Per-app state is the two windows, held by the handlers' closure (no module state, no nursery).
"""

from __future__ import annotations

import hmac
from typing import Any

from quart import request
from quart_trio import QuartTrio
from werkzeug.datastructures import Headers

from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.windows import SlidingWindow
from cotal_trio.http.errors import install_edge
from cotal_trio.http.faces import (
    JWKS_MAX_AGE_S,
    ExchangeContext,
    answer_exchange,
    check_transport,
    info_routes,
    read_json_body,
)

__all__ = ["JWKS_MAX_AGE_S", "UNKNOWN_PATH", "build_loopback_app"]

UNKNOWN_PATH = "unknown path - /health, /jwks, /exchange"
BAD_CAPABILITY = "missing/invalid exchange capability - read it from the space's auth-service.json"
TOO_MANY_BAD_CAPABILITIES = "too many invalid-capability attempts - wait a minute and retry"


def _presented_capability(headers: Headers) -> str | None:
    """The ``<cap>`` of ``Authorization: Bearer <cap>`` (scheme case-insensitive), or ``None``."""
    scheme, _, value = headers.get("Authorization", "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


class _LoopbackFace:
    """The exchange handler of one loopback app and the two windows it keeps."""

    def __init__(self, ctx: ExchangeContext) -> None:
        self._ctx = ctx
        self._bad_capabilities = SlidingWindow()
        self._refusals = SlidingWindow()

    def _check_capability(self, headers: Headers) -> None:
        """Constant-time capability check with its own window (upstream-notes 4.1)."""
        presented = _presented_capability(headers)
        expected = self._ctx.capability.encode("ascii")
        if presented is not None and hmac.compare_digest(presented.encode("utf-8", "replace"), expected):
            return
        self._ctx.count("bad-capability")
        if self._bad_capabilities.try_acquire(self._ctx.clock()):
            raise Refused(RefusalCode.BAD_CAPABILITY, BAD_CAPABILITY)
        raise Refused(RefusalCode.RATE_LIMITED, TOO_MANY_BAD_CAPABILITIES)

    async def exchange(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        """``POST /exchange``: ``200 {"token", "owner", "exp"}`` (``exp`` unix seconds).

        Raises (answered by the edge): ``Rejected`` 403/413/415; ``Refused`` BAD_CAPABILITY
        401, BAD_REQUEST 400, BAD_CREDENTIAL/NOT_GRANTED 401, RATE_LIMITED 429.
        """
        check_transport(request.headers)
        self._check_capability(request.headers)
        body = await read_json_body()
        return answer_exchange(self._ctx, body, admit_refusal=self._refusals.try_acquire)


def build_loopback_app(ctx: ExchangeContext) -> QuartTrio:
    """Build the loopback face for one space (DESIGN 7; upstream-notes 4.1).

    Args:
        ctx: the space's ports; the app reads them per request and never stores a nursery.

    Returns:
        A quart-trio app; serve it with :func:`cotal_trio.http.serve.serve_app`. Each call
        returns an app with fresh, empty budgets.
    """
    app = QuartTrio("cotal_trio.http.loopback")
    face = _LoopbackFace(ctx)
    routes = {**info_routes(ctx), "/exchange": {"POST": face.exchange}}
    install_edge(app, routes=routes, unknown_path=UNKNOWN_PATH)
    return app
