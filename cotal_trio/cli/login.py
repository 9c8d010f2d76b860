"""``cotal login`` and ``cotal logout``: a person's session at the space's pinned IdP (issue 19
item 5; spec "IdP compatibility").

``cotal login --space S`` runs the device-code flow (RFC 8628) against S's IdP: the pin's base URL
for a real IdP, or the development IdP the running ``cotal up`` serves. It prints the user code and
the verification address, polls as :func:`cotal_trio.core.device_flow.next_poll` decides, and keeps
the opaque session 0600 in the user's config folder (:mod:`cotal_trio.state.login_sessions`).
``cotal exchange`` and ``cotal check --actor A`` then take a fresh IdP JWT from ``GET <base>/token``
with that session whenever no ``--idp-token`` is given (:func:`cotal_trio.cli._idp_session.session_idp_token`).
``cotal logout --space S`` signs the session out at the IdP and deletes the file.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import trio
from cyclopts import Parameter

from ..core.device_flow import (
    UNAVAILABLE_ERROR,
    DeviceAuthorization,
    Failed,
    NoAnswer,
    Signed,
    Wait,
    next_poll,
    start_polling,
)
from ..core.errors import ConfigError, Unavailable
from ..http.idp_client import poll_device_token, request_device_code, sign_out
from ..state import ensure_dir
from ..state.files import FULL_DISK_ERRNOS
from ..state.login_sessions import LoginSession, load_session, remove_session, save_session, session_path
from ._idp_session import idp_base_url, idp_pin_of, kept_session, relogin_command
from .common import Where
from .exits import ExitCode

__all__ = ["DEFAULT_CLIENT_ID", "login", "logout", "run_device_login"]

# The client_id the device flow presents (a Better Auth IdP may restrict it with validateClient).
DEFAULT_CLIENT_ID = "cotal-cli"


async def run_device_login(
    base: str, *, space: str, client_id: str, show: Callable[[DeviceAuthorization], Awaitable[None]],
    clock: Callable[[], float] = time.time, sleep: Callable[[float], Awaitable[None]] = trio.sleep,
) -> Signed:
    """Run the device-code flow against the IdP at ``base`` until it ends (trio).

    Args:
        base: the IdP base URL (https, or loopback http).
        space: the space (named in every remedy).
        client_id: the device flow's ``client_id``.
        show: awaited once with the device code, before the first poll (the CLI prints it).
        clock: unix seconds now; sleep: waits that many seconds (a test passes its own pair).

    Returns:
        The session the IdP answered once the person approved.

    Raises:
        ConfigError: the IdP refused to start, or the flow ended without a session
            (``expired_token``, ``access_denied``, another error): the sentence names
            ``cotal login --space S`` again.
        Unavailable: the IdP could not be reached for the device code; or its polls went
            unanswered (no connection, a timeout, a 5xx) until the code expired: a poll without
            an answer is retried, at a backed-off wait (:func:`next_poll`).

    Bounded: it never polls past the code's ``expires_in`` (:func:`next_poll`).
    """
    answer = await trio.to_thread.run_sync(functools.partial(request_device_code, base, client_id=client_id))
    authorization = DeviceAuthorization.from_answer(answer, idp=base)
    await show(authorization)
    action = start_polling(authorization, space=space, now=clock())
    poll = functools.partial(_poll, base, device_code=authorization.device_code, client_id=client_id)
    while isinstance(action, Wait):
        await sleep(max(0.0, action.until - clock()))
        polled = await trio.to_thread.run_sync(poll)
        action = next_poll(action.state, polled, clock())
    if isinstance(action, Failed):
        raise (Unavailable if action.error == UNAVAILABLE_ERROR else ConfigError)(action.reason)
    return action


def _poll(base: str, *, device_code: str, client_id: str) -> tuple[int, dict[str, Any]] | NoAnswer:
    """One ``/device/token`` poll (blocking); a poll the IdP did not answer is a :class:`NoAnswer`
    for :func:`next_poll` to retry, not the end of the login."""
    try:
        return poll_device_token(base, device_code=device_code, client_id=client_id)
    except Unavailable as exc:  # its sentence ends in a remedy ("retry"); the flow's own sentence names the fix
        return NoAnswer(detail=str(exc).rsplit(" - ", 1)[0])


async def _print_code(authorization: DeviceAuthorization) -> None:
    print(f"To sign in, open {authorization.verification_uri} and enter the code: {authorization.user_code}")
    if authorization.verification_uri_complete:
        print(f"  (or open {authorization.verification_uri_complete})")
    print(f"Waiting for the approval (the code expires in {authorization.expires_in_s} s) ...", flush=True)


async def login(
    *,
    client_id: Annotated[str, Parameter(help="The client_id the device flow presents to the IdP.")] = DEFAULT_CLIENT_ID,
    where: Where = Where(),
) -> int:
    """Log in as a person at the space's pinned IdP (the device-code flow) and keep the session.

    Prints a user code and the address to approve it at, waits for the approval, then keeps the
    IdP session 0600 in $XDG_CONFIG_HOME/cotal/sessions/ (default ~/.config/cotal/sessions/),
    then signs out the session it replaces (an unreadable session file is replaced as it is); a
    new session that cannot be written is signed out and the earlier one is kept.
    `cotal exchange` and `cotal check --actor A` use it when no --idp-token is given; `cotal
    logout` revokes it. With the development IdP (`cotal up` without --idp), approve the code with
    `cotal dev-idp approve --user-code <code> --sub <you>`.
    """
    space_paths = where.provisioned()
    pin, base = idp_base_url(space_paths)
    path = session_path(os.environ, space=space_paths.space, issuer=pin.issuer)
    # Before the code: a session approved with nowhere to keep it would stay live, unrevocable.
    await trio.to_thread.run_sync(ensure_dir, path.parent)
    signed = await run_device_login(base, space=space_paths.space, client_id=client_id, show=_print_code)
    now = int(time.time())
    expires = now + signed.expires_in_s if signed.expires_in_s is not None else None
    try:
        earlier = load_session(path)
    except ConfigError:  # unreadable: there is no session to sign out, and the new one replaces the file
        earlier = None
    record = LoginSession(space=space_paths.space, issuer=pin.issuer, idp_url=base, session=signed.session,
                          created_at=now, expires_at=expires)  # fmt: skip
    await _keep(path, record, earlier=earlier)
    if earlier is not None:  # replaced, and only now (the new one is kept): sign the old one out, or it stays live
        await _sign_out_replaced(base, earlier.session, space_paths.space)
    print(f"logged in to space {space_paths.space} at {pin.issuer}; the session is kept in {path}")
    return ExitCode.OK


# Why a session file could not be written, by errno, and what frees the way; anything else: the path.
_SAVE_FIXES = {errno.EFBIG: "raise the file-size limit (ulimit -f)"} | dict.fromkeys(
    FULL_DISK_ERRNOS, "free space on that file system"
)


async def _keep(path: Path, record: LoginSession, *, earlier: LoginSession | None) -> None:
    """Write the new session over ``path`` (temp file and rename: the old file stays whole on failure).

    Raises:
        ConfigError: it could not be written; the new session is signed out first (nothing could
            revoke it later) and the sentence says the earlier session, if any, is kept.
    """
    try:
        await trio.to_thread.run_sync(save_session, path, record)
    except (OSError, ConfigError) as exc:
        unkept = _unkept(exc, path, record.space, earlier=earlier is not None)
    else:
        return
    await _sign_out_quietly(record.idp_url, record.session)  # outside the except: a Ctrl-C cancels it cleanly
    raise unkept


def _unkept(exc: OSError | ConfigError, path: Path, space: str, *, earlier: bool) -> ConfigError:
    """The sentence for a new session that could not be written to ``path``."""
    if isinstance(exc, OSError):
        why, fix = exc.strerror or str(exc), _SAVE_FIXES.get(exc.errno, "check that path and its folder")
    else:  # the folder could not be made (ensure_dir): its sentence names its own fix
        why, _, fix = str(exc).rpartition(" - ")
    kept = "your earlier session is kept (not signed out)" if earlier else "the new session is signed out"
    return ConfigError(f"cannot keep the new login session in {path} ({why}) - {kept}; {fix}, then run"
                       f" `{relogin_command(space)}` again")  # fmt: skip


async def _sign_out_replaced(base: str, session: str, space: str) -> None:
    """Sign the replaced ``session`` out at ``base``; when the IdP will not, say so on stderr: its
    file is gone (the new session took its place), so nothing here can sign it out later."""
    try:
        await trio.to_thread.run_sync(sign_out, base, session)
    except (ConfigError, Unavailable) as exc:
        why = str(exc).partition(" - ")[0]  # its own fix ("retry `cotal logout`") would end the new one
        print(f"cotal: warning: your earlier login session for space {space} was not signed out: {why} - it"
              " stays live at the IdP until it expires or you end it there", file=sys.stderr)


async def _sign_out_quietly(base: str, session: str) -> None:
    """Sign ``session`` out at ``base``, best effort: the login's outcome does not hang on it."""
    with contextlib.suppress(ConfigError, Unavailable):
        await trio.to_thread.run_sync(sign_out, base, session)


async def logout(*, where: Where = Where()) -> int:
    """Revoke your login session for the space at its IdP and delete it.

    A later `cotal exchange` without --idp-token then asks for `cotal login` again. With the
    development IdP and no `cotal up` running, the file is deleted (that IdP's sessions end with
    its process).
    """
    space_paths = where.provisioned()
    pin = idp_pin_of(space_paths)
    path, kept = kept_session(space_paths, pin)
    if kept is None:
        print(f"not logged in to space {space_paths.space} - nothing to revoke")
        return ExitCode.OK
    try:
        _, base = idp_base_url(space_paths)
    except ConfigError:  # the dev IdP is not served: its in-memory sessions are gone with it
        print(f"cotal: the development IdP of space {space_paths.space} is not running; its sessions ended"
              " with it", file=sys.stderr)  # fmt: skip
    else:
        try:
            await trio.to_thread.run_sync(sign_out, base, kept.session)
        except Unavailable as exc:
            raise Unavailable(f"{exc} - the session is kept; run `cotal logout --space {space_paths.space}` again") from None
        except ConfigError as exc:  # refused, not revoked: the file stays, so nothing claims it is
            raise ConfigError(f"{exc} {path}") from None
    await trio.to_thread.run_sync(remove_session, path)
    print(f"logged out of space {space_paths.space}; the session is revoked and {path} deleted")
    return ExitCode.OK

