"""``cotal check``: run the whole user-auth path against the running root."""

from __future__ import annotations

import json
import logging
import sys
from typing import Annotated

import trio
from cyclopts import Parameter

from ..core.errors import ConfigError, Unavailable
from cotal_trio.ops.selfcheck import CheckFailed, run_check
from ._idp_session import session_idp_token
from ._servers import Server, parse_servers, resolve_servers
from .common import Where
from .exits import ExitCode

__all__ = ["check"]


async def check(
    *,
    where: Where = Where(),
    server: Server = None,
    idp_token: Annotated[str | None, Parameter(help=(
        "An IdP token to use; without it, with --actor, a fresh one from your `cotal login` session."))] = None,
    actor: Annotated[str | None, Parameter(help=(
        "The granted actor to check as (with --idp-token, or after `cotal login`; needed when a real IdP is pinned)."
    ))] = None,
    as_json: Annotated[bool, Parameter(name="--json", negative="", help="Print one JSON object at the end.")] = False,
) -> int:
    """Token, exchange, connect, publish within the grant, a publish outside it refused, a
    tampered bearer refused. Exits 1 at the first failing step and names it.

    With --actor and no --idp-token it takes the IdP token from your `cotal login` session. With
    the development IdP and neither, it grants a temporary actor ``cotal_check`` and revokes it
    when done. On a root `cotal up` does not run (a cluster's), pass --server;
    with several URLs the check connects through the first that answers. With --json it prints
    only {"space", "passed", "steps": [the steps that passed], "failed": null or {"step",
    "reason"}} (step "" when the check could not start, for example no auth service runs).
    """
    if server is not None:  # the flags first: a bad --server is named before the root is looked at
        parse_servers(server)
    space_paths = where.provisioned()
    servers = resolve_servers(where.paths(), server)
    # The check provokes a permissions violation on purpose; nats-py reports it as an error.
    logging.getLogger("cotal.natsio").setLevel(logging.ERROR)
    steps: list[str] = []
    report = (lambda line: steps.append(line.removeprefix("✓ "))) if as_json else (lambda line: print(line, flush=True))
    try:
        if actor is not None and idp_token is None:
            idp_token = await trio.to_thread.run_sync(session_idp_token, space_paths)
        await run_check(where.paths(), space_paths.space, servers=servers, report=report, idp_token=idp_token, actor=actor)
    except CheckFailed as failed:
        if as_json:
            reason = str(failed).removeprefix(f"{failed.step}: ") if failed.step else str(failed)
            return _print_outcome(space_paths.space, steps, {"step": failed.step, "reason": reason})
        print(f"✗ {failed}", file=sys.stderr)
        return ExitCode.FAILED
    except (ConfigError, Unavailable) as exc:
        if not as_json:
            raise
        return _print_outcome(space_paths.space, steps, {"step": "", "reason": str(exc)})
    if as_json:
        return _print_outcome(space_paths.space, steps, None)
    print("check passed")
    return ExitCode.OK


def _print_outcome(space: str, steps: list[str], failed: dict[str, str] | None) -> int:
    """The ``--json`` object on stdout; the exit status (0 passed, 1 failed)."""
    print(json.dumps({"space": space, "passed": failed is None, "steps": steps, "failed": failed}, indent=2))
    return ExitCode.OK if failed is None else ExitCode.FAILED
