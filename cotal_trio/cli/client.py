"""Client commands: get a bearer from a space's auth service, and say how to connect.

``cotal exchange`` (human arm: an IdP token) and ``cotal agent-bearer`` (agent arm: the actor
token from a file) talk to the space's loopback face found through ``auth-service.json``
(upstream-notes 3.5, 4.1); ``cotal connect-info`` prints what a client needs to connect.

Exit codes of the two exchange commands: 0 with a bearer; 1 when the service refused the
exchange (or is not running); 2, ``DEPENDENCY_UNAVAILABLE``, when it answered 429
``RATE_LIMITED`` because the actor or its owner is out of connects (spec "Connect limits"): the
service's sentence and a remedy naming the bucket go to stderr, ``cotal agent-bearer`` also
prints ``retry-after <n>`` on stdout so the agent's endpoint runs it again after that long.
"""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path
from typing import Annotated, Any

from cyclopts import Parameter

from ..broker.spaces import MODE_STATIC, MODE_USER_AUTH, space_mode
from ..core import credentials as rules
from ..core.errors import ConfigError, Refused, Unavailable
from ..core.identity import check_actor, check_owner
from ..http.client import ExchangeRefused, post_exchange, read_service
from ..state import SpacePaths, load_idp_pin, missing
from ..state.credentials import list_records
from ._idp_session import served_dev_idp_url, session_idp_token
from ._servers import Server, parse_servers, resolve_servers
from .common import Where
from .exits import ExitCode

__all__ = ["EXIT_DEPENDENCY_UNAVAILABLE", "ExchangeRateLimited", "agent_bearer", "connect_info", "exchange"]

# Group and others get no access to a secret file.
PRIVATE_MODE_MASK = 0o077
# Exit status of a command whose dependency (here: the auth service's connect limits) says wait.
EXIT_DEPENDENCY_UNAVAILABLE = ExitCode.DEPENDENCY_UNAVAILABLE


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
        return _json_error("EXCHANGE_REFUSED", str(self), self.status, self.body)


def _json_error(code: str, message: str, status: int, cause: dict[str, Any], **extra: str) -> str:
    error = {"code": code, "message": message, **extra, "status": status, "cause": cause}
    return json.dumps({"error": error}, indent=2)


class ExchangeRateLimited(Unavailable):
    """The service answered 429 ``RATE_LIMITED``: the actor or its owner is out of connects.

    A dependency's answer, not a refusal: the same request succeeds once ``retry_after_s``
    have passed (spec "Connect limits"). The message is the service's sentence.

    Attributes:
        limit: ``"actor"`` (only that actor is limited) or ``"owner"`` (the whole account).
        retry_after_s: whole seconds to wait, at least 1.
        body: the service's answer ``{"code", "retryAfterSeconds", "limit", "error"}``.
    """

    def __init__(self, sentence: str, *, actor: str, limit: str, retry_after_s: int, body: dict[str, Any]) -> None:
        super().__init__(sentence)
        self.actor, self.limit, self.retry_after_s, self.body = actor, limit, retry_after_s, body

    @classmethod
    def of(cls, refused: ExchangeRefused, actor: str) -> ExchangeRateLimited | None:
        """The typed 429 of the connect limits in ``refused``, or None for any other answer."""
        body, n = refused.body, refused.body.get("retryAfterSeconds")
        if refused.status != 429 or body.get("code") != "RATE_LIMITED" or type(n) is not int or n < 1:
            return None
        if body.get("limit") not in ("actor", "owner"):
            return None
        return cls(refused.error, actor=actor, limit=body["limit"], retry_after_s=n, body=body)

    @property
    def remedy(self) -> str:
        """What to do, naming the bucket that ran out (``limit``)."""
        if self.limit == "actor":
            return (
                f'only actor "{self.actor}" is limited (its owner\'s other actors can still connect)'
                f" - run this again after {self.retry_after_s}s, not before"
            )
        return (
            "the whole account is limited: every actor of this owner shares its connects"
            f" - run this again after {self.retry_after_s}s, not before"
        )

    def report(self) -> None:
        """The sentence and the remedy on stderr, one ``cotal:`` line each."""
        print(f"cotal: {self}\ncotal: {self.remedy}", file=sys.stderr)

    def as_json(self) -> str:
        """``{"error": {"code": "DEPENDENCY_UNAVAILABLE", "message", "remedy", "status", "cause"}}``;
        ``cause`` is the service's answer (``RATE_LIMITED``, ``retryAfterSeconds``, ``limit``)."""
        return _json_error("DEPENDENCY_UNAVAILABLE", str(self), 429, self.body, remedy=self.remedy)


def run_exchange(space_paths: SpacePaths, actor: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` to the space's running auth service; the minted ``{token, owner, exp}``.

    Raises:
        ConfigError: the service is not running.
        ExchangeRateLimited: it answered 429 ``RATE_LIMITED`` (connect limits).
        ExchangeFailed: it refused: ``the exchange for actor "<a>" was refused: <its sentence>``.
        Unavailable: the service did not answer, or answered without a bearer.
    """
    service = read_service(space_paths)
    try:
        answer = post_exchange(service.url, service.cap, body)
    except ExchangeRefused as exc:
        if (limited := ExchangeRateLimited.of(exc, actor)) is not None:
            raise limited from None
        sentence = f'the exchange for actor "{actor}" was refused: {exc.error}'
        raise ExchangeFailed(sentence, exc.status, exc.body) from None
    token, owner, exp = answer.get("token"), answer.get("owner"), answer.get("exp")
    if not (isinstance(token, str) and isinstance(owner, str) and type(exp) is int):
        raise Unavailable(f"the auth service at {service.url} answered without a bearer - check its log")
    minted: dict[str, Any] = {"token": token, "owner": owner, "exp": exp}
    if isinstance(answer.get("managerInstanceId"), str):
        minted["managerInstanceId"] = answer["managerInstanceId"]
    return minted


def _view_fields(view: str | None, manager_instance: str | None) -> dict[str, Any]:
    """The body members of ``--view`` and ``--manager-instance`` (the service decides the view).

    Raises:
        ConfigError: ``--manager-instance`` without ``--view manager-caller``.
    """
    if manager_instance is not None and view != "manager-caller":
        raise ConfigError("--manager-instance pins the manager of a manager-caller view - add --view manager-caller")
    fields: dict[str, Any] = {}
    if view is not None:
        fields["view"] = view
    if manager_instance is not None:
        fields["managerInstanceId"] = manager_instance
    return fields


def exchange(
    *,
    actor: str,
    idp_token: str | None = None,
    ttl: int | None = None,
    view: str | None = None,
    manager_instance: str | None = None,
    as_json: Annotated[bool, Parameter(name="--json", negative="")] = False,
    where: Where = Where(),
) -> int:
    """Exchange an IdP token for a bearer of one of your actors (the human arm).

    The IdP token is --idp-token, or without it a fresh one from your `cotal login` session.

    Prints the bearer, or {"token", "owner", "exp"} with --json; a refusal with --json prints
    {"error": {"code", "message", "status", "cause"}} and exits 1. While the actor or its owner
    is out of connects it prints the service's sentence and a remedy and exits 2
    (DEPENDENCY_UNAVAILABLE; with --json, cause carries RATE_LIMITED, retryAfterSeconds, limit).

    Parameters
    ----------
    actor
        The actor to act as (granted with `cotal actor grant`).
    idp_token
        The IdP's sign-in token (a JWT; in development: `cotal dev-idp token --sub <you>`).
        Without it, a fresh one comes from your `cotal login --space S` session.
    ttl
        Requested bearer lifetime in seconds (at most 900, never beyond the IdP token).
    view
        Mint a view instead of the actor's own grant (docs/views.md): admin, purger,
        channel-purger, channel-writer, deployer, manager-service (each needs its ledger scope)
        or manager-caller (bound to your one live manager, or the one --manager-instance
        names). With --json a manager-caller answer names managerInstanceId. (transfer-writer
        names one transcript object, which HTTP clients send as transferWriter; this command
        does not.)
    manager_instance
        With --view manager-caller: the manager instance to bind (`cotal manager list`).
    as_json
        Print a JSON object instead of the bare bearer.
    """
    checked(check_actor, actor)
    if ttl is not None and ttl <= 0:
        raise ConfigError("--ttl is a positive number of seconds - omit it for the default")
    if idp_token is not None and not idp_token.strip():
        raise ConfigError("--idp-token needs the IdP's sign-in token (a JWT) - or leave it out to use `cotal login`")
    fields = _view_fields(view, manager_instance)
    space_paths = where.provisioned()
    token = idp_token.strip() if idp_token is not None else session_idp_token(space_paths)
    body: dict[str, Any] = {"idpToken": token, "actor": actor, **fields}
    if ttl is not None:
        body["ttlSec"] = ttl
    return _exchange_and_print(space_paths, actor, body, as_json=as_json, retry_after_line=False)


def _exchange_and_print(
    space_paths: SpacePaths, actor: str, body: dict[str, Any], *, as_json: bool, retry_after_line: bool
) -> int:
    """Run the exchange and print its outcome as ``cotal exchange``/``agent-bearer`` do; the exit code.

    The bearer (or ``{token, owner, exp}`` with ``as_json``): 0. Connect limits: the sentence and
    remedy on stderr (plus ``retry-after <n>`` on stdout with ``retry_after_line``), or the JSON
    error alone: 2. A refusal with ``as_json``: the JSON error, 1; without, it propagates.
    """
    try:
        answer = run_exchange(space_paths, actor, body)
    except ExchangeRateLimited as limited:
        if as_json:
            print(limited.as_json())
        else:
            limited.report()
            if retry_after_line:
                print(f"retry-after {limited.retry_after_s}")
        return EXIT_DEPENDENCY_UNAVAILABLE
    except ExchangeFailed as failed:
        if not as_json:
            raise
        print(failed.as_json())
        return ExitCode.FAILED
    print(json.dumps(answer, indent=2) if as_json else answer["token"])
    return ExitCode.OK


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
    view: str | None = None,
    manager_instance: str | None = None,
    as_json: Annotated[bool, Parameter(name="--json", negative="")] = False,
    where: Where = Where(),
) -> int:
    """Exchange an agent's actor token for a bearer (the agent arm) and print it.

    Prints the bearer, or {"token", "owner", "exp"} with --json; a refusal with --json prints
    {"error": {"code", "message", "status", "cause"}} and exits 1. While the agent or its owner
    is out of connects it prints the service's sentence and a remedy on stderr, retry-after <n>
    on stdout, and exits 2 (DEPENDENCY_UNAVAILABLE): run it again after n seconds, not before.
    With --json it prints only the error object instead (cause carries RATE_LIMITED,
    retryAfterSeconds, limit).

    Parameters
    ----------
    owner
        The agent's owner, u_ followed by 26 characters.
    actor
        The agent's actor name.
    token_file
        File holding the actor token printed once by `cotal actor grant --managed` (0600).
    view
        Only manager-caller: a bearer bound to the owner's one live manager (or --manager-instance).
    manager_instance
        With --view manager-caller: the manager instance to bind (`cotal manager list`).
    as_json
        Print a JSON object instead of the bare bearer.
    """
    checked(check_owner, owner)
    checked(check_actor, actor)
    body = {"owner": owner, "actor": actor, "actorToken": read_token_file(token_file), **_view_fields(view, manager_instance)}
    return _exchange_and_print(where.provisioned(), actor, body, as_json=as_json, retry_after_line=True)


def connect_details(where: Where, server: str | None = None) -> dict[str, Any]:
    """What a client of the space needs to connect, by the space's mode.

    A user-auth space: ``{space, mode: "user-auth", server, servers, sentinelCreds, authService,
    idp: {kind, issuer, audience, jwksUri}}``; ``jwksUri`` of the development IdP is where the
    running ``cotal up`` serves its keys (``<url>/jwks``), ``""`` while none runs. A static
    space (docs/static-credentials.md; issue 18 item 5): ``{space, mode: "static", server,
    servers, credentials: [{label, profile, principal, path, inboxPrefix, expiresAt, state}]}``,
    one entry per label's current credential, read from the records ``cotal auth mint`` writes.

    ``servers`` are the broker's seed URLs (``--server``, else the ``cotal up`` broker of
    ``policy.json``; issue 17 items 3 and 6), the field a client should use; ``server`` is the
    first of them alone (a URL list joined by commas is one bad URL to nats-py).

    Raises:
        ConfigError: a bad ``server``; neither ``server`` nor ``policy.json``; a corrupt
            ``mode.json``; the user-auth space's IdP pin or its sentinel is missing or corrupt
            (the sentence names the fix).
    """
    if server is not None:  # the flags first: a bad --server is named before the root is looked at
        parse_servers(server)
    space_paths = where.provisioned()
    servers = resolve_servers(where.paths(), server)
    reach = {"server": servers[0], "servers": list(servers)}  # `servers` is the list to use (docstring)
    if space_mode(space_paths) == MODE_STATIC:
        credentials = static_credentials(space_paths, now=int(time.time()))
        return {"space": space_paths.space, "mode": MODE_STATIC, **reach, "credentials": credentials}
    pin = load_idp_pin(space_paths.idp_json)
    if not space_paths.sentinel_creds.exists():
        raise missing(space_paths.sentinel_creds)
    jwks_uri = pin.jwks_uri or (served_dev_jwks(space_paths) if pin.kind == "dev" else "")
    return {
        "space": space_paths.space,
        "mode": MODE_USER_AUTH,
        **reach,
        "sentinelCreds": str(space_paths.sentinel_creds.absolute()),
        "authService": str(space_paths.auth_service_json.absolute()),
        "idp": {"kind": pin.kind, "issuer": pin.issuer, "audience": pin.audience, "jwksUri": jwks_uri},
    }


def static_credentials(space_paths: SpacePaths, *, now: int) -> list[dict[str, Any]]:
    """Each label's current credential of a static space, sorted by label: ``{label, profile,
    principal, path, inboxPrefix, expiresAt, state}`` (``state`` as ``cotal doctor auth`` names
    it: healthy, near-expiry, expired, no-expiry, revoked, pending; ``now`` in unix seconds).

    A record that cannot be read is named in a warning on stderr (``cotal doctor auth`` says how
    to restore it); the others are still listed.
    """
    records, bad = list_records(space_paths)
    for path, sentence in bad:
        print(f"cotal: warning: {sentence} ({path}) - run `cotal doctor auth` for the fix", file=sys.stderr)
    listed = []
    for record in records:
        cred = record.current
        listed.append({
            "label": cred.label, "profile": cred.profile, "principal": cred.principal, "path": cred.path,
            "inboxPrefix": f"_INBOX_{cred.inbox_nonce}", "expiresAt": cred.expires_at,
            "state": rules.classify(cred, now=now).value,
        })  # fmt: skip
    return listed


def served_dev_jwks(space_paths: SpacePaths) -> str:
    """``<url>/jwks`` of the development IdP the running ``cotal up`` serves, or ``""``
    (:func:`cotal_trio.cli._idp_session.served_dev_idp_url`)."""
    url = served_dev_idp_url(space_paths)
    return f"{url}/jwks" if url else ""


DEV_JWKS_NOTE = "none served now - `cotal up` serves the development IdP's keys while it runs"
NO_CREDENTIALS = "none minted - run `cotal auth mint --space {space}`"


def connect_info(
    *,
    as_json: Annotated[bool, Parameter(name="--json", negative="")] = False,
    server: Server = None,
    where: Where = Where(),
) -> None:
    """Print how a client connects to the space: server, sentinel creds, auth service, IdP.

    On a root `cotal up` runs, the server is its broker; on any other root (a cluster's),
    pass --server. The plain server: line lists every seed comma-separated, as --server takes
    them; with --json, servers lists them one by one (use it) and server is the first alone. A
    static space has no exchange: it prints the server and, per minted credential (`cotal auth
    mint`), its file, inbox prefix, profile and state. With the development IdP, idp.jwksUri is where the running
    `cotal up` serves its keys.

    Parameters
    ----------
    as_json
        Print a JSON object instead of one "key: value" line each.
    """
    details = connect_details(where, server)
    if as_json:
        print(json.dumps(details, indent=2))
        return
    details["server"] = ",".join(details.pop("servers"))  # the plain line: all seeds, as --server takes them
    if details["mode"] == MODE_STATIC:
        print("\n".join(static_lines(details)))
        return
    idp = details.pop("idp")
    if not idp["jwksUri"]:
        idp["jwksUri"] = DEV_JWKS_NOTE
    details.update({f"idp.{key}": value for key, value in idp.items()})
    print("\n".join(f"{key}: {value}" for key, value in details.items()))


def static_lines(details: dict[str, Any]) -> list[str]:
    """The plain lines of a static space: ``key: value``, then one ``credential.<label>`` line each."""
    lines = [f"space: {details['space']}", f"mode: {MODE_STATIC} (a client connects with its minted .creds file)",
             f"server: {details['server']}"]  # fmt: skip
    for cred in details["credentials"]:
        lines.append(f"credential.{cred['label']}: {cred['path']} (inbox prefix {cred['inboxPrefix']}, "
                     f"{cred['profile']}, {cred['state']})")  # fmt: skip
    if not details["credentials"]:
        lines.append(f"credentials: {NO_CREDENTIALS.format(space=details['space'])}")
    return lines
