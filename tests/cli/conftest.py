"""The CLI tests' fixtures: a provisioned root and cotal's logger restored (tests/support/cli_root.py)."""

from tests.support.cli_root import restore_cotal_logger, root  # noqa: F401  for every CLI test
