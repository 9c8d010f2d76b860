"""The public face: one space's token exchange for remote callers (DESIGN 7; upstream-notes 4.2).

Served like the loopback face on ``127.0.0.1`` (:func:`cotal_trio.http.serve.serve_app`); an
operator puts a TLS reverse proxy in front of it (spec "Exclusive ownership"). It needs **no
capability**: that proves same-uid access to a 0600 file and has no remote meaning, so here the
credential is the proof (spec "Listener policy").

Closed, exact-match route table (anything else is a JSON 404, a wrong method a JSON 405):

=================================  ==============================================================
``GET /health``                    ``{"ok": true, "issuer": "urn:cotal:auth:<space>"}``
``GET /jwks``                      ``{"keys": [<public JWK>]}`` with ``Cache-Control: max-age=300``
``POST /exchange``                 a bearer for an IdP token (human) or an actor token (agent)
``GET /.well-known/cotal-mesh``    the bootstrap document (:func:`mesh_document`)
``POST /manager-service-authority``  register or retire a remote manager instance (human, scope
                                   ``supervise``; :mod:`~cotal_trio.http.mesh_routes`)
``POST /manager-instances``        the caller's live manager instances
``POST /chat-session/open``,       a chat session of the caller, its ``session-caller``
``/chat-session/bearer``,          bearer, and its retirement
``/chat-session/retire``
``POST /service-endpoint-authority``  only with ``service_endpoints``: register or retire a
                                   service endpoint (:mod:`~cotal_trio.http.service_endpoint_routes`)
``POST /service-endpoint-host``    only with ``service_endpoints``: a ``service-host`` bearer
=================================  ==============================================================

Views: this face mints ``channel-writer``, ``channel-purger``, ``transfer-writer`` (all gated on
ledger scope ``admin``), ``manager-caller`` and, through ``/chat-session/bearer``,
``session-caller``; the loopback-only views are refused with a 400 naming the loopback face
(:func:`~cotal_trio.core.views.check_exchange_view`). A ``manager-caller`` selection has its own
per-principal windows (:func:`~cotal_trio.http.faces.select_manager_for`). Not served here (404):
``/service-endpoint-authority`` and ``/service-endpoint-host`` unless the space's service runs
with service endpoints (spec "Listener policy"), and every host-only door of the loopback face.

``POST /exchange`` pre-checks, in order, shared with the loopback face (``transport.py``, ``face_routes.py``): an
``Origin`` header is 403; ``Content-Type`` must start with ``application/json`` (415); the body
is at most 65536 bytes (413); it must be JSON (400, not counted). Every refusal from the body on
(a body that is not an object, a bad field, a refused credential) counts against the **peer's**
bucket: 30 refusals in any rolling 60 s, then 429 instead of the reason, while a valid
credential from that peer still mints (spec "Proxy attribution"). At most 1024 peer buckets are
kept, least recently used evicted (:class:`~cotal_trio.core.windows.WindowLru`). The peer is the
socket's host, or with ``trusted_proxy`` the last ``X-Forwarded-For`` hop (:func:`peer_key`).

Per-app state is the bucket LRU, held by the handlers' closure (no module state, no nursery).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from quart import request
from quart_trio import QuartTrio

from cotal_trio.core.creds import parse_creds
from cotal_trio.core.errors import CodecError, ConfigError
from cotal_trio.core.windows import WindowLru
from cotal_trio.http.errors import Handler, install_edge
from cotal_trio.http.face_routes import answer_exchange, counted_exchange, info_routes, refetch_for_unknown_idp_key
from cotal_trio.http.faces import ExchangeContext
from cotal_trio.http.mesh_routes import MESH_PATHS, Route, answer_mesh_route
from cotal_trio.http.service_endpoint_routes import SERVICE_ENDPOINT_PATHS, SERVICE_ENDPOINT_ROUTES
from cotal_trio.http.transport import check_transport, read_json_body

__all__ = ["AUTH_PROVIDER", "MESH_DOCUMENT_PATH", "UNKNOWN_PATH", "build_public_app", "mesh_document", "peer_key"]

# The auth provider the bootstrap document's `userAuth` arm names (upstream AUTH_PROVIDER_NAME).
# spec "Proxy attribution": a client's local arm must register under this same name, or the
# entry the document creates resolves to nothing; both read this one constant.
AUTH_PROVIDER = "cotal"
MESH_DOCUMENT_PATH = "/.well-known/cotal-mesh"
UNKNOWN_PATH = f"unknown path - /health, /jwks, /exchange, {', '.join(MESH_PATHS)}, {MESH_DOCUMENT_PATH}"
# The bucket of a request whose socket address is unknown (an ASGI scope without `client`).
UNKNOWN_PEER = "unknown"
_WEB_SCHEMES = ("https", "http")


def _web_url(value: object, what: str, fix: str) -> str:
    """``value`` without a trailing slash when it is an http(s) URL with a host.

    Raises:
        ConfigError: it is not; the sentence names ``what`` and ``fix``.
    """
    try:
        parts = urlsplit(value) if isinstance(value, str) else None
    except ValueError:  # an unclosed IPv6 bracket
        parts = None
    if parts is None or parts.scheme not in _WEB_SCHEMES or not parts.hostname:
        raise ConfigError(f"{what} {value!r} is not an https:// (or http://) URL with a host - {fix}")
    return value.rstrip("/")


def _check_creds(sentinel_creds: object) -> str:
    """The sentinel ``.creds`` text, checked to be one (a path passed by mistake is caught here).

    Raises:
        ConfigError: not ``.creds`` text.
    """
    if isinstance(sentinel_creds, str):
        try:
            parse_creds(sentinel_creds)
            return sentinel_creds
        except CodecError:
            pass
    raise ConfigError("the sentinel credential is not .creds text - pass the contents of the space's sentinel.creds")


def mesh_document(
    ctx: ExchangeContext, *, public_url: str, server: str, idp_url: str, sentinel_creds: str
) -> dict[str, Any]:
    """The ``GET /.well-known/cotal-mesh`` body (upstream-notes 4.3; spec "Proxy attribution").

    Shape::

        {"space": "<space>", "server": "<server>", "tlsRequired": true,
         "userAuth": {"provider": "cotal",
                      "idp": {"url": "<idp_url>", "issuer": "<pin issuer>", "audience": "<pin audience>"},
                      "endpoints": {"url": "<public_url>",
                                    "managerAuthorityUrl": "<public_url>/manager-service-authority"}},
         "sentinelCreds": "<the sentinel .creds text>"}

    Bootstrap material: the sentinel cannot publish or subscribe, but consumers take the
    document only from the intended HTTPS origin, over verified TLS.

    Args:
        ctx: the face's ports (``space`` and ``idp_pin``).
        public_url: the base clients reach this face by; a trailing slash is dropped. Clients
            derive ``/exchange`` by appending to it.
        server: the broker address remote clients dial (``nats:``, ``tls:``, ``ws:``, ``wss:``).
        idp_url: the IdP's base URL clients sign in at (``idp.json`` ``url``).
        sentinel_creds: the space's deny-all sentinel ``.creds`` text.

    Raises:
        ConfigError: ``public_url`` or ``idp_url`` is not an http(s) URL with a host,
            ``server`` is empty, or ``sentinel_creds`` is not ``.creds`` text.
    """
    base = _web_url(public_url, "the public exchange URL", "set --exchange-public-url to the address clients reach")
    idp = _web_url(idp_url, "the IdP URL", "pin the IdP's base URL (idp.json url)")
    if not isinstance(server, str) or not server:
        raise ConfigError("the public face needs the broker address remote agents dial - set --advertised-server")
    pin = ctx.idp_pin
    return {
        "space": ctx.space,
        "server": server,
        "tlsRequired": True,  # as upstream publishes it, whatever the server's scheme (upstream-notes 4.3)
        "userAuth": {
            "provider": AUTH_PROVIDER,
            "idp": {"url": idp, "issuer": pin.issuer, "audience": pin.audience},
            "endpoints": {"url": base, "managerAuthorityUrl": f"{base}/manager-service-authority"},
        },
        "sentinelCreds": _check_creds(sentinel_creds),
    }


def peer_key(client: Sequence[object] | None, forwarded: Sequence[str], *, trusted_proxy: bool) -> str:
    """The refusal bucket a public request counts against (spec "Proxy attribution").

    Args:
        client: the ASGI ``client`` of the socket, ``(host, port)``, or ``None``. Only the host
            keys the bucket: a new connection from the same host lands in the same bucket.
        forwarded: every ``X-Forwarded-For`` header value, in the order received (several
            headers read as one comma-joined list, RFC 9110 5.3).
        trusted_proxy: attribute by the **last** forwarded hop: the one the operator's own
            proxy appended. Without it forwarded headers are ignored, so a client cannot
            choose its bucket by sending one.

    Returns:
        The last non-empty hop (``trusted_proxy`` only), else the socket host, else
        :data:`UNKNOWN_PEER`.
    """
    if trusted_proxy:
        hops = [hop.strip() for value in forwarded for hop in value.split(",")]
        if hops and hops[-1]:
            return hops[-1]
    if client:
        return str(client[0])
    return UNKNOWN_PEER


class _PublicFace:
    """The exchange handler of one public app and the peer buckets it keeps."""

    def __init__(self, ctx: ExchangeContext, *, trusted_proxy: bool) -> None:
        self._ctx = ctx
        self._trusted_proxy = trusted_proxy
        self._refusals = WindowLru()
        # manager-caller selection windows, keyed (principal, "pinned" | "unpinned") (spec
        # "Proxy attribution": 30/min per class, one 1024-key LRU)
        self._selection = WindowLru()

    def _peer(self) -> str:
        forwarded = request.headers.getlist("X-Forwarded-For") if self._trusted_proxy else []
        return peer_key(request.scope.get("client"), forwarded, trusted_proxy=self._trusted_proxy)

    async def exchange(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        """``POST /exchange``: ``200 {"token", "owner", "exp"}`` (``exp`` unix seconds).

        Raises (answered by the edge): ``Rejected`` 403/413/415; ``Refused`` BAD_REQUEST 400,
        BAD_CREDENTIAL/NOT_GRANTED 401, RATE_LIMITED 429 once the peer's bucket is full.
        """
        with counted_exchange(self._ctx) as tally:
            check_transport(request.headers)
            body = await read_json_body()
            await refetch_for_unknown_idp_key(self._ctx, body)
            peer = self._peer()
            admit = functools.partial(self._refusals.try_acquire, peer)
            return await answer_exchange(
                self._ctx, body, face="public", admit_refusal=admit, peer=peer, tally=tally,
                selection_windows=self._selection,
            )  # fmt: skip

    def mesh_route(self, path: str, routes: Mapping[str, Route] | None = None) -> Handler:
        """The handler of one credential route of :data:`~cotal_trio.http.mesh_routes.MESH_PATHS`
        (or of ``routes``, the service-endpoint doors): the same pre-checks as ``/exchange``,
        refusals counted in the same peer bucket."""

        async def handle() -> tuple[dict[str, Any], int, dict[str, str]]:
            check_transport(request.headers)
            body = await read_json_body()
            await refetch_for_unknown_idp_key(self._ctx, body)
            peer = self._peer()
            admit = functools.partial(self._refusals.try_acquire, peer)
            return await answer_mesh_route(self._ctx, path, body, admit_refusal=admit, peer=peer, routes=routes)

        return handle


def build_public_app(
    ctx: ExchangeContext,
    *,
    public_url: str,
    advertised_server: str | None,
    server_url: str,
    idp_url: str,
    sentinel_creds: str,
    trusted_proxy: bool,
    service_endpoints: bool = False,
) -> QuartTrio:
    """Build the public face for one space (DESIGN 7; spec "Listener policy", "Proxy attribution").

    The bootstrap document is composed and checked here, once, so a bad input fails the lane's
    start rather than a client's request.

    Args:
        ctx: the space's ports; ``ctx.capability`` is never asked for on this face.
        public_url: the ``https://`` address clients reach this face by (``--exchange-public-url``;
            without one, the caller passes the bound address). Published as ``endpoints.url``.
        advertised_server: the broker address remote agents dial (``--advertised-server``), or
            ``None`` to advertise ``server_url``.
        server_url: the broker address the service itself uses (``--server``).
        idp_url: the pinned IdP's base URL (``idp.json`` ``url``) remote users sign in at.
        sentinel_creds: the space's deny-all sentinel ``.creds`` text (not its path).
        trusted_proxy: ``--exchange-trusted-proxy``: attribute peers by the last
            ``X-Forwarded-For`` hop; use it only when the listener is reachable solely through
            a proxy the operator controls.
        service_endpoints: serve ``POST /service-endpoint-authority`` and ``POST
            /service-endpoint-host`` (the space's service runs with ``--service-endpoints`` or its
            entry sets ``serviceEndpoints``); without it both are 404.

    Returns:
        A quart-trio app; serve it with :func:`cotal_trio.http.serve.serve_app` on 127.0.0.1.
        Each call returns an app with fresh, empty peer buckets.

    Raises:
        ConfigError: as :func:`mesh_document`, or ``trusted_proxy`` is not a bool.
    """
    if type(trusted_proxy) is not bool:
        raise ConfigError("trusted_proxy must be true or false (--exchange-trusted-proxy is a switch)")
    server = advertised_server if advertised_server is not None else server_url
    document = mesh_document(
        ctx, public_url=public_url, server=server, idp_url=idp_url, sentinel_creds=sentinel_creds
    )

    async def well_known() -> dict[str, Any]:
        return document

    app = QuartTrio("cotal_trio.http.public")
    face = _PublicFace(ctx, trusted_proxy=trusted_proxy)
    routes: dict[str, dict[str, Handler]] = {
        **info_routes(ctx), "/exchange": {"POST": face.exchange}, MESH_DOCUMENT_PATH: {"GET": well_known},
    }  # fmt: skip
    for path in MESH_PATHS:
        routes[path] = {"POST": face.mesh_route(path)}
    unknown_path = UNKNOWN_PATH
    if service_endpoints:
        for path in SERVICE_ENDPOINT_PATHS:
            routes[path] = {"POST": face.mesh_route(path, SERVICE_ENDPOINT_ROUTES)}
        unknown_path = f"{UNKNOWN_PATH}, {', '.join(SERVICE_ENDPOINT_PATHS)}"
    install_edge(app, routes=routes, unknown_path=unknown_path)
    return app
