"""Static credentials for the CLI and ops tests: the static space, with or without its broker
running (its own, or the provisioned root's ``operator_broker``), the mint, and a connection as a
minted receipt's ``.creds``."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.accounts import open_system_connection, push_accounts
from cotal_trio.broker.config import write_config
from cotal_trio.broker.process import free_port
from cotal_trio.broker.spaces import add_space
from cotal_trio.natsio import Connection, open_connection, open_loop
from cotal_trio.state import BrokerPolicy, RootPaths, atomic_write, load_broker, render_json, save_policy
from tests.support.brokers import Provisioned
from tests.support.cli_root import SPACE, Root

STATIC = "st"


def add_static(root: Root, space: str = STATIC) -> None:
    """Provision ``space`` as `cotal space add --static` does (its documented mode.json)."""
    now = int(time.time())
    provision.ensure_space(root.paths, load_broker(root.paths.broker_json), space, iat=now)
    atomic_write(root.paths.space(space).dir / "mode.json", render_json({"ver": 1, "mode": "static"}))


@pytest.fixture
def static_offline(root, tmp_path, monkeypatch) -> Root:
    """A static space whose root's broker does not run (nothing listens on its policy port)."""
    monkeypatch.chdir(tmp_path)
    add_static(root)
    return root


# How long the static_live broker may take to listen, and to stop (seconds).
LISTEN_CEILING_S = 15


def _listening(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + LISTEN_CEILING_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"the test broker did not listen on 127.0.0.1:{port} (exit {proc.poll()})", pytrace=False)


async def _push_root(root: Root, url: str) -> None:
    """The static space added on the running broker, and the root's other spaces' accounts pushed
    (what `cotal up` and `cotal space add` leave), so the broker holds what ``accounts.json`` holds."""
    await add_space(root.paths, STATIC, static=True, server_url=url, now=time.time())
    broker = load_broker(root.paths.broker_json)
    record = provision.load_space_accounts(root.paths, broker, SPACE)
    async with open_loop(), open_system_connection(url, broker) as conn:
        await push_accounts(conn, [record.data_jwt, record.auth_jwt])


@pytest.fixture
def static(root, tmp_path, monkeypatch, nats_server_bin) -> Iterator[Root]:
    """A static space with its root's broker running (a real nats-server on a free port, the root's
    ``policy.json`` naming it, the static space's accounts pushed): a static agent mint is an
    issuance and needs it (issue 19 item 2). Stopped by its pid afterwards."""
    monkeypatch.chdir(tmp_path)
    port = free_port()
    save_policy(root.paths.policy_json, BrokerPolicy(port=port))
    config = write_config(root.paths, load_broker(root.paths.broker_json), port=port, auth_timeout_s=None)
    proc = subprocess.Popen([nats_server_bin, "-c", str(config), "-l", str(root.paths.broker_log)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _listening(port, proc)
        trio.run(_push_root, root, f"nats://127.0.0.1:{port}")
        yield root
    finally:
        proc.terminate()
        proc.wait(LISTEN_CEILING_S)


# How long adding the static space on the operator_broker may take (seconds).
ADD_CEILING_S = 30


@pytest.fixture
async def static_space(operator_broker: str, provisioned: Provisioned, tmp_path, monkeypatch) -> AsyncIterator[tuple[str, RootPaths]]:
    """The static space added on the provisioned root's running broker (`cotal space add --static
    --server`), the working directory at ``tmp_path`` (where a mint writes its ``.creds``): yields
    (the broker's URL, the root's paths)."""
    monkeypatch.chdir(tmp_path)
    with trio.fail_after(ADD_CEILING_S):
        await add_space(provisioned.paths, STATIC, static=True, server_url=operator_broker, now=time.time())
    yield operator_broker, provisioned.paths


def connect_receipt(url: str, receipt: dict) -> AbstractAsyncContextManager[Connection]:
    """A connection to ``url`` as the ``.creds`` a ``cotal auth mint --json`` receipt names, on its
    inbox prefix, its nonce as the connection name, no reconnect (open it inside ``open_loop()``)."""
    with open(receipt["path"]) as handle:
        creds = handle.read()
    nonce = receipt["inboxPrefix"].removeprefix("_INBOX_")
    return open_connection(url, creds=creds, name=nonce, inbox_prefix=receipt["inboxPrefix"], reconnect=False)


def mint(root: Root, capsys, *argv: str) -> tuple[int, dict, str]:
    code, out, err = root.run(capsys, "auth", "mint", "--space", STATIC, *argv, "--json")
    return code, (json.loads(out) if code == 0 else {}), err


def one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cotal: "), err
    return lines[0].removeprefix("cotal: ")
