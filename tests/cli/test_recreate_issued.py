"""``cotal up --space <s> --recreate-issued-stores <backup-dir>``: refusals before anything is
written, then a real ``cotal up`` process that backs a drifted store up, deletes both stores and
starts with them recreated in the current shape."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.cli import main
from cotal_trio.core.errors import ConfigError
from cotal_trio.service.embedded import UpConfig, run_up
from cotal_trio.stores.issued import RECREATE_REMEDY, IssuedStores, issued_shapes
from cotal_trio.lane.service_endpoints import open_store_user
from cotal_trio.natsio import open_loop, stream_config
from cotal_trio.state import RootPaths, load_space

pytestmark = pytest.mark.broker

SPACE = "alpha"
READY = "✓ auth service up"
REMEDY = RECREATE_REMEDY.format(space=SPACE)
STORE_USER = {"pub": {"allow": ["$JS.API.>", "$KV.cotal_issued_alpha.>"]}, "sub": {"allow": ["_INBOX.>"]}}


def test_the_flag_needs_an_explicit_space(tmp_path, capsys):
    root = tmp_path / "root"
    assert main(["up", "--root", str(root), "--recreate-issued-stores", str(tmp_path / "b")]) == 1
    assert capsys.readouterr().err.strip() == (
        "cotal: --recreate-issued-stores deletes one space's issued stores, so it needs that space named"
        " - pass --space <s> too"
    )
    assert not root.exists() and not (tmp_path / "b").exists()


def test_the_backup_folder_must_be_empty(tmp_path, capsys):
    root, backup = tmp_path / "root", tmp_path / "b"
    backup.mkdir()
    (backup / "old.jsonl").write_text("{}\n")
    assert main(["up", "--root", str(root), "--space", SPACE, "--recreate-issued-stores", str(backup)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"cotal: --recreate-issued-stores {backup} is not an empty folder - pass a new or empty folder for the backup"
    )
    assert not root.exists()


async def _with_store_user(paths: RootPaths, url: str, work) -> object:
    material = load_space(paths.space(SPACE).callout_json, SPACE)
    async with open_loop(), open_store_user(
        material, url, name="test:issued", permissions=STORE_USER, iat=int(time.time()), reconnect=False
    ) as conn:
        return await work(conn)


async def _drift(conn) -> None:
    # The lane made the store in its current shape; put one of an older shape in its place.
    issued, _ = issued_shapes(SPACE)
    await conn.request("$JS.API.STREAM.DELETE.KV_cotal_issued_alpha", b"")
    created = await conn.request("$JS.API.STREAM.CREATE.KV_cotal_issued_alpha", json.dumps({**issued.config(), "deny_delete": False}).encode())
    assert "error" not in json.loads(created.data)
    await conn.request("$KV.cotal_issued_alpha.v1.before", b"old evidence")


async def _refusal(conn) -> str:
    with pytest.raises(ConfigError) as refused:
        await IssuedStores(conn, SPACE).ensure()
    return str(refused.value)


def _read_until_ready(proc: subprocess.Popen[str], ceiling_s: float = 40) -> list[str]:
    lines, deadline = [], time.monotonic() + ceiling_s
    while time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("Stop with Ctrl-C."):
            return lines
    proc.kill()
    raise AssertionError(f"cotal up did not become ready: {lines} {proc.stderr.read()}")


async def test_a_real_cotal_up_backs_up_deletes_and_recreates(tmp_path, nats_server_bin):
    paths, port, backup = RootPaths(tmp_path / "root"), free_port(), tmp_path / "backup"
    url = f"nats://127.0.0.1:{port}"
    config = UpConfig(paths=paths, space=SPACE, port=port, auth_timeout_s=2, nats_server=nats_server_bin)
    with trio.fail_after(30):  # a first start makes the root; a store is then drifted under it
        async with trio.open_nursery() as first:
            await first.start(functools.partial(run_up, config))
            await _with_store_user(paths, url, _drift)
            refused = await _with_store_user(paths, url, _refusal)
            first.cancel_scope.cancel()
    argv = [sys.executable, "-m", "cotal_trio", "up", "--root", str(paths.root), "--space", SPACE,
            "--recreate-issued-stores", str(backup)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = await trio.to_thread.run_sync(_read_until_ready, proc)
        with trio.fail_after(20):
            configs = await _with_store_user(paths, url, _check_and_read)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await trio.to_thread.run_sync(functools.partial(proc.communicate, timeout=20))
    assert proc.returncode == 0, err
    assert refused.endswith("is refused - " + REMEDY)
    assert any(line.startswith(READY) for line in lines)
    assert (
        f"  issued stores recreated; the old ones are backed up in {backup} (KV_cotal_issued_alpha: 1 messages,"
        " KV_cotal_accepted_alpha: 0 messages)\n"
    ) in lines  # both stores: the first start (the lane) created them
    assert sorted(p.name for p in backup.iterdir()) == [
        "KV_cotal_accepted_alpha.config.json", "KV_cotal_accepted_alpha.jsonl",
        "KV_cotal_issued_alpha.config.json", "KV_cotal_issued_alpha.jsonl",
    ]  # fmt: skip
    assert json.loads((backup / "KV_cotal_issued_alpha.config.json").read_text())["deny_delete"] is False
    saved = json.loads((backup / "KV_cotal_issued_alpha.jsonl").read_text())
    assert saved["subject"] == "$KV.cotal_issued_alpha.v1.before"
    assert [c["deny_delete"] for c in configs] == [True, True]
    assert [c["allow_direct"] for c in configs] == [False, True]


async def _check_and_read(conn) -> list[dict]:
    await IssuedStores(conn, SPACE).check()  # both exist, in the current shape
    return [await stream_config(conn, shape.name) for shape in issued_shapes(SPACE)]
