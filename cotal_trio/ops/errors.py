"""The CLI-side one-sentence error: a core refusal or a corrupt row, as a ConfigError.

Every ``cotal`` command answers a bad input with one sentence and exit 1 (cli/exits.py); the
core rules raise :class:`~cotal_trio.core.errors.Refused` or
:class:`~cotal_trio.core.errors.CodecError`, whose text is already that sentence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from cotal_trio.core.errors import CodecError, ConfigError, Refused, Unavailable, leaves

__all__ = ["as_config_error", "one_sentence"]


@contextlib.contextmanager
def as_config_error() -> Iterator[None]:
    """Turn a core refusal or a corrupt-row error into the CLI's one-sentence ConfigError.

    Raises:
        ConfigError: in place of a :class:`Refused` (its ``detail``) or a :class:`CodecError`
            (its text) raised in the block.
    """
    try:
        yield
    except Refused as exc:
        raise ConfigError(exc.detail) from None
    except CodecError as exc:
        raise ConfigError(str(exc)) from None


@contextlib.contextmanager
def one_sentence() -> Iterator[None]:
    """The loop's nursery wraps an error in a group: the first ConfigError or Unavailable goes out
    alone (the command prints one sentence).

    Raises:
        ConfigError, Unavailable: the first leaf of such a group raised in the block.
    """
    try:
        yield
    except* (ConfigError, Unavailable) as group:
        raise leaves(group)[0] from None
