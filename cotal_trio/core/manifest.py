"""The space manifest a lane host serves, its diff, and the ``.applied`` report (DESIGN.md 9).

One parser for both host kinds (spec "Exclusive ownership" and "Callout deadlines", last
paragraphs; upstream-notes 5.1). The manifest, version 2, is exactly::

    {"version": 2,
     "spaces": [{"space": "alpha", "exchangePublicPort": 7451,
                 "exchangePublicUrl": "https://auth.example", "exchangeTrustedProxy": true,
                 "advertisedServer": "wss://nats.example", "serviceEndpoints": false,
                 "toolResultConsent": false, "replicas": 3}]}

Only ``space`` is required. ``exchangePublicPort``, ``exchangePublicUrl`` and
``advertisedServer`` may be absent or ``null``; ``exchangeTrustedProxy``, ``serviceEndpoints``
and ``toolResultConsent`` are ``true`` or ``false`` and absent means ``false``. ``replicas`` is
the copies JetStream keeps of each of the space's stores, a whole number from 1 to 5, absent
means 1 (issue 17 item 1: more than 1 needs a cluster; the full lane creates and scales its
stores to it). A callout-only host reads only ``space`` from each entry. An empty ``spaces`` list is a host serving nothing.

A manifest with any problem is refused whole (:class:`ManifestRefused` lists every problem, one
sentence each) and the host keeps its current lanes. After each reconcile the host writes
``<manifest>.applied`` (:func:`render_applied`)::

    {"version": 1, "manifestSha256": "...", "appliedAt": "2026-11-29T10:00:00Z", "pid": 4242,
     "spaces": {"a": {"state": "serving"}, "b": {"state": "retrying", "reason": "..."}},
     "refused": null}

``pid`` is the host process that wrote it (issue 15 item 11): the file outlives a killed host,
so a reader checks that pid is alive and started before the file was written (its mtime) and
otherwise reads the file as "no host running" (:func:`parse_applied`, :func:`host_gone`). A
file written before ``pid`` was recorded has none (``AppliedReport.pid`` is ``None``).

Pure and synchronous: the caller reads the file and passes its bytes; time comes in as an
argument (:func:`format_utc` only formats it).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.identity import is_space

__all__ = [
    "APPLIED_VERSION",
    "AppliedReport",
    "LANE_STATES",
    "MANIFEST_VERSION",
    "LaneStatus",
    "Manifest",
    "ManifestDiff",
    "ManifestRefused",
    "DEFAULT_REPLICAS",
    "REPLICAS_RANGE",
    "SpaceEntry",
    "diff",
    "format_utc",
    "host_gone",
    "parse_applied",
    "parse_manifest",
    "public_face_problems",
    "replicas_problems",
    "render_applied",
    "render_manifest",
]

MANIFEST_VERSION = 2
APPLIED_VERSION = 1
# A lane's states as the `.applied` file names them (DESIGN.md 9).
LANE_STATES = ("starting", "serving", "retrying", "stopping")

# Manifest key -> SpaceEntry field. Absent means None for the first three keys, 1 for replicas,
# False for the rest.
_ENTRY_KEYS = {
    "space": "space",
    "exchangePublicPort": "exchange_public_port",
    "exchangePublicUrl": "exchange_public_url",
    "exchangeTrustedProxy": "exchange_trusted_proxy",
    "advertisedServer": "advertised_server",
    "serviceEndpoints": "service_endpoints",
    "toolResultConsent": "tool_result_consent",
    "replicas": "replicas",
}
# JetStream keeps 1 to 5 copies of a stream; a space's stores default to one.
REPLICAS_RANGE = range(1, 6)
DEFAULT_REPLICAS = 1
_FLAG_KEYS = ("exchangeTrustedProxy", "serviceEndpoints", "toolResultConsent")
# The public face's settings that need exchangePublicPort, and the names sentences give them.
_NEEDS_PORT = ("exchangePublicUrl", "exchangeTrustedProxy", "advertisedServer")
_MANIFEST_NAMES: Mapping[str, str] = MappingProxyType({key: key for key in ("exchangePublicPort", *_NEEDS_PORT)})
_TOP_KEYS = ("version", "spaces")
_EMPTY = 'the manifest is empty - write {"version": 2, "spaces": []} to serve nothing'
_SHAPE = '{"version": 2, "spaces": [{"space": "<name>"}]}'
_ENTRY_TAKES = "an entry takes " + ", ".join(list(_ENTRY_KEYS)[:-1]) + " and replicas"
_SHOWN_CHARS = 64
_MISSING: Any = object()

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_URL = re.compile(
    rf"(?P<scheme>[a-z]+)://(?P<host>\[[0-9A-Fa-f:.]+\]|{_LABEL}(?:\.{_LABEL})*)"
    r"(?::(?P<port>[0-9]{1,5}))?(?P<path>/[^\s?#]*)?"
)
_PUBLIC_SCHEMES = frozenset({"https"})
_SERVER_SCHEMES = frozenset({"nats", "tls", "ws", "wss"})
_PATH_SCHEMES = frozenset({"https", "ws", "wss"})
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_UTC_SECOND = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


class ManifestRefused(ConfigError):
    """The manifest is refused whole; the host keeps the lanes it has.

    Attributes:
        reasons: one sentence per problem, each naming its fix, in document order (top-level
            keys, then each entry, then duplicate spaces and shared ports). ``str(error)`` is
            the sentences joined by ``". "`` (the ``refused`` value of ``.applied``).
    """

    def __init__(self, reasons: tuple[str, ...]) -> None:
        self.reasons = tuple(reasons)
        if not self.reasons:
            raise ConfigError("ManifestRefused needs at least one reason (a caller bug)")
        super().__init__(". ".join(self.reasons))


# --- values ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceEntry:
    """One space a host serves: a manifest entry (DESIGN.md 9; upstream-notes 5.1).

    Attributes:
        space: the space name (``[A-Za-z0-9_-]{1,64}``, core/identity.py).
        exchange_public_port: the public exchange listener's port (1-65535), or ``None`` for no
            public face.
        exchange_public_url: the ``https://`` address clients reach the public face by, or
            ``None``; needs ``exchange_public_port``.
        exchange_trusted_proxy: attribute peers by the last ``X-Forwarded-For`` hop on the
            public face; ``True`` needs ``exchange_public_port``.
        advertised_server: the ``nats://``, ``tls://``, ``ws://`` or ``wss://`` broker address
            the public face advertises, or ``None``; needs ``exchange_public_port``.
        service_endpoints: open the space's service-endpoint admission (nothing closes it).
        tool_result_consent: serve the opt-in host-only door ``POST /tool-result-consent/issue``
            on the space's loopback face (spec "Host-only routes"; docs/host-doors.md).
        replicas: the copies JetStream keeps of each of the space's stores (1 to 5; more than
            1 needs a cluster of at least that many nodes; issue 17 item 1).

    Raises:
        ManifestRefused: a field breaks its rule; one sentence per broken rule.
    """

    space: str
    exchange_public_port: int | None = None
    exchange_public_url: str | None = None
    exchange_trusted_proxy: bool = False
    advertised_server: str | None = None
    service_endpoints: bool = False
    tool_result_consent: bool = False
    replicas: int = DEFAULT_REPLICAS

    def __post_init__(self) -> None:
        fields = {key: getattr(self, name) for key, name in _ENTRY_KEYS.items()}
        problems = _entry_problems(fields)
        if problems:
            where = _where(None, self.space)
            raise ManifestRefused(tuple(f"{where}: {p}" for p in problems))


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """A parsed manifest (DESIGN.md 9).

    Attributes:
        spaces: the entries, sorted by space (any iterable is sorted on construction).
        sha256: lowercase hex SHA-256 of the exact bytes parsed (``manifestSha256`` of
            ``.applied``).

    Raises:
        ManifestRefused: an entry is not a :class:`SpaceEntry`, a space appears twice, or two
            spaces share an ``exchangePublicPort``.
        ConfigError: ``sha256`` is not 64 lowercase hex characters.
    """

    spaces: tuple[SpaceEntry, ...]
    sha256: str

    def __post_init__(self) -> None:
        if not (isinstance(self.sha256, str) and _SHA256_HEX.fullmatch(self.sha256)):
            raise ConfigError("a manifest's sha256 is 64 lowercase hex characters")
        object.__setattr__(self, "spaces", _checked_entries(self.spaces))

    @property
    def names(self) -> tuple[str, ...]:
        """The space names, sorted."""
        return tuple(e.space for e in self.spaces)

    def entry(self, space: str) -> SpaceEntry | None:
        """The entry of ``space``, or ``None`` when the manifest does not name it."""
        return next((e for e in self.spaces if e.space == space), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestDiff:
    """What a reconcile does (:func:`diff`); each tuple sorted, together a partition.

    Attributes:
        added: spaces to open.
        removed: spaces to close.
        changed: spaces whose entry differs: that lane alone closes and reopens.
        unchanged: spaces whose lanes are left alone.
    """

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneStatus:
    """One lane's line in ``.applied`` (DESIGN.md 9).

    Attributes:
        state: one of :data:`LANE_STATES`.
        reason: why the lane is not serving, a non-empty sentence; required for
            ``"retrying"``, optional otherwise.

    Raises:
        ConfigError: an unknown state, an empty or non-text reason, or retrying without one.
    """

    state: str
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.state not in LANE_STATES:
            raise ConfigError(f"a lane state is one of {', '.join(LANE_STATES)}, not {_show(self.state)}")
        if self.reason is not None and not (isinstance(self.reason, str) and self.reason):
            raise ConfigError("a lane's reason is a non-empty sentence")
        if self.state == "retrying" and self.reason is None:
            raise ConfigError("a retrying lane needs the reason it is retried")


# --- rules shared by the values and the parser -------------------------------------------------


def _show(value: object) -> str:
    """``value`` as JSON (ASCII, at most 64 characters) for a sentence; never a whole blob."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _where(index: int | None, space: object) -> str:
    named = f'"{space}"' if is_space(space) else None
    if index is None:
        return f"space {named}" if named else "space entry"
    return f"spaces[{index}] ({named})" if named else f"spaces[{index}]"


def _is_url(value: object, schemes: frozenset[str]) -> bool:
    if not (isinstance(value, str) and value.isascii() and value.isprintable()):
        return False
    match = _URL.fullmatch(value)
    if match is None or match["scheme"] not in schemes:
        return False
    port_ok = match["port"] is None or 1 <= int(match["port"]) <= 65535
    return port_ok and (match["path"] is None or match["scheme"] in _PATH_SCHEMES)


def _space_problems(space: object) -> list[str]:
    if space is _MISSING:
        return ['no space - add "space": "<name>"']
    if is_space(space):
        return []
    return [f"space {_show(space)} is not a space name - use 1 to 64 letters, digits, _ and -"]


def _port_problems(port: object, name: str = "exchangePublicPort", verb: str = "write") -> list[str]:
    if port is None:
        return []
    if type(port) is not int:
        return [f"{name} {_show(port)} is not a whole number - {verb} a port from 1 to 65535"]
    if not 1 <= port <= 65535:
        return [f"{name} {port} is outside 1-65535 - {verb} a port from 1 to 65535"]
    return []


def _address_problems(fields: Mapping[str, object], names: Mapping[str, str], verb: str) -> list[str]:
    problems = []
    url, server = fields["exchangePublicUrl"], fields["advertisedServer"]
    if url is not None and not _is_url(url, _PUBLIC_SCHEMES):
        problems.append(
            f"{names['exchangePublicUrl']} {_show(url)} is not an https:// URL with a host - "
            f'{verb} the address clients reach, for example "https://auth.example"'
        )
    if server is not None and not _is_url(server, _SERVER_SCHEMES):
        problems.append(
            f"{names['advertisedServer']} {_show(server)} is not a nats://, tls://, ws:// or wss:// URL"
            f' with a host - {verb} the broker address remote agents dial, for example "wss://nats.example"'
        )
    return problems


def replicas_problems(replicas: object, name: str = "replicas", verb: str = "write") -> list[str]:
    """The broken rule of a replica count, one sentence naming its fix (a manifest entry's
    ``replicas`` and ``cotal space add --replicas`` both use it): a whole number from 1 to 5."""
    if type(replicas) is int and replicas in REPLICAS_RANGE:
        return []
    what = "is not a whole number" if type(replicas) is not int else "is outside 1-5"
    return [
        f"{name} {_show(replicas)} {what} - {verb} a count from 1 to 5 (more than 1 needs a cluster"
        " of at least that many nodes)"
    ]


def _flag_problems(fields: Mapping[str, object], keys: Iterable[str] = _FLAG_KEYS) -> list[str]:
    return [
        f"{key} {_show(fields[key])} is not true or false - write true or false"
        for key in keys if type(fields[key]) is not bool
    ]


def _needs_port_problems(fields: Mapping[str, object], names: Mapping[str, str] = _MANIFEST_NAMES) -> list[str]:
    if fields["exchangePublicPort"] is not None:
        return []
    port = names["exchangePublicPort"]
    return [
        f"{names[key]} needs {port} - add the public listener's port or remove {names[key]}"
        for key in _NEEDS_PORT if fields[key] not in (None, False)
    ]


def public_face_problems(
    *, port: object, url: object, trusted_proxy: object, advertised_server: object,
    names: Mapping[str, str] = _MANIFEST_NAMES, verb: str = "write",
) -> list[str]:
    """Every broken rule of a public face's four settings, one sentence each naming its fix.

    The one statement of what a valid public face is (a manifest entry and the CLI flags of
    ``cotal up`` and ``cotal auth-service`` both use it): the port is a whole number from 1 to
    65535; the public URL is ``https://`` with a host; the advertised server is a ``nats://``,
    ``tls://``, ``ws://`` or ``wss://`` URL with a host; the other three need the port.

    Args:
        port, url, trusted_proxy, advertised_server: the values (``None``/``False``: absent).
        names: how the sentences name the settings, by manifest key (``exchangePublicPort``,
            ``exchangePublicUrl``, ``exchangeTrustedProxy``, ``advertisedServer``); a CLI
            passes its flags. Default: the manifest keys.
        verb: the fix's verb for a bad value (``"write"`` in a file, ``"pass"`` for a flag).
    """
    fields = {
        "exchangePublicPort": port, "exchangePublicUrl": url,
        "exchangeTrustedProxy": trusted_proxy, "advertisedServer": advertised_server,
    }
    return [
        *_port_problems(port, names["exchangePublicPort"], verb),
        *_address_problems(fields, names, verb),
        *_flag_problems(fields, ("exchangeTrustedProxy",)),
        *_needs_port_problems(fields, names),
    ]


def _entry_problems(fields: Mapping[str, object]) -> list[str]:
    """Every broken rule of one entry, keyed by manifest key (``space`` may be ``_MISSING``)."""
    return [
        *_space_problems(fields["space"]),
        *_port_problems(fields["exchangePublicPort"]),
        *_address_problems(fields, _MANIFEST_NAMES, "write"),
        *_flag_problems(fields),
        *_needs_port_problems(fields),
        *replicas_problems(fields["replicas"]),
    ]


def _clash_problems(sightings: list[tuple[int, str, int | None]]) -> list[str]:
    """Duplicate spaces and shared ports among ``(index, space, port)`` sightings."""
    indexes: dict[str, list[int]] = {}
    ports: dict[int, set[str]] = {}
    for index, space, port in sightings:
        indexes.setdefault(space, []).append(index)
        if port is not None:
            ports.setdefault(port, set()).add(space)
    problems = [
        f'space "{space}" is listed {len(where)} times ({", ".join(f"spaces[{i}]" for i in where)})'
        " - keep one entry per space"
        for space, where in indexes.items() if len(where) > 1
    ]
    problems += [
        f"spaces {_and_list(sorted(names))} share exchangePublicPort {port} - give each space its own port"
        for port, names in sorted(ports.items()) if len(names) > 1
    ]
    return problems


def _checked_entries(spaces: Iterable[SpaceEntry]) -> tuple[SpaceEntry, ...]:
    """``spaces`` sorted by space.

    Raises:
        ManifestRefused: a non-entry, a space listed twice, or two spaces on one public port.
    """
    entries = tuple(spaces)
    if not all(isinstance(e, SpaceEntry) for e in entries):
        raise ManifestRefused(("every manifest entry must be a SpaceEntry (a caller bug)",))
    problems = _clash_problems([(i, e.space, e.exchange_public_port) for i, e in enumerate(entries)])
    if problems:
        raise ManifestRefused(tuple(problems))
    return tuple(sorted(entries, key=lambda e: e.space))


def _and_list(names: list[str]) -> str:
    quoted = [f'"{name}"' for name in names]
    return ", ".join(quoted[:-1]) + " and " + quoted[-1]


# --- parsing ----------------------------------------------------------------------------------


def _load(data: bytes) -> tuple[object, list[str]]:
    """The JSON value of ``data`` and the keys some object repeats.

    Raises:
        ManifestRefused: empty, not UTF-8, or not JSON.
    """
    if not data.strip():
        raise ManifestRefused((_EMPTY,))
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        counts = Counter(key for key, _ in items)
        repeated.extend(key for key, count in counts.items() if count > 1)
        return dict(items)

    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ManifestRefused(("the manifest is not UTF-8 text - save it as UTF-8 JSON",)) from None
    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=_no_constant), repeated
    except (ValueError, RecursionError) as exc:
        where = f" (line {exc.lineno} column {exc.colno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        raise ManifestRefused((f"the manifest is not valid JSON{where} - fix it; the shape is {_SHAPE}",)) from None


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _unknown_keys(obj: Mapping[str, object], known: Iterable[str], where: str, fix: str) -> list[str]:
    unknown = [key for key in obj if key not in known]
    if not unknown:
        return []
    shown = ", ".join(_show(key) for key in unknown)
    plural = "s" if len(unknown) > 1 else ""
    return [f"{where} unknown key{plural} {shown} - remove {'them' if plural else 'it'}; {fix}"]


def _top_problems(obj: Mapping[str, object]) -> list[str]:
    problems = _unknown_keys(obj, _TOP_KEYS, "the manifest has", 'a manifest holds only "version" and "spaces"')
    version = obj.get("version", _MISSING)
    if version is _MISSING:
        problems.append('the manifest has no version - add "version": 2')
    elif type(version) is not int or version != MANIFEST_VERSION:
        problems.append(f'the manifest version is {_show(version)}, not 2 - write "version": 2 (the shape is {_SHAPE})')
    spaces = obj.get("spaces", _MISSING)
    if spaces is _MISSING:
        problems.append('the manifest has no spaces list - add "spaces": [] (an empty list serves nothing)')
    elif not isinstance(spaces, list):
        problems.append(f'the manifest\'s spaces {_show(spaces)} is not a list - write "spaces": [{{"space": "<name>"}}]')
    return problems


def _entry_fields(raw: Mapping[str, object], callout_only: bool) -> dict[str, object]:
    """The entry's values by manifest key: absent flags are False, other absent values None."""
    read = ("space",) if callout_only else tuple(_ENTRY_KEYS)  # DESIGN.md 9: callout-only reads `space`
    fields: dict[str, object] = {key: False if key in _FLAG_KEYS else None for key in _ENTRY_KEYS}
    fields["replicas"] = DEFAULT_REPLICAS
    fields.update({key: raw[key] for key in read if key in raw})
    fields["space"] = raw.get("space", _MISSING)
    return fields


def _read_entry(index: int, raw: object, callout_only: bool) -> tuple[list[str], SpaceEntry | None]:
    """The problems of one raw entry, and its :class:`SpaceEntry` when there are none."""
    if not isinstance(raw, dict):
        return [f'spaces[{index}] {_show(raw)} is not an object - write {{"space": "<name>"}}'], None
    where = _where(index, raw.get("space"))
    fields = _entry_fields(raw, callout_only)
    problems = _unknown_keys(raw, _ENTRY_KEYS, f"{where}:", _ENTRY_TAKES)
    problems += [f"{where}: {p}" for p in _entry_problems(fields)]
    if problems:
        return problems, None
    return [], SpaceEntry(**{name: fields[key] for key, name in _ENTRY_KEYS.items()})


def _read_spaces(raw_spaces: list[object], callout_only: bool) -> tuple[list[str], list[SpaceEntry]]:
    problems: list[str] = []
    entries: list[SpaceEntry] = []
    sightings: list[tuple[int, str, int | None]] = []
    for index, raw in enumerate(raw_spaces):
        entry_problems, entry = _read_entry(index, raw, callout_only)
        problems += entry_problems
        entries += [entry] if entry else []
        if isinstance(raw, dict) and is_space(raw.get("space")):
            port = None if callout_only else raw.get("exchangePublicPort")
            sightings.append((index, raw["space"], port if not _port_problems(port) else None))
    return problems + _clash_problems(sightings), entries


def parse_manifest(data: bytes, *, callout_only: bool = False) -> Manifest:
    """Parse a version-2 manifest's bytes (DESIGN.md 9; upstream-notes 5.1).

    Args:
        data: the manifest file's exact bytes (UTF-8 JSON; a leading BOM is tolerated).
        callout_only: read only ``space`` from each entry (a callout-only host); the other
            known keys are accepted whatever their values, unknown keys are still refused.

    Returns:
        The :class:`Manifest`, entries sorted by space, ``sha256`` of ``data``.

    Raises:
        ManifestRefused: the manifest is refused whole, with one sentence per problem: empty,
            not UTF-8 JSON, not an object, a repeated key in any object, unknown top-level or
            entry keys, a version other than the integer 2, a missing or non-list ``spaces``,
            an entry that is not an object, a missing or malformed ``space``, a value of the
            wrong type (``true`` is not a port) or breaking its rule, a public-face key without
            ``exchangePublicPort``, a space listed twice, two spaces on one public port.
    """
    obj, repeated = _load(data)
    if not isinstance(obj, dict):
        raise ManifestRefused((f"the manifest is not a JSON object - write {_SHAPE}",))
    problems = [f"an object in the manifest repeats key {_show(key)} - keep one" for key in repeated]
    problems += _top_problems(obj)
    entries: list[SpaceEntry] = []
    if isinstance(obj.get("spaces"), list):
        entry_problems, entries = _read_spaces(obj["spaces"], callout_only)
        problems += entry_problems
    if problems:
        raise ManifestRefused(tuple(problems))
    return Manifest(spaces=tuple(entries), sha256=hashlib.sha256(data).hexdigest())


def render_manifest(spaces: Iterable[SpaceEntry]) -> bytes:
    """The canonical manifest bytes of ``spaces`` (for a manifest writer such as ``space add``).

    Sorted keys, 2-space indent, trailing newline; entries sorted by space; absent, ``None``
    and ``false`` values are omitted, and so is ``replicas`` at its default 1. ``parse_manifest(render_manifest(s)).spaces`` equals
    ``s`` sorted by space.

    Raises:
        ManifestRefused: a space listed twice or two spaces on one public port.
    """
    rows = [
        {key: getattr(e, name) for key, name in _ENTRY_KEYS.items() if not _default(key, getattr(e, name))}
        for e in _checked_entries(spaces)
    ]
    return _canonical({"version": MANIFEST_VERSION, "spaces": rows})


# --- diff and .applied ------------------------------------------------------------------------


def _default(key: str, value: object) -> bool:
    """Whether ``value`` is ``key``'s absent value (left out of a rendered manifest)."""
    if key == "replicas":
        return value == DEFAULT_REPLICAS and type(value) is int
    return value is None or value is False


def diff(old: Manifest | None, new: Manifest) -> ManifestDiff:
    """What reconciling from ``old`` (``None``: nothing served yet) to ``new`` opens and closes.

    A space in both whose entries differ in any field is ``changed``: its lane alone restarts
    (upstream-notes 5.1). The four tuples are sorted and partition the union of both spaces.
    """
    before = {e.space: e for e in old.spaces} if old else {}
    after = {e.space: e for e in new.spaces}
    both = before.keys() & after.keys()
    return ManifestDiff(
        added=tuple(sorted(after.keys() - before.keys())),
        removed=tuple(sorted(before.keys() - after.keys())),
        changed=tuple(sorted(s for s in both if before[s] != after[s])),
        unchanged=tuple(sorted(s for s in both if before[s] == after[s])),
    )


def format_utc(unix_seconds: float) -> str:
    """``unix_seconds`` as ``YYYY-MM-DDTHH:MM:SSZ`` (whole seconds, rounded down).

    A formatter of its argument, not a clock read.

    Raises:
        ConfigError: not a finite number within the years 1-9999 (a caller bug).
    """
    try:
        return datetime.fromtimestamp(math.floor(unix_seconds), UTC).strftime(_UTC_FORMAT)
    except (TypeError, ValueError, OverflowError, OSError):
        raise ConfigError(f"format_utc needs finite unix seconds, not {_show(unix_seconds)}") from None


def _check_applied_inputs(
    sha: str | None, applied_at: str, spaces: Mapping[str, LaneStatus], refused: str | None, pid: int
) -> None:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ConfigError("pid is the writing host's process id, a positive integer")
    if sha is not None and not (isinstance(sha, str) and _SHA256_HEX.fullmatch(sha)):
        raise ConfigError("manifestSha256 is 64 lowercase hex characters or None")
    try:
        ok = bool(_UTC_SECOND.fullmatch(applied_at)) and bool(datetime.strptime(applied_at, _UTC_FORMAT))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError("appliedAt is a UTC time like 2026-11-29T10:00:00Z - use format_utc")
    if not all(is_space(s) and isinstance(v, LaneStatus) for s, v in spaces.items()):
        raise ConfigError("spaces maps space names to LaneStatus values")
    if refused is not None and not (isinstance(refused, str) and refused):
        raise ConfigError("refused is the refusal sentence or None")


def render_applied(
    *, manifest_sha256: str | None, applied_at: str, spaces: Mapping[str, LaneStatus], refused: str | None,
    pid: int,
) -> bytes:
    """The ``<manifest>.applied`` bytes (DESIGN.md 9): canonical JSON, trailing newline.

    Args:
        pid: the writing host's process id (the caller's ``os.getpid()``; module docstring).
        manifest_sha256: hex SHA-256 of the manifest the lanes follow, ``None`` before any
            manifest was applied.
        applied_at: the reconcile's time, ``YYYY-MM-DDTHH:MM:SSZ`` (:func:`format_utc`).
        spaces: every lane the host still has, removed ones until fully stopped.
        refused: the last refusal's sentence (``str(ManifestRefused)``), or ``None``.

    Returns:
        ``{"appliedAt", "manifestSha256", "pid", "refused", "spaces": {<space>: {"state"[,
        "reason"]}}, "version": 1}`` with sorted keys and 2-space indent.

    Raises:
        ConfigError: an argument breaks its shape (a caller bug).
    """
    _check_applied_inputs(manifest_sha256, applied_at, spaces, refused, pid)
    lanes = {
        space: {"state": s.state} | ({"reason": s.reason} if s.reason is not None else {})
        for space, s in spaces.items()
    }
    return _canonical({
        "version": APPLIED_VERSION, "manifestSha256": manifest_sha256, "appliedAt": applied_at,
        "pid": pid, "spaces": lanes, "refused": refused,
    })


@dataclass(frozen=True, slots=True, kw_only=True)
class AppliedReport:
    """A ``.applied`` file as read back (:func:`parse_applied`).

    Attributes:
        spaces: every lane the file lists, by space.
        refused: the last refusal's sentence, or None.
        pid: the host process that wrote it; None in a file written before hosts recorded it.
    """

    spaces: Mapping[str, LaneStatus]
    refused: str | None
    pid: int | None


def parse_applied(data: bytes, *, path: str) -> AppliedReport:
    """Read ``.applied`` bytes (:func:`render_applied`'s shape) back.

    Only what a reader needs is checked: ``spaces`` maps names to ``{"state"[, "reason"]}``,
    ``pid`` (when present) is a positive integer, ``refused`` a sentence or null; other keys
    are ignored, so a newer writer's additions do not break an older reader.

    Args:
        path: the file's path, for the sentence of the error.

    Raises:
        ConfigError: not that shape: one sentence naming ``path`` and the fix.
    """
    bad = ConfigError(f"{path} is not a lane host's .applied file - delete it; the host rewrites it")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad from None
    if not isinstance(obj, dict) or not isinstance(obj.get("spaces"), dict):
        raise bad
    pid, refused = obj.get("pid"), obj.get("refused")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
        raise bad
    if refused is not None and not isinstance(refused, str):
        raise bad
    try:
        spaces = {
            name: LaneStatus(state=lane["state"], reason=lane.get("reason")) for name, lane in obj["spaces"].items()
        }
    except (AttributeError, KeyError, TypeError, ConfigError):
        raise bad from None
    return AppliedReport(spaces=MappingProxyType(spaces), refused=refused or None, pid=pid)


def host_gone(pid: int) -> str:
    """The sentence for a ``.applied`` whose writer ``pid`` is no longer running."""
    return f"no host running (the last host, pid {pid}, is gone)"


def _canonical(obj: object) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
