"""``cotal check``: run the whole user-auth path against the running root."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

from cyclopts import Parameter

from ..lanes.selfcheck import CheckFailed, run_check
from .common import Where

__all__ = ["check"]


async def check(
    *,
    where: Where = Where(),
    idp_token: Annotated[str | None, Parameter(help="An IdP token to use (needed when a real IdP is pinned).")] = None,
    actor: Annotated[str | None, Parameter(help="The granted actor to check as (with --idp-token).")] = None,
) -> int:
    """Token, exchange, connect, publish within the grant, a publish outside it refused, a
    tampered bearer refused. Exits 1 at the first failing step and names it.

    With the development IdP and no --idp-token, it grants a temporary actor ``cotal_check``
    and revokes it when done.
    """
    space_paths = where.provisioned()
    # The check provokes a permissions violation on purpose; nats-py reports it as an error.
    logging.getLogger("cotal.natsio").setLevel(logging.ERROR)
    try:
        await run_check(
            where.paths(), space_paths.space, report=lambda line: print(line, flush=True),
            idp_token=idp_token, actor=actor,
        )
    except CheckFailed as failed:
        print(f"✗ {failed}", file=sys.stderr)
        return 1
    print("check passed")
    return 0
