"""`cotal client` under test: a managed root's context, the IdP token and the cotal call."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import trio

from cotal_trio.cli import main
from cotal_trio.core.idp import parse_jwks
from cotal_trio.devidp import jwks, mint_dev_token
from cotal_trio.http import ExchangeContext
from cotal_trio.state import load_idp_pin, load_issuer_keys, load_owner_secret, read_principal
from tests.support.cli_root import SPACE, Root

SUB = "alice"
CEILING_S = 10


def _context(root: Root, cap: str) -> ExchangeContext:
    """The space's exchange ports, from the root's files (as a lane builds them)."""
    return ExchangeContext(
        space=SPACE, capability=cap,
        issuer_key=load_issuer_keys(root.space.issuer_json, SPACE).active,
        owner_secret=load_owner_secret(root.space.owner_secret_json),
        idp_pin=load_idp_pin(root.space.idp_json).pin(),
        idp_keys=lambda: parse_jwks(jwks(root.idp)),
        read_ledger=functools.partial(read_principal, root.space), clock=time.time,
    )  # fmt: skip


async def _cotal(root: Root, capsys, *argv: str) -> tuple[int, str, str]:
    """``cotal <argv> --root <root>`` in a worker thread: (exit code, stdout, stderr)."""
    capsys.readouterr()
    with trio.fail_after(CEILING_S):
        code = await trio.to_thread.run_sync(main, [*argv, "--root", str(root.paths.root)])
    out, err = capsys.readouterr()
    return code, out, err


def _idp_token(root: Root, sub: str = SUB) -> str:
    return mint_dev_token(root.idp, sub=sub, now=int(time.time()), ttl_s=600)


def _managed(root: Root, capsys, tmp_path: Path, mode: int = 0o600) -> Path:
    code, out, _ = root.run(capsys, "actor", "grant", "worker", "--sub", SUB, "--managed", "--full", "--json")
    assert code == 0
    token_file = tmp_path / "worker.token"
    token_file.write_text(json.loads(out)["actorToken"] + "\n")
    token_file.chmod(mode)
    return token_file
