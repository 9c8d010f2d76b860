"""Client commands: get a bearer from a space's auth service, and say how to connect.

``cotal exchange`` (human arm: an IdP token) and ``cotal agent-bearer`` (agent arm: the actor
token from a file) talk to the space's loopback face found through ``auth-service.json``
(upstream-notes 3.5, 4.1); ``cotal connect-info`` prints what a client needs to connect.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Annotated, Any

from cyclopts import Parameter

from ..core.errors import ConfigError, Refused, Unavailable
from ..core.identity import check_actor, check_owner
from ..http.client import ExchangeRefused, post_exchange, read_service
from ..state import SpacePaths, load_idp_pin, load_policy, missing
from .common import Where

__all__ = ["agent_bearer", "connect_info", "exchange"]

# Group and others get no access to a secret file.
PRIVATE_MODE_MASK = 0o077


def checked(check: Any, value: str) -> str:
    """``check(value)``; a core refusal becomes the ConfigError with the same sentence."""
    try:
        return check(value)
    except Refused as exc:
        raise ConfigError(exc.detail) from None


class ExchangeFailed(ConfigError):
    """The service refused the exchange; ``status`` and ``body`` are its HTTP answer."""

    def __init__(self, sentence: str, status: int, body: dict[str, Any]) -> None:
        super().__init__(sentence)
        self.status, self.body = status, body

    def as_json(self) -> str:
        """``{"error": {"code", "message", "status", "cause"}}`` for ``--json`` output."""
        error = {"code": "EXCHANGE_REFUSED", "message": str(self), "status": self.status, "cause": self.body}
        return json.dumps({"error": error}, indent=2)


def run_exchange(space_paths: SpacePaths, actor: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` to the space's running auth service; the minted ``{token, owner, exp}``.

    Raises:
        ConfigError: the service is not running.
        ExchangeFailed: it refused: ``the exchange for actor "<a>" was refused: <its sentence>``.
        Unavailable: the service did not answer, or answered without a bearer.
    """
    service = read_service(space_paths)
    try:
        answer = post_exchange(service.url, service.cap, body)
    except ExchangeRefused as exc:
        sentence = f'the exchange for actor "{actor}" was refused: {exc.error}'
        raise ExchangeFailed(sentence, exc.status, exc.body) from None
    token, owner, exp = answer.get("token"), answer.get("owner"), answer.get("exp")
    if not (isinstance(token, str) and isinstance(owner, str) and type(exp) is int):
        raise Unavailable(f"the auth service at {service.url} answered without a bearer - check its log")
    return {"token": token, "owner": owner, "exp": exp}


def exchange(
    *,
    actor: str,
    idp_token: str,
    ttl: int | None = None,
    as_json: Annotated[bool, Parameter(name="--json", negative="")] = False,
    where: Where = Where(),
) -> int:
    """Exchange an IdP token for a bearer of one of your actors (the human arm).

    Prints the bearer, or {"token", "owner", "exp"} with --json; a refusal with --json prints
    {"error": {"code", "message", "status", "cause"}} and exits 1.

    Parameters
    ----------
    actor
        The actor to act as (granted with `cotal actor grant`).
    idp_token
        The IdP's sign-in token (a JWT; in development: `cotal dev-idp token --sub <you>`).
    ttl
        Requested bearer lifetime in seconds (at most 900, never beyond the IdP token).
    as_json
        Print a JSON object instead of the bare bearer.
    """
    checked(check_actor, actor)
    if ttl is not None and ttl <= 0:
        raise ConfigError("--ttl is a positive number of seconds - omit it for the default")
    if not idp_token.strip():
        raise ConfigError("--idp-token needs the IdP's sign-in token (a JWT)")
    body: dict[str, Any] = {"idpToken": idp_token.strip(), "actor": actor}
    if ttl is not None:
        body["ttlSec"] = ttl
    try:
        answer = run_exchange(where.space_paths(), actor, body)
    except ExchangeFailed as failed:
        if not as_json:
            raise
        print(failed.as_json())
        return 1
    print(json.dumps(answer, indent=2) if as_json else answer["token"])
    return 0


def read_token_file(path: Path) -> str:
    """The actor token in ``path`` (surrounding whitespace stripped).

    A file that group or others may access gets a warning on stderr (it should be 0600).

    Raises:
        ConfigError: the file cannot be read or holds no token.
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise ConfigError(f"cannot read the token file {path} ({why}) - pass the file the actor token was saved to") from None
    if stat.S_IMODE(mode) & PRIVATE_MODE_MASK:
        print(f"cotal: warning: {path} is accessible by group or others - it should be 0600 (chmod 600 {path})", file=sys.stderr)
    if not text:
        raise ConfigError(f"the token file {path} is empty - save the actor token printed by the managed grant in it")
    return text


def agent_bearer(
    *,
    owner: str,
    actor: str,
    token_file: Path,
    where: Where = Where(),
) -> None:
    """Exchange an agent's actor token for a bearer (the agent arm) and print it.

    Parameters
    ----------
    owner
        The agent's owner, u_ followed by 26 characters.
    actor
        The agent's actor name.
    token_file
        File holding the actor token printed once by `cotal actor grant --managed` (0600).
    """
    checked(check_owner, owner)
    checked(check_actor, actor)
    body = {"owner": owner, "actor": actor, "actorToken": read_token_file(token_file)}
    print(run_exchange(where.space_paths(), actor, body)["token"])


def connect_details(where: Where) -> dict[str, Any]:
    """``{space, server, sentinelCreds, authService, idp}`` for a client of the space.

    Raises:
        ConfigError: the root's policy, the space's IdP pin or its sentinel is missing or
            corrupt (the sentence names `cotal up`).
    """
    space_paths = where.space_paths()
    policy = load_policy(where.paths().policy_json)
    pin = load_idp_pin(space_paths.idp_json)
    if not space_paths.sentinel_creds.exists():
        raise missing(space_paths.sentinel_creds)
    return {
        "space": space_paths.space,
        "server": f"nats://127.0.0.1:{policy.port}",
        "sentinelCreds": str(space_paths.sentinel_creds.absolute()),
        "authService": str(space_paths.auth_service_json.absolute()),
        "idp": {"kind": pin.kind, "issuer": pin.issuer, "audience": pin.audience, "jwksUri": pin.jwks_uri},
    }


def connect_info(
    *,
    as_json: Annotated[bool, Parameter(name="--json", negative="")] = False,
    where: Where = Where(),
) -> None:
    """Print how a client connects to the space: server, sentinel creds, auth service, IdP.

    Parameters
    ----------
    as_json
        Print a JSON object instead of one "key: value" line each.
    """
    details = connect_details(where)
    if as_json:
        print(json.dumps(details, indent=2))
        return
    idp = details.pop("idp")
    details.update({f"idp.{key}": value for key, value in idp.items()})
    print("\n".join(f"{key}: {value}" for key, value in details.items()))
