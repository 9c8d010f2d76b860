"""Removing a retired lifecycle's row file never loses another grant (cotal_trio/stores/lifecycle.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.lifecycle import LifecycleTarget
from cotal_trio.stores import lifecycle
from cotal_trio.state import SpacePaths, read_principal, write_row

OWNER = "u_" + "a" * 26
UID, NEWER = "a" * 26, "b" * 26


def _row(uid: str) -> LedgerRow:
    return LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=OWNER, actor="cli", scope=("spawn",), allow_subscribe=(">",),
        allow_publish=(), lifecycle_uid=uid, granted_at="2026-11-29T10:00:00.000Z",
    )  # fmt: skip


@pytest.fixture
def paths(tmp_path: Path) -> SpacePaths:
    return SpacePaths("alpha", tmp_path / "space")


def _files(paths: SpacePaths) -> list[str]:
    return sorted(p.name for p in paths.actors_dir.iterdir())


def test_the_lifecycles_own_row_is_removed(paths):
    write_row(paths, _row(UID))
    assert lifecycle.remove_row_if_holds(paths, LedgerKind.INTERACTIVE, LifecycleTarget(owner=OWNER, actor="cli", lifecycle_uid=UID))
    assert _files(paths) == []


def test_a_row_of_another_lifecycle_stays(paths):
    write_row(paths, _row(NEWER))
    target = LifecycleTarget(owner=OWNER, actor="cli", lifecycle_uid=UID)
    assert not lifecycle.remove_row_if_holds(paths, LedgerKind.INTERACTIVE, target)
    assert read_principal(paths, OWNER, "cli")[0].lifecycle_uid == NEWER
    assert _files(paths) == [f"{OWNER}.cli.json"]


def test_a_failed_read_puts_the_row_back(paths, monkeypatch):
    write_row(paths, _row(UID))
    original = Path.read_bytes

    def failing(self):
        if self.name.endswith(".tmp") or self.name.startswith("."):
            raise PermissionError(13, "Permission denied")
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", failing)
    with pytest.raises(PermissionError):
        lifecycle.remove_row_if_holds(paths, LedgerKind.INTERACTIVE, LifecycleTarget(owner=OWNER, actor="cli", lifecycle_uid=UID))
    monkeypatch.undo()
    assert read_principal(paths, OWNER, "cli")[0].lifecycle_uid == UID
    assert _files(paths) == [f"{OWNER}.cli.json"]


def test_without_hard_links_a_row_of_another_lifecycle_is_renamed_back(paths, monkeypatch):
    write_row(paths, _row(NEWER))

    def no_links(src, dst):
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "link", no_links)
    target = LifecycleTarget(owner=OWNER, actor="cli", lifecycle_uid=UID)
    assert not lifecycle.remove_row_if_holds(paths, LedgerKind.INTERACTIVE, target)
    monkeypatch.undo()
    assert read_principal(paths, OWNER, "cli")[0].lifecycle_uid == NEWER
    assert _files(paths) == [f"{OWNER}.cli.json"]
