"""The provisioning tests' fixtures: a root under ``tmp_path`` and a real operator-mode broker."""

from tests.support.brokers import operator_broker, provisioned  # noqa: F401  (defined in tests/support/brokers.py)
