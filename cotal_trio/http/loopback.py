"""The loopback face: one space's token exchange on 127.0.0.1 (DESIGN 7; upstream-notes 3.5, 4.1).

Closed, exact-match route table (anything else is a JSON 404, a wrong method a JSON 405):

=================  ==========================================================================
``GET /health``    ``{"ok": true, "issuer": "urn:cotal:auth:<space>"}``
``GET /jwks``      ``{"keys": [<public JWK>]}`` with ``Cache-Control: max-age=300``
``POST /exchange`` a bearer for an IdP token (human) or an actor token (agent)
``GET /metrics``   the lane's Prometheus text (:mod:`cotal_trio.lane.metrics`), when given
``GET /``          the status page (:mod:`cotal_trio.http.status_page`; capability once, then a cookie)
``/events``        websocket: the host's live events (:mod:`cotal_trio.lane.events`, docs/events.md),
                   when the lane has an event bus; a plain HTTP request to it is a JSON 426
``POST /tool-result-human-proof/verify``
                   host-only door: is ``{idpToken, subject}`` a fresh password proof of the
                   host's session subject? (``face_routes.answer_password_proof``; decides only)
``POST /manager-service-authority``
                   register or retire a manager instance (``mesh_routes.py``)
the other doors    ``/interactive-lifecycle/retire``, ``/managed-lifecycle/activate``,
                   ``/managed-lifecycle/retire`` (``lifecycle_doors.py``),
                   ``/manager-service-authority/verify-enrollment`` and the opt-in
                   ``/tool-result-consent/issue`` (``manager_doors.py``), given by the lane
                   through ``doors``; contracts in ``docs/host-doors.md``
=================  ==========================================================================

``GET /metrics`` needs **no capability**: a scraper on the host normally cannot read the 0600
``auth-service.json``, and the face listens on 127.0.0.1 only. What it serves is counts and
times labelled by space, outcome, bucket, arm and status, never an owner, actor or nonce, so a
local reader learns load, not who connects.

``POST /exchange`` pre-checks, in order (upstream-notes 3.5): an ``Origin`` header is 403 (no
browser may drive this face); ``Content-Type`` must start with ``application/json`` (415);
``Authorization: Bearer <capability>`` must match (401; its own 30-per-60-s window, then 429);
the body is at most 65536 bytes (413); it must be JSON (400). Then the exchange itself
(``face_routes.py``, shared with the public face). Every refusal from the body on counts against one
shared refused-exchange window (spec "Listener policy": 30 per rolling 60 s); once it is full a
refusal answers 429 instead of its reason, while a valid credential still mints. The proof door
takes the same pre-checks and counts its refusals in the same window.

``/events`` (issue 7 item 1) refuses its handshake before accepting: an ``Origin`` header other
than the face's own ``http://127.0.0.1:<port>`` is 403 (cross-site websocket hijacking); then
either the status page's session cookie of this port (``status_page.session_cookie_name`` and
``cookie_ok``) or ``Authorization: Bearer <capability>`` (the same check and bad-capability
window as every door: 401, then 429). ``GET /?cap=`` counts in that window too. Once
accepted it sends the subscription's hello, then each event as one JSON text message; a
consumer the bus drops for being slow gets what was already written to its socket, then close
code 1008 with the bus's reason.

Per-app state is the two windows, held by the handlers' closure (no module state, no nursery).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from quart import request, websocket
from quart_trio import QuartTrio
from werkzeug.datastructures import Headers

from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.events import SLOW_CONSUMER_CODE
from cotal_trio.core.windows import SlidingWindow
from cotal_trio.http.errors import Handler, Rejected, answer_error, install_edge
from cotal_trio.http.face_routes import (
    JWKS_MAX_AGE_S,
    answer_exchange,
    answer_password_proof,
    counted_exchange,
    info_routes,
    refetch_for_unknown_idp_key,
)
from cotal_trio.http.faces import ExchangeContext
from cotal_trio.http.mesh_routes import MANAGER_AUTHORITY_PATH, answer_mesh_route
from cotal_trio.http.status_page import cookie_ok, face_port, session_cookie_name, status_routes
from cotal_trio.http.transport import check_transport, read_json_body

__all__ = [
    "EVENTS_PATH", "JWKS_MAX_AGE_S", "PROOF_PATH", "UNKNOWN_PATH", "CapabilityGate", "EventFeed", "EventSource",
    "EventsDoor", "build_loopback_app", "metrics_route", "not_a_websocket", "presented_capability",
]

PROOF_PATH = "/tool-result-human-proof/verify"
EVENTS_PATH = "/events"
UNKNOWN_PATH = (
    f"unknown path - /health, /jwks, /exchange, /metrics, {MANAGER_AUTHORITY_PATH}, /events, / (the status page), "
    "and the host-only doors (docs/host-doors.md)"
)
NOT_A_WEBSOCKET = f"{EVENTS_PATH} is a websocket - connect with ws:// and the capability (`cotal watch` does)"
FOREIGN_ORIGIN = f"{EVENTS_PATH} accepts no cross-site connection - open the status page on this face itself"
BAD_CAPABILITY = "missing/invalid exchange capability - read it from the space's auth-service.json"
TOO_MANY_BAD_CAPABILITIES = "too many invalid-capability attempts - wait a minute and retry"


def presented_capability(headers: Headers) -> str | None:
    """The ``<cap>`` of ``Authorization: Bearer <cap>`` (scheme case-insensitive), or ``None``."""
    scheme, _, value = headers.get("Authorization", "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


class CapabilityGate:
    """One face's capability and the bad-capability window its doors share (upstream-notes 4.1).

    Args:
        capability: the face's capability (hex); compared in constant time.
        clock: the window's time, seconds (the face's ``clock``).
        refusal: the 401 sentence, naming where the capability is read.
    """

    def __init__(self, capability: str, clock: Callable[[], float], *, refusal: str = BAD_CAPABILITY) -> None:
        self.capability, self._clock, self._refusal = capability, clock, refusal
        self._bad_capabilities = SlidingWindow()

    def check(self, presented: str | None) -> None:
        """Constant-time check of a presented capability with its own window (upstream-notes 4.1).

        ``presented`` is the Bearer value (:func:`presented_capability`), a status page's
        ``?cap``, or ``None`` when none was presented (that counts as a bad one). Sync.

        Raises:
            Refused: BAD_CAPABILITY (401) for a missing or wrong value, counted in the window;
                RATE_LIMITED (429, :data:`TOO_MANY_BAD_CAPABILITIES`) once the window is full.
                The right capability passes even then.
        """
        expected = self.capability.encode("ascii")
        if presented is not None and hmac.compare_digest(presented.encode("utf-8", "replace"), expected):
            return
        if self._bad_capabilities.try_acquire(self._clock()):
            raise Refused(RefusalCode.BAD_CAPABILITY, self._refusal)
        raise Refused(RefusalCode.RATE_LIMITED, TOO_MANY_BAD_CAPABILITIES)


class _LoopbackFace:
    """The exchange handler of one loopback app and the two windows it keeps."""

    def __init__(self, ctx: ExchangeContext) -> None:
        self._ctx = ctx
        self.gate = CapabilityGate(ctx.capability, ctx.clock)
        self.check_capability = self.gate.check
        self._refusals = SlidingWindow()

    async def exchange(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        """``POST /exchange``: ``200 {"token", "owner", "exp"}`` (``exp`` unix seconds).

        Raises (answered by the edge): ``Rejected`` 403/413/415; ``Refused`` BAD_CAPABILITY
        401, BAD_REQUEST 400, BAD_CREDENTIAL/NOT_GRANTED 401, RATE_LIMITED 429.
        """
        with counted_exchange(self._ctx) as tally:
            check_transport(request.headers)
            self.check_capability(presented_capability(request.headers))
            body = await read_json_body()
            await refetch_for_unknown_idp_key(self._ctx, body)
            return await answer_exchange(
                self._ctx, body, face="loopback", admit_refusal=self._refusals.try_acquire, tally=tally
            )

    async def guard(self) -> object:
        """A host-only door's pre-checks: transport, capability, then the decoded JSON body."""
        check_transport(request.headers)
        self.check_capability(presented_capability(request.headers))
        body = await read_json_body()
        await refetch_for_unknown_idp_key(self._ctx, body)
        return body

    def admit_refusal(self, now: float) -> bool:
        """The shared refused-request window (doors count their refusals in it too)."""
        return self._refusals.try_acquire(now)

    async def manager_authority(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        """``POST /manager-service-authority`` (capability-gated; :mod:`~cotal_trio.http.mesh_routes`)."""
        body = await self.guard()
        return await answer_mesh_route(self._ctx, MANAGER_AUTHORITY_PATH, body, admit_refusal=self._refusals.try_acquire)

    async def password_proof(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        """``POST /tool-result-human-proof/verify``: ``200 {"verified": true, "sub", "owner",
        "authTime"}``; refusals as ``/exchange`` (401 for a token that is no fresh password proof).
        """
        body = await self.guard()
        return answer_password_proof(self._ctx, body, admit_refusal=self._refusals.try_acquire)


class EventFeed(Protocol):
    """One consumer's feed of an :class:`EventSource` (``lane.events.Subscription`` is one).

    Attributes:
        events: the stamped events (JSON-ready mappings), the hello first; the iteration ends
            once the consumer is dropped and drained.
        reason: why the source dropped this consumer (a slow consumer), or None.
    """

    @property
    def events(self) -> AsyncIterable[Mapping[str, Any]]: ...

    @property
    def reason(self) -> str | None: ...


class EventSource(Protocol):
    """The port ``/events`` streams from (``lane.events.EventBus`` is one; the lane passes it):
    ``subscribe(space)`` enters a feed of the events the face of ``space`` streams, removed on exit.
    """

    def subscribe(self, space: str | None) -> AbstractAsyncContextManager[EventFeed]: ...


class EventsDoor:
    """``/events``: the host's event bus over a websocket (issue 7 item 1; docs/events.md).

    Args:
        gate: the face's :class:`CapabilityGate` (its capability keys the session cookie).
        space: the face's space, whose view of the events it streams; None (the operator
            face, issue 18 item 8): every event of every space.
        bus: the :class:`EventSource`.
        unknown_path: the face's 404 sentence, for the refusals' edge.
    """

    def __init__(self, gate: CapabilityGate, space: str | None, bus: EventSource, *, unknown_path: str = UNKNOWN_PATH) -> None:
        self._gate, self._space, self._bus, self._unknown = gate, space, bus, unknown_path

    def _refusal(self) -> tuple[dict[str, object], int, dict[str, str]] | None:
        """The handshake's HTTP refusal (403 foreign ``Origin``, 401/429 no credential), or None."""
        origin = websocket.headers.get("Origin")
        port = face_port(websocket.scope)
        if origin is not None and origin != f"http://127.0.0.1:{port}":
            return answer_error(Rejected(403, FOREIGN_ORIGIN), unknown_path=self._unknown)
        if cookie_ok(websocket.cookies.get(session_cookie_name(port)), self._gate.capability):
            return None
        try:
            self._gate.check(presented_capability(websocket.headers))
        except Refused as refused:
            return answer_error(refused, unknown_path=self._unknown)
        return None

    async def serve(self) -> tuple[dict[str, object], int, dict[str, str]] | None:
        """Refuse the handshake, or accept and stream until the client leaves or is dropped.

        Each event is one JSON text message. A dropped consumer gets what was already written
        to its socket (the send in progress completes first), then close code 1008 with the
        bus's reason. The events still queued for a dropped consumer are discarded. A send to
        a consumer that stopped reading cannot be cancelled (hypercorn shields its socket
        writes): it waits until the consumer reads, leaves, or its shut window outlasts the
        face's ``TCP_USER_TIMEOUT`` (:data:`~cotal_trio.http.serve.USER_TIMEOUT_S`), which cuts
        the connection; it holds this task and its socket buffers, never the bus or the
        callout. Cancelled (quart does it) when the client disconnects. Returns a refusal as
        ``(JSON body, status, headers)``, which quart sends as the handshake's HTTP answer;
        None once accepted.
        """
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        await websocket.accept()
        async with self._bus.subscribe(self._space) as feed:
            async for event in feed.events:
                if feed.reason is not None:
                    break
                await websocket.send(json.dumps(event, separators=(",", ":")))
            reason = feed.reason
        if reason is not None:
            await websocket.close(SLOW_CONSUMER_CODE, reason)
        return None


async def not_a_websocket() -> Any:
    """A plain HTTP request to ``/events``: 426 naming the websocket."""
    raise Rejected(426, NOT_A_WEBSOCKET, {"Upgrade": "websocket"})


def metrics_route(exposition: Callable[[], tuple[bytes, str]]) -> Handler:
    """``GET /metrics``: ``exposition()``'s body with its Content-Type, never cached."""
    async def scrape() -> tuple[bytes, int, dict[str, str]]:
        body, content_type = exposition()
        return body, 200, {"Content-Type": content_type, "Cache-Control": "no-store"}

    return scrape


DoorTable = Callable[[Callable[[], Awaitable[object]], Callable[[float], bool]], Mapping[str, Mapping[str, Handler]]]
"""``doors(guard, admit_refusal) -> {path: {method: handler}}``: a set of host-only doors
(``http/lifecycle_doors.py``, ``http/manager_doors.py``) given the face's guard (transport,
capability, then the JSON body) and its shared refused-request window."""


def build_loopback_app(
    ctx: ExchangeContext, *, metrics: Callable[[], tuple[bytes, str]] | None = None, doors: Sequence[DoorTable] = (),
    events: EventSource | None = None,
) -> QuartTrio:
    """Build the loopback face for one space (DESIGN 7; upstream-notes 4.1).

    Args:
        ctx: the space's ports; the app reads them per request and never stores a nursery.
        metrics: ``() -> (body, Content-Type)``, the lane's exposition
            (``LaneMetrics.exposition``; sync), served as ``GET /metrics``; without it that
            path is a 404.
        doors: host-only door tables (:data:`DoorTable`), each given the face's guard and
            its shared window; a door path is served only when a table names it.
        events: the host's event source (an :class:`EventSource` port: the lane passes its
            ``EventBus``), streamed on the ``/events`` websocket (module docstring); without
            it that path is a 404.

    Returns:
        A quart-trio app; serve it with :func:`cotal_trio.http.serve.serve_app`. Each call
        returns an app with fresh, empty budgets.
    """
    app = QuartTrio("cotal_trio.http.loopback")
    face = _LoopbackFace(ctx)
    routes: dict[str, Mapping[str, Handler]] = {
        **info_routes(ctx), "/exchange": {"POST": face.exchange}, PROOF_PATH: {"POST": face.password_proof},
        MANAGER_AUTHORITY_PATH: {"POST": face.manager_authority},
    }  # fmt: skip
    for table in doors:
        routes.update(table(face.guard, face.admit_refusal))
    if metrics is not None:
        routes["/metrics"] = {"GET": metrics_route(metrics)}
    routes.update(status_routes(ctx.capability, face.check_capability))
    if events is not None:
        routes[EVENTS_PATH] = {"GET": not_a_websocket}
        app.add_websocket(EVENTS_PATH, "events", EventsDoor(face.gate, ctx.space, events).serve)
    install_edge(app, routes=routes, unknown_path=UNKNOWN_PATH)
    return app
