"""``cotal doctor auth``: the root's credentials and files, and the next command to run (issue 6 item 4).

Spec "Credential authority", section "Provisioning"; docs/static-credentials.md. What it checks:

* every managed credential (the records of :mod:`cotal_trio.state.credentials`): healthy, near
  expiry, expired, revoked; a ``--no-expiry`` one is a warning; a replaced credential with no
  expiry that was never revoked, or an unrecorded file with no expiry in the root's credential
  folder, is a finding (an unbounded credential nobody manages);
* the account JWT carries every revocation the records hold;
* the root's files: folders 0700 and files 0600 (no group or other bits; the broker's own
  ``broker/`` folder is the broker's, and ``spaces.json.applied`` is public on purpose), and
  every key file parses (the ``load_*`` validators);
* each pinned OIDC IdP's JWKS answers within ``IDP_PROBE_S``;
* when the root's broker answers, it holds each space's account JWTs exactly as ``accounts.json``.

The system user, callout and sentinel credentials never expire by design (provisioning, an
auth-account user that can only answer callouts, a deny-all bearer) and are not reported.
It ends with ``healthy`` (exit 0; warnings allowed) or ``next: <command>`` (exit 1).
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import cyclopts
import trio
from cyclopts import Parameter

from .. import natsio
from ..broker import provision
from ..broker.accounts import lookup_subject, open_system_connection
from ..broker.spaces import MODE_STATIC, list_spaces, resolve_server_url
from ..core import credentials as rules
from ..core import natsjwt
from ..core.credentials import Finding, LabelRecord, Severity
from ..core.creds import parse_creds
from ..core.errors import CodecError, ConfigError, Unavailable
from ..lanes.idp_keys import fetch_jwks
from ..state import (
    AccountsRecord,
    BrokerMaterial,
    IdpPinRecord,
    RootPaths,
    load_broker,
    load_idp_pin,
    load_issuer_keys,
    load_owner_secret,
    load_space,
    resolve_root,
)
from ..state.credentials import creds_dir, list_records
from ..state.files import TEMP_SUFFIX

__all__ = ["auth", "doctor_app", "inspect_root"]

doctor_app = cyclopts.App(name="doctor", help="Check the root and name the next command to run.")

IDP_PROBE_S = 3.0  # a pinned IdP's JWKS must answer within this
BROKER_PROBE_S = 5.0  # the whole broker comparison
PRIVATE_BITS = 0o077
# Written readable on purpose: `.applied` is read by orchestrators and holds no secret (lanes/host.py).
PUBLIC_SUFFIX = ".applied"

Json = Annotated[bool, Parameter(name="--json", negative="", help="Print a JSON object.")]


@dataclass
class Inspection:
    """What the file checks found; the IdP and broker checks add to it."""

    spaces: list[dict] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pins: list[tuple[str, IdpPinRecord]] = field(default_factory=list)
    accounts: dict[str, AccountsRecord] = field(default_factory=dict)
    revoked_label: dict[str, str] = field(default_factory=dict)  # space -> a label with a revoked key
    modes: dict[str, str] = field(default_factory=dict)
    broker: BrokerMaterial | None = None

    def find(self, subject: str, problem: str, next_step: str, severity: Severity = Severity.FINDING) -> None:
        self.findings.append(Finding(severity=severity, subject=subject, problem=problem, next=next_step))


def _remedy(exc: Exception) -> str:
    """The fix a ConfigError's sentence names (after its last " - "), or the sentence itself."""
    text = str(exc)
    return text.rsplit(" - ", 1)[1] if " - " in text else text


def _flags(space: str, root: str | None) -> str:
    flags = f"--space {shlex.quote(space)}"
    return flags if root is None else f"{flags} --root {shlex.quote(root)}"


# -- files -----------------------------------------------------------------------------------------


def _mode_finding(found: Inspection, path: Path) -> None:
    if path.name.endswith(TEMP_SUFFIX):  # a write in progress: it carries the final mode, and is gone soon
        return
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not st.st_mode & PRIVATE_BITS:
        return
    want = "700" if stat.S_ISDIR(st.st_mode) else "600"
    found.find(str(path), f"mode {stat.S_IMODE(st.st_mode):04o} lets other users in", f"chmod {want} {shlex.quote(str(path))}")


def check_modes(found: Inspection, paths: RootPaths) -> None:
    """Folders 0700 and files 0600 in the root, ``broker/`` left to the broker."""
    _mode_finding(found, paths.root)
    for entry in sorted(paths.root.iterdir()):
        if entry.is_file() and not entry.name.endswith(PUBLIC_SUFFIX):
            _mode_finding(found, entry)
    for top in (paths.spaces_dir, paths.root / "auth"):
        for folder, dirs, files in os.walk(top):
            _mode_finding(found, Path(folder))
            dirs.sort()
            for name in sorted(files):
                _mode_finding(found, Path(folder) / name)


def _check_keys(found: Inspection, paths: RootPaths, row: dict) -> None:
    space, sp = row["space"], paths.space(row["space"])
    try:
        material = load_space(sp.callout_json, space)
        load_issuer_keys(sp.issuer_json, space)
        load_owner_secret(sp.owner_secret_json)
        if row["mode"] != MODE_STATIC:
            found.pins.append((space, load_idp_pin(sp.idp_json)))
        if found.broker is not None:
            accounts = provision.load_space_accounts(paths, found.broker, space)
            signing = (material.data_callout_signing.public_key, material.data_service_signing.public_key)
            if accounts.data_signing_keys != signing:
                found.find(str(sp.accounts_json), "lists other data signing keys than callout.json holds",
                           f"cotal space add {space}{' --static' if row['mode'] == MODE_STATIC else ''}")
            found.accounts[space] = accounts
    except ConfigError as exc:
        found.find(f"space {space}", str(exc), _remedy(exc))


# -- credentials -----------------------------------------------------------------------------------


def _credential_row(record: LabelRecord, now: int) -> dict:
    cred = record.current
    return {**cred.to_json(), "health": rules.classify(cred, now=now).value,
            "replaced": [c.user_key for c in record.replaced]}  # fmt: skip


def _check_credentials(found: Inspection, paths: RootPaths, row: dict, root_flag: str | None, now: int) -> None:
    space, sp = row["space"], paths.space(row["space"])
    flags = _flags(space, root_flag)
    records, bad = list_records(sp)
    for path, sentence in bad:
        found.find(str(path), sentence, f"restore {shlex.quote(str(path))} from a backup, or move it aside")
    row["credentials"] = [_credential_row(r, now) for r in records]
    keys: set[str] = set()
    for record in records:
        current = Path(record.current.path)
        identity = shlex.quote(str(current)) if current.exists() else None
        found.findings += rules.credential_findings(record, now=now, flags=flags, identity=identity)
        if not current.is_relative_to(paths.root):
            _mode_finding(found, current)
        keys |= {c.user_key for c in record.all()}
        found.revoked_label.update({space: record.label for c in record.all() if c.revoked_at is not None})
    _check_revocations(found, space, records, flags, now)
    _check_unmanaged(found, paths, space, keys)


def _check_revocations(found: Inspection, space: str, records: list[LabelRecord], flags: str, now: int) -> None:
    accounts = found.accounts.get(space)
    if accounts is None:
        return
    missing = rules.missing_revocations(natsjwt.decode(accounts.data_jwt).claims, rules.revocations(records, now=now))
    for key in missing:
        label = next(r.label for r in records if any(c.user_key == key for c in r.all()))
        found.find(f"space {space}", f"its account does not carry the revocation of key {key} (credential {label})",
                   f"cotal auth revoke-credential {label} {flags} --key {key}")


def _check_unmanaged(found: Inspection, paths: RootPaths, space: str, keys: set[str]) -> None:
    folder = creds_dir(paths, space)
    for path in sorted(folder.glob("*.creds")) if folder.is_dir() else ():
        try:
            claims = natsjwt.decode(parse_creds(path.read_text())[0]).claims
        except (OSError, UnicodeDecodeError, CodecError):
            continue
        if claims.get("sub") not in keys and "exp" not in claims:
            found.find(str(path), "an unrecorded credential with no expiry: nothing lists or revokes it",
                       f"rm {shlex.quote(str(path))} (and every copy of it)")


def inspect_root(paths: RootPaths, only: str | None, root_flag: str | None, now: int) -> Inspection:
    """The file checks of ``cotal doctor auth`` (blocking file I/O; module docstring)."""
    if not paths.root.is_dir():
        raise ConfigError(f"{paths.root} is not a root - pass --root, or run `cotal up` to create it")
    found = Inspection()
    check_modes(found, paths)
    try:
        found.broker = load_broker(paths.broker_json)
    except ConfigError as exc:
        found.find(str(paths.broker_json), str(exc), _remedy(exc))
    try:
        rows = [r for r in list_spaces(paths) if only is None or r["space"] == only]
    except ConfigError as exc:
        found.find(str(paths.root), str(exc), _remedy(exc))
        rows = []
    if only is not None and not rows:
        raise ConfigError(f"space {only} is not in the root {paths.root} - see `cotal space list`")
    for row in rows:
        _check_keys(found, paths, row)
        _check_credentials(found, paths, row, root_flag, now)
        found.spaces.append(row)
    return found


# -- the IdPs and the broker -----------------------------------------------------------------------


async def check_idps(found: Inspection) -> None:
    """Each pinned OIDC IdP's JWKS answers within ``IDP_PROBE_S`` (dev pins have no URL)."""
    for space, pin in found.pins:
        if pin.kind != "oidc" or not pin.jwks_uri:
            continue
        problem = f"its pinned IdP's JWKS {pin.jwks_uri} did not answer within {IDP_PROBE_S:g} s"
        with trio.move_on_after(IDP_PROBE_S):
            try:
                await fetch_jwks(pin.jwks_uri)
                continue
            except (Unavailable, ConfigError) as exc:
                problem = str(exc)
        found.find(f"space {space}", problem, f"check that {pin.jwks_uri} answers, then run `cotal doctor auth` again")


def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside ``error``, exception groups flattened."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


async def check_broker(found: Inspection, paths: RootPaths, server: str | None, root_flag: str | None) -> None:
    """When the broker answers, it holds each space's account JWTs as ``accounts.json`` has them."""
    if found.broker is None or not found.accounts:
        return
    url = await resolve_server_url(paths, server)
    if url is None:
        found.notes.append("no broker running: its accounts were not compared with the root")
        return
    held: dict[str, bytes] = {}
    failed: list[Unavailable] = []
    with trio.move_on_after(BROKER_PROBE_S) as scope:
        try:
            async with natsio.open_loop(), open_system_connection(url, found.broker) as conn:
                for record in found.accounts.values():
                    for account in (record.data_account, record.auth_account):
                        held[account] = (await conn.request(lookup_subject(account), b"")).data.strip()
        except* Unavailable as group:  # natsio's loop nursery wraps it in a group (maybe nested)
            failed.extend(leaf for leaf in _leaves(group) if isinstance(leaf, Unavailable))
    if failed:
        found.notes.append(f"the broker at {url} did not answer ({failed[0]}): its accounts were not compared")
        return
    if scope.cancelled_caught:
        found.notes.append(f"the broker at {url} did not answer within {BROKER_PROBE_S:g} s: its accounts were not compared")
        return
    for space, record in found.accounts.items():
        same = all(held.get(a) == jwt.encode() for a, jwt in ((record.data_account, record.data_jwt),
                                                                (record.auth_account, record.auth_jwt)))  # fmt: skip
        if not same:
            found.find(f"space {space}", f"the broker at {url} holds other account JWTs than {paths.space(space).accounts_json}",
                       _push_command(found, space, root_flag))


def _push_command(found: Inspection, space: str, root_flag: str | None) -> str:
    """What pushes the root's accounts: a revocation re-push keeps the revocations; else space add."""
    label = found.revoked_label.get(space)
    if label is not None:
        return f"cotal auth revoke-credential {label} {_flags(space, root_flag)}"
    static = next((r["mode"] == MODE_STATIC for r in found.spaces if r["space"] == space), False)
    root = "" if root_flag is None else f" --root {shlex.quote(root_flag)}"
    return f"cotal space add {shlex.quote(space)}{' --static' if static else ''}{root}"


# -- the command -----------------------------------------------------------------------------------


@doctor_app.command
async def auth(
    *,
    space: Annotated[str | None, Parameter(help="Check only this space (default: every space).")] = None,
    server: Annotated[str | None, Parameter(help="Broker URL (default: the root's broker on 127.0.0.1, if it runs).")] = None,
    as_json: Json = False,
    root: Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal).")] = None,
) -> int:
    """Check the root's credentials, files, pinned IdPs and broker accounts; exit 0 when healthy.

    Lists every managed credential as healthy, near-expiry, expired or revoked, warns on
    --no-expiry ones, and ends with `healthy` or the next command to run.
    """
    if root is not None and not root.strip():
        raise ConfigError("--root is empty - pass a folder, or leave it out for ./.cotal")
    paths = RootPaths(resolve_root(root, os.environ))
    found = await trio.to_thread.run_sync(inspect_root, paths, space, root, int(time.time()))
    await check_idps(found)
    await check_broker(found, paths, server, root)
    healthy, last = rules.verdict(found.findings)
    if as_json:
        print(json.dumps({"healthy": healthy, "next": None if healthy else last.removeprefix("next: "),
                          "spaces": found.spaces, "findings": [f.to_json() for f in found.findings],
                          "notes": found.notes}, indent=2))  # fmt: skip
    else:
        print(_render(found, last, int(time.time())))
    return 0 if healthy else 1


def _render(found: Inspection, last: str, now: int) -> str:
    lines = []
    for row in found.spaces:
        creds = row.get("credentials", [])
        lines.append(f"space {row['space']} ({row['mode']}): {len(creds)} managed credentials")
        for c in creds:
            left = "never expires" if c["expiresAt"] is None else (
                f"expired at {c['expiresAt']}" if c["expiresAt"] <= now else f"expires at {c['expiresAt']} (in {c['expiresAt'] - now} s)")
            lines.append(f"  {c['label']:<16} {c['profile']:<9} {c['health']:<12} {left}  {c['owner']}.{c['actor']}")
    for finding in found.findings:
        lines.append(f"{finding.severity.value}: {finding.subject}: {finding.problem} - {finding.next}")
    lines += [f"note: {note}" for note in found.notes]
    return "\n".join([*lines, last])
