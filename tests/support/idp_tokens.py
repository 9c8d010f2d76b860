"""IdP tokens the development IdP's own mint cannot write, signed by its pinned key.

``mint_dev_token`` encodes its claims as UTF-8, so a subject holding a lone surrogate (``"\\ud800x"``)
raises UnicodeEncodeError there. An IdP that emits such a subject writes its JSON ASCII-escaped
(``\\ud800`` as text), which is what :func:`sign_ascii_escaped` signs (issue 15 item 6).
"""

from __future__ import annotations

import json

from cotal_trio.core.jose import b64url_encode
from cotal_trio.devidp import DevIdpMaterial


def sign_ascii_escaped(idp: DevIdpMaterial, claims: dict[str, object]) -> str:
    """A compact JWS of ``claims`` by ``idp``'s key (header ``EdDSA``, its ``kid``, ``JWT``), the
    header and claims JSON written ASCII-escaped, so any str (lone surrogates too) travels as text.

    ``claims`` is the whole payload (``iss``, ``aud``, ``sub``, ``iat``, ``exp``, ... as the caller
    wants them, unix seconds); nothing is added or checked.
    """
    header = {"alg": "EdDSA", "kid": idp.key.kid, "typ": "JWT"}
    signing_input = ".".join(b64url_encode(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims))
    return f"{signing_input}.{b64url_encode(idp.key.sign(signing_input.encode('ascii')))}"
