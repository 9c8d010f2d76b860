"""A root an earlier version wrote, not started since: its ``space.<hex>`` folders are listed with a
note by ``cotal space list``, ``cotal status`` and ``cotal doctor auth`` (issue 18 item 3 review:
they once listed nothing, and the doctor called the root healthy having checked nothing)."""

from __future__ import annotations

import json
import os

import pytest

from cotal_trio.state.space_folders import legacy_dir_name

from tests.support.cli_root import Root, provision

NOTE = "space default: folder not renamed yet - start `cotal up` or `cotal auth-service` once"


@pytest.fixture
def old_root(tmp_path) -> Root:
    root = provision(tmp_path / "root")
    os.rename(root.paths.spaces_dir / "default", root.paths.spaces_dir / legacy_dir_name("default"))
    return root


def test_space_list_names_the_folder_not_renamed_yet(old_root, capsys):
    assert old_root.run(capsys, "space", "list") == (0, NOTE + "\n", "")
    code, out, err = old_root.run(capsys, "space", "list", "--json")
    assert (code, json.loads(out), err) == (0, [], NOTE + "\n")


def test_status_names_the_folder_not_renamed_yet(old_root, capsys):
    code, out, err = old_root.run(capsys, "status")
    assert (code, out) == (1, NOTE + "\n")
    assert "no auth service is running" in err


def test_the_doctor_reports_the_folder_not_renamed_yet_as_a_finding(old_root, capsys):
    code, out, err = old_root.run(capsys, "doctor", "auth")
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert "finding: " + NOTE in lines
    assert lines[-1] == "next: start `cotal up` or `cotal auth-service` once"
    code, out, _ = old_root.run(capsys, "doctor", "auth", "--json")
    report = json.loads(out)
    assert (code, report["healthy"]) == (1, False)
    assert {"subject": "space default", "problem": "folder not renamed yet"}.items() <= report["findings"][0].items()


def test_a_renamed_root_has_no_note(old_root, capsys):
    from cotal_trio.state.space_folders import rename_space_folders

    assert rename_space_folders(old_root.paths) == ["default"]
    code, out, err = old_root.run(capsys, "space", "list")
    assert (code, out, err) == (0, "default\tuser-auth\tnot hosted\n", "")
