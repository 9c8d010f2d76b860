"""The service's log lines: one line each, whatever a client put in them.

Messages carry text clients chose (an exchange body's unknown keys, names and subjects a
refusal quotes). A newline in it would let a client write a line of its own into the operator's
log, one a ``grep outcome=minted`` would count, and an escape sequence could rewrite a
terminal. So a message's unprintable characters (``str.isprintable``: controls, line separators,
format characters such as zero-width joiners and bidi overrides, lone surrogates) are written as
their Python escapes (``\\n``, ``\\x1b``, ``\\ud808``). The traceback the formatter adds after a
message is written as Python formats it, lines and all: this escapes the message, not the
exception text of a traceback.
"""

from __future__ import annotations

import logging

__all__ = ["OneLineFormatter", "one_line"]


def one_line(text: str) -> str:
    """``text`` with every character that ``str.isprintable`` refuses (controls, line and
    paragraph separators, lone surrogates; a space is printable) as its escape, the same
    object when there is none. Linear in ``len(text)``; the common case is one C-level scan."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


class OneLineFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose message part is :func:`one_line`."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return one_line(super().formatMessage(record))
