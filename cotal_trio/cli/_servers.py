"""Which broker a root command talks to: ``--server``, else the root's ``cotal up`` broker.

Issue 17 items 3 and 6: on a cluster root (provisioned with ``cotal space add`` and served with
``cotal auth-service --server``) there is no ``policy.json``, which only ``cotal up`` writes, so
``connect-info``, ``check`` and ``status`` take ``--server``: one URL or every node's URL,
comma-separated. Without it they fall back to ``policy.json``'s loopback port.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from cyclopts import Parameter

from ..core.errors import ConfigError
from ..state import RootPaths, load_policy

__all__ = ["Server", "parse_servers", "resolve_servers"]

SCHEMES = ("nats", "tls")

Server = Annotated[
    str | None,
    Parameter(help="The broker, nats://host:port, or every node of a cluster comma-separated (default: the root's `cotal up` broker)."),
]


def parse_servers(text: str) -> tuple[str, ...]:
    """``--server`` as seed URLs: comma-separated, blanks around commas ignored, order kept,
    duplicates dropped.

    Raises:
        ConfigError: no URL, or one that is not ``nats://`` or ``tls://`` with a host.
    """
    servers = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not servers:
        raise ConfigError("--server is empty - pass nats://host:port (a cluster: every node's URL, comma-separated)")
    for server in servers:
        if not _is_broker_url(server):
            raise ConfigError(f"--server {server} is not a broker address - pass nats://host:port")
    return servers


def _is_broker_url(url: str) -> bool:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return parts.scheme in SCHEMES and bool(parts.hostname)


def resolve_servers(paths: RootPaths, server: str | None) -> tuple[str, ...]:
    """The broker URLs for ``paths``: ``--server`` parsed, else ``policy.json``'s loopback broker.

    Raises:
        ConfigError: a bad ``--server``; neither ``--server`` nor ``policy.json`` (one sentence
            naming both and the fix); a corrupt ``policy.json``.
    """
    if server is not None:
        return parse_servers(server)
    if not paths.policy_json.exists():
        raise ConfigError(
            f"no broker address for root {paths.root}: --server is not given and {paths.policy_json}"
            " is missing (only `cotal up` writes it) - pass --server nats://host:port"
            " (a cluster: every node's URL, comma-separated)"
        )
    return (f"nats://127.0.0.1:{load_policy(paths.policy_json).port}",)
