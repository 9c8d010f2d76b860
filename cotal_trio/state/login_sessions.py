"""A person's IdP login sessions, kept in their config folder (issue 19 item 5).

``cotal login --space S`` ends with an opaque revocable session from the space's pinned IdP
(spec "IdP compatibility"). It is a secret of the person, not of the root, so it lives in the
user's config folder, ``$XDG_CONFIG_HOME/cotal/sessions/`` (``~/.config/cotal/sessions/`` when
that is unset), one file per space and IdP issuer: ``<space>-<16 hex of sha256(issuer)>.json``,
``{"ver": 1, "space", "issuer", "idpUrl", "session", "createdAt", "expiresAt"}`` (unix seconds;
``expiresAt`` null when the IdP named no lifetime). Files are written 0600 through a temporary
file and a rename, in a 0700 folder; nothing else is ever written there.

Blocking file I/O: call these from synchronous code or through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cotal_trio.state.files import VERSION, atomic_write, read_fields, remove_quietly, render_json

__all__ = ["LoginSession", "config_folder", "load_session", "remove_session", "save_session", "session_path"]


def config_folder(environ: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/cotal``, else ``$HOME/.config/cotal`` (XDG Base Directory: a relative
    ``XDG_CONFIG_HOME`` is ignored); made absolute, not created."""
    xdg = environ.get("XDG_CONFIG_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "cotal"
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".config" / "cotal"


def session_path(environ: Mapping[str, str], *, space: str, issuer: str) -> Path:
    """Where the session of ``space`` at IdP ``issuer`` is kept (``space`` is a checked name)."""
    digest = hashlib.sha256(issuer.encode("utf-8")).hexdigest()[:16]
    return config_folder(environ) / "sessions" / f"{space}-{digest}.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoginSession:
    """One login: the space, the IdP it was made at, and the session (secret).

    Attributes:
        space: the space logged in to.
        issuer: the pinned IdP issuer at login time (a re-pinned space needs a new login).
        idp_url: the IdP base URL the login ran against.
        session: the opaque session token (the device flow's ``access_token``).
        created_at: unix seconds of the login.
        expires_at: unix seconds the IdP said the session ends, or None.
    """

    space: str
    issuer: str
    idp_url: str
    session: str = field(repr=False)
    created_at: int
    expires_at: int | None

    def to_json(self) -> bytes:
        """The file's bytes (see the module docstring)."""
        return render_json({
            "ver": VERSION, "space": self.space, "issuer": self.issuer, "idpUrl": self.idp_url,
            "session": self.session, "createdAt": self.created_at, "expiresAt": self.expires_at,
        })  # fmt: skip


def save_session(path: Path, login: LoginSession) -> None:
    """Write ``login`` to ``path`` 0600 (temp file + rename; the folder made 0700).

    Raises:
        ConfigError: the folder cannot be created.
        OSError: the write failed (the old file, if any, is unchanged).
    """
    atomic_write(path, login.to_json())


def load_session(path: Path) -> LoginSession | None:
    """The session kept at ``path``, or None when there is none.

    Raises:
        ConfigError: the file is corrupt (the sentence names it; the caller says to remove it,
            and ``cotal login`` writes a new one over it).
    """
    if not path.exists():
        return None
    fields = read_fields(path)
    expires = fields.obj.get("expiresAt")
    if expires is not None and type(expires) is not int:
        raise fields.bad("expiresAt has the wrong type")
    return LoginSession(
        space=fields.get("space", str), issuer=fields.get("issuer", str), idp_url=fields.get("idpUrl", str),
        session=fields.get("session", str), created_at=fields.get("createdAt", int), expires_at=expires,
    )


def remove_session(path: Path) -> bool:
    """Delete the session file; True when there was one."""
    return remove_quietly(path)
