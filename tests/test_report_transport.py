"""The suite's reports survive pytest-xdist's UTF-8 transport (tests/support/reports.py)."""

from __future__ import annotations

from tests.support.reports import transportable, transportable_sections


def test_a_lone_surrogate_becomes_its_escape_and_the_rest_stays():
    assert transportable("GET /a\ud843b") == "GET /a\\ud843b"
    assert transportable("GET /a\ud843b").encode("utf-8") == b"GET /a\\ud843b"


def test_encodable_text_is_left_as_it_is():
    text = "space=a path=/ä\u2603 \\ud843 stays an escape already"
    assert transportable(text) is text


def test_every_section_title_and_content_is_made_transportable():
    sections = [("Captured log call", "WARNING path=/\udfff"), ("Captured stdout call", "ok")]
    assert transportable_sections(sections) == [("Captured log call", "WARNING path=/\\udfff"), ("Captured stdout call", "ok")]
