"""``cotal dev-idp``: tokens from the root's development IdP (DEVELOPMENT ONLY).

``cotal up`` without ``--idp`` creates ``<root>/devidp.json`` and pins that IdP in the space;
``cotal dev-idp token --sub <name>`` then signs in as anyone, which is exactly what a
development root allows (see :mod:`cotal_trio.devidp`). ``cotal dev-idp approve --user-code C
--sub <name>`` is the person's half of ``cotal login``: signed in as ``<name>`` it approves the
code at the dev IdP the running ``cotal up`` serves (``deny`` refuses it). A space pinned to a
real IdP refuses.
"""

from __future__ import annotations

import json
import os
import time
from typing import Annotated

import cyclopts
from cyclopts import Parameter

from ..core.errors import ConfigError, Refused
from ..core.identity import check_space
from ..devidp import DevIdpMaterial, mint_dev_token
from ..state import RootPaths, load_idp_pin, resolve_root
from ..state.space_folders import require_root, require_space
from ..http.idp_client import answer_user_code
from ._idp_session import idp_base_url
from .actor import check_argv_text
from .common import Where

__all__ = ["approve", "deny", "dev_idp_app", "load_dev_idp", "token"]

dev_idp_app = cyclopts.App(
    name="dev-idp",
    help="The development IdP (development only): mint sign-in tokens from the root's devidp.json.",
)

DEFAULT_TTL_S = 3600


def load_dev_idp(paths: RootPaths) -> DevIdpMaterial:
    """Read ``<root>/devidp.json``.

    Raises:
        ConfigError: the file is missing (names ``cotal up`` without ``--idp``), unreadable,
            or not a development IdP document.
    """
    try:
        data = paths.devidp_json.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"no development IdP in {paths.root} - run `cotal up` without --idp first") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {paths.devidp_json} ({exc.strerror}) - check its permissions") from None
    return DevIdpMaterial.from_json(data)


def check_space_pin(paths: RootPaths, space: str, material: DevIdpMaterial) -> None:
    """The space must pin this development IdP, or its tokens would be refused at the exchange.

    Raises:
        ConfigError: a bad space name, a missing or corrupt ``idp.json``, a real IdP pinned,
            or another development IdP pinned.
    """
    try:
        check_space(space)
    except Refused as exc:
        raise ConfigError(f"--space: {exc.detail}") from None
    pin = load_idp_pin(require_space(paths, space).idp_json)
    if pin.kind != "dev":
        raise ConfigError(f"space {space} pins a real IdP ({pin.issuer}); get a token from it")
    if pin.issuer != material.issuer:
        raise ConfigError(
            f"space {space} pins another development IdP ({pin.issuer}) than {paths.devidp_json} - "
            "use the root the space was created in"
        )


@dev_idp_app.command
def token(
    *,
    sub: str,
    ttl: int = DEFAULT_TTL_S,
    root: Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal).")] = None,
    space: Annotated[str | None, Parameter(help="Also check that this space pins the development IdP.")] = None,
    as_json: Annotated[bool, Parameter(name="--json", negative="", help="Print a JSON object.")] = False,
) -> None:
    """Print a development IdP token (a JWT) for a subject.

    Exchange it for a bearer with `cotal exchange --actor <a> --idp-token <jwt>`. With --json
    it prints {"token", "sub", "issuer", "audience", "exp"} (exp in unix seconds).

    Parameters
    ----------
    sub
        The subject to sign in as (the owner is derived from it).
    ttl
        Lifetime of the token in seconds.
    """
    if ttl <= 0:
        raise ConfigError("--ttl is a positive number of seconds, for example --ttl 3600")
    if not sub:
        raise ConfigError("--sub needs a subject to sign in as, for example --sub alice")
    check_argv_text(sub, "--sub", "the subject")  # the service derives the owner from this sub
    paths = RootPaths(resolve_root(root, os.environ))
    require_root(paths)  # a mistyped --root is named as such, not as a missing IdP
    material = load_dev_idp(paths)
    if space is not None:
        check_space_pin(paths, space, material)
    now = int(time.time())
    jwt = mint_dev_token(material, sub=sub, now=now, ttl_s=ttl)
    if as_json:
        print(json.dumps({"token": jwt, "sub": sub, "issuer": material.issuer, "audience": material.audience,
                          "exp": now + ttl}, indent=2))  # fmt: skip
    else:
        print(jwt)


def _answer(user_code: str, sub: str, where: Where, *, approving: bool) -> None:
    """Sign in as ``sub`` at the running dev IdP of ``where``'s space and answer ``user_code``."""
    if not user_code.strip():
        raise ConfigError("--user-code needs the code `cotal login` printed, for example --user-code BCDF-GHJK")
    if not sub:
        raise ConfigError("--sub needs a subject to sign in as, for example --sub alice")
    check_argv_text(sub, "--sub", "the subject")
    space_paths = where.provisioned()
    material = load_dev_idp(where.paths())
    check_space_pin(where.paths(), space_paths.space, material)
    _, base = idp_base_url(space_paths)
    bearer = mint_dev_token(material, sub=sub, now=int(time.time()), ttl_s=60)
    answer_user_code(base, user_code=user_code.strip(), bearer=bearer, approve=approving)


@dev_idp_app.command
def approve(*, user_code: str, sub: str, where: Where = Where()) -> None:
    """Approve a `cotal login` user code as a subject (the person's half of the login).

    Parameters
    ----------
    user_code
        The code `cotal login` printed (case and the dash do not matter).
    sub
        The subject to sign in as (the owner is derived from it).
    """
    _answer(user_code, sub, where, approving=True)
    print(f"approved {user_code.strip()} for {sub}")


@dev_idp_app.command
def deny(*, user_code: str, sub: str, where: Where = Where()) -> None:
    """Deny a `cotal login` user code (that login then ends with access_denied).

    Parameters
    ----------
    user_code
        The code `cotal login` printed.
    sub
        The subject signed in to deny it.
    """
    _answer(user_code, sub, where, approving=False)
    print(f"denied {user_code.strip()}")
