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
* the development IdP a space pins, with the loader its lane starts with
  (:func:`cotal_trio.service.pins.load_pinned_dev_idp`: a corrupt ``devidp.json`` that ``cotal up``
  refuses is a finding here too, issue 18 item 9);
* each pinned OIDC IdP's JWKS answers within ``IDP_PROBE_S``;
* when the root's broker answers, it holds each space's account JWTs exactly as ``accounts.json``,
  and its data account (``CLAIMS.LOOKUP``) carries every revocation the records hold: a revocation
  recorded while no broker ran is a finding until it is pushed. With no broker answering, the
  account the broker stored (``broker/resolver/<account>.jwt``, what it serves when it starts) is
  compared instead;
* when the broker answers, each space's stores with their replica count and leader (issue 17
  item 1; :mod:`cotal_trio.ops.store_replicas`): a store with fewer copies than the space's
  ``spaces.json`` entry asks for (``replicas``) is a finding, fixed by the full lane's next start;
* when the broker answers, its leaf-node links (issue 17 item 5; :mod:`cotal_trio.ops.leaf_links`):
  a link binding one of a space's accounts from a leaf that does not trust the root's operator
  through the system account admits that leaf's clients with no callout, a warning naming the
  supported shape (docs/deploy.md "Leaf nodes"); a leaf of that shape with no callout member of
  the space connected to it refuses every connect made there, a warning naming the replica to run.

A problem found twice (one corrupt ``devidp.json`` pinned by two spaces; a broker that lacks a
revocation and so also differs from ``accounts.json``) is one finding, with its fix once.

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
from ..core.identity import is_space
from cotal_trio.ops.leaf_links import LeafLink, read_callout_members, read_leaf_links
from cotal_trio.ops.store_replicas import SpaceStores, read_spaces_stores, summary
from cotal_trio.service.idp_keys import fetch_jwks
from cotal_trio.service.pins import load_pinned_dev_idp
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
from ..state.space_folders import require_root, require_space, unrenamed_note, unrenamed_spaces
from .common import Where

__all__ = ["auth", "doctor_app", "inspect_root"]

doctor_app = cyclopts.App(name="doctor", help="Check the root and name the next command to run.")

IDP_PROBE_S = 3.0  # a pinned IdP's JWKS must answer within this
BROKER_PROBE_S = 5.0  # the whole broker comparison
PRIVATE_BITS = 0o077
# Written readable on purpose: `.applied` is read by orchestrators and holds no secret (service/host.py).
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
    records: dict[str, list[LabelRecord]] = field(default_factory=dict)  # space -> its credential records
    unsigned: set[str] = field(default_factory=set)  # spaces whose accounts.json lacks a revocation
    root_flag: str | None = None
    now: int = 0
    revoked_label: dict[str, str] = field(default_factory=dict)  # space -> a label with a revoked key
    modes: dict[str, str] = field(default_factory=dict)
    broker: BrokerMaterial | None = None
    stores: dict[str, SpaceStores] = field(default_factory=dict)  # space -> its stores, when the broker answered

    def find(self, subject: str, problem: str, next_step: str, severity: Severity = Severity.FINDING) -> None:
        finding = Finding(severity=severity, subject=subject, problem=problem, next=next_step)
        if finding not in self.findings:  # the same problem seen from two spaces is one finding
            self.findings.append(finding)


def _remedy(exc: Exception) -> str:
    """The fix a ConfigError's sentence names (after its last " - "), or the sentence itself."""
    text = str(exc)
    return text.rsplit(" - ", 1)[1] if " - " in text else text


def _split(exc: Exception) -> tuple[str, str]:
    """A ConfigError's sentence as (problem, fix): a finding prints its fix once, after the problem."""
    text = str(exc)
    return (text.rsplit(" - ", 1)[0], _remedy(exc)) if " - " in text else (text, text)


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
            pin = load_idp_pin(sp.idp_json)
            found.pins.append((space, pin))
            if pin.kind == "dev":
                _check_dev_idp(found, paths, space, pin)
        if found.broker is not None:
            accounts = provision.load_space_accounts(paths, found.broker, space)
            signing = (material.data_callout_signing.public_key, material.data_service_signing.public_key)
            if accounts.data_signing_keys != signing:
                found.find(str(sp.accounts_json), "lists other data signing keys than callout.json holds",
                           f"cotal space add {space}{' --static' if row['mode'] == MODE_STATIC else ''}")
            found.accounts[space] = accounts
    except ConfigError as exc:
        found.find(f"space {space}", *_split(exc))


def _check_dev_idp(found: Inspection, paths: RootPaths, space: str, pin: IdpPinRecord) -> None:
    """The development IdP as the space's lane loads it at its start (one finding per problem)."""
    try:
        load_pinned_dev_idp(paths, space, pin.issuer)
    except ConfigError as exc:
        found.find(str(paths.devidp_json), *_split(exc))


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
    found.records[space] = records
    _check_revocations(found, space, records, flags, now)
    _check_unmanaged(found, paths, space, keys)


def _check_revocations(found: Inspection, space: str, records: list[LabelRecord], flags: str, now: int) -> None:
    accounts = found.accounts.get(space)
    if accounts is None:
        return
    missing = rules.missing_revocations(natsjwt.decode(accounts.data_jwt).claims, rules.revocations(records, now=now))
    if missing:
        found.unsigned.add(space)
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
    """The file checks of ``cotal doctor auth`` (blocking file I/O; module docstring).

    Raises:
        ConfigError: no root at ``paths.root``, or ``only`` is not a space of it (the sentences
            of :mod:`cotal_trio.state.space_folders`, as every command says them).
    """
    require_root(paths)
    if only is not None:
        if not is_space(only):
            raise ConfigError(f"{only!r} is not a space name - use 1 to 64 letters, digits, _ and -")
        require_space(paths, only)
    found = Inspection(root_flag=root_flag, now=now)
    check_modes(found, paths)
    try:
        found.broker = load_broker(paths.broker_json)
    except ConfigError as exc:
        found.find(str(paths.broker_json), *_split(exc))
    try:
        rows = [r for r in list_spaces(paths) if only is None or r["space"] == only]
    except ConfigError as exc:
        found.find(str(paths.root), *_split(exc))
        rows = []
    if only is None:
        # A root an earlier version wrote lists no space until a start renames its folders: the
        # doctor checked nothing of such a space, so it is not healthy.
        for name in unrenamed_spaces(paths):
            note = unrenamed_note(name)
            found.find(f"space {name}", note.split(": ", 1)[1].split(" - ")[0], note.split(" - ", 1)[1])
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


def _unpushed_revocations(found: Inspection, space: str, held_jwt: str, where: str) -> bool:
    """A finding when the account JWT the broker holds (``held_jwt``, from ``where``) lacks a
    revocation the space's records hold; True when it found one."""
    try:
        held = natsjwt.decode(held_jwt).claims
    except CodecError:
        return False  # not an account JWT: the comparison with accounts.json names it
    if space in found.unsigned:
        return True  # accounts.json lacks it too: that finding's fix signs and pushes it
    records = found.records.get(space, [])
    missing = rules.missing_revocations(held, rules.revocations(records, now=found.now))
    if not missing:
        return False
    labels = {c.user_key: r.label for r in records for c in r.all()}
    keys = ", ".join(f"{key} (credential {labels[key]})" for key in missing)
    # One push carries every revocation of the space: re-running the revocation of one label does it.
    label = labels[next(iter(missing))]
    found.find(f"space {space}", f"{where} does not carry the revocation of {keys}: the broker admits it",
               f"cotal auth revoke-credential {label} {_flags(space, found.root_flag)}")
    return True


def check_stored_revocations(found: Inspection, paths: RootPaths) -> None:
    """With no broker answering: the account each space's broker stored (its resolver file, what it
    serves when it starts) carries the records' revocations (blocking file I/O)."""
    for space, record in found.accounts.items():
        stored = paths.resolver_dir / f"{record.data_account}.jwt"
        try:
            text = stored.read_text().strip()
        except FileNotFoundError:
            continue  # never pushed to this broker: `cotal space add` pushes it with its revocations
        except (OSError, UnicodeDecodeError) as exc:
            found.notes.append(f"{stored} could not be read ({exc}): its revocations were not compared")
            continue
        _unpushed_revocations(found, space, text, f"the account the broker stored ({stored})")


async def check_broker(found: Inspection, paths: RootPaths, server: str | None, root_flag: str | None) -> None:
    """When the broker answers, it holds each space's account JWTs as ``accounts.json`` has them,
    and its data account carries the records' revocations; when none answers, the stored account
    does (:func:`check_stored_revocations`)."""
    if found.broker is None or not found.accounts:
        return
    url = await resolve_server_url(paths, server)
    if url is None:
        found.notes.append("no broker running: its accounts were not compared with the root")
        if server is None:  # the root's own broker: what it stored is what it serves at its start
            await trio.to_thread.run_sync(check_stored_revocations, found, paths)
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
        if _unpushed_revocations(found, space, held.get(record.data_account, b"").decode(errors="replace"),
                                 f"the broker at {url}"):
            continue  # its fix pushes the account: the difference below is the same finding
        same = all(held.get(a) == jwt.encode() for a, jwt in ((record.data_account, record.data_jwt),
                                                                (record.auth_account, record.auth_jwt)))  # fmt: skip
        if not same:
            found.find(f"space {space}", f"the broker at {url} holds other account JWTs than {paths.space(space).accounts_json}",
                       _push_command(found, space, root_flag))


async def check_stores(found: Inspection, paths: RootPaths, server: str | None) -> None:
    """When the broker answers, each user-auth space's stores with their replica count and leader
    (``row["stores"]``); a store below the space's ``replicas`` is a finding."""
    spaces = [row["space"] for row in found.spaces if row["mode"] != MODE_STATIC and row["space"] in found.accounts]
    url = await resolve_server_url(paths, server) if spaces else None
    if url is None:
        return
    for stores in await read_spaces_stores(paths, url, spaces, now=time.time()):
        found.stores[stores.space] = stores
        row = next(r for r in found.spaces if r["space"] == stores.space)
        row["stores"] = stores.to_json()
        if stores.error is not None:
            found.notes.append(f"space {stores.space}'s stores were not read: {stores.error}")
        for store in stores.below:
            copies = "copy" if store.replicas == 1 else "copies"
            found.find(
                f"space {stores.space}",
                f"its store {store.stream} keeps {store.replicas} {copies} where its spaces.json entry asks for"
                f" replicas {stores.wanted}",
                f"restart the space's full auth service: it scales its stores to R{stores.wanted} at its start",
            )


async def check_leaf_links(found: Inspection, paths: RootPaths, server: str | None) -> None:
    """When the broker answers, each leaf link that binds a space's account from a leaf the
    callout does not decide (:mod:`cotal_trio.ops.leaf_links`) is a warning naming the fix; a
    broker that does not answer its system account's pings is a note."""
    if found.broker is None or not found.accounts:
        return
    url = await resolve_server_url(paths, server)
    if url is None:
        return
    owners = {account: space for space, record in found.accounts.items()
              for account in (record.data_account, record.auth_account)}  # fmt: skip
    links = None
    failed: list[BaseException] = []
    with trio.move_on_after(BROKER_PROBE_S) as scope:
        try:
            links = await read_leaf_links(url, found.broker)
        except* Unavailable as group:  # natsio's loop nursery wraps it in a group (maybe nested)
            failed.extend(_leaves(group))
    if failed:
        found.notes.append(f"the broker's leaf-node links were not read: {failed[0]}")
        return
    if scope.cancelled_caught or links is None:
        found.notes.append(f"the broker's leaf-node links were not read within {BROKER_PROBE_S:g} s")
        return
    root = "" if found.root_flag is None else f" --root {shlex.quote(found.root_flag)}"
    for link in links:
        space = owners.get(link.account)
        if space is None or link.decided:
            continue
        found.find(
            f"space {space}",
            f"leaf node {link.leaf} links its account {link.account} to {link.hub} but does not trust the root's"
            " operator through the system account: its clients reach the space with no auth callout",
            f"render the leaf with `cotal broker leaf-config --node {link.leaf} --hub nats-leaf://<hub>:<port>{root}`"
            f" and run a callout replica on it (`cotal service run callout-replica --space {space}"
            " --callout-server <leaf URL>`), or remove the link (docs/deploy.md \"Leaf nodes\")",
            Severity.WARNING,
        )
    await _check_leaf_members(found, url, [link for link in links if link.decided and owners.get(link.account)], root)


async def _check_leaf_members(found: Inspection, url: str, links: list[LeafLink], root: str) -> None:
    """Each decided leaf linking a space's data account has a callout member of that space
    connected to it; a leaf without one refuses every connect made there (a warning)."""
    assert found.broker is not None  # check_leaf_links
    for space, record in found.accounts.items():
        leaves = [link for link in links if link.account == record.data_account]
        if not leaves:
            continue
        failed: list[BaseException] = []
        members = None
        with trio.move_on_after(BROKER_PROBE_S):
            try:
                members = await read_callout_members(url, found.broker, record.auth_account)
            except* Unavailable as group:
                failed.extend(_leaves(group))
        if members is None:
            found.notes.append(f"space {space}'s callout members on its leaf nodes were not read"
                               f"{': ' + str(failed[0]) if failed else ''}")  # fmt: skip
            continue
        for link in leaves:
            if members.get(link.leaf, 0) == 0:
                found.find(
                    f"space {space}",
                    f"leaf node {link.leaf} has no callout member of the space connected: every connect made"
                    " through it is refused after the auth timeout",
                    f"run `cotal service run callout-replica --space {space}{root} --server <hub seeds>"
                    f" --callout-server {link.url or '<leaf URL>'}` (docs/deploy.md \"Leaf nodes\")",
                    Severity.WARNING,
                )


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
    if space is not None:
        Where(root=root, space=space).provisioned()  # a bad name, or not in the root: one sentence
    found = await trio.to_thread.run_sync(inspect_root, paths, space, root, int(time.time()))
    await check_idps(found)
    await check_broker(found, paths, server, root)
    await check_stores(found, paths, server)
    await check_leaf_links(found, paths, server)
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
        stores = found.stores.get(row["space"])
        if stores is not None and stores.error is None:
            wanted = "" if stores.wanted is None or stores.below else f", replicas {stores.wanted} wanted"
            lines.append(f"  {summary(stores)}{wanted}")
            for store in stores.stores:
                others = f"  {store.current} of {store.replicas - 1} other copies current" if store.replicas > 1 else ""
                lines.append(f"    {store.stream:<28} R{store.replicas}  leader {store.leader or 'none'}{others}")
    for finding in found.findings:
        lines.append(f"{finding.severity.value}: {finding.subject}: {finding.problem} - {finding.next}")
    lines += [f"note: {note}" for note in found.notes]
    return "\n".join([*lines, last])
