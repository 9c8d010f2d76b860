"""Issue 19 item 5: ``cotal login``/``logout``/``exchange`` on a root nothing serves - each says
what to run, and ``cotal logout`` still deletes the session of a development IdP that is gone."""

from __future__ import annotations

import os

import pytest

from cotal_trio.state import IdpPinRecord, save_idp_pin
from cotal_trio.state.login_sessions import LoginSession, save_session, session_path
from tests.support.cli_root import BROKER_PORT, SPACE
from tests.support.static_mint import STATIC, add_static


def _keep(root, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    path = session_path(os.environ, space=SPACE, issuer=root.idp.issuer)
    save_session(path, LoginSession(space=SPACE, issuer=root.idp.issuer, idp_url="http://127.0.0.1:9",
                                    session="gone", created_at=1, expires_at=None))  # fmt: skip
    return path


def test_login_without_cotal_up_names_it(root, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    code, out, err = root.run(capsys, "login", "--space", SPACE)
    assert (code, out) == (1, "")
    assert err == (f"cotal: space {SPACE} uses the development IdP, which only a running `cotal up` serves - start"
                   f" `cotal up --space {SPACE}` and retry\n")  # fmt: skip


def test_logout_deletes_the_session_of_a_dev_idp_that_is_gone(root, capsys, tmp_path, monkeypatch):
    path = _keep(root, tmp_path, monkeypatch)
    code, out, err = root.run(capsys, "logout", "--space", SPACE)
    assert code == 0 and not path.exists()
    assert "its sessions ended with it" in err
    assert root.run(capsys, "logout", "--space", SPACE)[1] == f"not logged in to space {SPACE} - nothing to revoke\n"


def test_an_unreadable_session_file_is_named(root, capsys, tmp_path, monkeypatch):
    path = _keep(root, tmp_path, monkeypatch)
    path.write_text("{")
    code, out, err = root.run(capsys, "logout", "--space", SPACE)
    assert code == 1
    assert err == f"cotal: the login session file {path} is unreadable - remove it and run `cotal login --space {SPACE}`\n"


@pytest.mark.parametrize("argv", [("login",), ("logout",), ("exchange", "--actor", "cli")])
def test_a_static_space_has_no_login(root, capsys, tmp_path, monkeypatch, argv):
    """A static space has no IdP (its clients connect with minted credentials): login, logout and
    an exchange without --idp-token say so, instead of calling the space unprovisioned."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    add_static(root)
    code, out, err = root.run(capsys, *argv, "--space", STATIC)
    assert (code, out) == (1, "")
    assert err == (f"cotal: space {STATIC} is a static space: it has no IdP to log in to - its clients connect with"
                   " minted credentials (cotal auth mint)\n")  # fmt: skip


@pytest.mark.parametrize(("mode", "warned"), [(0o644, True), (0o640, True), (0o600, False)], ids=["0644", "0640", "0600"])
def test_a_session_file_others_may_read_is_named_with_the_fix(root, capsys, tmp_path, monkeypatch, mode, warned):
    """The session file holds the person's session (it mints IdP tokens): one open to group or
    others gets a warning naming it and `chmod 600`, once, as a token file does (cli/client.py),
    and the command goes on (here to an IdP that does not answer)."""
    base = f"http://127.0.0.1:{BROKER_PORT}"  # a port that refuses connections
    save_idp_pin(root.space.idp_json, IdpPinRecord(kind="oidc", url=base, issuer=base, audience=base, jwks_uri=f"{base}/jwks"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    path = session_path(os.environ, space=SPACE, issuer=base)
    save_session(path, LoginSession(space=SPACE, issuer=base, idp_url=base, session="s", created_at=1, expires_at=None))
    os.chmod(path, mode)
    code, out, err = root.run(capsys, "exchange", "--actor", "cli", "--space", SPACE)
    assert (code, out) == (1, "")
    warning = f"cotal: warning: {path} is accessible by group or others - it should be 0600 (chmod 600 {path})\n"
    assert err.count(warning) == (1 if warned else 0)
    assert err.startswith(warning if warned else f"cotal: cannot reach the IdP at {base}")
