"""``cotal login`` as a person runs it: a real process whose printed user code the test approves
(issue 19 item 5), and a Better-Auth-shaped EdDSA IdP whose issuer and audience are its origin."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from cotal_trio.core.jose import IssuerKey
from tests.support.process_lines import Lines

_CODE = re.compile(r"enter the code: ([A-Z]{4}-[A-Z]{4})$")


@dataclass(frozen=True)
class OriginIdp:
    """A :class:`~cotal_trio.devidp.idp.TokenSigner` shaped like Better Auth's JWT plugin: issuer
    and audience are the IdP's origin (what ``cotal up --idp <base>`` pins)."""

    issuer: str
    audience: str
    key: IssuerKey

    @property
    def kid(self) -> str:
        return self.key.kid

    @classmethod
    def at(cls, origin: str) -> OriginIdp:
        return cls(issuer=origin, audience=origin, key=IssuerKey.generate(os.urandom(32)))


def person_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a person whose config folder is under ``tmp_path``."""
    return {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}


def session_files(tmp_path: Path) -> list[Path]:
    """The session files ``cotal login`` kept for the person of :func:`person_env`."""
    folder = tmp_path / "xdg" / "cotal" / "sessions"
    return sorted(folder.iterdir()) if folder.exists() else []


async def start_login(
    nursery: trio.Nursery, root: Path, space: str, env: dict[str, str], **options: Any
) -> tuple[trio.Process, str]:
    """``cotal login --space <space> --root <root>`` as a process; it and the user code it printed.
    ``options`` go to :func:`trio.run_process` (e.g. a ``preexec_fn`` that sets a limit)."""
    command = [sys.executable, "-m", "cotal_trio", "login", "--space", space, "--root", str(root)]
    start = functools.partial(trio.run_process, command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              check=False, env=env, **options)  # fmt: skip
    process = await nursery.start(start)
    lines = Lines(process.stdout)
    while (found := _CODE.search(await lines.next())) is None:
        pass
    return process, found.group(1)


async def finish(process: trio.Process) -> tuple[int, str, str]:
    """Wait for the process: ``(exit code, rest of stdout, stderr)``."""
    code = await process.wait()
    out = (await _drain(process.stdout)).decode()
    err = (await _drain(process.stderr)).decode()
    return code, out, err


async def _drain(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some():
        data += chunk
    return data


async def round_trip(conn, space: str) -> None:
    """Publish on channel ``team.hello`` of ``space`` and receive it back: the bearer's grant
    (``team.>`` both ways, as ``Stack.grant`` gives) works on the broker, with no error."""
    received, inbox = trio.open_memory_channel(4)
    subject = f"cotal.{space}.ch.team.hello"
    await conn.subscribe(f"cotal.{space}.ch.team.>", on_message=received.send_nowait)
    await conn.publish(subject, b"hi")
    await conn.flush()
    msg = await inbox.receive()
    assert (msg.subject, msg.data, conn.error_count) == (subject, b"hi", 0)
