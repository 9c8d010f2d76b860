"""Where a person's login sessions are kept and how (state/login_sessions.py; issue 19 item 5)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from cotal_trio.core.errors import ConfigError
from cotal_trio.state.login_sessions import (
    LoginSession,
    config_folder,
    load_session,
    remove_session,
    save_session,
    session_path,
)

LOGIN = LoginSession(space="alpha", issuer="https://idp.example", idp_url="https://idp.example/api/auth",
                     session="opaque", created_at=1_800_000_000, expires_at=1_800_604_800)  # fmt: skip


def test_the_config_folder_follows_xdg_then_home():
    assert config_folder({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}) == Path("/x/cotal")
    assert config_folder({"XDG_CONFIG_HOME": "relative", "HOME": "/h"}) == Path("/h/.config/cotal")  # XDG: ignored
    assert config_folder({"HOME": "/h"}) == Path("/h/.config/cotal")


def test_sessions_are_keyed_by_space_and_issuer():
    env = {"XDG_CONFIG_HOME": "/x"}
    path = session_path(env, space="alpha", issuer="https://idp.example")
    assert path.parent == Path("/x/cotal/sessions") and path.name.startswith("alpha-") and path.suffix == ".json"
    assert session_path(env, space="alpha", issuer="https://other.example") != path
    assert session_path(env, space="beta", issuer="https://idp.example") != path


def test_a_session_round_trips_0600_in_a_0700_folder(tmp_path):
    path = session_path({"XDG_CONFIG_HOME": str(tmp_path)}, space="alpha", issuer=LOGIN.issuer)
    assert load_session(path) is None
    save_session(path, LOGIN)
    assert load_session(path) == LOGIN
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    assert "opaque" not in repr(LOGIN)
    assert remove_session(path) and not remove_session(path)


def test_a_corrupt_session_file_is_named(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"ver": 1, "space": "alpha"}')
    with pytest.raises(ConfigError, match=str(path)):
        load_session(path)
