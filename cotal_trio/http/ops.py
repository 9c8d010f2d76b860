"""The operator face: one per host process, on 127.0.0.1 and a port that does not move (issue 18 item 8).

Every lane's loopback face has a port of its own, new at each lane start, and shows its own
space's traffic. The operator face is the process's: the service (``service/ops_face.py``) serves
it before its lanes start and until the process ends, so its port and its capability stay the
same across lane restarts, manifest edits and fences. Closed, exact-match route table:

=================  ==========================================================================
``GET /health``    ``{"ok": true, "pid": <pid>, "lanes": {space: {"state", "reason"}}}``
``GET /metrics``   every lane's metrics with their ``space`` label, ``cotal_lane_state`` and
                   ``cotal_build_info`` (``lane/ops.py``); **no capability**, as the loopback
                   face's ``/metrics`` (counts and times by space, never who connects)
``GET /``          the status page (:mod:`cotal_trio.http.status_page`) with every space's traffic
``/events``        websocket: every space's events, each naming its space (docs/events.md)
=================  ==========================================================================

``/`` and ``/events`` follow the loopback face's rules exactly (:mod:`cotal_trio.http.loopback`):
the capability once as ``?cap=`` (its own bad-capability window: 401, then 429), then the
session cookie ``cotal_session_<port>`` (HMAC of the capability); ``/events`` refuses a foreign
``Origin`` (403) and takes the cookie or ``Authorization: Bearer <capability>``. The capability is
the ``cap`` of the face's readiness file ``<root>/ops/<port>.json`` (0600, ``{ver, url, pid,
cap}``, the shape of a lane's ``auth-service.json``), minted once per process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from quart_trio import QuartTrio

from cotal_trio.http.errors import Handler, install_edge
from cotal_trio.http.loopback import (
    EVENTS_PATH,
    CapabilityGate,
    EventSource,
    EventsDoor,
    metrics_route,
    not_a_websocket,
)
from cotal_trio.http.status_page import status_routes

__all__ = ["OPS_BAD_CAPABILITY", "OPS_UNAUTHORIZED_PAGE", "OPS_UNKNOWN_PATH", "build_ops_app"]

OPS_UNKNOWN_PATH = "unknown path - the operator face serves /health, /metrics, /events and / (the status page)"
OPS_BAD_CAPABILITY = "missing/invalid operator capability - read cap from <root>/ops/<port>.json"

OPS_UNAUTHORIZED_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cotal status - capability needed</title></head>
<body><h1>cotal status: capability needed</h1>
<p>This is the process's operator face: every space it serves on one page. It needs the face's
capability once: the <code>cap</code> field of <code>ops/&lt;port&gt;.json</code> under the cotal
root (readable by the service's user only). <code>cotal status</code> names the face and its file.</p>
<p>Open <code>http://127.0.0.1:&lt;port&gt;/?cap=&lt;capability&gt;</code> on this host; the page
then keeps a session cookie while the process runs: the capability is minted when the service
starts and lasts until it stops, whatever its lanes do.</p>
</body></html>
"""


def build_ops_app(
    *, capability: str, clock: Callable[[], float], metrics: Callable[[], tuple[bytes, str]], events: EventSource,
    lanes: Callable[[], Mapping[str, Mapping[str, Any]]],
) -> QuartTrio:
    """Build the process's operator face (module docstring).

    Args:
        capability: the face's capability (hex), minted once per process.
        clock: seconds, for the bad-capability window.
        metrics: ``() -> (body, Content-Type)``, the board's exposition (``OpsBoard.exposition``;
            sync), served as ``GET /metrics``.
        events: the process's event bus, streamed unfiltered on ``/events``.
        lanes: ``() -> {space: {"state", "reason"}}`` (``EventBus.lanes``; sync), for ``/health``.

    Returns:
        A quart-trio app; serve it with :func:`cotal_trio.http.serve.serve_app`.
    """
    app = QuartTrio("cotal_trio.http.ops")
    gate = CapabilityGate(capability, clock, refusal=OPS_BAD_CAPABILITY)

    async def health() -> tuple[dict[str, Any], int]:
        return {"ok": True, "pid": os.getpid(), "lanes": {space: dict(lane) for space, lane in lanes().items()}}, 200

    routes: dict[str, Mapping[str, Handler]] = {
        "/health": {"GET": health}, "/metrics": {"GET": metrics_route(metrics)}, EVENTS_PATH: {"GET": not_a_websocket},
        **status_routes(capability, gate.check, unauthorized=OPS_UNAUTHORIZED_PAGE),
    }  # fmt: skip
    app.add_websocket(EVENTS_PATH, "events", EventsDoor(gate, None, events, unknown_path=OPS_UNKNOWN_PATH).serve)
    install_edge(app, routes=routes, unknown_path=OPS_UNKNOWN_PATH)
    return app
