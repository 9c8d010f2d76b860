"""The device-code login's client side (spec "IdP compatibility"; RFC 8628 section 3.5).

``cotal login`` asks the space's pinned IdP for a device code (``POST <base>/device/code``), shows
the person the user code and the verification address, and polls ``POST <base>/device/token``
until the IdP answers with the opaque session (``access_token``), refuses, or the code expires.
What to do after each answer is :func:`next_poll`, a pure function of the polling state, the
answer and the time; the shell only sleeps until the :class:`Wait` says and sends the poll.

The RFC's rules it keeps: wait ``interval`` seconds between polls (5 when the IdP names none);
``slow_down`` adds 5 seconds to the interval for this and every later poll; ``expired_token``,
``access_denied`` and any other OAuth error end the flow; a poll that got no answer (no
connection, a timeout, a 5xx) is retried at a reduced frequency, its wait doubled for each such
poll in a row (section 3.5: "clients MUST unilaterally reduce their polling frequency before
retrying"); and the client gives up by itself once ``expires_in`` has passed, so polling is
bounded even against an IdP that never says ``expired_token`` or never answers again.

Pure and synchronous: times are unix seconds passed in as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cotal_trio.core.errors import ConfigError

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEVICE_CODE_GRANT",
    "MAX_BACKOFF_S",
    "MAX_EXPIRES_IN_S",
    "SLOW_DOWN_STEP_S",
    "UNAVAILABLE_ERROR",
    "DeviceAuthorization",
    "Failed",
    "NoAnswer",
    "PollState",
    "Signed",
    "Wait",
    "next_poll",
    "start_polling",
]

# RFC 8628 section 3.4: the grant_type of a device access token request.
DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
# RFC 8628 section 3.2: "If no value is provided, clients MUST use 5 as the default."
DEFAULT_INTERVAL_S = 5
# RFC 8628 section 3.5: slow_down - "the interval MUST be increased by 5 seconds".
SLOW_DOWN_STEP_S = 5
# An IdP naming a longer wait than this is treated as broken rather than waited on.
MAX_INTERVAL_S = 300
# A code lifetime longer than this is polled for this long only (seconds; RFC 8628's example is
# 1800, Better Auth's default 30 minutes): polling stays bounded, and ``now + expires_in`` a float.
MAX_EXPIRES_IN_S = 86400
# The client never polls more than once a second, even when an IdP names an interval of 0.
MIN_INTERVAL_S = 1
# The longest wait the backoff after unanswered polls reaches (seconds), unless the interval
# itself is longer: an IdP back after an outage is polled again within a minute.
MAX_BACKOFF_S = 60
# The error of a flow that ended because the IdP did not answer (RFC 6749 section 4.1.2.1's code
# for a server that cannot handle the request for now): the shell raises Unavailable for it.
UNAVAILABLE_ERROR = "temporarily_unavailable"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceAuthorization:
    """The IdP's answer to ``POST <base>/device/code`` (RFC 8628 section 3.2).

    Attributes:
        device_code: the secret the client polls with (never shown).
        user_code: what the person enters at the verification address.
        verification_uri: where the person approves the code.
        verification_uri_complete: the same address with the code filled in, or None.
        expires_in_s: seconds the codes stay valid, positive, at most ``MAX_EXPIRES_IN_S``
            (a longer lifetime is cut to it).
        interval_s: seconds between polls (``DEFAULT_INTERVAL_S`` when the IdP named none;
            at least ``MIN_INTERVAL_S``).
    """

    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    expires_in_s: int
    interval_s: int

    @classmethod
    def from_answer(cls, body: Mapping[str, Any], *, idp: str) -> DeviceAuthorization:
        """Read the ``/device/code`` JSON answer.

        Raises:
            ConfigError: a member is missing or of the wrong type (the IdP at ``idp`` does not
                speak the device-code flow: the sentence says so).
        """
        def bad(member: str) -> ConfigError:
            return ConfigError(
                f"the IdP at {idp} answered /device/code without a valid {member} - it does not speak "
                "the device-code flow (RFC 8628) that `cotal login` needs"
            )

        texts = {}
        for member in ("device_code", "user_code", "verification_uri"):
            if not isinstance(body.get(member), str) or not body[member]:
                raise bad(member)
            texts[member] = body[member]
        expires_in, interval = body.get("expires_in"), body.get("interval", DEFAULT_INTERVAL_S)
        if type(expires_in) is not int or expires_in <= 0:
            raise bad("expires_in")
        if type(interval) is not int or not 0 <= interval <= MAX_INTERVAL_S:
            raise bad("interval")
        complete = body.get("verification_uri_complete")
        return cls(
            **texts, verification_uri_complete=complete if isinstance(complete, str) and complete else None,
            expires_in_s=min(expires_in, MAX_EXPIRES_IN_S), interval_s=max(interval, MIN_INTERVAL_S),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PollState:
    """Where a device-code login stands.

    Attributes:
        space: the space logging in (named in every remedy).
        interval_s: seconds to wait before the next poll (grows by 5 at each ``slow_down``).
        expires_at: unix seconds after which the user code is dead.
        failures: polls in a row that got no answer (0 after any answer); each doubles the next
            wait, up to ``MAX_BACKOFF_S``.
    """

    space: str
    interval_s: int
    expires_at: float
    failures: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class NoAnswer:
    """A ``/device/token`` poll that got no answer: no connection, a timeout, or a reply that is
    not an HTTP JSON answer (``detail`` says which, without a remedy)."""

    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """Poll ``/device/token`` again once the clock reads ``until`` (unix seconds)."""

    until: float
    state: PollState


@dataclass(frozen=True, slots=True, kw_only=True)
class Signed:
    """The IdP approved: ``session`` is the opaque revocable session (its ``access_token``).

    Attributes:
        session: the session token (secret; kept 0600 by the shell).
        expires_in_s: its lifetime in seconds when the IdP named one, else None.
    """

    session: str
    expires_in_s: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed:
    """The login is over without a session.

    Attributes:
        error: the RFC 8628 / OAuth error code (``expired_token``, ``access_denied``, ...).
        reason: one sentence naming what happened and the fix.
    """

    error: str
    reason: str


def start_polling(authorization: DeviceAuthorization, *, space: str, now: float) -> Wait | Failed:
    """The first wait: ``interval`` seconds after the code was issued (RFC 8628 section 3.5);
    :class:`Failed` when the code expires before that."""
    state = PollState(space=space, interval_s=authorization.interval_s, expires_at=now + authorization.expires_in_s)
    return _wait(state, now)


def _again(state: PollState) -> str:
    return f"run `cotal login --space {state.space}` again"


def _expired(state: PollState) -> Failed:
    return Failed(
        error="expired_token",
        reason=f"the user code expired before it was approved - {_again(state)} and approve the new code in time",
    )


def _wait(state: PollState, now: float) -> Wait | Failed:
    until = now + state.interval_s
    if until >= state.expires_at:  # the code is dead before the next poll could be answered
        return _expired(state)
    return Wait(until=until, state=state)


def _retry(state: PollState, detail: str, now: float) -> Wait | Failed:
    """The wait after a poll without an answer: doubled per failure in a row (RFC 8628 3.5)."""
    failures = state.failures + 1
    wait_s = min(state.interval_s * 2**failures, max(state.interval_s, MAX_BACKOFF_S))
    if now + wait_s >= state.expires_at:
        return Failed(error=UNAVAILABLE_ERROR, reason=(
            f"the IdP did not answer the login's polls before the user code expired ({detail}) - check that the"
            f" IdP runs, then {_again(state)}"))  # fmt: skip
    return Wait(until=now + wait_s, state=replace(state, failures=failures))


def next_poll(
    state: PollState, answer: tuple[int, Mapping[str, Any]] | NoAnswer, now: float
) -> Wait | Signed | Failed:
    """What to do after a ``/device/token`` poll.

    Args:
        state: the polling state the last :class:`Wait` carried.
        answer: ``(HTTP status, decoded JSON object)`` of the poll, or :class:`NoAnswer`.
        now: unix seconds when the answer arrived (or the poll failed).

    Returns:
        :class:`Signed` for a 200 carrying an ``access_token``; :class:`Wait` for
        ``authorization_pending`` (same interval), ``slow_down`` (interval + 5 s), and for a
        :class:`NoAnswer` or a 5xx without one of those errors (the wait doubled per such poll
        in a row); :class:`Failed` for ``expired_token``, ``access_denied``, any other error or
        answer without a token, or a next poll that would fall after the code's expiry
        (``error`` is ``UNAVAILABLE_ERROR`` when the last poll got no answer).
    """
    if isinstance(answer, NoAnswer):
        return _retry(state, answer.detail, now)
    status, body = answer
    error = body.get("error")
    if status == 200 and isinstance(body.get("access_token"), str) and body["access_token"]:
        expires_in = body.get("expires_in")
        return Signed(session=body["access_token"], expires_in_s=expires_in if type(expires_in) is int else None)
    answered = replace(state, failures=0)
    if error == "authorization_pending":
        return _wait(answered, now)
    if error == "slow_down":
        return _wait(replace(answered, interval_s=state.interval_s + SLOW_DOWN_STEP_S), now)
    if error == "expired_token":
        return _expired(state)
    if error == "access_denied":
        return Failed(error="access_denied", reason=f"the sign-in was denied at the IdP - {_again(state)} and approve the code")
    described = body.get("error_description") or body.get("message")
    said = f": {described}" if isinstance(described, str) and described else ""
    if status >= 500 and error in (None, "server_error", UNAVAILABLE_ERROR):  # the IdP failed, it did not refuse
        return _retry(state, f"HTTP {status}{said}", now)
    detail = f"{error}{said}" if error else f"HTTP {status}{said}"
    return Failed(error=str(error or "invalid_response"), reason=f"the IdP refused the login ({detail}) - {_again(state)}")
