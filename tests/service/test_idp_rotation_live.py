"""A space pinned to a real (OIDC) IdP whose keys rotate while the lane serves (issue 5 item 6:
"an unknown kid triggers at most one refetch per 30 s").

Real nats-server (test_auth_service_live's mesh), a real lane host, and the IdP's JWKS served
over loopback HTTP by a small quart-trio app whose key set the test changes. The exchange for a
token signed by the IdP's new key mints in one request (the lane re-reads the JWKS), and the
bearer connects through the broker.
"""

from __future__ import annotations

import functools
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from quart_trio import QuartTrio

from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.jose import IssuerKey, sign_ed25519_jws
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.http import serve_app
from cotal_trio.service.host import Host, HostConfig, run_host
from cotal_trio.lane.spec import LaneCommon
from cotal_trio.service.hosting import FullLanes, lane_factory
from cotal_trio.state import IdpPinRecord, load_owner_secret, read_json, save_idp_pin, write_row
from tests.support.stack import _post
from tests.support.service import AUTH_TIMEOUT_S, Mesh, serving, until, write_manifest

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 60
ISSUER = "https://idp.test"
AUDIENCE = "cotal-test"
FIRST, NEXT = IssuerKey(seed=bytes([5] * 32)), IssuerKey(seed=bytes([6] * 32))


class Jwks:
    """The IdP's JWKS endpoint: serves ``keys``; counts its reads."""

    def __init__(self, *keys: IssuerKey) -> None:
        self.keys, self.reads = list(keys), 0
        self.app = QuartTrio(__name__)
        self.app.add_url_rule("/jwks", "jwks", self._jwks)

    async def _jwks(self):
        self.reads += 1
        return {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": k.x, "kid": k.kid, "alg": "EdDSA", "use": "sig"} for k in self.keys]}


def _token(key: IssuerKey, sub: str) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now - 5, "exp": now + 600}
    return sign_ed25519_jws({"alg": "EdDSA", "kid": key.kid, "typ": "JWT"}, claims, key)


def _grant(mesh: Mesh, space: str, sub: str) -> None:
    sp = mesh.paths.space(space)
    write_row(sp, LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=derive_owner(load_owner_secret(sp.owner_secret_json), ISSUER, sub),
        actor="cli", scope=("spawn",), allow_subscribe=("team.>",), allow_publish=("team.>",), role=None,
        parent=None, label=None, token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
        granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    ))  # fmt: skip


async def _exchange(mesh: Mesh, space: str, token: str) -> tuple[int, dict]:
    service = read_json(mesh.paths.space(space).auth_service_json)
    return await trio.to_thread.run_sync(_post, service["url"] + "/exchange", service["cap"], {"idpToken": token, "actor": "cli"})


async def test_a_rotated_idp_key_is_picked_up_by_the_next_exchange(mesh: Mesh, nursery: trio.Nursery, tmp_path: Path):
    jwks = Jwks(FIRST)
    with trio.fail_after(CEILING_S):
        port = await nursery.start(functools.partial(serve_app, jwks.app))
        save_idp_pin(mesh.paths.space("a").idp_json, IdpPinRecord(
            kind="oidc", url=ISSUER, issuer=ISSUER, audience=AUDIENCE, jwks_uri=f"http://127.0.0.1:{port}/jwks",
        ))  # fmt: skip
        _grant(mesh, "a", "alice")
        manifest = tmp_path / "host" / "spaces.json"
        manifest.parent.mkdir()
        write_manifest(manifest, "a")
        start_lane = lane_factory(
            root=mesh.paths, common=LaneCommon(server_url=mesh.server_url, limits=CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S), clock=time.time),
            lanes=FullLanes(),
        )
        host: Host = await nursery.start(run_host, HostConfig(manifest=manifest, start_lane=start_lane, backstop_s=600))
        await until(host, manifest, serving("a"))
        assert jwks.reads == 1  # read once when the lane started

        status, reply = await _exchange(mesh, "a", _token(FIRST, "alice"))
        assert status == 200, reply
        await mesh.admitted("a", reply["token"])

        jwks.keys = [NEXT]  # the IdP rotates: the first key is gone, a new one signs
        status, reply = await _exchange(mesh, "a", _token(NEXT, "alice"))
        assert status == 200, reply
        assert jwks.reads == 2  # one re-read, in that request
        await mesh.admitted("a", reply["token"])

        # A made-up kid right after is refused without asking the IdP again (30 s cooldown).
        stranger = IssuerKey(seed=bytes([7] * 32))
        status, reply = await _exchange(mesh, "a", _token(stranger, "alice"))
        assert (status, jwks.reads) == (401, 2), reply
        assert "is not in the pinned JWKS" in reply["error"]
