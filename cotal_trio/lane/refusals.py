"""A refused callout connection, named (issue 15 item 10: "Misconfiguration is named").

A broker whose auth account does not list the space's callout user in ``auth_users`` sends the
lane's own callout connection through the auth callout, which nothing answers, and refuses it
with a bare ``Authorization Violation``. :func:`name_callout_refusal` is called where a lane's
callout connect is refused (lane/sessions.py), so every host names it the same way: ``cotal
auth-service --space`` on exit, a ``--spaces`` host and ``cotal up`` in the lane's ``retrying``
reason (``.applied``, the unit's STATUS, the log). It reads back the auth account JWT the broker
holds (LOOKUP, as the root's system user) and, when that lacks the callout user, returns the
sentence with the command that re-pushes the space. Anything else, or a broker that cannot be
asked within ``DIAGNOSE_S``, keeps the original error.
"""

from __future__ import annotations

import logging

import trio

from cotal_trio.broker.accounts import lookup_subject, open_system_connection
from cotal_trio.core import natsjwt
from cotal_trio.core.errors import CodecError, ConfigError, Unavailable
from cotal_trio.state import RootPaths, SpaceMaterial, SpacePaths, load_broker

__all__ = ["AUTH_VIOLATION", "DIAGNOSE_S", "name_callout_refusal"]

log = logging.getLogger("cotal.lane")

# The broker's text for a refused connect, and how long reading the auth account back may take
# (seconds).
AUTH_VIOLATION = "Authorization Violation"
DIAGNOSE_S = 5.0


async def name_callout_refusal(
    error: Unavailable, *, space_paths: SpacePaths, material: SpaceMaterial, server_url: str
) -> Exception:
    """Trio: the error to raise for the space's refused callout connect.

    Must run inside :func:`cotal_trio.natsio.open_loop`. Bounded by ``DIAGNOSE_S``.

    Args:
        error: the refusal of the callout connection (:func:`cotal_trio.natsio.open_connection`).
        space_paths: the space's folder; its root's ``broker.json`` holds the system user.
        material: the space's material (its auth account and callout user).
        server_url: the broker the lane connects to.

    Returns:
        A :class:`ConfigError` naming the missing ``auth_users`` entry and the ``cotal space
        add`` that re-pushes the space, when the broker's auth account lacks the callout user;
        otherwise ``error`` itself.
    """
    if AUTH_VIOLATION not in str(error):
        return error
    root = _root_of(space_paths)
    with trio.move_on_after(DIAGNOSE_S):
        try:
            auth_users = await _auth_users_on_broker(root, material, server_url)
        except (ConfigError, Unavailable, CodecError) as exc:
            log.debug("space %s: the auth account could not be read back: %s", material.space, exc)
            return error
        if material.callout_user not in auth_users:
            fix = f"cotal space add {material.space} --root {root.root} --server {server_url}"
            # What is wrong comes before the keys, so a cut copy (the unit's STATUS) still says it.
            return ConfigError(
                f"space {material.space}: the broker's auth account does not list the space's callout user in its"
                f" auth_users (account {material.auth_account}, user {material.callout_user}), so the broker"
                f" refused the auth service's own callout connection - re-push the space's accounts with `{fix}`"
                " (it re-signs them from the root)"
            )
    return error


def _root_of(space_paths: SpacePaths) -> RootPaths:
    """The root holding ``space_paths``: a space's folder is ``<root>/spaces/<folder>``
    (state/layout.py)."""
    return RootPaths(space_paths.dir.parent.parent)


async def _auth_users_on_broker(root: RootPaths, material: SpaceMaterial, server_url: str) -> list[object]:
    """The ``auth_users`` of the space's auth account JWT the broker holds.

    Raises:
        ConfigError: the root has no readable ``broker.json``, or the broker refused the system user.
        Unavailable: the broker did not answer, or holds no JWT for the account.
        CodecError: the broker's answer is not a JWT.
    """
    broker = await trio.to_thread.run_sync(load_broker, root.broker_json)
    async with open_system_connection(server_url, broker) as system:
        reply = await system.request(lookup_subject(material.auth_account), b"")
    nats = natsjwt.decode(reply.data.strip()).claims.get("nats")
    authorization = nats.get("authorization") if isinstance(nats, dict) else None
    users = authorization.get("auth_users") if isinstance(authorization, dict) else None
    return users if isinstance(users, list) else []
