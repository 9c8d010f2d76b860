"""``cotal up`` refuses flag values that would be ignored or break the root, before any write."""

from __future__ import annotations

import pytest

from cotal_trio.cli import main

# A port outside 1-65535 is a usage error (exit 64): tests/cli/test_exit_codes.py.
BAD_FLAGS = [
    (["--auth-timeout", "inf"], "cotal: --auth-timeout inf is out of range"),
    (["--auth-timeout", "0"], "cotal: --auth-timeout 0.0 is out of range"),
    (["--auth-timeout", "0.25"], "cotal: --auth-timeout 0.25 is out of range"),
    (["--auth-timeout", "1e9"], "cotal: --auth-timeout 1000000000.0 is out of range"),
    (["--nats-server", ""], "cotal: --nats-server is empty"),
    (["--space", "a.b"], "cotal: --space: "),
]


@pytest.mark.parametrize(("flags", "sentence"), BAD_FLAGS)
def test_bad_flags_are_one_sentence_and_write_nothing(tmp_path, capsys, flags, sentence):
    root = tmp_path / "root"
    assert main(["up", "--root", str(root), *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith(sentence) and len(err.strip().splitlines()) == 1
    assert not root.exists()


def test_an_empty_root_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["up", "--root", ""]) == 1
    assert capsys.readouterr().err.strip() == "cotal: --root is empty - pass a folder, or leave it out for ./.cotal"
    assert list(tmp_path.iterdir()) == []


SAME_PORT = [
    (["--port", "4555", "--ops-port", "4555"], "--port 4555 and --ops-port 4555"),
    (["--ops-port", "7461", "--exchange-public-port", "7461"], "--ops-port 7461 and --exchange-public-port 7461"),
    (["--http-port", "7462", "--ops-port", "7462"], "--http-port 7462 and --ops-port 7462"),
    (["--port", "7463", "--http-port", "7463"], "--port 7463 and --http-port 7463"),
]


@pytest.mark.parametrize(("flags", "pair"), SAME_PORT)
def test_two_listeners_on_one_port_are_refused_before_any_write(tmp_path, capsys, flags, pair):
    """One port given to two of cotal up's listeners: refused at once, naming both flags (the
    start used to run and then call its own listener "busy - stop whatever holds it")."""
    root = tmp_path / "root"
    assert main(["up", "--root", str(root), *flags]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"cotal: {pair} are the same port - give each listener its own port"]
    assert not root.exists()
