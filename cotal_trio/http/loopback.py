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
(``faces.py``). Every refusal from the body on counts against one shared refused-exchange
window (spec "Listener policy": 30 per rolling 60 s); once it is full a refusal answers 429
instead of its reason, while a valid credential still mints.

Per-app state is the two windows, held by the handlers' closure (no module state, no nursery).
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from quart import request
from quart_trio import QuartTrio
from werkzeug.datastructures import Headers

from cotal_trio.core.bearer import space_issuer
from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.exchange import parse_exchange_body
from cotal_trio.core.windows import SlidingWindow
from cotal_trio.http.errors import BODY_TOO_LARGE, LOGGER, MAX_BODY_BYTES, Rejected, install_edge
from cotal_trio.http.faces import ExchangeContext, exchange_arm, mint_exchange

__all__ = ["JWKS_MAX_AGE_S", "UNKNOWN_PATH", "build_loopback_app"]

# How long clients may cache the JWKS (upstream JWKS_MAX_AGE_SEC); a retired kid stays
# published at least this long plus the longest bearer lifetime.
JWKS_MAX_AGE_S = 300
UNKNOWN_PATH = "unknown path - /health, /jwks, /exchange"
BROWSER_ORIGIN = "browser-origin requests are not served here"
NOT_JSON_MEDIA = "send the exchange body as JSON with Content-Type: application/json"
BAD_CAPABILITY = "missing/invalid exchange capability - read it from the space's auth-service.json"
TOO_MANY_BAD_CAPABILITIES = "too many invalid-capability attempts - wait a minute and retry"
TOO_MANY_REFUSALS = "too many refused exchanges - wait a minute and retry"
NOT_JSON = "request body is not valid JSON"


def _presented_capability(headers: Headers) -> str | None:
    """The ``<cap>`` of ``Authorization: Bearer <cap>`` (scheme case-insensitive), or ``None``."""
    scheme, _, value = headers.get("Authorization", "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _check_transport(headers: Headers) -> None:
    """Origin (403) then media type (415) (upstream-notes 3.5 pre-checks 2 and 3)."""
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


class _LoopbackFace:
    """The handlers of one loopback app and the two windows they share."""

    def __init__(self, ctx: ExchangeContext) -> None:
        self._ctx = ctx
        self._bad_capabilities = SlidingWindow()
        self._refusals = SlidingWindow()

    async def health(self) -> dict[str, Any]:
        """``GET /health``: ``{"ok": true, "issuer": "urn:cotal:auth:<space>"}``."""
        return {"ok": True, "issuer": space_issuer(self._ctx.space)}

    async def jwks(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        """``GET /jwks``: ``{"keys": [<public JWK>]}``, cacheable for :data:`JWKS_MAX_AGE_S`."""
        body = {"keys": [self._ctx.issuer_key.public_jwk()]}
        return body, 200, {"Cache-Control": f"max-age={JWKS_MAX_AGE_S}"}

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

    def _refused(self, refusal: Refused, arm: str, now: float) -> Refused:
        """Log a refusal, count it, and return what to answer: itself, or 429 once full."""
        what = "an agent exchange" if arm == "agent" else "an exchange"
        LOGGER.warning("auth-service: refused %s: %s", what, refusal.detail)
        if self._refusals.try_acquire(now):
            self._ctx.count("refused")
            return refusal
        self._ctx.count("throttled")
        return Refused(RefusalCode.RATE_LIMITED, TOO_MANY_REFUSALS)

    async def exchange(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        """``POST /exchange``: ``200 {"token", "owner", "exp"}`` (``exp`` unix seconds).

        Raises (answered by the edge): ``Rejected`` 403/413/415; ``Refused`` BAD_CAPABILITY
        401, BAD_REQUEST 400, BAD_CREDENTIAL/NOT_GRANTED 401, RATE_LIMITED 429.
        """
        _check_transport(request.headers)
        self._check_capability(request.headers)
        obj = _decode_json(await _read_body())
        now = self._ctx.clock()  # once, after the body: waiting shortens the bearer, never extends it
        arm = "human"
        try:
            parsed = parse_exchange_body(obj)
            arm = exchange_arm(parsed)
            minted = mint_exchange(self._ctx, parsed, now=now)
        except Refused as refusal:
            raise self._refused(refusal, arm, now) from None
        self._ctx.count("minted")
        return minted.body(), 200, {"Cache-Control": "no-store"}


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
    routes = {"/health": {"GET": face.health}, "/jwks": {"GET": face.jwks}, "/exchange": {"POST": face.exchange}}
    install_edge(app, routes=routes, unknown_path=UNKNOWN_PATH)
    return app
