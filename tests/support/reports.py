"""Test reports that pytest-xdist can carry from a worker to the controller.

xdist sends every report (its captured stdout, stderr and log sections, a failure's message
and traceback, passed or not) to the controller as UTF-8. The fuzz tests feed the faces lone
surrogates on purpose (issue 15 item 6), and one in a captured log or a failure's message kills
the worker with a UnicodeEncodeError: the run ends in an INTERNALERROR with its tests unrun. So
every string of the serialized report is made encodable (a lone surrogate becomes its
``\\udXXX`` escape) before it leaves the worker.
"""

from __future__ import annotations

__all__ = ["transportable", "transportable_data"]


def transportable(text: str) -> str:
    """``text`` with every code point UTF-8 cannot encode (a lone surrogate) as a backslash
    escape; any other text is returned as it is (the same object)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def transportable_data(value: object) -> object:
    """``value`` (a serialized report: dicts, lists, tuples, strings, numbers) with every string
    in it, keys too, made :func:`transportable`; a new container where anything changed."""
    if isinstance(value, str):
        return transportable(value)
    if isinstance(value, dict):
        return {transportable_data(k): transportable_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(transportable_data(item) for item in value)
    return value
