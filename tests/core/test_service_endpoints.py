"""Service endpoints (core/service_endpoints.py): the row, the doors' bodies and each decision
(spec "Listener policy", "Callout replicas"; docs/http-api.md "Service endpoints")."""

from __future__ import annotations

import pytest

from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.service_endpoints import (
    AUTHORITY_BODY,
    AUTHORITY_REQUEST,
    ENDPOINT_RULE,
    NOT_SERVING,
    SERVICE_ENDPOINT_SCOPE,
    AuthorityRequest,
    ServiceEndpointRecord,
    decide_registration,
    decide_retirement,
    decide_service_connect,
    decide_service_host,
    parse_authority_body,
    parse_service_row,
    record_key,
    render_service_row,
)
from cotal_trio.core.views import ServiceEndpointBinding

OWNER, OTHER = "u_" + "a" * 26, "u_" + "b" * 26
ID1, ID2 = "1" * 26, "2" * 28
NOW = 1_767_225_600
SCOPE = (SERVICE_ENDPOINT_SCOPE,)


def record(**extra) -> ServiceEndpointRecord:
    fields = {
        "endpoint": "search", "instance_id": ID1, "owner": OWNER, "actor": "svc", "serve_epoch": 1,
        "registered_at": NOW, "label": None,
    } | extra  # fmt: skip
    return ServiceEndpointRecord(**fields)


def register(endpoint: str = "search", label: str | None = None) -> AuthorityRequest:
    return AuthorityRequest(idp_token="jwt", kind="register", actor="svc", endpoint=endpoint, label=label)


def retire(instance_id: str = ID1) -> AuthorityRequest:
    return AuthorityRequest(idp_token="jwt", kind="retire", actor="svc", endpoint="search", instance_id=instance_id)


def test_the_row_round_trips_in_its_documented_order():
    stored = render_service_row(record(label="index"))
    assert stored == (
        b'{"ver":1,"endpoint":"search","instanceId":"%s","owner":"%s","actor":"svc","serveEpoch":1,'
        b'"registeredAt":%d,"label":"index"}' % (ID1.encode(), OWNER.encode(), NOW)
    )
    assert parse_service_row(stored) == record(label="index")
    assert record().key == record_key("search") == "svcep.search"


@pytest.mark.parametrize(
    "stored",
    [b"not json", b'{"ver":2}', render_service_row(record()).replace(b'"serveEpoch":1', b'"serveEpoch":0')],
)
def test_a_bad_row_is_a_codec_error(stored):
    with pytest.raises(CodecError):
        parse_service_row(stored)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"endpoint": "v1", "instance_id": 7}, ENDPOINT_RULE),
        ({"instance_id": "ABC" * 9}, "instanceId is not a lifecycle token ([a-z0-9]{26,32})"),
        ({"owner": "alice"}, "owner is not a derived owner"),
        ({"actor": "a.b"}, "actor is not an actor name"),
        ({"serve_epoch": True}, "serveEpoch must be an int >= 1"),
        ({"registered_at": 1.5}, "registeredAt must be whole unix seconds"),
        ({"label": "x" * 129}, "label must be printable text of at most 128 characters"),
        ({"label": "two\nlines"}, "label must be printable text of at most 128 characters"),
    ],
)
def test_each_broken_field_of_a_record_is_named_with_the_row(fields, problem):
    with pytest.raises(CodecError) as caught:
        record(**fields)
    assert str(caught.value) == f"service endpoint row: {problem}"


@pytest.mark.parametrize("name", ["v1", "", "a.b", "*", "x" * 65])
def test_an_endpoint_name_that_would_widen_a_subject_or_take_the_issued_rail_is_refused(name):
    with pytest.raises(Refused) as info:
        record_key(name)
    assert info.value.code is RefusalCode.BAD_REQUEST
    with pytest.raises(CodecError):
        record(endpoint=name)


def test_authority_bodies_parse():
    assert parse_authority_body(
        {"idpToken": "jwt", "request": {"kind": "register", "actor": "svc", "endpoint": "search", "label": "index"}}
    ) == register(label="index")
    assert parse_authority_body(
        {"idpToken": "jwt", "request": {"kind": "retire", "actor": "svc", "endpoint": "search", "instanceId": ID1}}
    ) == retire()


def test_a_null_label_is_no_label():
    assert parse_authority_body(
        {"idpToken": "jwt", "request": {"kind": "register", "actor": "svc", "endpoint": "search", "label": None}}
    ) == register()


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        ([], AUTHORITY_BODY),
        ({"idpToken": "jwt"}, AUTHORITY_BODY),
        ({"idpToken": "jwt", "request": {}, "actor": "svc"}, AUTHORITY_BODY),
        ({"idpToken": 1, "request": {}}, AUTHORITY_BODY),
        ({"idpToken": "jwt", "request": []}, AUTHORITY_REQUEST),
        ({"idpToken": "jwt", "request": {"kind": "list"}}, AUTHORITY_REQUEST),
        ({"idpToken": "jwt", "request": {"kind": "register", "actor": "svc"}}, AUTHORITY_REQUEST),
        ({"idpToken": "jwt", "request": {"kind": "register", "actor": "svc", "endpoint": "e", "instanceId": ID1}},
         AUTHORITY_REQUEST),
        ({"idpToken": "jwt", "request": {"kind": "retire", "actor": "svc", "endpoint": "e", "label": "x"}},
         AUTHORITY_REQUEST),
        ({"idpToken": "jwt", "request": {"kind": "register", "actor": "svc", "endpoint": "v1"}},
         "endpoint must be 1 to 64 characters"),
        ({"idpToken": "jwt", "request": {"kind": "retire", "actor": "svc", "endpoint": "e", "instanceId": "NOPE"}},
         "instanceId must be the id the registration answered"),
        ({"idpToken": "jwt", "request": {"kind": "register", "actor": "svc", "endpoint": "e", "label": "a\nb"}},
         "label must be printable text"),
    ],
)  # fmt: skip
def test_bad_authority_bodies_are_400_with_the_rule(body, sentence):
    with pytest.raises(Refused) as info:
        parse_authority_body(body)
    assert info.value.code is RefusalCode.BAD_REQUEST
    assert info.value.detail.startswith(sentence)


def test_a_free_name_is_registered_at_epoch_1():
    made = decide_registration(OWNER, "svc", SCOPE, register(label="index"), None, instance_id=ID1, now=NOW)
    assert made == record(label="index")


def test_the_same_principal_takes_its_name_back_with_the_next_epoch():
    made = decide_registration(OWNER, "svc", SCOPE, register(), record(serve_epoch=3), instance_id=ID2, now=NOW + 5)
    assert (made.instance_id, made.serve_epoch, made.registered_at) == (ID2, 4, NOW + 5)


@pytest.mark.parametrize("holder", [record(owner=OTHER), record(actor="other")])
def test_a_name_registered_to_another_principal_is_a_conflict(holder):
    with pytest.raises(Refused) as info:
        decide_registration(OWNER, "svc", SCOPE, register(), holder, instance_id=ID2, now=NOW)
    assert info.value.code is RefusalCode.CONFLICT
    assert "registered to another principal" in info.value.detail


def test_every_door_needs_the_scope_and_names_the_grant():
    grant = f"`cotal actor grant svc --owner {OWNER} --scope service-endpoint`"
    binding = ServiceEndpointBinding(endpoint="search", instance_id=ID1)
    for decide in (
        lambda: decide_registration(OWNER, "svc", ("spawn",), register(), None, instance_id=ID1, now=NOW),
        lambda: decide_retirement(OWNER, "svc", ("spawn",), retire(), record()),
        lambda: decide_service_host(OWNER, "svc", (), binding, record()),
    ):
        with pytest.raises(Refused) as info:
            decide()
        assert info.value.code is RefusalCode.FORBIDDEN
        assert grant in info.value.detail


def test_retirement_names_the_one_registration_it_deletes():
    assert decide_retirement(OWNER, "svc", SCOPE, retire(), record()) == record()
    for existing in (None, record(instance_id=ID2), record(owner=OTHER), record(actor="other")):
        with pytest.raises(Refused) as info:
            decide_retirement(OWNER, "svc", SCOPE, retire(), existing)
        assert info.value.code is RefusalCode.NOT_FOUND


def test_a_host_bearer_is_only_for_the_live_registration_of_its_principal():
    binding = ServiceEndpointBinding(endpoint="search", instance_id=ID1)
    assert decide_service_host(OWNER, "svc", SCOPE, binding, record()) == record()
    for existing in (None, record(instance_id=ID2), record(owner=OTHER), record(actor="other")):
        with pytest.raises(Refused) as info:
            decide_service_host(OWNER, "svc", SCOPE, binding, existing)
        assert info.value.code is RefusalCode.NOT_FOUND


def test_the_callout_admits_a_host_only_while_serving_and_registered():
    binding = ServiceEndpointBinding(endpoint="search", instance_id=ID1)
    decide_service_connect(OWNER, "svc", binding, record(), serving=True)  # admitted: no refusal
    with pytest.raises(Refused) as info:
        decide_service_connect(OWNER, "svc", binding, record(), serving=False)
    assert (info.value.code, info.value.detail) == (RefusalCode.NOT_GRANTED, NOT_SERVING)
    for existing in (None, record(instance_id=ID2), record(owner=OTHER), record(actor="other")):
        with pytest.raises(Refused) as info:
            decide_service_connect(OWNER, "svc", binding, existing, serving=True)
        assert info.value.code is RefusalCode.NOT_GRANTED
        assert "no longer registered to this principal" in info.value.detail
    with pytest.raises(Refused):
        decide_service_connect(OWNER, "svc", None, record(), serving=True)
