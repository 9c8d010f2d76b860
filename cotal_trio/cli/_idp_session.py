"""The login session a command uses in place of ``--idp-token`` (issue 19 item 5).

Where a space's IdP login endpoints live (:func:`idp_base_url`), the session ``cotal login`` kept
for it (:func:`kept_session`), and a fresh IdP JWT from that session (:func:`session_idp_token`):
``cotal exchange``, ``cotal check`` and ``cotal login``/``logout`` share them.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from ..broker.spaces import MODE_STATIC, space_mode
from ..core.errors import ConfigError
from ..http.client import read_service
from ..http.idp_client import fetch_session_token
from ..state import IdpPinRecord, SpacePaths, load_idp_pin, read_json
from ..state.files import open_to_others
from ..state.login_sessions import LoginSession, load_session, session_path

__all__ = ["idp_base_url", "idp_pin_of", "kept_session", "served_dev_idp_url", "session_idp_token"]


def served_dev_idp_url(space_paths: SpacePaths) -> str:
    """The base URL of the development IdP the running ``cotal up`` serves, or ``""``.

    ``cotal up`` serves the development IdP on a port of its own and its lane records that URL as
    ``devIdpUrl`` in the space's readiness file (``auth-service.json``); a file whose process is
    gone, or without the field (``cotal auth-service`` serves no IdP), gives ``""``.
    """
    try:
        read_service(space_paths)  # refuses a file whose process is gone
        url = read_json(space_paths.auth_service_json).get("devIdpUrl")
    except ConfigError:
        return ""
    return url if isinstance(url, str) and url.startswith("http://") else ""


def relogin_command(space: str) -> str:
    """The command that makes a new login session for ``space``."""
    return f"cotal login --space {space}"


def idp_pin_of(space_paths: SpacePaths) -> IdpPinRecord:
    """The space's IdP pin, the one a login is made at (blocking read).

    Raises:
        ConfigError: a static space (it has no IdP: its clients connect with minted
            credentials); the pin is missing or corrupt.
    """
    if space_mode(space_paths) == MODE_STATIC:
        raise ConfigError(f"space {space_paths.space} is a static space: it has no IdP to log in to - its clients"
                          " connect with minted credentials (cotal auth mint)")  # fmt: skip
    return load_idp_pin(space_paths.idp_json)


def idp_base_url(space_paths: SpacePaths) -> tuple[IdpPinRecord, str]:
    """The space's IdP pin and the base URL its login endpoints live under.

    Raises:
        ConfigError: a static space; the pin is missing or corrupt; the space uses the
            development IdP and no ``cotal up`` serves it now.
    """
    pin = idp_pin_of(space_paths)
    if pin.kind == "oidc":
        return pin, pin.url
    url = served_dev_idp_url(space_paths)
    if not url:
        raise ConfigError(
            f"space {space_paths.space} uses the development IdP, which only a running `cotal up` serves"
            f" - start `cotal up --space {space_paths.space}` and retry"
        )
    return pin, url


def kept_session(space_paths: SpacePaths, pin: IdpPinRecord) -> tuple[Path, LoginSession | None]:
    """The session file of the space at its pinned IdP, and the session kept there (or None).

    Raises:
        ConfigError: the file is unreadable (the sentence says to remove it and log in again).
    """
    path = session_path(os.environ, space=space_paths.space, issuer=pin.issuer)
    try:
        return path, load_session(path)
    except ConfigError:
        raise ConfigError(f"the login session file {path} is unreadable - remove it and run"
                          f" `{relogin_command(space_paths.space)}`") from None  # fmt: skip


def session_idp_token(space_paths: SpacePaths) -> str:
    """A fresh IdP JWT from the person's login session for the space (blocking HTTP).

    Raises:
        ConfigError: no login for this space and its pinned IdP ("pass --idp-token, or run
            `cotal login --space S`"); the IdP rejected the session (revoked, signed out,
            expired: "run `cotal login --space S`"); the session file is unreadable.

    A session file group or others may read gets one warning on stderr naming it and
    ``chmod 600`` (:func:`~cotal_trio.state.files.open_to_others`); it is used all the same.
        Unavailable: the IdP could not be reached or answered without a token.
    """
    pin, base = idp_base_url(space_paths)
    path, kept = kept_session(space_paths, pin)
    relogin = relogin_command(space_paths.space)
    if kept is None:
        raise ConfigError(f"no --idp-token given and you are not logged in to space {space_paths.space}"
                          f" - run `{relogin}` (or pass --idp-token)")  # fmt: skip
    if open_to_others(path) is not None:  # the project's rule for secrets: warn, as for a token file
        print(f"cotal: warning: {path} is accessible by group or others - it should be 0600"
              f" (chmod 600 {shlex.quote(str(path))})", file=sys.stderr)  # fmt: skip
    return fetch_session_token(base, kept.session, relogin=relogin)
