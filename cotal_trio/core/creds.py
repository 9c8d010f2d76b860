"""NATS ``.creds`` files: a user JWT and its nkey seed in the decorated text form.

The format nats-py and the nats CLI read: a ``-----BEGIN NATS USER JWT-----`` block, then a
``-----BEGIN USER NKEY SEED-----`` block, each closed by a matching ``------END ...------`` line.
"""

from __future__ import annotations

import re

from .errors import CodecError

__all__ = ["format_creds", "parse_creds"]

_BLOCK = re.compile(r"-{3,}[^\n]*BEGIN[^\n]*-{3,}\s*\n([^\n]+)\n\s*-{3,}[^\n]*END[^\n]*-{3,}")

_TEMPLATE = """-----BEGIN NATS USER JWT-----
{jwt}
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.
NKEYs are sensitive and should be treated as secrets.

-----BEGIN USER NKEY SEED-----
{seed}
------END USER NKEY SEED------

*************************************************************
"""


def format_creds(jwt: str, seed: str) -> str:
    """Render a user JWT and its seed as ``.creds`` text (a secret: write it 0600)."""
    return _TEMPLATE.format(jwt=jwt, seed=seed)


def parse_creds(text: str) -> tuple[str, str]:
    """Return ``(jwt, seed)`` from ``.creds`` text.

    Raises:
        CodecError: the text does not hold a JWT block followed by a seed block.
    """
    blocks = _BLOCK.findall(text)
    if len(blocks) < 2:
        raise CodecError("not a NATS creds file: expected a user JWT block and a seed block")
    return blocks[0].strip(), blocks[1].strip()
