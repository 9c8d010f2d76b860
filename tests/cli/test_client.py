"""``cotal exchange``, ``cotal agent-bearer`` and ``cotal connect-info`` (cotal_trio/cli/client.py).

The exchange commands run against the real loopback face (hypercorn on port 0 in pytest-trio's
``nursery``) built from the provisioned root, found through an ``auth-service.json`` the test
writes the way a lane does. ``main`` blocks, so it runs in a worker thread.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import time
from pathlib import Path

import pytest
import trio

from cotal_trio.cli import main
from cotal_trio.core.bearer import validate_bearer
from cotal_trio.core.jose import BearerKeySet
from cotal_trio.core.ledger import AGENT_EXCHANGE_REFUSAL
from cotal_trio.http import build_loopback_app, serve_app
from cotal_trio.state import (
    load_issuer_keys,
    read_principal,
    write_json,
)

from tests.support.cli_root import BROKER_PORT, SPACE, Root
from tests.support.cli_client import SUB, _context, _cotal, _idp_token, _managed


@pytest.fixture
async def service(root: Root, nursery: trio.Nursery) -> str:
    """Serve the loopback face and publish ``auth-service.json``; yields its URL."""
    cap = secrets.token_hex(32)
    port = await nursery.start(functools.partial(serve_app, build_loopback_app(_context(root, cap))))
    url = f"http://127.0.0.1:{port}"
    write_json(root.space.auth_service_json, {"ver": 1, "url": url, "pid": os.getpid(), "cap": cap})
    return url


def _bearer(root: Root, token: str):
    keys = BearerKeySet.from_keys(load_issuer_keys(root.space.issuer_json, SPACE).keys)
    return validate_bearer(token, keys=keys, space=SPACE, now=time.time())


# --- exchange -------------------------------------------------------------------------------


async def test_exchange_prints_a_bearer_that_validates(root, service, capsys):
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    code, out, err = await _cotal(root, capsys, "exchange", "--actor", "cli", "--idp-token", _idp_token(root))
    assert (code, err) == (0, "")
    bearer = _bearer(root, out.strip())
    row, _ = read_principal(root.space, root.owner_of(SUB), "cli")
    assert (bearer.owner, bearer.actor, bearer.lifecycle_uid) == (row.owner, "cli", row.lifecycle_uid)


async def test_exchange_json_and_ttl(root, service, capsys):
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    _, token, _ = root.run(capsys, "dev-idp", "token", "--sub", SUB)
    code, out, _ = await _cotal(
        root, capsys, "exchange", "--actor", "cli", "--idp-token", token.strip(), "--ttl", "120", "--json"
    )
    answer = json.loads(out)
    assert code == 0 and sorted(answer) == ["exp", "owner", "token"]
    assert answer["owner"] == root.owner_of(SUB) and _bearer(root, answer["token"]).exp == answer["exp"]
    assert abs(answer["exp"] - time.time() - 120) < 5


async def test_a_refused_exchange_prints_the_sentence_and_exits_1(root, service, capsys):
    code, out, err = await _cotal(root, capsys, "exchange", "--actor", "web", "--idp-token", _idp_token(root))
    assert (code, out) == (1, "")
    owner = root.owner_of(SUB)
    expected = (
        f'cotal: the exchange for actor "web" was refused: actor "web" is not granted for this user - '
        f"the mesh operator lets them in with `cotal actor grant web --owner {owner}`"
    )
    assert expected in err.splitlines()[-1]


async def test_a_refused_exchange_with_json_prints_a_json_error(root, service, capsys):
    code, out, err = await _cotal(root, capsys, "exchange", "--actor", "web", "--idp-token", _idp_token(root), "--json")
    assert code == 1 and "cotal:" not in err  # (stderr has the in-process service's own log line)
    error = json.loads(out)["error"]
    assert (error["code"], error["status"]) == ("EXCHANGE_REFUSED", 401)
    assert error["message"].startswith('the exchange for actor "web" was refused: actor "web" is not granted')
    assert error["cause"]["error"].startswith('actor "web" is not granted')


async def test_an_exchange_after_a_regrant_gets_the_new_lifecycle(root, service, capsys):
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    _, first, _ = await _cotal(root, capsys, "exchange", "--actor", "cli", "--idp-token", _idp_token(root))
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    _, second, _ = await _cotal(root, capsys, "exchange", "--actor", "cli", "--idp-token", _idp_token(root))
    assert _bearer(root, first.strip()).lifecycle_uid != _bearer(root, second.strip()).lifecycle_uid


async def test_exchange_without_a_running_service_names_cotal_up(root, capsys):
    code, _, err = await _cotal(root, capsys, "exchange", "--actor", "cli", "--idp-token", _idp_token(root))
    assert code == 1
    assert err == "cotal: the auth service for space default is not running - start `cotal up`, or host the space in a running one with `cotal space add default`\n"


async def test_exchange_checks_the_actor_name_before_calling(root, capsys):
    code, _, err = await _cotal(root, capsys, "exchange", "--actor", "a-b", "--idp-token", "x")
    assert code == 1 and err.startswith("cotal: an actor name is 1 to 64 letters")


# --- agent-bearer ---------------------------------------------------------------------------


async def test_agent_bearer_prints_a_bearer_that_validates(root, service, capsys, tmp_path):
    token_file = _managed(root, capsys, tmp_path)
    owner = root.owner_of(SUB)
    code, out, err = await _cotal(
        root, capsys, "agent-bearer", "--owner", owner, "--actor", "worker", "--token-file", str(token_file)
    )
    assert (code, err) == (0, "")
    bearer = _bearer(root, out.strip())
    assert (bearer.owner, bearer.actor) == (owner, "worker") and bearer.exp - time.time() <= 300


async def test_a_token_file_open_to_others_gets_a_warning(root, service, capsys, tmp_path):
    token_file = _managed(root, capsys, tmp_path, mode=0o644)
    code, out, err = await _cotal(
        root, capsys, "agent-bearer", "--owner", root.owner_of(SUB), "--actor", "worker", "--token-file", str(token_file)
    )
    assert code == 0 and _bearer(root, out.strip()).actor == "worker"
    assert err == f"cotal: warning: {token_file} is accessible by group or others - it should be 0600 (chmod 600 {token_file})\n"


async def test_a_wrong_actor_token_is_refused_with_the_agent_sentence(root, service, capsys, tmp_path):
    token_file = _managed(root, capsys, tmp_path)
    token_file.write_text("not-the-token")
    code, out, err = await _cotal(
        root, capsys, "agent-bearer", "--owner", root.owner_of(SUB), "--actor", "worker", "--token-file", str(token_file)
    )
    assert (code, out) == (1, "")
    assert f'cotal: the exchange for actor "worker" was refused: {AGENT_EXCHANGE_REFUSAL}' in err.splitlines()


async def test_a_missing_or_empty_token_file_is_one_sentence(root, capsys, tmp_path):
    owner = root.owner_of(SUB)
    missing = tmp_path / "nope"
    code, _, err = await _cotal(root, capsys, "agent-bearer", "--owner", owner, "--actor", "w", "--token-file", str(missing))
    assert code == 1 and err.startswith(f"cotal: cannot read the token file {missing} (No such file or directory)")
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    empty.chmod(0o600)
    code, _, err = await _cotal(root, capsys, "agent-bearer", "--owner", owner, "--actor", "w", "--token-file", str(empty))
    assert code == 1 and err.startswith(f"cotal: the token file {empty} is empty")


# --- connect-info ---------------------------------------------------------------------------


def test_connect_info_json_has_absolute_paths(root, capsys, monkeypatch):
    monkeypatch.chdir(root.paths.root.parent)
    capsys.readouterr()
    code = main(["connect-info", "--json", "--root", root.paths.root.name])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "space": SPACE,
        "mode": "user-auth",
        "server": f"nats://127.0.0.1:{BROKER_PORT}",
        "servers": [f"nats://127.0.0.1:{BROKER_PORT}"],
        "sentinelCreds": str(root.space.sentinel_creds),
        "authService": str(root.space.auth_service_json),
        "idp": {"kind": "dev", "issuer": root.idp.issuer, "audience": root.idp.audience, "jwksUri": ""},
    }
    assert Path(json.loads(out)["sentinelCreds"]).is_absolute() and root.space.sentinel_creds.exists()


def test_connect_info_plain_is_one_line_per_key(root, capsys):
    code, out, _ = root.run(capsys, "connect-info")
    assert code == 0
    assert out.splitlines() == [
        f"space: {SPACE}",
        "mode: user-auth",
        f"server: nats://127.0.0.1:{BROKER_PORT}",
        f"sentinelCreds: {root.space.sentinel_creds}",
        f"authService: {root.space.auth_service_json}",
        "idp.kind: dev",
        f"idp.issuer: {root.idp.issuer}",
        f"idp.audience: {root.idp.audience}",
        "idp.jwksUri: none served now - `cotal up` serves the development IdP's keys while it runs",
    ]


def test_connect_info_of_an_unknown_space_names_it(root, capsys):
    code, _, err = root.run(capsys, "connect-info", "--space", "other")
    assert (code, err) == (1, f"cotal: space other is not in the root {root.paths.root} - see `cotal space list`\n")


def test_the_test_roots_broker_port_refuses_every_connect():
    """The CLI tests' root records a broker port nothing listens on, whatever else runs on the
    machine (a developer's `cotal up`, another helper's broker): a connect there is refused, so
    "no broker answers" holds in every test that relies on it."""
    import socket

    with socket.socket() as probe:
        probe.settimeout(5)
        with pytest.raises(ConnectionRefusedError):
            probe.connect(("127.0.0.1", BROKER_PORT))
