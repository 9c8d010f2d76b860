"""A small synchronous client of a Better-Auth-shaped IdP (spec "IdP compatibility").

``cotal login``, ``cotal logout`` and the commands that take an IdP token from a login speak the
stock flow's endpoints under the IdP's base URL (the space's pin ``url``, or where ``cotal up``
serves the development IdP):

* ``POST <base>/device/code`` ``{client_id, scope}`` and ``POST <base>/device/token``
  ``{grant_type, device_code, client_id}`` (Better Auth's device-authorization plugin, RFC 8628);
* ``GET <base>/token`` with ``Authorization: Bearer <session>`` -> ``{"token": <EdDSA JWT>}``
  (Better Auth's JWT plugin, through its bearer plugin);
* ``POST <base>/sign-out`` with the same header: the session is revoked.

The session travels only to ``https://`` or a loopback ``http://`` address, never through a
redirect (:func:`cotal_trio.http.client.check_url`). Standard library only; blocking: call it
through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from cotal_trio.core.device_flow import DEVICE_CODE_GRANT
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.http.client import DEFAULT_TIMEOUT_S, MAX_RESPONSE_BYTES, check_url, no_redirect_opener

__all__ = [
    "SessionRejected", "answer_user_code", "fetch_session_token", "poll_device_token", "request_device_code",
    "sign_out",
]  # fmt: skip


class SessionRejected(ConfigError):
    """The IdP does not know the session (revoked, signed out or expired): log in again."""


def _call(base: str, path: str, *, body: dict[str, Any] | None, session: str | None) -> tuple[int, dict[str, Any]]:
    """One request: ``(status, JSON object)``; an HTTP error status is an answer too.

    Raises:
        ConfigError: ``base`` is neither https nor loopback http.
        Unavailable: nothing answers, it timed out, the answer is not HTTP (or is cut short), or
            it is not a JSON object.
    """
    url = check_url(base)
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode("utf-8")
    if session is not None:
        headers["Authorization"] = f"Bearer {session}"
    request = urllib.request.Request(url + path, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with no_redirect_opener(url).open(request, timeout=DEFAULT_TIMEOUT_S) as response:
            status, raw = response.status, response.read(MAX_RESPONSE_BYTES)
    except urllib.error.HTTPError as error:
        with error:
            status, raw = error.code, error.read(MAX_RESPONSE_BYTES)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise Unavailable(f"cannot reach the IdP at {url} ({reason}) - check that it runs and retry") from None
    except http.client.HTTPException as error:  # not HTTP (a NATS port's INFO), or cut short: not an OSError
        raise Unavailable(f"cannot reach the IdP at {url} (its answer is not HTTP: {type(error).__name__})"
                          " - check that it runs and retry") from None  # fmt: skip
    try:
        answer = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        answer = None
    if not isinstance(answer, dict):
        raise Unavailable(f"the IdP at {url} answered {path} (HTTP {status}) with something that is not a JSON object"
                          " - check that the space's IdP is Better-Auth-shaped")  # fmt: skip
    return status, answer


def request_device_code(base: str, *, client_id: str, scope: str = "") -> dict[str, Any]:
    """``POST <base>/device/code``: the device-code answer (read it with
    :meth:`cotal_trio.core.device_flow.DeviceAuthorization.from_answer`).

    Raises:
        ConfigError: the IdP refused (its ``error_description`` is named), or a bad ``base``.
        Unavailable: as :func:`_call`.
    """
    status, answer = _call(base, "/device/code", body={"client_id": client_id, "scope": scope}, session=None)
    if status != 200:
        why = answer.get("error_description") or answer.get("message") or answer.get("error") or f"HTTP {status}"
        raise ConfigError(f"the IdP at {base} refused to start a device login ({why}) - check that it has the"
                          " device-authorization plugin and accepts this client id")  # fmt: skip
    return answer


def poll_device_token(base: str, *, device_code: str, client_id: str) -> tuple[int, dict[str, Any]]:
    """``POST <base>/device/token``: ``(status, answer)`` for :func:`cotal_trio.core.device_flow.next_poll`.

    Raises:
        ConfigError, Unavailable: as :func:`_call`.
    """
    body = {"grant_type": DEVICE_CODE_GRANT, "device_code": device_code, "client_id": client_id}
    return _call(base, "/device/token", body=body, session=None)


def fetch_session_token(base: str, session: str, *, relogin: str) -> str:
    """``GET <base>/token`` with the session: a fresh IdP JWT.

    Args:
        base: the IdP base URL.
        session: the opaque session.
        relogin: the command that makes a new session (named when this one is rejected).

    Raises:
        SessionRejected: 401/403: the session was revoked, signed out or has expired.
        Unavailable: any other answer without a token, or as :func:`_call`.
    """
    status, answer = _call(base, "/token", body=None, session=session)
    if status in (401, 403):
        raise SessionRejected(f"the IdP at {base} no longer accepts your login session (revoked, signed out or"
                              f" expired) - run `{relogin}`")  # fmt: skip
    token = answer.get("token")
    if status != 200 or not isinstance(token, str) or not token:
        raise Unavailable(f"the IdP at {base} answered /token (HTTP {status}) without a token - retry shortly")
    return token


def sign_out(base: str, session: str) -> None:
    """``POST <base>/sign-out`` with the session: the IdP revokes it. A 2xx answer, or 401 (the IdP
    no longer knows the session), means it is gone.

    Raises:
        Unavailable: the IdP answered with a server error, or as :func:`_call`.
        ConfigError: any other answer (an IdP without ``/sign-out``, a forbidden sign-out): the
            session may still be live; the sentence ends by asking to delete the session file,
            whose path the caller appends.
    """
    status, _ = _call(base, "/sign-out", body={}, session=session)
    if status >= 500:
        raise Unavailable(f"the IdP at {base} failed to sign out (HTTP {status}) - retry `cotal logout`")
    if not (200 <= status < 300 or status == 401):
        raise ConfigError(f"the IdP at {base} refused the sign-out (HTTP {status}) - the session may still be live:"
                          " sign out at the IdP itself, then delete the session file")  # fmt: skip


def answer_user_code(base: str, *, user_code: str, bearer: str, approve: bool) -> None:
    """``POST <base>/device/approve`` (or ``/device/deny``) ``{userCode}`` as the person signed in
    with ``bearer`` (Better Auth: their session; the development IdP: a JWT it signed).

    Raises:
        ConfigError: the IdP refused (no such pending code, or the sign-in was not accepted);
            its sentence is named.
        Unavailable: as :func:`_call`.
    """
    path = "/device/approve" if approve else "/device/deny"
    status, answer = _call(base, path, body={"userCode": user_code}, session=bearer)
    if status != 200:
        why = answer.get("error_description") or answer.get("error") or f"HTTP {status}"
        raise ConfigError(f"the IdP at {base} refused {path} for user code {user_code} ({why})")
