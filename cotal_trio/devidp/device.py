"""The development IdP's device-code grants and sessions (issue 19 item 5). DEVELOPMENT ONLY.

The server half of the login ``cotal login`` runs (spec "IdP compatibility": the stock flow speaks
Better Auth's device-code endpoints with an opaque revocable session), in Better Auth's shape:

* :meth:`DeviceGrants.issue` answers ``POST /device/code``: ``{device_code, user_code,
  verification_uri, verification_uri_complete, expires_in, interval}``.
* :meth:`DeviceGrants.poll` answers ``POST /device/token``: 200 ``{access_token, token_type:
  "Bearer", expires_in, scope}`` once approved, else 400 ``{error, error_description}`` with
  ``authorization_pending``, ``slow_down`` (a poll sooner than the interval after the last one;
  the grant's interval then grows by 5 s, RFC 8628 section 3.5), ``expired_token``,
  ``access_denied`` or ``invalid_grant``.
* :meth:`DeviceGrants.approve` / :meth:`DeviceGrants.deny` are ``POST /device/approve`` and
  ``/device/deny`` ``{userCode}``, for a person who signed in (the app checks that).
* The ``access_token`` is an opaque session: :meth:`DeviceGrants.session_subject` is what ``GET
  /token`` reads to mint a fresh JWT, :meth:`DeviceGrants.revoke` is ``POST /sign-out``.

A synchronous table with no clock of its own: every call takes ``now`` (unix seconds) and the
app passes its clock in, so a test drives expiry and ``slow_down`` without waiting. It lives as
long as the dev IdP's app: a restarted ``cotal up`` forgets its sessions (log in again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cotal_trio.core.device_flow import SLOW_DOWN_STEP_S
from cotal_trio.core.errors import ConfigError

__all__ = ["DevicePolicy", "DeviceGrants", "normalize_user_code"]

# RFC 8628 section 6.1: a user code of 8 characters from 20 consonants (no vowels, so no words;
# no look-alikes) carries about 34.5 bits, enough within its short lifetime and the poll rate.
_USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
_USER_CODE_LENGTH = 8
_UNBIASED = 256 - 256 % len(_USER_CODE_ALPHABET)
_SECRET_BYTES = 32
# Better Auth's default session lifetime: seven days.
SESSION_TTL_S = 7 * 24 * 3600


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicePolicy:
    """How long a device code lives and how often it may be polled.

    Attributes:
        interval_s: the ``interval`` advertised (seconds between polls), 0 or more.
        expires_in_s: the codes' lifetime in seconds, positive (Better Auth's default: 30 min).

    Raises:
        ConfigError: a negative interval or a non-positive lifetime.
    """

    interval_s: int = 5
    expires_in_s: int = 1800

    def __post_init__(self) -> None:
        if type(self.interval_s) is not int or self.interval_s < 0:
            raise ConfigError("the device-code interval is 0 or more whole seconds")
        if type(self.expires_in_s) is not int or self.expires_in_s <= 0:
            raise ConfigError("the device-code lifetime is a positive number of whole seconds")


@dataclass(slots=True, kw_only=True)
class _Grant:
    user_code: str
    client_id: str
    scope: str
    expires_at: float
    interval_s: int
    last_poll: float
    subject: str | None = None
    approved_at: float = 0.0
    denied: bool = False


@dataclass(slots=True, kw_only=True)
class _Session:
    subject: str
    signed_in_at: float
    expires_at: float


def normalize_user_code(text: str) -> str:
    """A user code as typed (any case, with or without ``-`` or spaces) in its stored form."""
    return "".join(ch for ch in text.upper() if ch.isalnum())


def _error(error: str, description: str) -> tuple[int, dict[str, Any]]:
    return 400, {"error": error, "error_description": description}


@dataclass(slots=True)
class DeviceGrants:
    """The pending device codes and the live sessions of one dev IdP (not thread-safe: one
    trio loop owns it).

    Args:
        policy: interval and lifetime of new codes.
        random_bytes: a CSPRNG ``n -> n bytes`` (``os.urandom``).
    """

    policy: DevicePolicy
    random_bytes: Callable[[int], bytes]
    _grants: dict[str, _Grant] = field(default_factory=dict)
    _by_user_code: dict[str, str] = field(default_factory=dict)
    _sessions: dict[str, _Session] = field(default_factory=dict)

    def _secret(self) -> str:
        return self.random_bytes(_SECRET_BYTES).hex()

    def _user_code(self) -> str:
        while True:
            # Bytes of 240 and above are dropped, so each of the 20 letters is equally likely.
            letters = [b % len(_USER_CODE_ALPHABET) for b in self.random_bytes(2 * _USER_CODE_LENGTH) if b < _UNBIASED]
            code = "".join(_USER_CODE_ALPHABET[i] for i in letters[:_USER_CODE_LENGTH])
            if len(code) == _USER_CODE_LENGTH and code not in self._by_user_code:
                return code

    def issue(self, *, client_id: str, scope: str, verification_uri: str, now: float) -> dict[str, Any]:
        """A new device code (``POST /device/code``).

        Args:
            client_id: the client's id (kept, and checked again at each poll).
            scope: the requested scope, ``""`` for none.
            verification_uri: the absolute address of the approval route.
            now: unix seconds.

        Returns:
            ``{device_code, user_code ("XXXX-XXXX"), verification_uri, verification_uri_complete,
            expires_in, interval}``.
        """
        self._forget_expired(now)
        device_code, code = self._secret(), self._user_code()
        self._grants[device_code] = _Grant(
            user_code=code, client_id=client_id, scope=scope, expires_at=now + self.policy.expires_in_s,
            interval_s=self.policy.interval_s, last_poll=now,
        )
        self._by_user_code[code] = device_code
        shown = f"{code[:4]}-{code[4:]}"
        return {
            "device_code": device_code, "user_code": shown, "verification_uri": verification_uri,
            "verification_uri_complete": f"{verification_uri}?user_code={shown}",
            "expires_in": self.policy.expires_in_s, "interval": self.policy.interval_s,
        }  # fmt: skip

    def poll(self, *, device_code: str, client_id: str, now: float) -> tuple[int, dict[str, Any]]:
        """One ``POST /device/token`` poll: ``(HTTP status, JSON body)`` as the module says."""
        grant = self._grants.get(device_code)
        if grant is None or grant.client_id != client_id:
            return _error("invalid_grant", "unknown device code - start the login again")
        if now >= grant.expires_at:
            self._drop(device_code)
            return _error("expired_token", "the device code expired - start the login again")
        if now < grant.last_poll + grant.interval_s:
            grant.interval_s += SLOW_DOWN_STEP_S
            grant.last_poll = now
            return _error("slow_down", f"polled too fast - wait {grant.interval_s} s between polls")
        grant.last_poll = now
        if grant.denied:
            self._drop(device_code)
            return _error("access_denied", "the user denied the sign-in")
        if grant.subject is None:
            return _error("authorization_pending", "the user has not approved the code yet")
        self._drop(device_code)
        session = self._secret()
        self._sessions[session] = _Session(
            subject=grant.subject, signed_in_at=grant.approved_at, expires_at=now + SESSION_TTL_S
        )
        return 200, {"access_token": session, "token_type": "Bearer", "expires_in": SESSION_TTL_S, "scope": grant.scope}

    def _pending(self, user_code: str, now: float) -> _Grant | None:
        self._forget_expired(now)
        device_code = self._by_user_code.get(normalize_user_code(user_code))
        grant = None if device_code is None else self._grants.get(device_code)
        if grant is None or now >= grant.expires_at or grant.subject is not None or grant.denied:
            return None
        return grant

    def is_pending(self, user_code: str, *, now: float) -> bool:
        """True while ``user_code`` waits for an answer (issued, not expired, not yet answered)."""
        return self._pending(user_code, now) is not None

    def approve(self, *, user_code: str, subject: str, now: float) -> bool:
        """``subject`` approves ``user_code`` (``POST /device/approve``); False when no such code
        is pending (unknown, expired, or already answered)."""
        grant = self._pending(user_code, now)
        if grant is None:
            return False
        grant.subject, grant.approved_at = subject, now
        return True

    def deny(self, *, user_code: str, now: float) -> bool:
        """The person denies ``user_code`` (``POST /device/deny``); False when none is pending."""
        grant = self._pending(user_code, now)
        if grant is None:
            return False
        grant.denied = True
        return True

    def session_subject(self, session: str, *, now: float) -> tuple[str, float] | None:
        """``(subject, signed_in_at)`` of a live session (``signed_in_at``: unix seconds of the
        approval, the ``auth_time`` of the JWTs it gets), or None (unknown, revoked or expired)."""
        found = self._sessions.get(session)
        if found is None or now >= found.expires_at:
            self._sessions.pop(session, None)
            return None
        return found.subject, found.signed_in_at

    def revoke(self, session: str) -> bool:
        """End a session (``POST /sign-out``); False when it was not live."""
        return self._sessions.pop(session, None) is not None

    def _drop(self, device_code: str) -> None:
        grant = self._grants.pop(device_code, None)
        if grant is not None:
            self._by_user_code.pop(grant.user_code, None)

    def _forget_expired(self, now: float) -> None:
        # Kept one lifetime past expiry, so a late poll still hears expired_token, not invalid_grant.
        stale = now - self.policy.expires_in_s
        for device_code in [dc for dc, grant in self._grants.items() if stale >= grant.expires_at]:
            self._drop(device_code)
