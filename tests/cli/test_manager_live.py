"""``cotal manager register|list|retire`` against a running ``cotal up`` equivalent (``run_up``).

The commands run through ``main()`` in a worker thread (they start their own ``trio.run``) and
reach the broker the root recorded, or ``--server``. The records store is deleted first and then
created as a full lane creates it, so the missing-store sentence is seen whether or not the lane
already creates the store at start.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator

import pytest
import trio

from cotal_trio.cli import main
from cotal_trio.core.managers import ManagerInstance
from cotal_trio.stores.records import RecordsStore, ensure_records_stores, records_bucket
from cotal_trio.lane.service_endpoints import open_store_user
from cotal_trio.natsio import Connection, delete_bucket, open_loop
from cotal_trio.state import load_space
from tests.support.stack import SPACE, Stack

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 60
SUB = "alice"


@pytest.fixture
async def store_conn(stack: Stack) -> AsyncIterator[Connection]:
    """A full lane's kind of store user of the stack's space (the JetStream API)."""
    material = load_space(stack.space_paths.callout_json, SPACE)
    permissions = {"pub": {"allow": ["$JS.API.>", f"$KV.{records_bucket(SPACE)}.>"]}, "sub": {"allow": ["_INBOX.>"]}}
    async with open_loop(), open_store_user(
        material, stack.info.server_url, name="test:manager-cli", permissions=permissions, iat=int(time.time()),
        reconnect=False,
    ) as conn:
        yield conn


async def cotal(stack: Stack, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``cotal <argv> --root <root> --space alpha`` in a worker thread: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = await trio.to_thread.run_sync(main, [*argv, "--root", str(stack.paths.root), "--space", SPACE])
    out, err = capsys.readouterr()
    return code, out, err


async def test_register_list_retire(stack: Stack, store_conn: Connection, capsys) -> None:
    owner = stack.owner(SUB)
    stack.grant(SUB, "mgr", scope=("spawn", "supervise"))
    server = ("--server", stack.info.server_url)
    with trio.fail_after(CEILING_S):
        await delete_bucket(store_conn, records_bucket(SPACE))
        missing = await cotal(stack, capsys, "manager", "list")
        await ensure_records_stores(store_conn, SPACE)

        code, out, _ = await cotal(stack, capsys, "manager", "register", "--actor", "mgr", "--sub", SUB, "--label", "build box", "--json")
        assert code == 0
        first = json.loads(out)
        code, out, _ = await cotal(stack, capsys, "manager", "register", "--actor", "mgr", "--owner", owner, *server)
        assert code == 0 and re.fullmatch(r"[a-z0-9]{26,32}\n", out)
        second = out.strip()

        listed = await cotal(stack, capsys, "manager", "list", "--sub", SUB, "--json")
        everyone = await cotal(stack, capsys, "manager", "list", *server)
        stored = await RecordsStore(store_conn, SPACE).get_manager(owner, first["instanceId"])

        retired = await cotal(stack, capsys, "manager", "retire", second, "--sub", SUB)
        again = await cotal(stack, capsys, "manager", "retire", second, "--owner", owner, "--json")
        after = await cotal(stack, capsys, "manager", "list", "--owner", owner, "--json")

    assert missing == (
        1, "", f"cotal: space {SPACE} has no store cotal_records_{SPACE} - start the space's full auth service once:"
        " it creates the stores\n",
    )  # fmt: skip
    assert first == {
        "ver": 1, "instanceId": first["instanceId"], "owner": owner, "actor": "mgr", "serveEpoch": 1,
        "registeredAt": first["registeredAt"], "label": "build box",
    }  # fmt: skip
    assert abs(first["registeredAt"] - time.time()) < CEILING_S
    assert stored == ManagerInstance(
        instance_id=first["instanceId"], owner=owner, actor="mgr", serve_epoch=1,
        registered_at=first["registeredAt"], label="build box",
    )  # fmt: skip
    ids = sorted([first["instanceId"], second])
    assert listed[0] == 0 and [row["instanceId"] for row in json.loads(listed[1])] == ids
    lines = everyone[1].splitlines()
    assert everyone[0] == 0 and [line.split(" ")[0] for line in lines] == ids
    labelled = next(line for line in lines if line.startswith(first["instanceId"]))
    assert labelled.startswith(f"{first['instanceId']} owner={owner} actor=mgr epoch=1 registered=")
    assert labelled.endswith(' label="build box"')
    assert retired == (0, f"retired manager instance {second} of owner {owner}\n", "")
    assert again[0] == 0 and json.loads(again[1]) == {"owner": owner, "instanceId": second, "retired": False}
    assert after[0] == 0 and [row["instanceId"] for row in json.loads(after[1])] == [first["instanceId"]]


async def test_list_with_nothing_registered_says_so(stack: Stack, store_conn: Connection, capsys) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_records_stores(store_conn, SPACE)
        result = await cotal(stack, capsys, "manager", "list", "--sub", SUB)
    assert result == (0, f"no manager instance is registered to owner {stack.owner(SUB)} in space {SPACE}\n", "")
