"""How ``cotal actor grant`` and ``revoke`` retire a lifecycle through the running auth service.

While a space's auth service runs (its ``auth-service.json`` names a live process and that
service answers ``GET /health`` for this space), the interactive row of a principal is not
simply replaced or deleted: the service's loopback door ``POST /interactive-lifecycle/retire``
retires its lifecycle first (spec "Host-only routes"; docs/host-doors.md). It records the
retirement, withdraws the lifecycle's issuance rows and removes the row file.

A 200 ``retired`` is a whole retirement; a 202 ``retired`` with ``"withdrawn": "partial"`` is
one whose withdrawal did not finish: the lifecycle is refused all the same and the rows left
end on their TTL (:class:`Retired` with ``partial``), so the command succeeds and says so.

Two ways a retirement can fail, told apart by the answer's ``outcome``:

* ``"not-executed"``: the service refused before its barrier; nothing changed.
  :class:`RetireRefused` carries its sentence.
* anything else (an error without that outcome, no answer, an answer that is not a
  retirement of this lifecycle): the barrier may have begun, so the outcome is unknown.
  :class:`RetireUnknown` says so and names ``cotal actor list`` to check.

Blocking (``urllib``), like :mod:`cotal_trio.http.client`, whose URL rules it shares:
credentials go to loopback ``http://`` or ``https://`` only, with no redirects and no proxy.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from ..core.bearer import space_issuer
from ..core.errors import ConfigError, Unavailable
from ..core.ledger import LedgerRow
from ..http.client import MAX_RESPONSE_BYTES, ServiceRecord, check_url, no_redirect_opener, read_service
from ..state import SpacePaths

__all__ = [
    "HEALTH_TIMEOUT_S",
    "RETIRE_PATH",
    "RETIRE_TIMEOUT_S",
    "RetireRefused",
    "RetireUnknown",
    "Retired",
    "retire_interactive",
    "running_service",
]

RETIRE_PATH = "/interactive-lifecycle/retire"
# A service that does not answer its health check this fast counts as not running (seconds).
HEALTH_TIMEOUT_S = 2.0
# The door bounds its own work: a held row finished and the row read (5 s each), then the
# retirement (stores.lifecycle.RETIRE_S, 30 s); wait a little longer than the sum.
RETIRE_TIMEOUT_S = 45.0


class RetireRefused(ConfigError):
    """The service refused the retirement before its barrier (``outcome: "not-executed"``):
    nothing changed. The message is the service's sentence, prefixed with what was refused."""


class RetireUnknown(Unavailable):
    """The retirement may or may not have happened; the message names ``cotal actor list``."""


@dataclass(frozen=True, slots=True)
class Retired:
    """A retirement the service confirmed: the lifecycle and how many issuance rows it withdrew.

    Attributes:
        partial: the service answered 202 ``"withdrawn": "partial"``: the lifecycle is retired and
            refused, but the withdrawal did not finish (docs/host-doors.md).
        left: on a partial retirement, the rows known left (None: how many is unknown).
        expire_within_s: on a partial retirement, the seconds within which the rows left end.
    """

    lifecycle_uid: str
    withdrawn: int
    partial: bool = False
    left: int | None = None
    expire_within_s: int | None = None


def _read_json(response: Any) -> object:
    try:
        return json.loads(response.read(MAX_RESPONSE_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _health_answers(url: str, space: str) -> bool:
    """True when ``GET <url>/health`` answers 200 ``{"ok": true, "issuer": <this space's>}``
    within :data:`HEALTH_TIMEOUT_S`."""
    try:
        base = check_url(url)
        with no_redirect_opener(base).open(f"{base}/health", timeout=HEALTH_TIMEOUT_S) as response:
            answer = _read_json(response)
    except (ConfigError, urllib.error.URLError, OSError, ValueError):
        return False
    return isinstance(answer, dict) and answer.get("ok") is True and answer.get("issuer") == space_issuer(space)


def running_service(space_paths: SpacePaths) -> ServiceRecord | None:
    """The space's auth service if it is running, else None (blocking, at most about 2 s).

    Running means: ``auth-service.json`` exists, names a live process, and that service
    answers ``GET /health`` for this space. A readiness file that cannot be read is no
    running service either (nothing could reach it).
    """
    if not space_paths.auth_service_json.exists():
        return None
    try:
        service = read_service(space_paths)
    except ConfigError:
        return None
    return service if _health_answers(service.url, space_paths.space) else None


def _unknown(row: LedgerRow, url: str, why: str) -> RetireUnknown:
    return RetireUnknown(
        f"retiring lifecycle {row.lifecycle_uid} of {row.principal} through the auth service at {url}"
        f" has an unknown outcome ({why}) - check with `cotal actor list` whether the row still holds"
        " that lifecycle, then run this command again"
    )


def _refusal(row: LedgerRow, url: str, error: urllib.error.HTTPError) -> RetireRefused | RetireUnknown:
    with error:
        body = _read_json(error)
    sentence = body.get("error") if isinstance(body, dict) else None
    if isinstance(body, dict) and body.get("outcome") == "not-executed" and isinstance(sentence, str):
        return RetireRefused(
            f"the auth service did not retire lifecycle {row.lifecycle_uid} of {row.principal} (nothing changed): {sentence}"
        )
    return _unknown(row, url, f"HTTP {error.code}: {sentence}" if isinstance(sentence, str) else f"HTTP {error.code}")


def _confirmed(row: LedgerRow, answer: object) -> Retired | None:
    expected = {"outcome": "retired", "owner": row.owner, "actor": row.actor, "lifecycleUid": row.lifecycle_uid}
    if not isinstance(answer, dict) or any(answer.get(name) != value for name, value in expected.items()):
        return None
    withdrawn = answer.get("withdrawn")
    if withdrawn == "partial":
        count, left, within = answer.get("withdrawnRows"), answer.get("rowsLeft"), answer.get("rowsExpireWithinS")
        if _count(count) and (left is None or _count(left)) and _count(within):
            return Retired(row.lifecycle_uid, count, partial=True, left=left, expire_within_s=within)
        return None
    return Retired(row.lifecycle_uid, withdrawn) if _count(withdrawn) else None


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def retire_interactive(service: ServiceRecord, row: LedgerRow) -> Retired:
    """``POST <url>/interactive-lifecycle/retire`` for ``row``'s lifecycle, with the capability.

    Args:
        service: the running service (:func:`running_service`).
        row: the principal's current interactive row, as read just before.

    Returns:
        The confirmed :class:`Retired`.

    Raises:
        RetireRefused: refused with ``outcome: "not-executed"``; nothing changed.
        RetireUnknown: any other failure; the retirement may have happened.
    """
    body = {"owner": row.owner, "actor": row.actor, "lifecycleUid": row.lifecycle_uid}
    headers = {"Content-Type": "application/json", "Accept": "application/json", "Authorization": f"Bearer {service.cap}"}
    try:
        base = check_url(service.url)
        post = urllib.request.Request(f"{base}{RETIRE_PATH}", data=json.dumps(body).encode(), headers=headers, method="POST")
        with no_redirect_opener(base).open(post, timeout=RETIRE_TIMEOUT_S) as response:
            answer = _read_json(response)
    except urllib.error.HTTPError as error:
        raise _refusal(row, service.url, error) from None
    except (ConfigError, urllib.error.URLError, OSError, ValueError) as error:
        raise _unknown(row, service.url, f"no answer: {getattr(error, 'reason', error)}") from None
    retired = _confirmed(row, answer)
    if retired is None:
        raise _unknown(row, service.url, "the answer was not a retirement of that lifecycle")
    return retired
