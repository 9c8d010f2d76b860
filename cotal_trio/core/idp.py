"""IdP token verification for the human exchange arm (spec "Bridge contract" step 1).

The IdP's JWT is verified offline against the **pinned** JWKS with the algorithm pinned to EdDSA
(spec "IdP compatibility": RS256/ES256 IdPs need host-side re-issuance first). A token never
influences key resolution: ``jku``/``jwk``/``x5u``/``x5c`` headers are refused. Issuer and
audience must equal the pin exactly; ``exp`` and ``iat`` are required; an expired proof is
refused, and the bearer minted from it never outlives it (``core/exchange.py``).

Pure and synchronous: the shell fetches or reads the JWKS and passes it to :func:`parse_jwks`;
time comes in as ``now`` (unix seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nacl.signing import VerifyKey

from cotal_trio.core.bearer import CLOCK_SKEW_S
from cotal_trio.core.errors import ConfigError, RefusalCode, Refused
from cotal_trio.core.jose import JwsWording, parse_ed25519_jwks, verify_ed25519_jws

__all__ = [
    "PASSWORD_PROOF_MAX_AGE_S",
    "IdpIdentity",
    "IdpPin",
    "check_password_proof",
    "parse_jwks",
    "parse_password_proof_body",
    "verify_idp_token",
]

# Spec "Password proof": a password sign-in this recent, at most, proves a person is present.
PASSWORD_PROOF_MAX_AGE_S = 300
_PROOF_FIELDS = frozenset({"idpToken", "subject"})

_IDP_WORDING = JwsWording(
    what="IdP token",
    fix="sign in to the IdP again for a fresh token and retry",
    unknown_key=(
        "IdP token key {kid} is not in the pinned JWKS (re-read at most every 30 s) - if the IdP "
        "has just rotated its keys, sign in again in 30 s; otherwise the token is not from the pinned IdP"
    ),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class IdpPin:
    """The IdP coordinates a space trusts (spec "IdP compatibility": never loosened).

    Attributes:
        issuer: the exact ``iss`` of IdP tokens; also the issuer fed to owner derivation.
        audience: the exact ``aud`` (string or singleton list in the token).
        jwks_uri: where the shell fetches the JWKS from, or ``None`` when the JWKS is pinned
            inline.

    Raises:
        ConfigError: ``issuer`` or ``audience`` is not a non-empty string, or ``jwks_uri`` is
            given but not an ``https://`` or ``http://`` URL.
    """

    issuer: str
    audience: str
    jwks_uri: str | None = None

    def __post_init__(self) -> None:
        for name in ("issuer", "audience"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"the IdP pin needs a non-empty {name} - set it in the space's idp pin")
        uri = self.jwks_uri
        if uri is not None and not (isinstance(uri, str) and uri.startswith(("https://", "http://"))):
            raise ConfigError("the IdP pin's jwks_uri must be an http(s) URL - set it to the IdP's JWKS address")


@dataclass(frozen=True, slots=True, kw_only=True)
class IdpIdentity:
    """What a verified IdP token says about the person.

    Attributes:
        sub: the IdP subject (non-empty).
        iat: issued-at, unix seconds.
        exp: expiry, unix seconds; the minted bearer never outlives it.
        auth_time: signed integer ``auth_time`` or ``None`` when absent or malformed
            (spec "Password proof": malformed provenance only matters to that decision).
        amr: signed ``amr`` strings, ``()`` when absent or malformed.
    """

    sub: str
    iat: int
    exp: int
    auth_time: int | None = None
    amr: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.sub, str) or not self.sub:
            raise Refused(RefusalCode.BAD_CREDENTIAL, "IdP token sub must be a non-empty string")


def parse_jwks(doc: object) -> dict[str, VerifyKey]:
    """Parse the IdP's JWKS document into ``{kid: VerifyKey}``.

    Accepts only ``{"keys": [...]}`` whose keys are all public Ed25519 OKP JWKs with a
    non-empty ``kid`` (see :func:`cotal_trio.core.jose.parse_ed25519_jwks`).

    Raises:
        CodecError: any other shape, a non-Ed25519 key, a missing or duplicate ``kid``.
    """
    return parse_ed25519_jwks(doc)


def _bad(problem: str) -> Refused:
    return Refused(RefusalCode.BAD_CREDENTIAL, f"IdP token {problem} - {_IDP_WORDING.fix}")


def _check_pin(claims: Mapping[str, Any], pin: IdpPin) -> None:
    if claims.get("iss") != pin.issuer:
        raise Refused(
            RefusalCode.BAD_CREDENTIAL,
            f"IdP token issuer is not the pinned issuer {pin.issuer} - sign in with the IdP this space pins",
        )
    aud = claims.get("aud")
    if aud != pin.audience and aud != [pin.audience]:
        raise Refused(
            RefusalCode.BAD_CREDENTIAL,
            f"IdP token audience is not the pinned audience {pin.audience} - sign in for this mesh's audience",
        )


def _check_times(claims: Mapping[str, Any], now: float) -> tuple[int, int]:
    exp, iat = claims.get("exp"), claims.get("iat")
    if type(exp) is not int or type(iat) is not int:
        raise _bad("needs integer exp and iat claims")
    if now >= exp:
        raise Refused(RefusalCode.BAD_CREDENTIAL, "IdP token expired - sign in to the IdP again for a fresh token and retry")
    nbf = claims.get("nbf", iat)
    if iat > now + CLOCK_SKEW_S or type(nbf) is not int or nbf > now + CLOCK_SKEW_S:
        raise _bad("is not valid yet (iat or nbf in the future); check this host's clock")
    return iat, exp


def _provenance(claims: Mapping[str, Any]) -> tuple[int | None, tuple[str, ...]]:
    auth_time, amr = claims.get("auth_time"), claims.get("amr")
    auth_time = auth_time if type(auth_time) is int else None
    amr_ok = isinstance(amr, list) and all(isinstance(item, str) for item in amr)
    return auth_time, tuple(amr) if amr_ok else ()


def verify_idp_token(token: object, *, pin: IdpPin, keys: Mapping[str, VerifyKey], now: float) -> IdpIdentity:
    """Verify an IdP JWT against the pin (spec "Bridge contract" step 1; upstream-notes 3.5).

    Rules: compact JWS with ``alg`` ``EdDSA``/``Ed25519``; no ``jku``/``jwk``/``x5u``/``x5c``;
    ``kid`` in ``keys``; signature verifies; ``iss == pin.issuer``; ``aud == pin.audience`` or
    ``[pin.audience]``; integer ``exp`` and ``iat``; expired when ``now >= exp`` (no skew: an
    expired proof mints nothing); ``iat`` (and ``nbf`` when present) at most 5 s in the
    future; ``sub`` a non-empty string.

    Args:
        token: the ``idpToken`` of the exchange body.
        pin: the space's IdP pin.
        keys: the pinned JWKS, parsed by :func:`parse_jwks`.
        now: wall time, unix seconds.

    Returns:
        The verified :class:`IdpIdentity`.

    Raises:
        Refused: BAD_CREDENTIAL with a sentence naming the broken rule; an unknown ``kid``
            says the key is not in the pinned JWKS.
    """
    claims = verify_ed25519_jws(token, keys, wording=_IDP_WORDING)
    _check_pin(claims, pin)
    iat, exp = _check_times(claims, now)
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise _bad("has no subject (sub must be a non-empty string)")
    auth_time, amr = _provenance(claims)
    return IdpIdentity(sub=sub, iat=iat, exp=exp, auth_time=auth_time, amr=amr)


def parse_password_proof_body(body: object) -> tuple[str, str]:
    """The ``(idpToken, subject)`` of a ``POST /tool-result-human-proof/verify`` body.

    The body is closed: exactly ``{"idpToken": str, "subject": str}``, ``subject`` being the
    host's authenticated session subject (the IdP ``sub`` the host signed its user in as).

    Raises:
        Refused: BAD_REQUEST naming the field that is missing, extra or not a non-empty string.
    """
    if not isinstance(body, dict):
        raise Refused(RefusalCode.BAD_REQUEST, 'the body must be a JSON object {"idpToken", "subject"}')
    extra = sorted(set(body) - _PROOF_FIELDS)
    if extra:
        raise Refused(RefusalCode.BAD_REQUEST, f"unknown field {extra[0]!r} - the body is exactly {{idpToken, subject}}")
    for name in sorted(_PROOF_FIELDS):
        if not isinstance(body.get(name), str) or not body[name]:
            raise Refused(RefusalCode.BAD_REQUEST, f"{name} must be a non-empty string")
    return body["idpToken"], body["subject"]


def check_password_proof(identity: IdpIdentity, *, subject: str, now: float) -> None:
    """Decide a verified IdP token as a fresh password proof for ``subject`` (spec "Password
    proof"): its ``sub`` is the host's session subject, its signed integer-second ``auth_time``
    is no later than ``now`` and at most ``PASSWORD_PROOF_MAX_AGE_S`` (300 s) old, and its signed
    ``amr`` contains ``pwd``. A recent ``iat`` proves nothing here.

    Pure: ``identity`` comes from :func:`verify_idp_token` (signature, pin and expiry checked),
    ``now`` is wall time in unix seconds. Exchange is unaffected by this rule.

    Raises:
        Refused: BAD_CREDENTIAL with a sentence naming what is missing, malformed, in the
            future or stale, and the fix.
    """
    if identity.sub != subject:
        raise Refused(
            RefusalCode.BAD_CREDENTIAL,
            "IdP token is for another subject than the session's - the signed-in user must sign in again",
        )
    if identity.auth_time is None:
        raise Refused(
            RefusalCode.BAD_CREDENTIAL,
            "IdP token carries no integer auth_time, so it proves no password sign-in - sign in with the password again",
        )
    if identity.auth_time > now:
        raise Refused(RefusalCode.BAD_CREDENTIAL, "IdP token auth_time is in the future - check the IdP's and this host's clocks")
    age = now - identity.auth_time
    if age > PASSWORD_PROOF_MAX_AGE_S:
        raise Refused(
            RefusalCode.BAD_CREDENTIAL,
            f"IdP token password sign-in is {int(age)} s old (at most {PASSWORD_PROOF_MAX_AGE_S} s) - sign in with the password again",
        )
    if "pwd" not in identity.amr:
        raise Refused(
            RefusalCode.BAD_CREDENTIAL,
            "IdP token amr does not contain pwd - sign in with the password (not another method) and retry",
        )
