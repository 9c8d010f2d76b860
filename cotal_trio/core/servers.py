"""A broker's seed URLs: the comma-separated list ``--server`` takes (issue 17 item 3).

A cluster is reached through any of its nodes; a process given every node's client URL starts
while some are down, connecting through the first that answers (nats-py's ``servers=[...]``).
Pure: no I/O.
"""

from __future__ import annotations

import re

from .errors import ConfigError

__all__ = ["SCHEMES", "join_servers", "parse_servers"]

SCHEMES = ("nats", "tls")
_FIX = "pass nats://host:port (a cluster: every node's URL, comma-separated)"


def parse_servers(text: str, *, flag: str = "--server") -> tuple[str, ...]:
    """``text`` as seed URLs: comma-separated, blanks around commas ignored, order kept,
    duplicates dropped.

    Args:
        text: ``nats://h1:4222,nats://h2:4222`` (one URL is a list of one).
        flag: the name the error sentences give the value (``--server``, a record's field).

    Returns:
        The URLs, at least one, in the order given.

    Raises:
        ConfigError: the list is empty, has an empty item (``a,,b``, a trailing comma), or an
            item that is not ``nats://`` or ``tls://`` with a host (a numeric port optional:
            nats-py takes 4222 without one).
    """
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise ConfigError(f"{flag} is empty - {_FIX}")
    if not all(parts):
        raise ConfigError(f"{flag} {text.strip()} has an empty item - {_FIX}, with no empty item between commas")
    for server in parts:
        if not _is_broker_url(server):
            raise ConfigError(f"{flag} {server} is not a broker address - pass nats://host:port")
    return tuple(dict.fromkeys(parts))


def join_servers(servers: tuple[str, ...] | list[str]) -> str:
    """The seed URLs as one ``--server`` value (comma-joined): what :func:`parse_servers` reads back."""
    return ",".join(servers)


# scheme://[user[:password]@]host[:port][/]: a host name or address, or a bracketed IPv6 one.
_BROKER_URL = re.compile(r"(?P<scheme>[a-z]+)://(?:[^@/\s]+@)?(?:\[[0-9A-Fa-f:.]+\]|[^:/\s\[\]@]+)(?::[0-9]{1,5})?/?")


def _is_broker_url(url: str) -> bool:
    match = _BROKER_URL.fullmatch(url)
    return match is not None and match["scheme"] in SCHEMES
