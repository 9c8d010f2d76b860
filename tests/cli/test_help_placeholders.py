"""Placeholders such as ``<root>`` in the CLI's help survive both renderings of it.

cyclopts renders every help text as Markdown: in the terminal (``--help``) and in docs/cli.md
(which GitHub renders). A bare ``<root>/ops/<port>.json`` is an HTML tag there and vanishes
(``cotal up --help`` printed "its capability is in /ops/.json"), so a placeholder belongs in a
code span. The reference is generated from the same texts (:func:`cotal_trio.cli.reference.render`).
"""

from __future__ import annotations

import re

from cotal_trio.cli import main
from cotal_trio.cli.reference import render


def _bare_placeholders(markdown: str) -> list[str]:
    """Lines of ``markdown`` outside code blocks with a ``<word`` that is not in a code span."""
    found, in_block = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        if not in_block and re.search(r"<[A-Za-z/]", re.sub(r"`[^`]*`", "", line)):
            found.append(line)
    return found


def test_no_help_text_has_a_placeholder_outside_a_code_span():
    assert _bare_placeholders(render()) == []


def test_up_help_names_the_operator_face_file(capsys):
    assert main(["up", "--help"]) == 0
    out = re.sub(r"[\s│]+", " ", capsys.readouterr().out)
    assert "<root>/ops/<port>.json" in out
