"""A provisioned root for the CLI tests: broker and space material, a dev IdP and its pin.

Nothing runs: the root is files under ``tmp_path``, built with the same provisioning code
``cotal up`` uses, plus ``policy.json``, ``devidp.json`` and the space's ``idp.json``. Also ``cotal``
run in this thread or in a worker thread (for a test whose broker runs in its nursery meanwhile) and
the fixture that undoes ``main()``'s logging setup.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from cotal_trio.broker.provision import ensure_root, ensure_space
from cotal_trio.cli import main
from cotal_trio.core.identity import derive_owner
from cotal_trio.devidp import DevIdpMaterial, create_dev_idp
from cotal_trio.state import (
    BrokerPolicy,
    IdpPinRecord,
    RootPaths,
    SpacePaths,
    atomic_write,
    load_owner_secret,
    save_idp_pin,
    save_policy,
)

SPACE = "default"


def _reserve_refusing_port() -> socket.socket:
    """A socket bound to a free loopback port and never listening, kept for the test run: the
    kernel hands that port to nobody else, and a connect to it is refused (a fixed number such
    as 4333 is refused only while nothing else on the machine listens there)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    return held


_HELD = _reserve_refusing_port()
BROKER_PORT = _HELD.getsockname()[1]


@dataclass(frozen=True)
class Root:
    """A provisioned test root with one space (``default``) pinned to a dev IdP."""

    paths: RootPaths
    space: SpacePaths
    idp: DevIdpMaterial

    def owner_of(self, sub: str) -> str:
        """The owner ``derive_owner`` gives ``sub`` in this space."""
        return derive_owner(load_owner_secret(self.space.owner_secret_json), self.idp.issuer, sub)

    def run(self, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
        """``cotal <argv> --root <root>``: (exit code, stdout, stderr)."""
        return run_cotal(capsys, *argv, "--root", str(self.paths.root))


def provision(root_dir: Path) -> Root:
    """Provision ``root_dir`` like `cotal up` with the development IdP would."""
    paths = RootPaths(root_dir)
    now = int(time.time())
    ensure_space(paths, ensure_root(paths, iat=now), SPACE, iat=now)
    save_policy(paths.policy_json, BrokerPolicy(port=BROKER_PORT))
    material = create_dev_idp(os.urandom)
    atomic_write(paths.devidp_json, material.to_json().encode())
    space = paths.space(SPACE)
    pin = IdpPinRecord(kind="dev", url="", issuer=material.issuer, audience=material.audience, jwks_uri="")
    save_idp_pin(space.idp_json, pin)
    return Root(paths=paths, space=space, idp=material)


@pytest.fixture
def root(tmp_path: Path) -> Root:
    return provision(tmp_path / "root")


def run_cotal(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``cotal <argv>`` in this thread: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def cotal(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``cotal <argv>`` in a worker thread (the trio loop runs on): (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = await trio.to_thread.run_sync(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def restore_cotal_logger() -> Iterator[None]:
    """Undo ``main()``'s ``configure_logging`` (it stops ``cotal`` logs reaching caplog)."""
    logger = logging.getLogger("cotal")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    yield
    logger.handlers[:], logger.propagate = saved[0], saved[1]
    logger.setLevel(saved[2])  # setLevel clears logging's isEnabledFor caches; `.level =` does not
