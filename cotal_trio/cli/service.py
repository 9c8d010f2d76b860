"""``cotal service``: the service presets, as systemd units (issue 7 item 4, "Service units").

``cotal service install auth-service --spaces M --server URL`` writes
``/etc/systemd/system/cotal-auth-service.service`` (``--user``: the user's unit folder;
``--out PATH``: that file, or that folder) and prints the ``systemctl`` commands that start it;
``cotal service install callout-replica (--spaces M | --space S) --server URL`` does the same for
a callout-only replica (``cotal-callout-replica[-S].service``). ``cotal service render ...``
takes the same flags and prints the unit instead of writing it. ``cotal service run
auth-service|callout-replica`` is what a unit's ``ExecStart`` runs: the preset in the foreground
(:func:`cotal_trio.cli.auth_service.serve`), the entry that replaces the deprecated ``cotal
auth-service`` (spec "Callout replicas", issue 19 item 7), so a preset's unit never logs that
entry's deprecation note; a container or a script runs it the same way.

The serving flags are ``cotal auth-service``'s own, checked by the same rules
(:class:`~cotal_trio.service.hosting.ServiceConfig`), and the unit's ``ExecStart`` runs exactly
them with absolute paths: the ``cotal`` script installed beside this interpreter, ``--root``
resolved now (``$COTAL_ROOT`` or ``./.cotal`` become absolute), the manifest made absolute but
not resolved through symlinks (the host follows a symlink swap of it).

The unit is ``Type=notify``: the service sends ``READY=1`` once every lane serves, which is when
every space's ``auth-service.json`` is written (:mod:`cotal_trio.service.notify`), so
``systemctl start`` returns when the spaces answer. ``--watchdog S`` adds ``WatchdogSec=S`` (the
trio loop pings every S/2); a manifest unit gets ``ExecReload`` (SIGHUP rereads the manifest).
The file is written atomically, 0644; a different existing file is refused without ``--force``.
A symlink in its place (``systemctl link FILE`` makes one) is never replaced, ``--force`` or not:
a plain file there would silently detach the unit from the linked file the operator edits, so
the refusal names that file (``--out <it>`` writes it). The unit folder must exist, except the
user's (``--user``), which is created as ``systemctl --user edit`` would.

Errors: :class:`~cotal_trio.core.errors.ConfigError` (one sentence, exit 1) for refused flags, a
missing unit folder, a unit that cannot be read or written (permission, read-only file system,
full device; :func:`unwritable` names the fix), a linked unit, or a different unit in place.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import cyclopts
from cyclopts import Parameter

from ..core.errors import ConfigError
from ..core.servers import join_servers, parse_servers
from cotal_trio.service.hosting import ServiceConfig, public_fields
from ..state.files import atomic_write
from .auth_service import AuthTimeoutFlag, OpsPortFlag, RootFlag, Served, ServerFlag, ServiceEndpointsFlag
from .auth_service import serve as serve_preset
from .common import PortRange, PublicFaceFlags, Where, check_auth_timeout

__all__ = ["ExecUnit", "cotal_script", "render_unit", "service_app", "unwritable"]

service_app = cyclopts.App(name="service", help="The service presets auth-service and callout-replica: write their systemd units, or run them.")
install_app = cyclopts.App(name="install", help="Write a systemd unit and print the systemctl commands that start it.")
render_app = cyclopts.App(name="render", help="Print a systemd unit without writing it (same flags as install).")
run_app = cyclopts.App(name="run", help="Run a preset in the foreground until SIGTERM: what its unit's ExecStart runs.")
service_app.command(install_app)
service_app.command(render_app)
service_app.command(run_app)

SYSTEM_UNITS = Path("/etc/systemd/system")
UNIT_MODE = 0o644  # systemd reads units as any user; a unit holds no secret (paths and flags only)
DEFAULT_START_TIMEOUT_S = 90.0  # systemd's own DefaultTimeoutStartSec
MIN_WATCHDOG_S = 1.0  # pings every half of it; below a second a GC pause or a busy loop is a restart
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_PLAIN = re.compile(r"[^\s\"'\\;]+")  # an ExecStart word that needs no quotes


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class Serve:
    """The flags of the unit's ``cotal auth-service`` that both kinds of unit take."""

    server: Annotated[str, Parameter(help="The broker's seed URLs, comma-separated: nats://host:port, or every node of a cluster; it must already trust the spaces' accounts.")]
    spaces: Annotated[Path | None, Parameter(help="Serve the spaces this manifest lists (exclusive with --space).")] = None
    space: Annotated[str | None, Parameter(help="Serve this one space (exclusive with --spaces).")] = None
    root: Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal), made absolute.")] = None
    auth_timeout: Annotated[float | None, Parameter(help="The broker's authorization timeout in seconds (default 2).")] = None
    ops_port: Annotated[int, Parameter(validator=PortRange(free=True), help="The process's operator face on 127.0.0.1 (/metrics of every space, the status page, /events): pass a port for a fixed scrape target; 0 picks a free one at each start.")] = 0


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class Full:
    """The flags only the full auth service takes (``cotal auth-service``'s, with ``--space``)."""

    service_endpoints: Annotated[bool, Parameter(help="With --space: host service endpoints and open the space's service-endpoint admission (docs/http-api.md).")] = False
    public: PublicFaceFlags = PublicFaceFlags()


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class Unit:
    """How systemd runs the service, and where the unit goes."""

    name: Annotated[str | None, Parameter(help="The unit is cotal-NAME.service (default: auth-service, or callout-replica[-SPACE]).")] = None
    user: Annotated[bool, Parameter(negative="", help="A user unit (~/.config/systemd/user, WantedBy=default.target).")] = False
    watchdog: Annotated[float | None, Parameter(help="WatchdogSec: systemd restarts the service when its loop stops pinging for this many seconds.")] = None
    start_timeout: Annotated[float, Parameter(help="TimeoutStartSec: seconds for every lane to serve before systemd fails the start.")] = DEFAULT_START_TIMEOUT_S


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class Target:
    """Where ``install`` writes the unit."""

    out: Annotated[Path | None, Parameter(help="Write the unit to this .service file, or into this folder (exclusive with --user).")] = None
    force: Annotated[bool, Parameter(negative="", help="Replace an existing unit file with other content.")] = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecUnit:
    """A unit to render (:func:`render_unit`).

    Attributes:
        description: the ``Description=`` text.
        argv: ``ExecStart``: the absolute ``cotal`` script, then its arguments.
        watchdog_s: ``WatchdogSec`` in seconds, None for no watchdog.
        start_timeout_s: ``TimeoutStartSec`` in seconds.
        user: a user unit (``WantedBy=default.target``) rather than a system one.
        reload: add ``ExecReload`` (SIGHUP: the host rereads its manifest).
    """

    description: str
    argv: tuple[str, ...]
    watchdog_s: float | None = None
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    user: bool = False
    reload: bool = False


def render_unit(unit: ExecUnit) -> str:
    """The unit file's text (sync, pure).

    Raises:
        ConfigError: a word or the description holds a control character (a unit is line-based).
    """
    lines = [
        "# Written by `cotal service` (cotal_trio/cli/service.py); `systemctl cat` shows what systemd reads.",
        "[Unit]",
        f"Description={_escape(unit.description)}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        "ExecStart=" + " ".join(_exec_word(word) for word in unit.argv),
        *(["ExecReload=kill -HUP $MAINPID"] if unit.reload else []),
        "Restart=on-failure",
        "RestartSec=2",
        f"TimeoutStartSec={unit.start_timeout_s:g}s",
        *([f"WatchdogSec={unit.watchdog_s:g}s"] if unit.watchdog_s is not None else []),
        "KillSignal=SIGTERM",
        "",
        "[Install]",
        f"WantedBy={'default.target' if unit.user else 'multi-user.target'}",
    ]
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    """``text`` with systemd's specifier (``%``) and variable (``$``) characters doubled."""
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ConfigError(f"{text!r} holds a control character, which a unit file cannot carry - rename it")
    return text.replace("%", "%%").replace("$", "$$")


def _exec_word(word: str) -> str:
    """One ``ExecStart`` word: escaped, double-quoted when it holds blanks, quotes, ``\\`` or ``;``."""
    text = _escape(word)
    if _PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def cotal_script() -> Path:
    """The absolute path of the ``cotal`` script of this installation.

    The one pip installed beside this interpreter (a venv's ``bin/``, a container's
    ``/usr/local/bin``), else the first on ``PATH``.

    Raises:
        ConfigError: neither exists.
    """
    beside = Path(sys.executable).with_name("cotal")
    if beside.is_file() and os.access(beside, os.X_OK):
        return Path(os.path.abspath(beside))
    found = shutil.which("cotal")
    if found is None:
        raise ConfigError(
            f"cannot find the cotal script beside {sys.executable} or on PATH - install this package"
            " (pip install) into the interpreter the unit should run"
        )
    return Path(os.path.abspath(found))


# --- the commands ---------------------------------------------------------------------------


@install_app.command(name="auth-service")
def install_auth_service(*, serve: Serve, full: Full = Full(), unit: Unit = Unit(), target: Target = Target()) -> int:
    """Install a unit running the full auth service (lanes with their exchange faces)."""
    spec, name = _unit(serve, full, unit, callout_only=False), _name(unit, serve, "auth-service")
    _check_paths(serve)
    return _install(spec, name, unit, target)


CalloutServer = Annotated[str | None, Parameter(help="Answer the connects of this server, a leaf node's URL(s); its stores stay on --server (docs/deploy.md \"Leaf nodes\").")]


@install_app.command(name="callout-replica")
def install_callout_replica(
    *, serve: Serve, callout_server: CalloutServer = None, unit: Unit = Unit(), target: Target = Target()
) -> int:
    """Install a unit running a callout-only replica (``cotal service run callout-replica``)."""
    spec = _unit(serve, Full(), unit, callout_only=True, callout_server=callout_server)
    name = _name(unit, serve, "callout-replica")
    _check_paths(serve)
    return _install(spec, name, unit, target)


@render_app.command(name="auth-service")
def render_auth_service(*, serve: Serve, full: Full = Full(), unit: Unit = Unit()) -> int:
    """Print the unit ``install auth-service`` would write."""
    rendered = _unit(serve, full, unit, callout_only=False)
    _name(unit, serve, "auth-service")  # the same name check as install
    print(render_unit(rendered), end="")
    return 0


@render_app.command(name="callout-replica")
def render_callout_replica(*, serve: Serve, callout_server: CalloutServer = None, unit: Unit = Unit()) -> int:
    """Print the unit ``install callout-replica`` would write."""
    rendered = _unit(serve, Full(), unit, callout_only=True, callout_server=callout_server)
    _name(unit, serve, "callout-replica")  # the same name check as install
    print(render_unit(rendered), end="")
    return 0


@run_app.command(name="auth-service")
async def run_auth_service(
    *,
    served: Served = Served(),
    server: ServerFlag = None,
    root: RootFlag = None,
    auth_timeout: AuthTimeoutFlag = None,
    service_endpoints: ServiceEndpointsFlag = False,
    ops_port: OpsPortFlag = 0,
    public: PublicFaceFlags = PublicFaceFlags(),
) -> int:
    """Run the full auth service (lanes with their exchange faces) until SIGINT or SIGTERM.

    The flags and behaviour of `cotal auth-service` without --callout-only, and no deprecation note.
    """
    return await serve_preset(
        served=served, server=server, root=root, callout_only=False, auth_timeout=auth_timeout,
        service_endpoints=service_endpoints, public=public, command="cotal service run auth-service", ops_port=ops_port,
    )


@run_app.command(name="callout-replica")
async def run_callout_replica(
    *, served: Served = Served(), server: ServerFlag = None, root: RootFlag = None, callout_server: CalloutServer = None,
    auth_timeout: AuthTimeoutFlag = None, ops_port: OpsPortFlag = 0,
) -> int:
    """Run a callout-only replica until SIGINT or SIGTERM (what `cotal auth-service --callout-only` runs, without its deprecation note)."""
    return await serve_preset(
        served=served, server=server, root=root, callout_only=True, callout_server=callout_server,
        auth_timeout=auth_timeout, service_endpoints=False, public=PublicFaceFlags(),
        command="cotal service run callout-replica", ops_port=ops_port,
    )


def _unit(serve: Serve, full: Full, unit: Unit, *, callout_only: bool, callout_server: str | None = None) -> ExecUnit:
    """Check the flags as ``cotal auth-service`` does; the unit that runs them."""
    config = _config(serve, full, callout_only=callout_only, callout_server=callout_server)
    if unit.watchdog is not None and not MIN_WATCHDOG_S <= unit.watchdog <= 86_400:
        raise ConfigError(f"--watchdog {unit.watchdog:g} is out of range - pass seconds from {MIN_WATCHDOG_S:g} to 86400")
    if not 0 < unit.start_timeout <= 86_400:
        raise ConfigError(f"--start-timeout {unit.start_timeout:g} is out of range - pass seconds above 0, at most 86400")
    kind = "callout replica" if callout_only else "auth service"
    what = f"spaces of {config.manifest}" if config.manifest is not None else f"space {config.space}"
    return ExecUnit(
        description=f"Cotal {kind} ({what})", argv=(str(cotal_script()), *_argv(config, serve.auth_timeout)),
        watchdog_s=unit.watchdog, start_timeout_s=unit.start_timeout, user=unit.user,
        reload=config.manifest is not None,
    )


def _config(serve: Serve, full: Full, *, callout_only: bool, callout_server: str | None = None) -> ServiceConfig:
    """The :class:`ServiceConfig` ``cotal auth-service`` would build from these flags."""
    if (serve.space is None) == (serve.spaces is None):
        raise ConfigError("pass exactly one of --space (one space) and --spaces (a manifest of spaces)")
    server = join_servers(parse_servers(serve.server))  # the seed list, as auth-service takes it
    check_auth_timeout(serve.auth_timeout)
    if serve.space is not None:
        Where(root=serve.root, space=serve.space).space_paths()  # validates the name
    return ServiceConfig(
        root=Where(root=serve.root).paths(), server_url=server, space=serve.space,
        manifest=Path(os.path.abspath(serve.spaces)) if serve.spaces is not None else None,
        callout_only=callout_only, service_endpoints=full.service_endpoints, ops_port=serve.ops_port,
        callout_server=None if callout_server is None else join_servers(parse_servers(callout_server, flag="--callout-server")),
        **public_fields(full.public),
    )


def _check_paths(serve: Serve) -> None:
    """Refuse to install a unit whose root or manifest is not there: it would start and serve
    nothing (issue 18 item 6). ``render`` does not check: its unit may be for another host.

    Raises:
        ConfigError: the root folder, or the ``--spaces`` manifest, does not exist (one sentence each).
    """
    root = Where(root=serve.root).paths().root
    if not root.is_dir():
        raise ConfigError(
            f"the root {root} does not exist - pass the --root of an existing one (`cotal up` or "
            "`cotal space add --new-root` makes one); the unit would serve nothing"
        )
    if serve.spaces is not None and not os.path.exists(serve.spaces):
        raise ConfigError(
            f"--spaces {os.path.abspath(serve.spaces)} does not exist - write the manifest first"
            ' (an empty one is {"version": 2, "spaces": []}); the auth service refuses a missing one at start'
        )


def _argv(config: ServiceConfig, auth_timeout: float | None) -> list[str]:
    """``cotal service run <preset>``'s arguments for ``config`` (absolute paths)."""
    preset = "callout-replica" if config.callout_only else "auth-service"
    argv = ["service", "run", preset, "--server", config.server_url, "--root", str(config.root.root)]
    argv += ["--spaces", str(config.manifest)] if config.manifest is not None else ["--space", str(config.space)]
    argv += ["--callout-server", config.callout_server] if config.callout_server is not None else []
    argv += ["--auth-timeout", f"{auth_timeout:g}"] if auth_timeout is not None else []
    argv += ["--service-endpoints"] if config.service_endpoints else []
    argv += ["--ops-port", str(config.ops_port)] if config.ops_port else []
    for name, value in public_fields(config).items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)] if value not in (None, False) else []
    return argv


def _name(unit: Unit, serve: Serve, kind: str) -> str:
    name = unit.name or (f"{kind}-{serve.space}" if serve.space and kind == "callout-replica" else kind)
    if not _NAME.fullmatch(name):
        raise ConfigError(f"--name {name} is not a unit name - use letters, digits, '_', '.' and '-'")
    return name


def _unit_path(name: str, unit: Unit, target: Target) -> Path:
    """Where the unit goes: ``--out`` (a file, or a folder), the user's units, or the system's."""
    file = f"cotal-{name}.service"
    if target.out is not None:
        if unit.user:
            raise ConfigError("--out and --user both say where the unit goes - pass one of them")
        out = Path(os.path.abspath(target.out))
        if out.is_dir():
            return out / file
        if out.suffix != ".service":
            raise ConfigError(f"--out {target.out} must be a folder or a .service file (systemd reads no other name)")
        return out
    if unit.user:
        config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(config_home) / "systemd" / "user" / file
    return SYSTEM_UNITS / file


def _install(spec: ExecUnit, name: str, unit: Unit, target: Target) -> int:
    """Write the unit atomically unless a different one is there (without --force) or a link
    is (ever); say what next.

    Raises:
        ConfigError: a different unit without ``--force``, a symlink with other content, a
            missing folder (not ``--user``), or the unit cannot be read or written.
    """
    path, data = _unit_path(name, unit, target), render_unit(spec).encode()
    existing = _read_unit(path)
    if existing == data:
        print(f"✓ {path} is already this unit")
    elif path.is_symlink():
        linked = os.path.realpath(path)
        raise ConfigError(
            f"{path} is a symlink to {linked} (`systemctl link` makes these) - cotal does not replace a link"
            f" with a file: pass --out {linked} to write the linked unit, or remove the link"
            f" (`systemctl disable {path.name}`) first"
        )
    elif existing is not None and not target.force:
        raise ConfigError(
            f"{path} exists with other content - compare it with `cotal service render ...` and pass"
            " --force to replace it, or choose another --name"
        )
    else:
        _write_unit(path, data, make_folder=unit.user and target.out is None)
        print(f"✓ wrote {path}")
    _print_next(path, unit.user, linked=target.out is not None)
    return 0


def _read_unit(path: Path) -> bytes | None:
    """The unit file at ``path`` (through a symlink), or None when there is none (or a dangling link).

    Raises:
        ConfigError: it exists and cannot be read (:func:`unwritable`).
    """
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError as exc:
        raise unwritable(path, exc) from None


def _write_unit(path: Path, data: bytes, *, make_folder: bool) -> None:
    """Write ``data`` to ``path`` atomically, mode 0644; its folder is created only if ``make_folder``.

    Raises:
        ConfigError: the folder is missing (and not to be made), is not a folder, or the write
            failed (:func:`unwritable`); ``path`` is then unchanged.
    """
    if not make_folder and not path.parent.is_dir():
        raise ConfigError(
            f"the folder {path.parent} does not exist - create it (mkdir -p {path.parent}) or pass --out an existing folder"
        )
    try:
        atomic_write(path, data, mode=UNIT_MODE)
    except OSError as exc:
        raise unwritable(path, exc) from None


# errno -> (what happened, the fix), for a unit that cannot be read or written.
_WRITE_FIXES = {
    errno.EACCES: ("permission denied", "run as root, or pass --user or --out a folder you can write"),
    errno.EPERM: ("permission denied", "run as root, or pass --user or --out a folder you can write"),
    errno.EROFS: ("read-only file system", "pass --out a writable folder, then `systemctl link` the unit"),
    errno.ENOSPC: ("no space left on the device", "free some, or pass --out a folder on another device"),
}


def unwritable(path: Path, exc: OSError) -> ConfigError:
    """The one sentence for a unit ``path`` that an ``OSError`` kept from being read or written:
    ``cannot write <path> (<what>) - <fix>`` (sync, pure; the error is returned, not raised)."""
    what, fix = _WRITE_FIXES.get(exc.errno or 0, (exc.strerror or type(exc).__name__, "pass --out a folder you can write"))
    return ConfigError(f"cannot write {path} ({what}) - {fix}")


def _print_next(path: Path, user: bool, *, linked: bool) -> None:
    systemctl = "systemctl --user" if user else "systemctl"
    print("next:")
    if linked:
        print(f"  {systemctl} link {path}")
    print(f"  {systemctl} daemon-reload")
    print(f"  {systemctl} enable --now {path.name}")
    print(f"  {systemctl} status {path.name}     # STATUS: <n>/<m> lanes serving")
    print(f"  journalctl {'--user-unit' if user else '-u'} {path.name} -f")
