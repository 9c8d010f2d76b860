"""Manager instances (core/managers.py): key, row codec, and selection with its exact sentences."""

from __future__ import annotations

import json

import pytest

from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.registration import RegistrationRequest
from cotal_trio.core.managers import (
    SHED_PINNED,
    SHED_UNPINNED,
    ManagerInstance,
    SelectionRefused,
    manager_key,
    owner_prefix,
    parse_manager_authority_body,
    parse_manager_row,
    render_manager_row,
    select_manager,
)

OWNER = "u_" + "a" * 26
OTHER = "u_" + "b" * 26
ID1, ID2, ID3 = "1" * 26, "2" * 30, "3" * 32
NOW = 1_767_225_600


def mgr(instance_id: str = ID1, owner: str = OWNER, **extra) -> ManagerInstance:
    fields = {"actor": "mgr", "serve_epoch": 1, "registered_at": NOW, "label": None} | extra
    return ManagerInstance(instance_id=instance_id, owner=owner, **fields)


ROW = mgr(label="build box")
STORED = (
    '{"ver":1,"instanceId":"%s","owner":"%s","actor":"mgr","serveEpoch":1,"registeredAt":%d,"label":"build box"}'
    % (ID1, OWNER, NOW)
).encode()


def test_key_and_owner_prefix():
    assert manager_key(OWNER, ID1) == f"mgr.{OWNER}.{ID1}" == ROW.key
    assert owner_prefix(OWNER) == f"mgr.{OWNER}."


@pytest.mark.parametrize(("owner", "instance_id"), [("alice", ID1), (OWNER, "A" * 26), (OWNER, "x" * 25), (OWNER, "x.y" * 10)])
def test_a_malformed_owner_or_id_makes_no_key(owner, instance_id):
    with pytest.raises(CodecError, match="^manager instance row: "):
        manager_key(owner, instance_id)


def test_the_row_is_compact_json_in_the_documented_order_and_round_trips():
    assert render_manager_row(ROW) == STORED
    assert parse_manager_row(STORED) == ROW
    unlabelled = mgr(ID3, serve_epoch=7)
    assert json.loads(render_manager_row(unlabelled))["label"] is None
    assert parse_manager_row(render_manager_row(unlabelled)) == unlabelled


def test_a_non_ascii_label_round_trips():
    row = mgr(label="Büro – Kasten")
    assert parse_manager_row(render_manager_row(row)).label == "Büro – Kasten"


def _with(**changes) -> bytes:
    obj = json.loads(STORED)
    for name, value in changes.items():
        if value is _DROP:
            del obj[name]
        else:
            obj[name] = value
    return json.dumps(obj).encode()


_DROP = object()


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\xff", "it is not UTF-8 JSON"),
        (b"not json", "it is not UTF-8 JSON"),
        (b"[]", "keys must be exactly ver, instanceId, owner, actor, serveEpoch, registeredAt, label"),
        (_with(label=_DROP), "keys must be exactly"),
        (_with(extra=1), "keys must be exactly"),
        (_with(ver=2), "ver 2 is not understood"),
        (_with(ver=True), "ver True is not understood"),
        (_with(instanceId="ABC" * 9), "instanceId is not a lifecycle token"),
        (_with(instanceId=7), "instanceId is not a lifecycle token"),
        (_with(owner="alice"), "owner is not a derived owner"),
        (_with(actor="a.b"), "actor is not an actor name"),
        (_with(serveEpoch=0), "serveEpoch must be an int >= 1"),
        (_with(serveEpoch=1.0), "serveEpoch must be an int >= 1"),
        (_with(serveEpoch=True), "serveEpoch must be an int >= 1"),
        (_with(registeredAt=-1), "registeredAt must be whole unix seconds"),
        (_with(registeredAt="now"), "registeredAt must be whole unix seconds"),
        (_with(label="x" * 129), "label must be printable text of at most 128 characters"),
        (_with(label="two\nlines"), "label must be printable text"),
        (_with(label=5), "label must be printable text"),
    ],
)
def test_malformed_rows_are_refused(data, problem):
    with pytest.raises(CodecError) as caught:
        parse_manager_row(data)
    assert str(caught.value).startswith(f"manager instance row: {problem}")


def test_a_label_of_128_characters_is_accepted():
    assert parse_manager_row(_with(label="x" * 128)).label == "x" * 128


# -- selection ---------------------------------------------------------------------------------

UNPINNED_NONE = (
    "no live manager instance is registered to you - register a running manager with"
    " `cotal manager register`, then exchange again"
)
PINNED_CHECK = "check that the pinned manager instance is live and registered to you: `cotal manager list`"


def refusal(instances, *, pinned=None, owner=OWNER) -> SelectionRefused:
    with pytest.raises(SelectionRefused) as caught:
        select_manager(instances, owner=owner, pinned=pinned)
    assert isinstance(caught.value, Refused) and caught.value.code is RefusalCode.NOT_GRANTED
    return caught.value


def test_authority_bodies_parse_to_their_request():
    register = {"idpToken": "jwt", "request": {"kind": "register", "actor": "mgr", "label": "build box"}}
    assert parse_manager_authority_body(register) == RegistrationRequest(
        idp_token="jwt", kind="register", actor="mgr", label="build box"
    )
    retire = {"idpToken": "jwt", "request": {"kind": "retire", "actor": "mgr", "instanceId": ID1}}
    assert parse_manager_authority_body(retire) == RegistrationRequest(
        idp_token="jwt", kind="retire", actor="mgr", instance_id=ID1
    )
    unlabelled = {"idpToken": "jwt", "request": {"kind": "register", "actor": "mgr", "label": None}}
    assert parse_manager_authority_body(unlabelled) == RegistrationRequest(idp_token="jwt", kind="register", actor="mgr")


@pytest.mark.parametrize(
    ("request_", "sentence"),
    [
        ({"kind": "register", "actor": "mgr", "endpoint": "search"},
         'request must be {"kind": "register", "actor": "<manager actor>", "label"?: "<text>"} or '
         '{"kind": "retire", "actor": "<manager actor>", "instanceId": "<id>"}'),
        ({"kind": "retire", "actor": "mgr"}, "instanceId must be the id the registration answered ([a-z0-9]{26,32})"),
        ({"kind": "register", "actor": "mgr", "label": "a\tb"}, "label must be printable text of at most 128 characters"),
    ],
)  # fmt: skip
def test_bad_authority_requests_are_refused_with_their_rule(request_, sentence):
    with pytest.raises(Refused) as info:
        parse_manager_authority_body({"idpToken": "jwt", "request": request_})
    assert (info.value.code, info.value.detail) == (RefusalCode.BAD_REQUEST, sentence)


def test_the_one_live_instance_is_chosen_unpinned():
    assert select_manager([mgr(ID2), mgr(ID1, OTHER)], owner=OWNER, pinned=None) == mgr(ID2)


def test_a_pinned_instance_of_the_caller_is_chosen_among_several():
    assert select_manager([mgr(ID1), mgr(ID2), mgr(ID3)], owner=OWNER, pinned=ID2) == mgr(ID2)


@pytest.mark.parametrize("instances", [[], [mgr(ID1, OTHER)]], ids=["empty", "only-other-owners"])
def test_no_live_instance(instances):
    refused = refusal(instances)
    assert (refused.detail, refused.pinned, refused.kind) == (UNPINNED_NONE, False, "none")


def test_ambiguous_lists_the_ids_sorted():
    refused = refusal([mgr(ID3), mgr(ID1), mgr(ID2), mgr("9" * 26, OTHER)])
    assert refused.detail == (
        f"3 live manager instances are registered to you ({ID1}, {ID2}, {ID3}), so none was chosen"
        " - pick one with --manager-instance <id> (`cotal manager list` shows them)"
    )
    assert (refused.pinned, refused.kind) == (False, "ambiguous")


def test_ambiguous_lists_at_most_five_ids_and_counts_the_rest():
    ids = [f"{n}" * 26 for n in range(7, 0, -1)]
    refused = refusal([mgr(i) for i in ids])
    listed = ", ".join(sorted(ids)[:5])
    assert refused.detail == (
        f"7 live manager instances are registered to you ({listed} and 2 more), so none was chosen"
        " - pick one with --manager-instance <id> (`cotal manager list` shows them)"
    )


@pytest.mark.parametrize(
    "instances", [[], [mgr(ID2)], [mgr(ID1, OTHER)]], ids=["none-live", "another-live", "other-owners"]
)
def test_pinned_not_live_or_not_yours(instances):
    refused = refusal(instances, pinned=ID1)
    assert refused.detail == f"manager instance {ID1} is not live or not registered to you - {PINNED_CHECK}"
    assert (refused.pinned, refused.kind) == (True, "pinned")


def test_a_malformed_pin_is_not_echoed():
    refused = refusal([mgr(ID1)], pinned="<script>")
    assert refused.detail == f"the pinned manager instance is not live or not registered to you - {PINNED_CHECK}"


def test_shed_sentences_name_each_class_remedy():
    assert SHED_UNPINNED == (
        "too many manager selections without a pinned instance were refused - wait a minute, then pick one with"
        " --manager-instance <id> (`cotal manager list` shows them), or register a running manager with"
        " `cotal manager register`"
    )
    assert SHED_PINNED == f"too many pinned manager selections were refused - wait a minute, and {PINNED_CHECK}"
