"""Static credentials for the CLI tests: a minted static service user and the fixture that adds it."""

from __future__ import annotations

import json
import time

import pytest

from cotal_trio.broker import provision
from cotal_trio.state import atomic_write, load_broker, render_json
from tests.support.cli_root import Root

STATIC = "st"


def add_static(root: Root, space: str = STATIC) -> None:
    """Provision ``space`` as `cotal space add --static` does (its documented mode.json)."""
    now = int(time.time())
    provision.ensure_space(root.paths, load_broker(root.paths.broker_json), space, iat=now)
    atomic_write(root.paths.space(space).dir / "mode.json", render_json({"ver": 1, "mode": "static"}))


@pytest.fixture
def static(root, tmp_path, monkeypatch) -> Root:
    monkeypatch.chdir(tmp_path)
    add_static(root)
    return root


def mint(root: Root, capsys, *argv: str) -> tuple[int, dict, str]:
    code, out, err = root.run(capsys, "auth", "mint", "--space", STATIC, *argv, "--json")
    return code, (json.loads(out) if code == 0 else {}), err


def one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cotal: "), err
    return lines[0].removeprefix("cotal: ")
