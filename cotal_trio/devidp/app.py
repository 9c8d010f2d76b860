"""The development IdP's HTTP face: its JWKS, health, and the device-code login. DEVELOPMENT ONLY.

Closed route table, each under ``base_path`` (``""`` for ``cotal up``'s dev IdP), in the shape of
Better Auth with its device-authorization, bearer and JWT plugins (spec "IdP compatibility"; the
grant rules are :mod:`cotal_trio.devidp.device`):

=========================  ======================================================================
``GET /jwks``              the public key set (cacheable for 300 s)
``GET /health``            ``{"ok": true, "devOnly": true, "issuer": ...}``
``POST /device/code``      ``{client_id, scope?}`` (JSON or form) -> the RFC 8628 device code
``POST /device/token``     ``{grant_type: urn:ietf:params:oauth:grant-type:device_code,
                           device_code, client_id}`` -> ``{access_token, ...}`` or an RFC error
``GET /device``            ``?user_code=`` -> ``{user_code, status, approve}`` (how to approve)
``POST /device/approve``   ``{userCode}`` with ``Authorization: Bearer <dev IdP JWT>``: the JWT's
                           ``sub`` approves the code (``cotal dev-idp approve`` sends it)
``POST /device/deny``      ``{userCode}``, same sign-in
``GET /token``             ``Authorization: Bearer <session>`` -> ``{"token": <EdDSA JWT>}``
``POST /sign-out``         ``Authorization: Bearer <session>`` -> ``{"success": true}``; the
                           session is revoked
=========================  ======================================================================

Any other path is a JSON 404 and a wrong method a JSON 405 (the auth service's error edge,
``http/errors.py``). Approving a code needs a JWT signed with the private key in the 0600
``devidp.json``, so only the root's own user can sign anyone in, as with ``cotal dev-idp token``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from quart import request
from quart_trio import QuartTrio

from cotal_trio.core.device_flow import DEVICE_CODE_GRANT
from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.idp import IdpPin, parse_jwks, verify_idp_token
from cotal_trio.devidp.device import DeviceGrants, DevicePolicy
from cotal_trio.devidp.idp import TokenSigner, jwks, mint_dev_token
from cotal_trio.http.errors import install_edge
from cotal_trio.http.transport import read_json_body

__all__ = ["DEV_UNKNOWN_PATH", "SESSION_JWT_TTL_S", "build_dev_idp_app"]

DEV_UNKNOWN_PATH = (
    "unknown path - the development IdP serves /jwks, /health, /device/code, /device/token, /device, "
    "/device/approve, /device/deny, /token and /sign-out"
)
# Same cache lifetime as the auth service's own JWKS (upstream-notes 3.1).
_JWKS_MAX_AGE_S = 300
# Better Auth's JWT plugin default: a JWT from GET /token lives 15 minutes.
SESSION_JWT_TTL_S = 900
_FORM = "application/x-www-form-urlencoded"
# A user code that is not waiting: mistyped (the login still waits for the right one), or ended.
NO_PENDING_CODE = "no pending user code matches - check the code `cotal login` printed, or start `cotal login` again"
Answer = tuple[dict[str, Any], int]


async def _fields() -> dict[str, Any]:
    """The request body as ``{name: value}``: a form (RFC 8628's encoding) or a JSON object
    (Better Auth's clients); anything else is an empty dict, which the route then refuses."""
    if request.mimetype == _FORM:
        raw = (await request.get_data()).decode("utf-8", "replace")
        return {name: values[0] for name, values in parse_qs(raw).items()}
    body = await read_json_body()
    return body if isinstance(body, dict) else {}


def _bearer() -> str:
    header = request.headers.get("Authorization", "")
    return header[len("Bearer ") :].strip() if header.startswith("Bearer ") else ""


def _oauth_error(error: str, description: str, status: int = 400) -> Answer:
    return {"error": error, "error_description": description}, status


@dataclass(frozen=True, slots=True, kw_only=True)
class _Routes:
    """The handlers of one dev IdP app: its signer, its grants and its clock."""

    material: TokenSigner
    grants: DeviceGrants
    clock: Callable[[], float]
    base_path: str

    async def device_code(self) -> Answer:
        fields = await _fields()
        client_id, scope = fields.get("client_id"), fields.get("scope", "")
        if not isinstance(client_id, str) or not client_id or not isinstance(scope, str):
            return _oauth_error("invalid_request", "client_id is required (a string), scope is optional")
        verification = f"{request.host_url.rstrip('/')}{self.base_path}/device"
        return self.grants.issue(client_id=client_id, scope=scope, verification_uri=verification, now=self.clock()), 200

    async def device_token(self) -> Answer:
        fields = await _fields()
        if fields.get("grant_type") != DEVICE_CODE_GRANT:
            return _oauth_error("unsupported_grant_type", f"grant_type must be {DEVICE_CODE_GRANT}")
        code, client_id = fields.get("device_code"), fields.get("client_id")
        if not isinstance(code, str) or not isinstance(client_id, str):
            return _oauth_error("invalid_request", "device_code and client_id are required")
        status, body = self.grants.poll(device_code=code, client_id=client_id, now=self.clock())
        return body, status

    async def device_page(self) -> Answer:
        code = request.args.get("user_code", "")
        if not code:
            return {"user_code": "<code>", "approve": "cotal dev-idp approve --user-code <code> --sub <you>"}, 200
        if not self.grants.is_pending(code, now=self.clock()):
            return {"user_code": code, "status": "not pending", "fix": NO_PENDING_CODE}, 200
        return {"user_code": code, "status": "pending", "approve": f"cotal dev-idp approve --user-code {code} --sub <you>"}, 200

    def _signed_in_subject(self) -> str:
        pin = IdpPin(issuer=self.material.issuer, audience=self.material.audience)
        try:
            return verify_idp_token(_bearer(), pin=pin, keys=parse_jwks(jwks(self.material)), now=self.clock()).sub
        except Refused:
            raise Refused(
                RefusalCode.BAD_CREDENTIAL,
                "sign in first: send Authorization: Bearer <a development IdP token> (`cotal dev-idp approve` does)",
            ) from None

    async def _answer_code(self, approving: bool) -> Answer:
        subject = self._signed_in_subject()
        user_code = (await _fields()).get("userCode")
        if not isinstance(user_code, str) or not user_code:
            return _oauth_error("invalid_request", "userCode is required")
        now = self.clock()
        if approving:
            done = self.grants.approve(user_code=user_code, subject=subject, now=now)
        else:
            done = self.grants.deny(user_code=user_code, now=now)
        if not done:
            return _oauth_error("invalid_request", NO_PENDING_CODE)
        return {"success": True}, 200

    async def approve(self) -> Answer:
        return await self._answer_code(True)

    async def deny(self) -> Answer:
        return await self._answer_code(False)

    async def token(self) -> Answer:
        now = self.clock()
        found = self.grants.session_subject(_bearer(), now=now)
        if found is None:
            return {"error": "UNAUTHORIZED", "message": "no live session - log in again"}, 401
        subject, signed_in_at = found
        ttl_s, auth_time = SESSION_JWT_TTL_S, int(signed_in_at)
        return {"token": mint_dev_token(self.material, sub=subject, now=int(now), ttl_s=ttl_s, auth_time=auth_time)}, 200

    async def sign_out(self) -> Answer:
        self.grants.revoke(_bearer())
        return {"success": True}, 200


def build_dev_idp_app(
    material: TokenSigner,
    *,
    device: DevicePolicy | None = None,
    clock: Callable[[], float] = time.time,
    base_path: str = "",
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> QuartTrio:
    """Build the development IdP's app (serve it with ``http.serve.serve_app``).

    Args:
        material: the IdP's signer (``devidp.json``'s material; a test may pass another
            issuer, e.g. its origin, to be a Better-Auth-shaped IdP).
        device: interval and lifetime of device codes (default: 5 s and 30 minutes).
        clock: unix seconds now (a test passes its own to drive expiry and ``slow_down``).
        base_path: prefix of every route (Better Auth serves under ``/api/auth``), ``""`` or
            ``/segment...`` without a trailing slash.
        random_bytes: the CSPRNG for device codes and sessions.

    Returns:
        A quart-trio app answering the module's route table only.
    """
    app = QuartTrio("cotal_trio.devidp")
    key_set = jwks(material)
    grants = DeviceGrants(policy=device or DevicePolicy(), random_bytes=random_bytes)
    routes = _Routes(material=material, grants=grants, clock=clock, base_path=base_path)

    async def serve_jwks() -> tuple[dict[str, Any], int, dict[str, str]]:
        return key_set, 200, {"Cache-Control": f"max-age={_JWKS_MAX_AGE_S}"}

    async def health() -> dict[str, Any]:
        return {"ok": True, "devOnly": True, "issuer": material.issuer}

    table = {
        "/jwks": {"GET": serve_jwks}, "/health": {"GET": health},
        "/device/code": {"POST": routes.device_code}, "/device/token": {"POST": routes.device_token},
        "/device": {"GET": routes.device_page}, "/device/approve": {"POST": routes.approve},
        "/device/deny": {"POST": routes.deny}, "/token": {"GET": routes.token}, "/sign-out": {"POST": routes.sign_out},
    }  # fmt: skip
    install_edge(app, routes={base_path + path: methods for path, methods in table.items()}, unknown_path=DEV_UNKNOWN_PATH)
    return app
