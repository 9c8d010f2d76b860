"""`cotal up` hosting several spaces: a second process's view of it and the wait for a manifest to apply."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import trio

from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.natsio import open_connection, open_loop
from cotal_trio.state import RootPaths, load_owner_secret, read_json, write_row
from tests.support.stack import Stack, _post


def applied(paths: RootPaths) -> dict:
    path = paths.spaces_manifest.with_name("spaces.json.applied")
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}


async def until_applied(paths: RootPaths, done, ceiling_s: float = 10) -> dict:
    with trio.fail_after(ceiling_s):
        while not done(applied(paths).get("spaces", {})):
            await trio.sleep(0.02)
    return applied(paths)["spaces"]


class Other:
    """A client's view of a second space of the stack's root."""

    def __init__(self, stack: Stack, space: str) -> None:
        self.stack, self.space, self.paths = stack, space, stack.paths.space(space)

    def grant(self, sub: str, actor: str) -> None:
        """An interactive row in this space's ledger (its own owner secret)."""
        owner = derive_owner(load_owner_secret(self.paths.owner_secret_json), self.stack.info.pin.issuer, sub)
        write_row(self.paths, LedgerRow(
            kind=LedgerKind.INTERACTIVE, owner=owner, actor=actor, scope=("spawn",),
            allow_subscribe=("team.>",), allow_publish=("team.>",), role=None, parent=None,
            label=None, token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
            granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        ))

    async def bearer(self, sub: str, actor: str) -> str:
        service = read_json(self.paths.auth_service_json)
        body = {"idpToken": self.stack.idp_token(sub), "actor": actor}
        status, answer = await trio.to_thread.run_sync(_post, service["url"] + "/exchange", service["cap"], body)
        assert status == 200, answer
        return answer["token"]

    async def connects(self, bearer: str) -> bool:
        try:
            async with open_loop(), open_connection(
                self.stack.info.server_url, creds=self.paths.sentinel_creds.read_text(), token=bearer,
                name="ibxprobe", inbox_prefix="_INBOX_ibxprobe", reconnect=False,
            ):
                return True
        except Exception:  # noqa: BLE001 - any refusal of the connect is the answer here
            return False
