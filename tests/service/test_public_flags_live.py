"""The public face from the command line (issue 5 item 1), on a real nats-server.

``cotal auth-service --space a --exchange-public-port P --exchange-public-url https://...`` runs
as an operator runs it, in a subprocess against test_auth_service_live's ``mesh``, with space
``a`` pinned to a real (OIDC) IdP whose JWKS this test serves on loopback: a process outside
``cotal up`` has no development IdP to name. ``cotal up``'s flags are driven through ``run_up``
in-process. Every process started here is stopped by its pid.
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from quart_trio import QuartTrio

from cotal_trio.broker.process import free_port
from cotal_trio.broker.spaces import hosted_entries
from cotal_trio.core.errors import ConfigError
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.jose import IssuerKey, sign_ed25519_jws
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.manifest import SpaceEntry
from cotal_trio.http import serve_app
from cotal_trio.service.embedded import UpConfig, run_up
from cotal_trio.lane.spec import PublicFace
from cotal_trio.state import (
    IdpPinRecord,
    RootPaths,
    load_owner_secret,
    save_idp_pin,
    write_row,
)
from tests.support.service import Mesh
from tests.support.stack import request_json as _request

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

REPO = Path(__file__).resolve().parents[2]
CEILING_S = 60
READY = "✓ auth-service up"
ISSUER = "https://idp.test"
AUDIENCE = "cotal-test"
KEY = IssuerKey(seed=bytes([7] * 32))
PUBLIC_URL = "https://auth.example"


def _jwks_app() -> QuartTrio:
    app = QuartTrio(__name__)

    @app.route("/jwks")
    async def jwks():
        return {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": KEY.x, "kid": KEY.kid, "alg": "EdDSA", "use": "sig"}]}

    return app


def _idp_token(sub: str) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now - 5, "exp": now + 600}
    return sign_ed25519_jws({"alg": "EdDSA", "kid": KEY.kid, "typ": "JWT"}, claims, KEY)


async def _pin_real_idp(mesh: Mesh, nursery: trio.Nursery, space: str) -> None:
    """Serve the IdP's JWKS on loopback, pin ``space`` to it, and grant alice/cli there."""
    port = await nursery.start(functools.partial(serve_app, _jwks_app()))
    sp = mesh.paths.space(space)
    save_idp_pin(sp.idp_json, IdpPinRecord(
        kind="oidc", url=ISSUER, issuer=ISSUER, audience=AUDIENCE, jwks_uri=f"http://127.0.0.1:{port}/jwks",
    ))
    write_row(sp, LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=derive_owner(load_owner_secret(sp.owner_secret_json), ISSUER, "alice"),
        actor="cli", scope=("spawn",), allow_subscribe=("team.>",), allow_publish=("team.>",), role=None,
        parent=None, label=None, token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
        granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    ))  # fmt: skip


def _auth_service(mesh: Mesh, *flags: str, server: str | None = None) -> subprocess.Popen[str]:
    argv = [
        sys.executable, "-m", "cotal_trio", "auth-service", "--space", "a", "--server", server or mesh.server_url,
        "--root", str(mesh.paths.root), "--auth-timeout", "1", *flags,
    ]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ready(proc: subprocess.Popen[str], ceiling_s: float = 30) -> str:
    """Blocking: the banner line, once the process prints it (bounded)."""
    deadline = time.monotonic() + ceiling_s
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith(READY):
                return line
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=20)
    raise AssertionError(f"cotal auth-service did not become ready: {err}")


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Blocking: SIGTERM our process by pid, and its exit code and stderr."""
    os.kill(proc.pid, signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=20)
        raise
    return proc.returncode, err


async def test_auth_service_flags_serve_the_public_face(mesh: Mesh, nursery: trio.Nursery):
    port = free_port()
    with trio.fail_after(CEILING_S):
        await _pin_real_idp(mesh, nursery, "a")
        # a seed list (issue 17 item 3): the service connects through the first; the bootstrap
        # document names that one URL (a client reads `server` as one broker address)
        seeds = f"{mesh.server_url},nats://127.0.0.1:{free_port()}"
        proc = _auth_service(mesh, "--exchange-public-port", str(port), "--exchange-public-url", PUBLIC_URL, server=seeds)
        try:
            banner = await trio.to_thread.run_sync(_wait_ready, proc)
            assert f"public face on 127.0.0.1:{port} ({PUBLIC_URL})" in banner
            # The readiness file names the public face too (upstream-notes 4.1 shape).
            ready = json.loads(mesh.paths.space("a").auth_service_json.read_text())
            assert sorted(ready) == ["cap", "opsUrl", "pid", "publicUrl", "url", "ver"] and ready["publicUrl"] == PUBLIC_URL
            base = f"http://127.0.0.1:{port}"
            assert await trio.to_thread.run_sync(_request, base + "/health") == (
                200, {"ok": True, "issuer": "urn:cotal:auth:a"},
            )
            status, doc = await trio.to_thread.run_sync(_request, base + "/.well-known/cotal-mesh")
            assert status == 200, doc
            assert doc["space"] == "a" and doc["server"] == mesh.server_url
            assert doc["userAuth"]["endpoints"]["url"] == PUBLIC_URL
            assert doc["userAuth"]["idp"]["issuer"] == ISSUER
            assert doc["sentinelCreds"] == mesh.paths.space("a").sentinel_creds.read_text()
            # No capability on this face: the IdP token is the proof, and its bearer connects.
            body = {"idpToken": _idp_token("alice"), "actor": "cli"}
            status, minted = await trio.to_thread.run_sync(_request, base + "/exchange", body)
            assert status == 200, minted
            await mesh.admitted("a", minted["token"])
        finally:
            code, err = await trio.to_thread.run_sync(_stop, proc)
        assert code == 0, err
        assert not mesh.paths.space("a").auth_service_json.exists()


async def test_a_taken_public_port_is_named(mesh: Mesh, nursery: trio.Nursery):
    with trio.fail_after(CEILING_S), socket.socket() as squatter:
        await _pin_real_idp(mesh, nursery, "a")
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        proc = _auth_service(mesh, "--exchange-public-port", str(port))
        _, err = await trio.to_thread.run_sync(functools.partial(proc.communicate, timeout=30))
    assert proc.returncode == 1 and "Traceback" not in err
    assert f"cotal: port {port} on 127.0.0.1 is busy" in err.splitlines()[-1]
    assert not mesh.paths.space("a").auth_service_json.exists()


async def test_a_dev_idp_space_refuses_the_public_flag_naming_it(mesh: Mesh, nursery: trio.Nursery):
    """Found by a new-user run: the refusal named only the manifest key (``exchangePublicPort``)
    to a user who passed the flag."""
    with trio.fail_after(CEILING_S):
        proc = _auth_service(mesh, "--exchange-public-port", str(free_port()))
        _, err = await trio.to_thread.run_sync(functools.partial(proc.communicate, timeout=30))
    assert proc.returncode == 1 and "Traceback" not in err
    assert err.splitlines()[-1] == (
        "cotal: space a is pinned to the development IdP, which only `cotal up` serves - pin a real IdP before"
        " giving the space a public face, or drop --exchange-public-port (exchangePublicPort in a manifest)"
    )


async def test_up_serves_the_face_its_flags_record(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str):
    """``cotal up``'s flags become its space's entry, which gives the lane its face; a face
    whose port is taken fails the start, names the port, and is not recorded."""
    paths, port = RootPaths(tmp_path / "root"), free_port()
    config = functools.partial(UpConfig, paths=paths, space="alpha", auth_timeout_s=2, nats_server=nats_server_bin)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with trio.fail_after(CEILING_S), pytest.RaisesGroup(
            pytest.RaisesExc(ConfigError, match=f"port {port} on 127.0.0.1 is busy"), flatten_subgroups=True,
        ):
            await nursery.start(run_up, config(port=free_port(), exchange_public_port=port))
    assert hosted_entries(paths) == [SpaceEntry(space="alpha")]

    with trio.fail_after(CEILING_S):
        info = await nursery.start(run_up, config(
            port=free_port(), exchange_public_port=port, exchange_public_url=PUBLIC_URL, advertised_server="wss://nats.example",
        ))
        assert info.public == PublicFace(port=port, url=PUBLIC_URL, advertised_server="wss://nats.example")
        assert hosted_entries(paths) == [SpaceEntry(
            space="alpha", exchange_public_port=port, exchange_public_url=PUBLIC_URL, advertised_server="wss://nats.example",
        )]
        status, doc = await trio.to_thread.run_sync(_request, f"http://127.0.0.1:{port}/.well-known/cotal-mesh")
        assert status == 200, doc
        assert doc["server"] == "wss://nats.example" and doc["userAuth"]["endpoints"]["url"] == PUBLIC_URL
