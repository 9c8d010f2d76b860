"""ops/callers.py ``open_temporary_user``: nothing listening at ``--server`` is one sentence.

The sentence puts the connect's own words in brackets without natsio's ``connect <url>: ``
prefix. The prefix was stripped as the caller spelled the URL, and natsio names the seed list
as it parsed it (blanks around commas dropped: core/servers.py), so a list written with spaces
(``nats://a:1, nats://b:2``) kept the prefix inside the brackets: the URL twice, in two
spellings. Both ports are closed loopback ports (nothing listens; no broker is needed to refuse).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.process import free_port
from cotal_trio.core.errors import Unavailable, leaves
from cotal_trio.natsio import open_loop
from cotal_trio.ops.callers import open_temporary_user
from cotal_trio.state import RootPaths, load_space

SPACE = "s"


async def test_a_seed_list_with_spaces_is_named_once_in_its_parsed_spelling(tmp_path: Path):
    paths, now = RootPaths(tmp_path / "root"), int(time.time())
    provision.ensure_space(paths, provision.ensure_root(paths, iat=now), SPACE, iat=now)
    material = load_space(paths.space(SPACE).callout_json, SPACE)
    first, second = free_port(), free_port()
    with trio.fail_after(30), pytest.RaisesGroup(Unavailable, flatten_subgroups=True) as refused:
        async with open_loop(), open_temporary_user(
            material, f"nats://127.0.0.1:{first}, nats://127.0.0.1:{second}", name="test", permissions={},
            inbox_nonce="n1", now=now,
        ):
            pytest.fail("connected")
    seeds = f"nats://127.0.0.1:{first},nats://127.0.0.1:{second}"
    (error,) = leaves(refused.value)
    sentence = str(error)
    assert sentence.startswith(f"cannot reach the broker at {seeds} ([Errno 111] "), sentence
    assert "connect nats://" not in sentence and sentence.endswith(
        ") - start the root's broker (`cotal up`), or pass --server nats://host:port of a running one that trusts "
        "the space's account"
    )
