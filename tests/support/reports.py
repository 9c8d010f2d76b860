"""Test reports that pytest-xdist can carry from a worker to the controller.

xdist sends every report (its captured stdout, stderr and log sections included, passed or
not) to the controller as UTF-8. The fuzz tests feed the faces lone surrogates on purpose
(issue 15 item 6), and a face that logs such a key of an exchange body leaves one in the captured
log: the worker then dies of a UnicodeEncodeError and the run ends in an INTERNALERROR with
its tests unrun. So the captured text is made encodable (a lone surrogate becomes its
``\\udXXX`` escape) before the report leaves the worker.
"""

from __future__ import annotations

__all__ = ["transportable", "transportable_sections"]


def transportable(text: str) -> str:
    """``text`` with every code point UTF-8 cannot encode (a lone surrogate) as a backslash
    escape; any other text is returned as it is (the same object)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def transportable_sections(sections: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A report's ``(title, content)`` sections, each made :func:`transportable`."""
    return [(transportable(title), transportable(content)) for title, content in sections]
