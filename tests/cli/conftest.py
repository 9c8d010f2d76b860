"""The CLI tests' fixtures: a provisioned root (tests/support/cli_root.py) and cotal's logger restored."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.support.cli_root import root  # noqa: F401  the provisioned root, for every CLI test


@pytest.fixture(autouse=True)
def restore_cotal_logger() -> Iterator[None]:
    """Undo ``main()``'s ``configure_logging`` (it stops ``cotal`` logs reaching caplog)."""
    logger = logging.getLogger("cotal")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    yield
    logger.handlers[:], logger.propagate = saved[0], saved[1]
    logger.setLevel(saved[2])  # setLevel clears logging's isEnabledFor caches; `.level =` does not
