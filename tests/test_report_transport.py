"""The suite's reports survive pytest-xdist's UTF-8 transport (tests/support/reports.py)."""

from __future__ import annotations

import execnet
import pytest

from tests.support.reports import transportable, transportable_data


def test_a_lone_surrogate_becomes_its_escape_and_the_rest_stays():
    assert transportable("GET /a\ud843b") == "GET /a\\ud843b"
    assert transportable("GET /a\ud843b").encode("utf-8") == b"GET /a\\ud843b"


def test_encodable_text_is_left_as_it_is():
    text = "space=a path=/ä\u2603 \\ud843 stays an escape already"
    assert transportable(text) is text


def test_every_string_of_a_nested_report_is_made_transportable():
    data = {"sections": [("Captured log call", "WARNING path=/\udfff")], "n": 3, "k\ud800": (None, "ok")}
    assert transportable_data(data) == {"sections": [("Captured log call", "WARNING path=/\\udfff")], "n": 3, "k\\ud800": (None, "ok")}


def test_a_failing_reports_message_with_a_lone_surrogate_can_be_sent(pytestconfig):
    """What the worker sends for a failure whose message holds one (the reviewer's case)."""
    try:
        raise AssertionError("subject x\ud800y")
    except AssertionError:
        info = pytest.ExceptionInfo.from_current()
    report = pytest.TestReport("t.py::t", ("t.py", 1, "t"), {}, "failed", info.getrepr(), "call")
    data = pytestconfig.hook.pytest_report_to_serializable(config=pytestconfig, report=report)
    with pytest.raises(execnet.DumpError):
        execnet.dumps(report._to_json())  # as pytest alone would serialize it
    assert b"subject x\\ud800y" in execnet.dumps(data)
