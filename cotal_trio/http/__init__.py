"""The HTTP faces (DESIGN 7): quart-trio apps served by hypercorn on 127.0.0.1.

Handlers are thin: parse, call the pure core, and let the one error edge (``errors.py``) turn
any exception into a JSON answer.
"""

from cotal_trio.http.errors import REFUSAL_STATUS, Rejected, answer_error, install_edge
from cotal_trio.http.faces import ExchangeContext, Minted, mint_exchange
from cotal_trio.http.loopback import build_loopback_app
from cotal_trio.http.serve import serve_app

__all__ = [
    "REFUSAL_STATUS",
    "ExchangeContext",
    "Minted",
    "Rejected",
    "answer_error",
    "build_loopback_app",
    "install_edge",
    "mint_exchange",
    "serve_app",
]
