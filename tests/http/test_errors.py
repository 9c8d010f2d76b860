"""The one HTTP error edge (cotal_trio/http/errors.py): refusal codes to statuses, door fields."""

from __future__ import annotations

import pytest

from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.http.errors import REFUSAL_STATUS, answer_error


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (RefusalCode.BAD_REQUEST, 400), (RefusalCode.BAD_CAPABILITY, 401), (RefusalCode.BAD_CREDENTIAL, 401),
        (RefusalCode.NOT_GRANTED, 401), (RefusalCode.FORBIDDEN, 403), (RefusalCode.NOT_FOUND, 404),
        (RefusalCode.CONFLICT, 409), (RefusalCode.PRECONDITION_FAILED, 412), (RefusalCode.RATE_LIMITED, 429),
    ],
)  # fmt: skip
def test_every_refusal_code_has_its_status(code, status):
    assert REFUSAL_STATUS[code] == status
    assert answer_error(Refused(code, "a sentence - the fix"), unknown_path="x") == (
        {"error": "a sentence - the fix"}, status, {}
    )


def test_every_code_is_mapped():
    assert set(REFUSAL_STATUS) == set(RefusalCode)


def test_a_refusals_fields_join_the_body_and_cannot_replace_the_sentence():
    refusal = Refused(RefusalCode.CONFLICT, "lifecycle moved on - re-read the row", fields={"outcome": "not-executed", "error": "x"})
    body, status, _ = answer_error(refusal, unknown_path="x")
    assert (body, status) == ({"outcome": "not-executed", "error": "lifecycle moved on - re-read the row"}, 409)
