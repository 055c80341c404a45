"""Shared by the whole suite: the Postgres DSN, no silent skips in CI, and no
asyncio error that only reached a log (tests/asyncio_errors.py).

Tests that need PostgreSQL read its DSN from LLMGW_TEST_POSTGRES and skip when
it is unset, so the suite runs on a laptop without one. CI sets
LLMGW_TEST_REQUIRE_ALL, which turns such a skip into a failure: a Postgres test
that quietly did not run is a Postgres adapter nobody tested. The outside
programs some tests drive (``promtool``, ``openssl``) are found with
``require_tool``, which skips the same way and fails the same way in CI.

What llmgw keeps on a host for a database server's database (the gateway's
journal, ``Store.state_dir``) goes under ``$XDG_STATE_HOME``: a directory of the
session's own, removed at its end, so no test writes to the home directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator

import pytest

pytest_plugins = ["tests.asyncio_errors"]

POSTGRES_ENV = "LLMGW_TEST_POSTGRES"
_STATE_HOME = tempfile.TemporaryDirectory(prefix="llmgw-test-state-")


def pytest_configure(config: pytest.Config) -> None:
    # Child processes (gateways the tests start) inherit it.
    os.environ["XDG_STATE_HOME"] = _STATE_HOME.name


def pytest_unconfigure(config: pytest.Config) -> None:
    _STATE_HOME.cleanup()


@pytest.fixture
def postgres_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set")
    return url


def require_tool(name: str, install: str) -> str:
    """The path of program ``name``; skip without it, or fail where every test must run."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed; {install}"
        if os.environ.get("LLMGW_TEST_REQUIRE_ALL"):
            pytest.fail(f"{message} (LLMGW_TEST_REQUIRE_ALL is set: every test must run)")
        pytest.skip(message)
    return path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and os.environ.get("LLMGW_TEST_REQUIRE_ALL"):
        reason = str(report.longrepr)
        if POSTGRES_ENV in reason:
            report.outcome = "failed"
            report.longrepr = f"skipped in CI, where every test must run: {reason}"
    return report
