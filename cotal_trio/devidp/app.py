"""The development IdP's HTTP face: its JWKS and a health route. DEVELOPMENT ONLY.

Closed route table: ``GET /jwks`` (the public key set, cacheable for 300 s) and ``GET /health``
(``{"ok": true, "devOnly": true, "issuer": ...}``); any other path is a JSON 404 and a wrong
method a JSON 405 (the same error edge as the auth service's faces, ``http/errors.py``).

There is deliberately no route that mints a token: minting needs the private key from the 0600
``devidp.json`` (``idp.mint_dev_token``), so only the root's own user can sign in through it.
"""

from __future__ import annotations

from typing import Any

from quart_trio import QuartTrio

from cotal_trio.devidp.idp import DevIdpMaterial, jwks
from cotal_trio.http.errors import install_edge

__all__ = ["DEV_UNKNOWN_PATH", "build_dev_idp_app"]

DEV_UNKNOWN_PATH = "unknown path - the development IdP serves only /jwks and /health"
# Same cache lifetime as the auth service's own JWKS (upstream-notes 3.1).
_JWKS_MAX_AGE_S = 300


def build_dev_idp_app(material: DevIdpMaterial) -> QuartTrio:
    """Build the development IdP's app (serve it with ``http.serve.serve_app``).

    Args:
        material: the dev IdP; only its public half is served.

    Returns:
        A quart-trio app answering ``GET /jwks`` and ``GET /health`` only.
    """
    app = QuartTrio("cotal_trio.devidp")
    key_set = jwks(material)

    async def serve_jwks() -> tuple[dict[str, Any], int, dict[str, str]]:
        return key_set, 200, {"Cache-Control": f"max-age={_JWKS_MAX_AGE_S}"}

    async def health() -> dict[str, Any]:
        return {"ok": True, "devOnly": True, "issuer": material.issuer}

    routes = {"/jwks": {"GET": serve_jwks}, "/health": {"GET": health}}
    install_edge(app, routes=routes, unknown_path=DEV_UNKNOWN_PATH)
    return app
