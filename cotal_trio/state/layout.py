"""Where everything lives in a root: one frozen value per folder, no I/O.

```
<root>/                               0700
  broker.json        operator + system material (provisioning only)
  policy.json        {ver, port, authTimeoutS[, opsPort]}
  devidp.json        the development IdP's state
  spaces.json        the manifest
  ops/<port>.json    readiness file of a running process's operator face {ver, url, pid, cap}
  broker/            server.conf, resolver/, jetstream/, nats-server.log, nats-server.pid
  spaces/<space>/                     the folder is the space's name, as the operator typed it
    accounts.json    provisioning record: account pubs and current account JWTs
    callout.json     what a lane holds (DESIGN.md section 4, last paragraph)
    issuer.json      bearer issuer keys
    owner-secret.json
    idp.json         the IdP pin
    sentinel.creds   the space's public deny-all credential
    auth-service.json  readiness file of the running auth service
    actors/          interactive ledger rows <owner>.<actor>.json
    managed-actors/  managed ledger rows
```

The space folder is the space's own name: a space name is 1 to 64 of ``[A-Za-z0-9_-]``
(core/identity.py), so it is one safe path segment (no ``/``, no ``.`` or ``..``), and an error
message or an ``ls`` of the root reads as the operator typed it. :meth:`RootPaths.space` refuses
any other string (ConfigError; callers validate names first). Roots written before named the folder
``space.<hex of the UTF-8 name>``; :mod:`cotal_trio.state.space_folders` renames those at the next
start and says what to do when a space is not in the root.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.identity import is_space

__all__ = ["ROOT_ENV", "DEFAULT_ROOT", "RootPaths", "SpacePaths", "resolve_root", "space_dir_name"]

ROOT_ENV = "COTAL_ROOT"
DEFAULT_ROOT = ".cotal"


def resolve_root(flag: str | None, environ: Mapping[str, str]) -> Path:
    """The root folder: ``flag``, else ``$COTAL_ROOT``, else ``./.cotal``; made absolute.

    ``~`` is expanded; the path is not resolved through symlinks and nothing is created.
    """
    chosen = flag or environ.get(ROOT_ENV) or DEFAULT_ROOT
    return Path(os.path.abspath(Path(chosen).expanduser()))


def space_dir_name(space: str) -> str:
    """The folder segment of a space: its name.

    Raises:
        ConfigError: ``space`` is not a space name (it would not be one safe path segment; a
            name read from a hand-edited file gets the sentence, never a traceback).
    """
    if not is_space(space):
        raise ConfigError(f"{space!r} is not a space name - use 1 to 64 letters, digits, _ and -")
    return space


@dataclass(frozen=True, slots=True)
class SpacePaths:
    """The files of one space under ``<root>/spaces/``."""

    space: str
    dir: Path

    @property
    def accounts_json(self) -> Path:
        return self.dir / "accounts.json"

    @property
    def callout_json(self) -> Path:
        return self.dir / "callout.json"

    @property
    def issuer_json(self) -> Path:
        return self.dir / "issuer.json"

    @property
    def owner_secret_json(self) -> Path:
        return self.dir / "owner-secret.json"

    @property
    def idp_json(self) -> Path:
        return self.dir / "idp.json"

    @property
    def sentinel_creds(self) -> Path:
        return self.dir / "sentinel.creds"

    @property
    def actors_dir(self) -> Path:
        """Interactive ledger rows."""
        return self.dir / "actors"

    @property
    def managed_dir(self) -> Path:
        """Managed (agent) ledger rows."""
        return self.dir / "managed-actors"

    @property
    def auth_service_json(self) -> Path:
        return self.dir / "auth-service.json"


@dataclass(frozen=True, slots=True)
class RootPaths:
    """The files of a root folder; ``root`` should be absolute (see :func:`resolve_root`)."""

    root: Path

    @property
    def broker_json(self) -> Path:
        """Operator and system material: read by provisioning only."""
        return self.root / "broker.json"

    @property
    def policy_json(self) -> Path:
        return self.root / "policy.json"

    @property
    def devidp_json(self) -> Path:
        return self.root / "devidp.json"

    @property
    def spaces_manifest(self) -> Path:
        return self.root / "spaces.json"

    @property
    def broker_dir(self) -> Path:
        return self.root / "broker"

    @property
    def server_conf(self) -> Path:
        return self.broker_dir / "server.conf"

    @property
    def resolver_dir(self) -> Path:
        return self.broker_dir / "resolver"

    @property
    def jetstream_dir(self) -> Path:
        return self.broker_dir / "jetstream"

    @property
    def broker_log(self) -> Path:
        return self.broker_dir / "nats-server.log"

    @property
    def broker_pid(self) -> Path:
        return self.broker_dir / "nats-server.pid"

    @property
    def spaces_dir(self) -> Path:
        return self.root / "spaces"

    @property
    def ops_dir(self) -> Path:
        """The operator faces' readiness files, one per listening port (issue 18 item 8)."""
        return self.root / "ops"

    def ops_json(self, port: int) -> Path:
        """The readiness file of the operator face on 127.0.0.1:``port``: ``{ver, url, pid, cap}``."""
        return self.ops_dir / f"{port}.json"

    def space(self, name: str) -> SpacePaths:
        """The paths of space ``name`` (no I/O; ConfigError when ``name`` is not a space name)."""
        return SpacePaths(name, self.spaces_dir / space_dir_name(name))
