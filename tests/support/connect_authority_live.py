"""The connect authority on a live broker: its registrations and the paths it counts."""

from __future__ import annotations

import trio

from cotal_trio.lane.callout.authority import ConnectAuthority
from cotal_trio.state import read_json
from tests.support.stack import Stack, _post


def _count_paths(monkeypatch) -> dict[str, list[object]]:
    """What each of ConnectAuthority's two paths answered, in order: ``prepared`` (``finish``,
    the writes sent beside the issuance row) and ``after the re-check`` (the port awaited;
    "cancelled" when the callout stopped waiting for it)."""
    paths: dict[str, list[object]] = {"prepared": [], "after the re-check": []}
    finish, call = ConnectAuthority.finish, ConnectAuthority.__call__

    async def finished(self, *args):
        paths["prepared"].append(extra := await finish(self, *args))
        return extra

    async def called(self, *args):
        try:
            extra = await call(self, *args)
        except trio.Cancelled:  # the callout stopped waiting for it (its deadline less the margin)
            paths["after the re-check"].append("cancelled")
            raise
        paths["after the re-check"].append(extra)
        return extra

    monkeypatch.setattr(ConnectAuthority, "finish", finished)
    monkeypatch.setattr(ConnectAuthority, "__call__", called)
    return paths


async def _loopback(stack: Stack, path: str, body: dict, *, cap: str | None = None) -> tuple[int, dict]:
    service = read_json(stack.space_paths.auth_service_json)
    return await trio.to_thread.run_sync(_post, service["url"] + path, cap or service["cap"], body)


async def _register(stack: Stack, sub: str, actor: str) -> str:
    status, body = await _loopback(
        stack, "/manager-service-authority", {"idpToken": stack.idp_token(sub), "request": {"kind": "register", "actor": actor}}
    )
    assert status == 200, body
    return body["instanceId"]
