"""Which nats-server runs: beside the interpreter, then its scripts folder, then PATH (issue 18 item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cotal_trio.broker import process
from cotal_trio.broker.process import find_nats_server, nats_server_folders, nats_server_version


def _exe(folder: Path, body: str = "#!/bin/sh\necho 'nats-server: v9.9.9'\n", mode: int = 0o755) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nats-server"
    path.write_text(body)
    path.chmod(mode)
    return path


@pytest.fixture
def scripts(tmp_path, monkeypatch) -> Path:
    """The environment's scripts folder (sysconfig's), empty unless a test puts a binary there."""
    folder = tmp_path / "scripts"
    folder.mkdir()
    monkeypatch.setattr(process.sysconfig, "get_path", lambda name: str(folder) if name == "scripts" else None)
    return folder


def test_the_one_beside_the_interpreter_wins_over_scripts_and_path(tmp_path, scripts):
    beside = _exe(tmp_path / "venv" / "bin")
    _exe(scripts)
    on_path = _exe(tmp_path / "path")
    found = find_nats_server(executable=str(tmp_path / "venv" / "bin" / "python"), path=str(on_path.parent))
    assert found == str(beside)


def test_the_scripts_folder_comes_before_path(tmp_path, scripts):
    in_scripts = _exe(scripts)
    on_path = _exe(tmp_path / "path")
    found = find_nats_server(executable=str(tmp_path / "bare" / "python"), path=str(on_path.parent))
    assert found == str(in_scripts)


def test_path_is_the_last_resort_and_none_when_absent(tmp_path, scripts):
    on_path = _exe(tmp_path / "path")
    python = str(tmp_path / "bare" / "python")
    assert find_nats_server(executable=python, path=str(on_path.parent)) == str(on_path)
    assert find_nats_server(executable=python, path=str(tmp_path / "empty")) is None


def test_a_file_that_is_not_executable_is_passed_over(tmp_path, scripts):
    _exe(tmp_path / "venv" / "bin", mode=0o644)
    on_path = _exe(tmp_path / "path")
    found = find_nats_server(executable=str(tmp_path / "venv" / "bin" / "python"), path=str(on_path.parent))
    assert found == str(on_path)


def test_the_interpreter_folder_is_not_resolved_through_its_symlink(tmp_path, scripts):
    """A venv's python is a symlink to the system one; the venv's bin is where the wheel put it."""
    system = tmp_path / "system" / "python3"
    system.parent.mkdir()
    system.write_text("")
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(system)
    assert nats_server_folders(str(venv_python)) == [venv_python.parent, scripts]


def test_the_version_is_the_one_it_prints(tmp_path):
    assert nats_server_version(str(_exe(tmp_path))) == "v9.9.9"


def test_a_version_that_does_not_answer_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "VERSION_TIMEOUT_S", 0.2)
    slow = _exe(tmp_path, body="#!/bin/sh\nexec sleep 30\n")
    assert nats_server_version(str(slow)) == "version unknown: --version did not answer within 0.2 s"
