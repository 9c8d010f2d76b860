"""Issue 19 item 5: a Better-Auth-shaped EdDSA IdP works without code changes (spec "IdP
compatibility").

The IdP here is served at ``http://127.0.0.1:<port>/api/auth`` (Better Auth's default base path)
with the paths and JSON field names of Better Auth's device-authorization, bearer and JWT
plugins, and issues EdDSA JWTs whose issuer and audience are its origin. ``cotal up --idp <base>``
pins it (JWKS at ``<base>/jwks``); ``cotal login`` runs against the pin's base URL, the person
approves at ``<base>/device/approve`` with their own sign-in, and ``cotal exchange`` without
``--idp-token`` mints a bearer from ``GET <base>/token`` that a real nats-server admits.
"""

from __future__ import annotations

import functools
import json
import time

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.devidp import DevicePolicy, build_dev_idp_app, mint_dev_token
from cotal_trio.http.idp_client import answer_user_code
from cotal_trio.http.serve import serve_app
from tests.support.cli_root import cotal
from tests.support.login import round_trip, OriginIdp, finish, person_env, session_files, start_login
from tests.support.stack import SPACE, client, start_stack

CEILING_S = 60
BASE_PATH = "/api/auth"


@pytest.mark.broker
async def test_login_against_a_better_auth_shaped_idp(nursery, tmp_path, nats_server_bin, capsys, monkeypatch):
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    idp = OriginIdp.at(origin)
    app = build_dev_idp_app(idp, device=DevicePolicy(interval_s=1, expires_in_s=120), base_path=BASE_PATH)
    await nursery.start(functools.partial(serve_app, app, port=port))
    base = origin + BASE_PATH
    stack = await start_stack(nursery, tmp_path, nats_server_bin, idp_url=base)
    assert (stack.info.pin.kind, stack.info.pin.issuer, stack.info.pin.jwks_uri) == ("oidc", origin, f"{base}/jwks")
    stack.grant("alice", "cli")
    env = person_env(tmp_path)
    for name in ("XDG_CONFIG_HOME", "HOME"):
        monkeypatch.setenv(name, env[name])
    where = ("--space", SPACE, "--root", str(stack.paths.root))
    with trio.fail_after(CEILING_S):
        process, user_code = await start_login(nursery, stack.paths.root, SPACE, env)
        signed_in = mint_dev_token(idp, sub="alice", now=int(time.time()))  # the person's own sign-in
        approve = functools.partial(answer_user_code, base, user_code=user_code, bearer=signed_in, approve=True)
        await trio.to_thread.run_sync(approve)
        code, out, err = await finish(process)
        assert code == 0, err
        assert len(session_files(tmp_path)) == 1
        code, bearer, err = await cotal(capsys, "exchange", "--actor", "cli", "--json", *where)
        assert code == 0, err
        async with client(stack, json.loads(bearer)["token"]) as conn:
            await round_trip(conn, SPACE)
        assert (await cotal(capsys, "logout", *where))[0] == 0
