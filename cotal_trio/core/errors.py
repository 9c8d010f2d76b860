"""The service's typed errors: who is at fault decides how an error is answered.

STYLE.md practice 17-18. Mapping to a wire answer happens once, at the edge:

* :class:`Refused` is the caller's fault (bad signature, expired bearer, unknown actor, scope too
  wide). The callout answers it with a signed denial carrying :meth:`Refused.reason`; the HTTP
  faces answer it with a 4xx JSON body ``{"error": <sentence>}``. Its subclass
  :class:`RateLimited` (connect limits) carries the typed 429 fields and its own callout reason.
* :class:`Unavailable` is a dependency's fault (store or broker unreachable). The callout gives
  no mint; HTTP answers 503; a single-space replica exits.
* :class:`CodecError` is malformed wire material (an nkey, a NATS JWT, an xkey box, a creds
  file). Where it comes from a peer it is dropped or refused; where it comes from the root it is
  a :class:`ConfigError`.
* :class:`ConfigError` is the operator's bad input (a flag, a corrupt root file, a busy port).
  Its message is one sentence that names the fix; the CLI prints it and exits non-zero.
* Anything else is our bug: a generic 500 or a denial, logged with its traceback.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = [
    "AuthServiceError",
    "CodecError",
    "ConfigError",
    "RateLimited",
    "RefusalCode",
    "Refused",
    "Unavailable",
    "leaves",
]


class AuthServiceError(Exception):
    """Base class of every error this package raises on purpose."""


class CodecError(AuthServiceError, ValueError):
    """Malformed wire material: an nkey, seed, NATS JWT, xkey box or creds file.

    The message says what was malformed, never the secret itself.
    """


class ConfigError(AuthServiceError):
    """Operator input that cannot be used; the message is one sentence naming the fix."""


class Unavailable(AuthServiceError):
    """A dependency (broker, store, IdP JWKS) did not answer; retrying later may succeed."""


class RefusalCode(enum.StrEnum):
    """Why a caller was refused; the HTTP edge maps each code to a status in one table."""

    BAD_REQUEST = "bad-request"
    BAD_CAPABILITY = "bad-capability"
    BAD_CREDENTIAL = "bad-credential"
    NOT_GRANTED = "not-granted"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not-found"
    CONFLICT = "conflict"
    PRECONDITION_FAILED = "precondition-failed"
    RATE_LIMITED = "rate-limited"


class Refused(AuthServiceError):
    """The caller's request is refused; ``detail`` is the sentence the caller is shown.

    Attributes:
        code: the :class:`RefusalCode` (selects the HTTP status at the edge).
        detail: a sentence that names the fix; safe to show to the caller (no secrets, no
            internal exception text).
        fields: extra members of the JSON error body beside ``error`` (a host door's
            ``outcome``); JSON values, never secrets. Empty for most refusals.
    """

    def __init__(self, code: RefusalCode, detail: str, *, fields: Mapping[str, object] | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.fields = dict(fields or {})

    def reason(self) -> str:
        """The denial reason string for a signed callout denial (the detail sentence)."""
        return self.detail


class RateLimited(Refused):
    """A connect limit ran out (spec "Connect limits"); built by ``core.limits.Limited.error``.

    The callout denies with :meth:`reason` (``RATE_LIMITED retry-after <n>s ...``); the exchange
    answers 429 with :meth:`body` and a ``Retry-After: <n>`` header; ``detail`` is the sentence.

    Attributes:
        limit: the bucket that ran out: ``"actor"``, ``"owner"`` or ``"host"``.
        retry_after_s: whole seconds, at least 1, until every bucket the connect draws on has a
            connect again (if nothing else spends it first).
        owner, actor: the principal charged (``None`` for the host bucket).
    """

    def __init__(
        self,
        detail: str,
        *,
        callout_reason: str,
        limit: str,
        retry_after_s: int,
        owner: str | None = None,
        actor: str | None = None,
    ) -> None:
        super().__init__(RefusalCode.RATE_LIMITED, detail)
        self.callout_reason = callout_reason
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.owner, self.actor = owner, actor

    def reason(self) -> str:
        """The signed callout denial's reason: ``RATE_LIMITED retry-after <n>s`` and whom."""
        return self.callout_reason

    def body(self) -> dict[str, object]:
        """The 429 body ``{"code": "RATE_LIMITED", "retryAfterSeconds", "limit", "error"}``."""
        return {"code": "RATE_LIMITED", "retryAfterSeconds": self.retry_after_s, "limit": self.limit, "error": self.detail}


def leaves(error: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``error``, depth first (``[error]`` for a plain one).

    Nursery boundaries wrap errors in exception groups (STYLE.md practice 20); an edge that
    maps errors to a sentence looks at the leaves.
    """
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]
