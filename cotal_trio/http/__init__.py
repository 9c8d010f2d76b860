"""The HTTP faces (DESIGN 7): quart-trio apps served by hypercorn on 127.0.0.1.

Two faces per space: the loopback face (capability-gated, ``loopback.py``) and the optional
public face (no capability, per-peer refusal budgets, the bootstrap document; ``public.py``).
Handlers are thin: parse, call the pure core, and let the one error edge (``errors.py``) turn
any exception into a JSON answer. What both faces share: the request hygiene (``transport.py``),
the routes (``face_routes.py``), the ports and the minting (``faces.py``). Beside them, one per
process, the operator face (``ops.py``; issue 18 item 8): every space's metrics, status page and
events on one fixed port, with the loopback face's capability rules.
"""

from cotal_trio.http.errors import REFUSAL_STATUS, Rejected, answer_error, install_edge
from cotal_trio.http.faces import ExchangeContext, Minted
from cotal_trio.http.loopback import build_loopback_app
from cotal_trio.http.public import AUTH_PROVIDER, build_public_app, mesh_document
from cotal_trio.http.serve import serve_app

__all__ = [
    "AUTH_PROVIDER",
    "REFUSAL_STATUS",
    "ExchangeContext",
    "Minted",
    "Rejected",
    "answer_error",
    "build_loopback_app",
    "build_public_app",
    "install_edge",
    "mesh_document",
    "serve_app",
]
