"""The development IdP (issue 2 item 8): an EdDSA IdP for ``cotal up`` without a real IdP.

DEVELOPMENT ONLY. Tokens are minted from the root's 0600 ``devidp.json``; its HTTP face serves
the public JWKS, a health route and Better Auth's device-code login (``app.py``), which mints a
JWT only for a session a person approved with a token signed by that same key.
"""

from cotal_trio.devidp.app import DEV_UNKNOWN_PATH, build_dev_idp_app
from cotal_trio.devidp.device import DeviceGrants, DevicePolicy
from cotal_trio.devidp.idp import (
    DEV_AUDIENCE,
    DEV_ISSUER_PREFIX,
    DevIdpMaterial,
    TokenSigner,
    create_dev_idp,
    jwks,
    mint_dev_token,
)

__all__ = [
    "DEV_AUDIENCE",
    "DEV_ISSUER_PREFIX",
    "DEV_UNKNOWN_PATH",
    "DeviceGrants",
    "DevicePolicy",
    "DevIdpMaterial",
    "TokenSigner",
    "build_dev_idp_app",
    "create_dev_idp",
    "jwks",
    "mint_dev_token",
]
