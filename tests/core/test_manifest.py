"""The space manifest, its diff and the `.applied` report (core/manifest.py; DESIGN.md 9)."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.manifest import (
    LANE_STATES,
    AppliedReport,
    LaneStatus,
    Manifest,
    ManifestDiff,
    ManifestRefused,
    SpaceEntry,
    diff,
    format_utc,
    host_gone,
    parse_applied,
    parse_manifest,
    render_applied,
    render_manifest,
)

SHA_A = "a" * 64
ENTRY_TAKES = (
    "an entry takes space, exchangePublicPort, exchangePublicUrl, exchangeTrustedProxy, "
    "advertisedServer, serviceEndpoints, toolResultConsent and replicas"
)
REPLICAS_FIX = "write a count from 1 to 5 (more than 1 needs a cluster of at least that many nodes)"
SHAPE = '{"version": 2, "spaces": [{"space": "<name>"}]}'
PORT_FIX = "write a port from 1 to 65535"
URL_FIX = 'write the address clients reach, for example "https://auth.example"'
SERVER_FIX = 'host - write the broker address remote agents dial, for example "wss://nats.example"'


def doc(*entries: object, **top: object) -> bytes:
    """A manifest's bytes: version 2 with ``entries``; ``top`` overrides or adds top-level keys."""
    return json.dumps({"version": 2, "spaces": list(entries), **top}).encode()


def refusal(data: bytes, **kwargs: bool) -> tuple[str, ...]:
    with pytest.raises(ManifestRefused) as caught:
        parse_manifest(data, **kwargs)
    assert str(caught.value) == ". ".join(caught.value.reasons)
    return caught.value.reasons


# --- accepted manifests ------------------------------------------------------------------------


def test_a_full_entry_reads_every_field():
    data = doc({
        "space": "alpha", "exchangePublicPort": 7451, "exchangePublicUrl": "https://auth.example",
        "exchangeTrustedProxy": True, "advertisedServer": "wss://nats.example/ws", "serviceEndpoints": True,
        "toolResultConsent": True, "replicas": 3,
    })
    manifest = parse_manifest(data)
    assert manifest == Manifest(
        spaces=(SpaceEntry(
            space="alpha", exchange_public_port=7451, exchange_public_url="https://auth.example",
            exchange_trusted_proxy=True, advertised_server="wss://nats.example/ws", service_endpoints=True,
            tool_result_consent=True, replicas=3,
        ),),
        sha256=hashlib.sha256(data).hexdigest(),
    )


def test_absent_and_null_values_are_the_defaults_and_entries_sort_by_space():
    data = doc({"space": "b", "exchangePublicPort": None, "exchangePublicUrl": None}, {"space": "a"})
    manifest = parse_manifest(data)
    assert manifest.names == ("a", "b")
    assert manifest.entry("b") == SpaceEntry(space="b")
    assert manifest.entry("c") is None
    assert manifest.spaces[0] == SpaceEntry(
        space="a", exchange_public_port=None, exchange_public_url=None, exchange_trusted_proxy=False,
        advertised_server=None, service_endpoints=False,
    )


def test_an_empty_spaces_list_serves_nothing():
    data = b'{"version": 2, "spaces": []}\n'
    assert parse_manifest(data) == Manifest(spaces=(), sha256=hashlib.sha256(data).hexdigest())


def test_the_sha_is_of_the_exact_bytes_and_a_bom_is_tolerated():
    plain = b'{"version": 2, "spaces": [{"space": "a"}]}'
    with_bom = b"\xef\xbb\xbf" + plain
    assert parse_manifest(with_bom).spaces == parse_manifest(plain).spaces
    assert parse_manifest(with_bom).sha256 == hashlib.sha256(with_bom).hexdigest()
    assert parse_manifest(plain + b"\n").sha256 != parse_manifest(plain).sha256


@pytest.mark.parametrize("url", [
    "https://auth.example", "https://auth.example:8443", "https://auth.example/s/alpha", "https://10.0.0.1",
    "https://[::1]:8443/", "https://a-b.example.com",
])
def test_public_urls_accepted(url):
    entry = parse_manifest(doc({"space": "a", "exchangePublicPort": 7451, "exchangePublicUrl": url})).spaces[0]
    assert entry.exchange_public_url == url


@pytest.mark.parametrize("server", [
    "nats://nats.example", "nats://nats.example:4222", "tls://nats.example:4443", "ws://127.0.0.1:8080",
    "wss://nats.example/ws", "wss://[2001:db8::1]:443",
])
def test_advertised_servers_accepted(server):
    entry = parse_manifest(doc({"space": "a", "exchangePublicPort": 7451, "advertisedServer": server})).spaces[0]
    assert entry.advertised_server == server


def test_trusted_proxy_false_needs_no_port():
    assert parse_manifest(doc({"space": "a", "exchangeTrustedProxy": False})).spaces == (SpaceEntry(space="a"),)


# --- refusals: each problem has its sentence ---------------------------------------------------

REFUSALS = [
    ("empty", b"", ('the manifest is empty - write {"version": 2, "spaces": []} to serve nothing',)),
    ("whitespace", b" \n\t\r\n", ('the manifest is empty - write {"version": 2, "spaces": []} to serve nothing',)),
    ("not utf-8", b'{"version": 2, "spaces": [{"space": "\xff"}]}',
     ("the manifest is not UTF-8 text - save it as UTF-8 JSON",)),
    ("truncated", b'{"version": 2,', (
        ("the manifest is not valid JSON (line 1 column 15: Expecting property name enclosed in double quotes)"
        f" - fix it; the shape is {SHAPE}"),)),
    ("trailing data", b'{"version": 2, "spaces": []} x',
     (f"the manifest is not valid JSON (line 1 column 30: Extra data) - fix it; the shape is {SHAPE}",)),
    ("NaN", b'{"version": 2, "spaces": [{"space": "a", "exchangePublicPort": NaN}]}',
     (f"the manifest is not valid JSON - fix it; the shape is {SHAPE}",)),
    ("a list", b"[]", (f"the manifest is not a JSON object - write {SHAPE}",)),
    ("a string", b'"spaces"', (f"the manifest is not a JSON object - write {SHAPE}",)),
    ("unknown top key", doc(extra=1),
     ('the manifest has unknown key "extra" - remove it; a manifest holds only "version" and "spaces"',)),
    ("unknown top keys", doc(b=1, a=2),
     ('the manifest has unknown keys "b", "a" - remove them; a manifest holds only "version" and "spaces"',)),
    ("no version", b'{"spaces": []}', ('the manifest has no version - add "version": 2',)),
    ("version 1", doc(version=1),
     (f'the manifest version is 1, not 2 - write "version": 2 (the shape is {SHAPE})',)),
    ("version text", doc(version="2"),
     (f'the manifest version is "2", not 2 - write "version": 2 (the shape is {SHAPE})',)),
    ("version float", doc(version=2.0),
     (f'the manifest version is 2.0, not 2 - write "version": 2 (the shape is {SHAPE})',)),
    ("version bool", doc(version=True),
     (f'the manifest version is true, not 2 - write "version": 2 (the shape is {SHAPE})',)),
    ("no spaces", b'{"version": 2}',
     ('the manifest has no spaces list - add "spaces": [] (an empty list serves nothing)',)),
    ("spaces object", b'{"version": 2, "spaces": {"a": {}}}',
     ('the manifest\'s spaces {"a": {}} is not a list - write "spaces": [{"space": "<name>"}]',)),
    ("spaces null", b'{"version": 2, "spaces": null}',
     ('the manifest\'s spaces null is not a list - write "spaces": [{"space": "<name>"}]',)),
    ("entry a string", doc("alpha"), ('spaces[0] "alpha" is not an object - write {"space": "<name>"}',)),
    ("entry unknown key", doc({"space": "a", "agentProvisioningUrl": "https://x"}),
     (f'spaces[0] ("a"): unknown key "agentProvisioningUrl" - remove it; {ENTRY_TAKES}',)),
    ("entry unknown keys", doc({"space": "a", "port": 1, "Space": "a"}),
     (f'spaces[0] ("a"): unknown keys "port", "Space" - remove them; {ENTRY_TAKES}',)),
    ("entry without space", doc({"exchangePublicPort": 7451}), ('spaces[0]: no space - add "space": "<name>"',)),
    ("space with a dot", doc({"space": "a.b"}),
     ('spaces[0]: space "a.b" is not a space name - use 1 to 64 letters, digits, _ and -',)),
    ("space empty", doc({"space": ""}),
     ('spaces[0]: space "" is not a space name - use 1 to 64 letters, digits, _ and -',)),
    ("space a number", doc({"space": 7}),
     ("spaces[0]: space 7 is not a space name - use 1 to 64 letters, digits, _ and -",)),
    ("space too long", doc({"space": "a" * 65}),
     (f'spaces[0]: space "{"a" * 60}... is not a space name - use 1 to 64 letters, digits, _ and -',)),
    ("port true", doc({"space": "a", "exchangePublicPort": True}),
     (f'spaces[0] ("a"): exchangePublicPort true is not a whole number - {PORT_FIX}',)),
    ("port text", doc({"space": "a", "exchangePublicPort": "7451"}),
     (f'spaces[0] ("a"): exchangePublicPort "7451" is not a whole number - {PORT_FIX}',)),
    ("port float", doc({"space": "a", "exchangePublicPort": 7451.0}),
     (f'spaces[0] ("a"): exchangePublicPort 7451.0 is not a whole number - {PORT_FIX}',)),
    ("port 0", doc({"space": "a", "exchangePublicPort": 0}),
     (f'spaces[0] ("a"): exchangePublicPort 0 is outside 1-65535 - {PORT_FIX}',)),
    ("port 65536", doc({"space": "a", "exchangePublicPort": 65536}),
     (f'spaces[0] ("a"): exchangePublicPort 65536 is outside 1-65535 - {PORT_FIX}',)),
    ("port negative", doc({"space": "a", "exchangePublicPort": -1}),
     (f'spaces[0] ("a"): exchangePublicPort -1 is outside 1-65535 - {PORT_FIX}',)),
    *[
        (f"public url {url!r}", doc({"space": "a", "exchangePublicPort": 7451, "exchangePublicUrl": url}),
         (f'spaces[0] ("a"): exchangePublicUrl {json.dumps(url)} is not an https:// URL with a host - {URL_FIX}',))
        for url in [
            "http://auth.example", "https://", "https:///path", "https://user@auth.example", "auth.example",
            "https://auth.example?x=1", "https://auth.example#top", "https://auth example", "https://auth.example:0",
            "https://auth.example:99999", "HTTPS://auth.example", "https://ауth.example", 7451,
        ]
    ],
    *[
        (f"advertised {server!r}", doc({"space": "a", "exchangePublicPort": 7451, "advertisedServer": server}),
         ((f'spaces[0] ("a"): advertisedServer {json.dumps(server)} is not a nats://, tls://, ws:// or wss:// '
          f"URL with a {SERVER_FIX}"),))
        for server in [
            "http://nats.example", "nats.example:4222", "nats://", "nats://nats.example/path",
            "nats://a.example,nats://b.example", "wss://nats.example?x", "https://nats.example", True,
        ]
    ],
    ("trusted proxy text", doc({"space": "a", "exchangePublicPort": 7451, "exchangeTrustedProxy": "yes"}),
     ('spaces[0] ("a"): exchangeTrustedProxy "yes" is not true or false - write true or false',)),
    ("trusted proxy null", doc({"space": "a", "exchangePublicPort": 7451, "exchangeTrustedProxy": None}),
     ('spaces[0] ("a"): exchangeTrustedProxy null is not true or false - write true or false',)),
    ("service endpoints 1", doc({"space": "a", "serviceEndpoints": 1}),
     ('spaces[0] ("a"): serviceEndpoints 1 is not true or false - write true or false',)),
    ("tool result consent string", doc({"space": "a", "toolResultConsent": "yes"}),
     ('spaces[0] ("a"): toolResultConsent "yes" is not true or false - write true or false',)),
    ("replicas 0", doc({"space": "a", "replicas": 0}), (f'spaces[0] ("a"): replicas 0 is outside 1-5 - {REPLICAS_FIX}',)),
    ("replicas 6", doc({"space": "a", "replicas": 6}), (f'spaces[0] ("a"): replicas 6 is outside 1-5 - {REPLICAS_FIX}',)),
    ("replicas text", doc({"space": "a", "replicas": "3"}),
     (f'spaces[0] ("a"): replicas "3" is not a whole number - {REPLICAS_FIX}',)),
    ("replicas true", doc({"space": "a", "replicas": True}),
     (f'spaces[0] ("a"): replicas true is not a whole number - {REPLICAS_FIX}',)),
    ("replicas float", doc({"space": "a", "replicas": 3.0}),
     (f'spaces[0] ("a"): replicas 3.0 is not a whole number - {REPLICAS_FIX}',)),
    ("replicas null", doc({"space": "a", "replicas": None}),
     (f'spaces[0] ("a"): replicas null is not a whole number - {REPLICAS_FIX}',)),
    ("url without port", doc({"space": "a", "exchangePublicUrl": "https://auth.example"}),
     (('spaces[0] ("a"): exchangePublicUrl needs exchangePublicPort - '
      "add the public listener's port or remove exchangePublicUrl"),)),
    ("trusted proxy without port", doc({"space": "a", "exchangeTrustedProxy": True}),
     (('spaces[0] ("a"): exchangeTrustedProxy needs exchangePublicPort - '
      "add the public listener's port or remove exchangeTrustedProxy"),)),
    ("advertised without port", doc({"space": "a", "advertisedServer": "wss://nats.example"}),
     (('spaces[0] ("a"): advertisedServer needs exchangePublicPort - '
      "add the public listener's port or remove advertisedServer"),)),
    ("duplicate space", doc({"space": "a"}, {"space": "b"}, {"space": "a", "serviceEndpoints": True}),
     ('space "a" is listed 2 times (spaces[0], spaces[2]) - keep one entry per space',)),
    ("two spaces on one port", doc(
        {"space": "b", "exchangePublicPort": 7451}, {"space": "a", "exchangePublicPort": 7451},
        {"space": "c", "exchangePublicPort": 7452},
    ), ('spaces "a" and "b" share exchangePublicPort 7451 - give each space its own port',)),
    ("three spaces on one port", doc(*[{"space": s, "exchangePublicPort": 7451} for s in "cab"]),
     ('spaces "a", "b" and "c" share exchangePublicPort 7451 - give each space its own port',)),
    ("repeated key", b'{"version": 2, "spaces": [{"space": "a", "space": "b"}]}',
     ('an object in the manifest repeats key "space" - keep one',)),
]


@pytest.mark.parametrize(("data", "reasons"), [(d, r) for _, d, r in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_each_refusal_names_the_problem_and_its_fix(data, reasons):
    assert refusal(data) == reasons


def test_every_problem_is_listed_and_the_manifest_refused_whole():
    data = json.dumps({
        "version": 1, "extra": True,
        "spaces": [
            {"space": "good"},
            {"space": "a", "exchangePublicPort": True, "exchangePublicUrl": "http://x"},
            "b",
            {"space": "c", "exchangePublicPort": 7451},
            {"space": "d", "exchangePublicPort": 7451, "bogus": 1},
            {"space": "c"},
        ],
    }).encode()
    reasons = refusal(data)
    assert reasons == (
        'the manifest has unknown key "extra" - remove it; a manifest holds only "version" and "spaces"',
        f'the manifest version is 1, not 2 - write "version": 2 (the shape is {SHAPE})',
        f'spaces[1] ("a"): exchangePublicPort true is not a whole number - {PORT_FIX}',
        f'spaces[1] ("a"): exchangePublicUrl "http://x" is not an https:// URL with a host - {URL_FIX}',
        'spaces[2] "b" is not an object - write {"space": "<name>"}',
        f'spaces[4] ("d"): unknown key "bogus" - remove it; {ENTRY_TAKES}',
        'space "c" is listed 2 times (spaces[3], spaces[5]) - keep one entry per space',
        'spaces "c" and "d" share exchangePublicPort 7451 - give each space its own port',
    )


def test_the_refusal_is_a_config_error_whose_message_joins_the_sentences():
    with pytest.raises(ConfigError, match=r"^the manifest has no version - add \"version\": 2\. the manifest has no spaces"):
        parse_manifest(b"{}")


def test_a_refusal_needs_a_reason():
    with pytest.raises(ConfigError):
        ManifestRefused(())


# --- the callout-only reading -----------------------------------------------------------------


def test_callout_only_reads_only_the_space():
    data = doc(
        {"space": "b", "exchangePublicPort": 7451, "serviceEndpoints": True, "advertisedServer": "wss://x"},
        {"space": "a", "exchangePublicPort": 7451, "exchangeTrustedProxy": True},
    )
    assert refusal(data) == ('spaces "a" and "b" share exchangePublicPort 7451 - give each space its own port',)
    manifest = parse_manifest(data, callout_only=True)
    assert manifest.spaces == (SpaceEntry(space="a"), SpaceEntry(space="b"))
    assert manifest.sha256 == hashlib.sha256(data).hexdigest()


def test_callout_only_ignores_the_values_of_other_known_keys():
    data = doc({
        "space": "a", "exchangePublicPort": True, "exchangePublicUrl": "http://x", "exchangeTrustedProxy": "yes",
        "advertisedServer": 7, "serviceEndpoints": None,
    })
    assert parse_manifest(data, callout_only=True).spaces == (SpaceEntry(space="a"),)


@pytest.mark.parametrize(("data", "reasons"), [
    (doc({"space": "a", "bogus": 1}), (f'spaces[0] ("a"): unknown key "bogus" - remove it; {ENTRY_TAKES}',)),
    (doc({"space": "a"}, {"space": "a"}), ('space "a" is listed 2 times (spaces[0], spaces[1]) - keep one entry per space',)),
    (doc({"exchangePublicPort": 1}), ('spaces[0]: no space - add "space": "<name>"',)),
    (doc({"space": "a b"}), ('spaces[0]: space "a b" is not a space name - use 1 to 64 letters, digits, _ and -',)),
    (doc(version=3), (f'the manifest version is 3, not 2 - write "version": 2 (the shape is {SHAPE})',)),
    (b" ", ('the manifest is empty - write {"version": 2, "spaces": []} to serve nothing',)),
], ids=["unknown key", "duplicate", "no space", "bad space", "version", "empty"])
def test_callout_only_still_refuses_the_grammar(data, reasons):
    assert refusal(data, callout_only=True) == reasons


# --- the value types ----------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "reasons"), [
    ({"space": "a", "exchange_public_port": 70000}, (f'space "a": exchangePublicPort 70000 is outside 1-65535 - {PORT_FIX}',)),
    ({"space": "a b"}, ('space entry: space "a b" is not a space name - use 1 to 64 letters, digits, _ and -',)),
    ({"space": "a", "exchange_trusted_proxy": True, "service_endpoints": "no"}, (
        'space "a": serviceEndpoints "no" is not true or false - write true or false',
        ("space \"a\": exchangeTrustedProxy needs exchangePublicPort - "
        "add the public listener's port or remove exchangeTrustedProxy"),
    )),
])
def test_a_space_entry_validates_itself(fields, reasons):
    with pytest.raises(ManifestRefused) as caught:
        SpaceEntry(**fields)
    assert caught.value.reasons == reasons


def test_a_manifest_sorts_its_entries_and_refuses_clashes():
    manifest = Manifest(spaces=[SpaceEntry(space="b"), SpaceEntry(space="a")], sha256=SHA_A)
    assert manifest.spaces == (SpaceEntry(space="a"), SpaceEntry(space="b"))
    with pytest.raises(ManifestRefused, match="listed 2 times"):
        Manifest(spaces=(SpaceEntry(space="a"), SpaceEntry(space="a")), sha256=SHA_A)
    with pytest.raises(ManifestRefused, match="share exchangePublicPort 1"):
        Manifest(spaces=(SpaceEntry(space="a", exchange_public_port=1), SpaceEntry(space="b", exchange_public_port=1)), sha256=SHA_A)
    with pytest.raises(ManifestRefused, match="SpaceEntry"):
        Manifest(spaces=({"space": "a"},), sha256=SHA_A)
    with pytest.raises(ConfigError, match="sha256"):
        Manifest(spaces=(), sha256="A" * 64)


@pytest.mark.parametrize(("fields", "match"), [
    ({"state": "running"}, "a lane state is one of starting, serving, retrying, stopping"),
    ({"state": "retrying"}, "a retrying lane needs the reason"),
    ({"state": "serving", "reason": ""}, "non-empty sentence"),
    ({"state": "serving", "reason": 5}, "non-empty sentence"),
])
def test_a_lane_status_validates_itself(fields, match):
    with pytest.raises(ConfigError, match=match):
        LaneStatus(**fields)


def test_lane_states_are_the_four_of_the_design():
    assert LANE_STATES == ("starting", "serving", "retrying", "stopping")
    assert LaneStatus(state="stopping", reason="fenced").reason == "fenced"


# --- render_manifest ----------------------------------------------------------------------------


def test_render_manifest_is_canonical_and_omits_defaults():
    entries = [
        SpaceEntry(space="b", exchange_public_port=7451, exchange_trusted_proxy=True, service_endpoints=False),
        SpaceEntry(space="a", service_endpoints=True),
    ]
    assert render_manifest(entries) == (
        b'{\n  "spaces": [\n    {\n      "serviceEndpoints": true,\n      "space": "a"\n    },\n'
        b'    {\n      "exchangePublicPort": 7451,\n      "exchangeTrustedProxy": true,\n      "space": "b"\n'
        b'    }\n  ],\n  "version": 2\n}\n'
    )
    assert render_manifest([]) == b'{\n  "spaces": [],\n  "version": 2\n}\n'


def test_render_manifest_refuses_a_duplicate():
    with pytest.raises(ManifestRefused, match='space "a" is listed 2 times'):
        render_manifest([SpaceEntry(space="a"), SpaceEntry(space="a", service_endpoints=True)])


# --- diff ---------------------------------------------------------------------------------------


def manifest(*entries: SpaceEntry) -> Manifest:
    return Manifest(spaces=entries, sha256=SHA_A)


A, B, C = SpaceEntry(space="a"), SpaceEntry(space="b"), SpaceEntry(space="c")
B_PUBLIC = SpaceEntry(space="b", exchange_public_port=7451)


@pytest.mark.parametrize(("old", "new", "expected"), [
    (None, manifest(), ManifestDiff(added=(), removed=(), changed=(), unchanged=())),
    (None, manifest(B, A), ManifestDiff(added=("a", "b"), removed=(), changed=(), unchanged=())),
    (manifest(A, B), manifest(A, B), ManifestDiff(added=(), removed=(), changed=(), unchanged=("a", "b"))),
    (manifest(A, B, C), manifest(A, C), ManifestDiff(added=(), removed=("b",), changed=(), unchanged=("a", "c"))),
    (manifest(A, B), manifest(), ManifestDiff(added=(), removed=("a", "b"), changed=(), unchanged=())),
    (manifest(A, B), manifest(A, B_PUBLIC), ManifestDiff(added=(), removed=(), changed=("b",), unchanged=("a",))),
    (manifest(A, B_PUBLIC), manifest(B, C), ManifestDiff(added=("c",), removed=("a",), changed=("b",), unchanged=())),
], ids=["nothing", "first apply", "same", "remove one", "remove all", "change one", "mixed"])
def test_diff(old, new, expected):
    assert diff(old, new) == expected


def test_diff_ignores_the_sha_and_entry_order():
    data = doc({"space": "b"}, {"space": "a"})
    assert diff(parse_manifest(data), manifest(A, B)).unchanged == ("a", "b")


# --- the .applied document ----------------------------------------------------------------------


def test_render_applied_golden():
    sha = hashlib.sha256(b"manifest").hexdigest()
    out = render_applied(
        manifest_sha256=sha, applied_at="2026-11-29T10:00:00Z",
        spaces={"b": LaneStatus(state="retrying", reason="the broker refused the callout user"),
                "a": LaneStatus(state="serving")},
        refused=None, pid=4242,
    )
    assert out == (
        b'{\n  "appliedAt": "2026-11-29T10:00:00Z",\n'
        b'  "manifestSha256": "' + sha.encode() + b'",\n'
        b'  "pid": 4242,\n'
        b'  "refused": null,\n'
        b'  "spaces": {\n'
        b'    "a": {\n      "state": "serving"\n    },\n'
        b'    "b": {\n      "reason": "the broker refused the callout user",\n      "state": "retrying"\n    }\n'
        b"  },\n"
        b'  "version": 1\n}\n'
    )
    assert json.loads(out) == {
        "version": 1, "manifestSha256": sha, "appliedAt": "2026-11-29T10:00:00Z",
        "pid": 4242,
        "spaces": {"a": {"state": "serving"}, "b": {"state": "retrying", "reason": "the broker refused the callout user"}},
        "refused": None,
    }
    back = parse_applied(out, path="x.applied")
    assert back == AppliedReport(
        spaces={"a": LaneStatus(state="serving"), "b": LaneStatus(state="retrying", reason="the broker refused the callout user")},
        refused=None, pid=4242,
    )


def test_render_applied_of_a_first_manifest_that_was_refused():
    with pytest.raises(ManifestRefused) as caught:
        parse_manifest(b"")
    out = render_applied(
        manifest_sha256=None, applied_at="2026-11-29T10:00:00Z", spaces={}, refused=str(caught.value), pid=1,
    )
    assert out == (
        b'{\n  "appliedAt": "2026-11-29T10:00:00Z",\n  "manifestSha256": null,\n  "pid": 1,\n'
        b'  "refused": "the manifest is empty - write {\\"version\\": 2, \\"spaces\\": []} to serve nothing",\n'
        b'  "spaces": {},\n  "version": 1\n}\n'
    )


GOOD_APPLIED = {"manifest_sha256": SHA_A, "applied_at": "2026-11-29T10:00:00Z", "spaces": {}, "refused": None, "pid": 7}


@pytest.mark.parametrize(("override", "match"), [
    ({"manifest_sha256": "abc"}, "manifestSha256"),
    ({"applied_at": "2026-11-29T10:00:00.000Z"}, "appliedAt"),
    ({"applied_at": "2026-11-29 10:00:00Z"}, "appliedAt"),
    ({"applied_at": "2026-02-30T10:00:00Z"}, "appliedAt"),
    ({"applied_at": 1795946400}, "appliedAt"),
    ({"spaces": {"a.b": LaneStatus(state="serving")}}, "LaneStatus"),
    ({"spaces": {"a": {"state": "serving"}}}, "LaneStatus"),
    ({"refused": ""}, "refused"),
    ({"pid": 0}, "pid"),
    ({"pid": True}, "pid"),
    ({"pid": "7"}, "pid"),
])
def test_render_applied_refuses_a_malformed_argument(override, match):
    with pytest.raises(ConfigError, match=match):
        render_applied(**(GOOD_APPLIED | override))


def test_parse_applied_of_a_file_that_names_no_writer():
    """An older host's file has no ``pid``: the writer is unknown, not gone."""
    back = parse_applied(b'{"version": 1, "spaces": {"a": {"state": "serving"}}, "refused": null}', path="x")
    assert back == AppliedReport(spaces={"a": LaneStatus(state="serving")}, refused=None, pid=None)


@pytest.mark.parametrize("data", [
    b"", b"[]", b'{"spaces": ["a"]}', b'{"spaces": {"a": {}}}', b'{"spaces": {"a": {"state": "odd"}}}',
    b'{"spaces": {}, "pid": -1}', b'{"spaces": {}, "pid": true}', b'{"spaces": {}, "refused": 3}',
    b"\xff", b"[" * 100_000,
])
def test_parse_applied_refuses_what_no_host_writes(data):
    with pytest.raises(ConfigError, match=r"^x\.applied is not a lane host's \.applied file - delete it; the host rewrites it$"):
        parse_applied(data, path="x.applied")


def test_host_gone_names_the_pid():
    assert host_gone(31337) == "no host running (the last host, pid 31337, is gone)"


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "1970-01-01T00:00:00Z"),
    (1795946400, "2026-11-29T10:00:00Z"),
    (1795946400.999, "2026-11-29T10:00:00Z"),
    (1795946399.999999, "2026-11-29T09:59:59Z"),
    (-1.5, "1969-12-31T23:59:58Z"),
])
def test_format_utc(seconds, text):
    assert format_utc(seconds) == text


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), 1e20, "0"])
def test_format_utc_refuses_a_non_time(seconds):
    with pytest.raises(ConfigError, match="format_utc"):
        format_utc(seconds)


# --- properties ---------------------------------------------------------------------------------

SPACE_NAMES = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
HOSTS = st.sampled_from(["auth.example", "10.0.0.7", "[::1]", "a-b.example.org"])


@st.composite
def entry_fields(draw: st.DrawFn, space: str, port: int | None) -> SpaceEntry:
    public = port is not None
    return SpaceEntry(
        space=space,
        exchange_public_port=port,
        exchange_public_url=draw(st.none() | HOSTS.map(lambda h: f"https://{h}/x")) if public else None,
        exchange_trusted_proxy=draw(st.booleans()) if public else False,
        advertised_server=draw(st.none() | st.builds("{}://{}:4222".format, st.sampled_from(["nats", "tls", "ws", "wss"]), HOSTS))
        if public else None,
        service_endpoints=draw(st.booleans()),
    )


@st.composite
def entry_lists(draw: st.DrawFn) -> list[SpaceEntry]:
    names = draw(st.lists(SPACE_NAMES, unique=True, max_size=8))
    ports = draw(st.lists(st.integers(1, 65535), unique=True, min_size=len(names), max_size=len(names)))
    public = draw(st.lists(st.booleans(), min_size=len(names), max_size=len(names)))
    return [draw(entry_fields(n, p if pub else None)) for n, p, pub in zip(names, ports, public, strict=True)]


@given(entry_lists())
def test_parse_of_render_round_trips(entries):
    data = render_manifest(entries)
    parsed = parse_manifest(data)
    assert parsed == Manifest(spaces=entries, sha256=hashlib.sha256(data).hexdigest())
    assert render_manifest(parsed.spaces) == data
    assert parse_manifest(data, callout_only=True).names == parsed.names


@given(entry_lists(), entry_lists())
def test_diff_partitions_the_union_of_spaces(old_entries, new_entries):
    old, new = manifest(*old_entries), manifest(*new_entries)
    result = diff(old, new)
    parts = (result.added, result.removed, result.changed, result.unchanged)
    flat = [space for part in parts for space in part]
    assert len(flat) == len(set(flat))
    assert set(flat) == set(old.names) | set(new.names)
    assert all(list(part) == sorted(part) for part in parts)
    assert set(result.added) == set(new.names) - set(old.names)
    assert all(old.entry(s) != new.entry(s) for s in result.changed)
    assert diff(new, new).unchanged == new.names


# --- replicas (issue 17 item 1) ------------------------------------------------------------------


def test_replicas_absent_is_one_and_one_is_not_rendered():
    manifest = parse_manifest(doc({"space": "a"}, {"space": "b", "replicas": 3}, {"space": "c", "replicas": 1}))
    assert [e.replicas for e in manifest.spaces] == [1, 3, 1]
    assert render_manifest(manifest.spaces) == (
        b'{\n  "spaces": [\n    {\n      "space": "a"\n    },\n    {\n      "replicas": 3,\n      "space": "b"\n'
        b'    },\n    {\n      "space": "c"\n    }\n  ],\n  "version": 2\n}\n'
    )


def test_a_changed_replica_count_restarts_that_lane_alone():
    old = parse_manifest(doc({"space": "a"}, {"space": "b"}))
    new = parse_manifest(doc({"space": "a", "replicas": 3}, {"space": "b"}))
    assert diff(old, new) == ManifestDiff(added=(), removed=(), changed=("a",), unchanged=("b",))


def test_a_space_entry_refuses_a_bad_count():
    with pytest.raises(ManifestRefused) as refused:
        SpaceEntry(space="a", replicas=9)
    assert refused.value.reasons == (f'space "a": replicas 9 is outside 1-5 - {REPLICAS_FIX}',)


def test_callout_only_ignores_replicas():
    assert parse_manifest(doc({"space": "a", "replicas": "x"}), callout_only=True).spaces == (SpaceEntry(space="a"),)
