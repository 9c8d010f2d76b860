"""A small synchronous client of the token exchange (upstream-notes 3.5 and 4.1).

Used by the CLI (``cotal exchange``, ``cotal agent-bearer``): find the running auth service of
a space through its readiness file ``auth-service.json`` ``{ver, url, pid, cap}``, then
``POST <url>/exchange`` with the loopback capability. Standard library only (``urllib``).

Credentials travel only to a loopback ``http://`` address or over ``https://``; redirects are
never followed (they would carry the capability elsewhere), and a loopback call ignores proxy
settings. Blocking: call it from synchronous code or through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cotal_trio.core.errors import AuthServiceError, ConfigError, Unavailable
from cotal_trio.state import Fields, SpacePaths, read_fields
from cotal_trio.state.applied import applied_path, read_applied
from cotal_trio.state.liveness import pid_alive  # re-exported: its readers import it from here

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ExchangeRefused",
    "ServiceRecord",
    "check_url",
    "no_redirect_opener",
    "pid_alive",
    "post_exchange",
    "read_service",
]

DEFAULT_TIMEOUT_S = 10.0
# The exchange answers a few hundred bytes; anything much larger is not an auth service.
MAX_RESPONSE_BYTES = 1 << 20
_CAPABILITY = re.compile(r"[0-9a-f]{64}")
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class ExchangeRefused(AuthServiceError):
    """The auth service answered the exchange with an HTTP error.

    Attributes:
        status: the HTTP status (401 refused, 400 malformed, 429 throttled, ...).
        error: the service's sentence (its ``error`` field), or a stand-in naming the status.
        body: the decoded JSON answer, or ``{}`` when it was not a JSON object.
    """

    def __init__(self, status: int, error: str, body: dict[str, Any]) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.body = body


@dataclass(frozen=True, slots=True)
class ServiceRecord:
    """A running auth service of a space, from its ``auth-service.json``.

    Attributes:
        url: the loopback face, ``http://127.0.0.1:<port>``.
        cap: the per-start exchange capability (64 lowercase hex; secret).
        pid: the service's process id.
    """

    url: str
    cap: str = field(repr=False)
    pid: int


def _not_running(space_paths: SpacePaths) -> ConfigError:
    """Why there is no auth service to talk to: a live host of the root's ``spaces.json`` that
    lists the space as not serving (retrying with its reason, starting) says so and that it
    comes back by itself; otherwise nothing runs it."""
    space, root = space_paths.space, space_paths.dir.parent.parent
    try:
        applied = read_applied(applied_path(root / "spaces.json"))
    except ConfigError:
        applied = None
    lane = None if applied is None or applied.alive is not True else applied.report.spaces.get(space)
    if lane is not None and lane.state != "serving":
        why = f"{lane.state}: {lane.reason}" if lane.reason else lane.state
        return ConfigError(
            f"the auth service for space {space} is not serving now ({why}) - it comes back by itself"
            f" once the cause is gone; `cotal status --root {root}` shows it"
        )
    return ConfigError(
        f"the auth service for space {space} is not running - start `cotal up`, or host the space"
        f" in a running one with `cotal space add {space}`"
    )


def _record(fields: Fields) -> ServiceRecord:
    url, cap, pid = fields.get("url", str), fields.get("cap", str), fields.get("pid", int)
    if _CAPABILITY.fullmatch(cap) is None:
        raise fields.bad("cap is not 64 lowercase hex characters")
    if pid <= 0:
        raise fields.bad("pid is not a process id")
    if not url.startswith(("http://", "https://")):
        raise fields.bad("url is not an http(s) URL")
    return ServiceRecord(url=url, cap=cap, pid=pid)


def read_service(space_paths: SpacePaths) -> ServiceRecord:
    """The running auth service of the space (its readiness file, upstream-notes 4.1).

    Raises:
        ConfigError: the file is missing or names a process that is gone, or one that started
            after the file was written (its pid reused; "... is not running - start `cotal up`,
            ..."), or the file is corrupt.
    """
    if not space_paths.auth_service_json.exists():
        raise _not_running(space_paths)
    record = _record(read_fields(space_paths.auth_service_json))
    if not pid_alive(record.pid, since=_written_at(space_paths.auth_service_json)):
        raise _not_running(space_paths)
    return record


def _written_at(path: Path) -> float | None:
    """``path``'s modification time (unix seconds), or None when it is gone."""
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def check_url(url: str) -> str:
    """``url`` if credentials may be sent to it: ``https://``, or ``http://`` to a loopback host.

    Returns:
        The URL without a trailing slash.

    Raises:
        ConfigError: another scheme or a plain-http URL to a non-loopback host.
    """
    parts = urlsplit(url)
    loopback = parts.scheme == "http" and parts.hostname in _LOOPBACK_HOSTS
    if not (loopback or (parts.scheme == "https" and parts.hostname)):
        raise ConfigError(f"{url} is neither https:// nor a loopback http:// address - use the auth service's https URL")
    return url.rstrip("/")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse every redirect: a 3xx becomes an HTTPError instead of a second request."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, D102
        return None


def no_redirect_opener(url: str) -> urllib.request.OpenerDirector:
    """An opener that follows no redirect and, for loopback ``http://``, uses no proxy."""
    handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
    if urlsplit(url).scheme == "http":
        handlers.append(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    return urllib.request.build_opener(*handlers)


def _request(url: str, cap: str | None, body: dict[str, Any]) -> urllib.request.Request:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if cap is not None:
        headers["Authorization"] = f"Bearer {cap}"
    data = json.dumps(body).encode("utf-8")
    return urllib.request.Request(f"{url}/exchange", data=data, headers=headers, method="POST")


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _refused(error: urllib.error.HTTPError) -> ExchangeRefused:
    with error:
        body = _json_object(error.read(MAX_RESPONSE_BYTES)) or {}
    sentence = body.get("error")
    if not isinstance(sentence, str) or not sentence:
        sentence = f"the auth service answered HTTP {error.code} without a reason"
    return ExchangeRefused(error.code, sentence, body)


def _unavailable(url: str, error: BaseException) -> Unavailable:
    reason = getattr(error, "reason", error)
    if isinstance(reason, ConnectionRefusedError):
        return Unavailable(f"nothing answers at {url} - start the auth service with `cotal up` and retry")
    if isinstance(reason, TimeoutError):
        return Unavailable(f"the auth service at {url} did not answer in time - retry shortly")
    return Unavailable(f"cannot reach the auth service at {url} ({reason}) - check that it is running and retry")


def post_exchange(
    url: str, cap: str | None, body: dict[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    """``POST <url>/exchange`` with ``body`` as JSON; returns the 200 answer (upstream-notes 3.5).

    Args:
        url: the face's base URL (loopback ``http://`` or ``https://``).
        cap: the loopback capability, sent as ``Authorization: Bearer <cap>``; ``None`` for the
            public face.
        body: the exchange body, for example ``{"idpToken", "actor", "ttlSec"?}``.
        timeout_s: socket timeout, seconds (the CLI's edge; blocking call).

    Returns:
        The decoded JSON object, ``{"token", "owner", "exp"}`` for a mint.

    Raises:
        ConfigError: ``url`` is not https or loopback http.
        ExchangeRefused: the service answered an HTTP error (its ``error`` sentence).
        Unavailable: connection refused, timed out, an answer that is not HTTP (or is cut short),
            or one that is not a JSON object.
    """
    base = check_url(url)
    try:
        with no_redirect_opener(base).open(_request(base, cap, body), timeout=timeout_s) as response:
            raw = response.read(MAX_RESPONSE_BYTES)
    except urllib.error.HTTPError as error:
        raise _refused(error) from None
    except (urllib.error.URLError, OSError) as error:
        raise _unavailable(base, error) from None
    except http.client.HTTPException as error:  # not HTTP (a NATS port's INFO), or cut short: not an OSError
        raise Unavailable(f"cannot reach the auth service at {base} (its answer is not HTTP: {type(error).__name__})"
                          " - check that it is running and retry") from None  # fmt: skip
    answer = _json_object(raw)
    if answer is None:
        raise Unavailable(f"{base} answered the exchange with something that is not a JSON object - check the URL")
    return answer
