"""Parsers for the callout's ``auth callout:`` log lines, in the format spec "Callout deadlines" gives,
for the core, lane and store tests (written from the spec, not shared with the code under test)."""

from __future__ import annotations

import re

# One line: the fixed fields in the spec's order, then the outcome's own suffix.
_STEPS = ("queue", "verify", "ledger", "policy", "sign")
CALLOUT_LINE = re.compile(
    r"auth callout: level=(?P<level>info|warn) outcome=(?P<outcome>minted|denied|timeout|shed)"
    r" space=(?P<space>\S+) req=(?P<req>\S+) cid=(?P<cid>\d+)"
    r" owner=(?P<owner>\S+) actor=(?P<actor>\S+)"
    + "".join(rf" {step}_ms=(?P<{step}_ms>\d+)" for step in _STEPS)
    + r" total_ms=(?P<total_ms>\d+)"
    r'(?: reason="(?P<reason>(?:[^"\\]|\\.)*)"'
    r"| at=(?P<at>queue|verify|ledger|policy|sign)"
    r"| waited_ms=(?P<waited_ms>\d+) ahead=(?P<ahead>\d+))?"
)
DROPPED_LINE = re.compile(
    r'auth callout: level=warn outcome=dropped space=(?P<space>\S+) reason="(?P<reason>(?:[^"\\]|\\.)*)"'
)
_SUFFIX = {"minted": set(), "denied": {"reason"}, "timeout": {"at"}, "shed": {"waited_ms", "ahead"}}
_INTS = {"cid", "total_ms", "waited_ms", "ahead", *(f"{step}_ms" for step in _STEPS)}


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_callout_line(line: str) -> dict[str, object]:
    """Every field of one ``auth callout:`` line; ints as ints, the reason unescaped.

    Raises AssertionError when the line does not match the spec's format, or carries a suffix
    that belongs to another outcome.
    """
    match = CALLOUT_LINE.fullmatch(line)
    assert match is not None, f"not a callout line: {line!r}"
    fields = {k: v for k, v in match.groupdict().items() if v is not None}
    suffix = set(fields) & {"reason", "at", "waited_ms", "ahead"}
    assert suffix == _SUFFIX[fields["outcome"]], line
    if "reason" in fields:
        fields["reason"] = _unquote(fields["reason"])
    return {k: int(v) if k in _INTS else v for k, v in fields.items()}


def parse_dropped_line(line: str) -> dict[str, str]:
    """``space`` and the unescaped ``reason`` of an ``outcome=dropped`` line."""
    match = DROPPED_LINE.fullmatch(line)
    assert match is not None, f"not a dropped line: {line!r}"
    return {"space": match["space"], "reason": _unquote(match["reason"])}
