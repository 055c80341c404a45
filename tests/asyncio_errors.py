"""Fail the test during which asyncio logs an error.

Some asyncio defects never become a warning, so ``filterwarnings = ["error"]``
cannot see them: a task whose exception nobody retrieved, a task destroyed
while still pending, an exception escaping a callback. asyncio only logs them,
at ERROR, to its own logger, usually when the garbage collector or the closing
of the loop finds the task. They are the asyncio twins of an unclosed socket,
and are treated the same way: the phase (setup, call or teardown) in which one
is logged fails with the message.

Like an unraisable warning, the report lands in the test that was running when
the task was found, which may be a later one than the test that dropped it.
"""

from __future__ import annotations

import logging
from collections.abc import Generator

import pytest


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_RECORDER = _Recorder()


def pytest_configure(config: pytest.Config) -> None:
    logging.getLogger("asyncio").addHandler(_RECORDER)


def pytest_unconfigure(config: pytest.Config) -> None:
    logging.getLogger("asyncio").removeHandler(_RECORDER)


def _fail_on_logged_errors() -> None:
    records, _RECORDER.records = _RECORDER.records, []
    if records:
        text = "\n".join(_RECORDER.format(r) for r in records)
        pytest.fail(f"asyncio logged {len(records)} error(s) no code handled:\n{text}",
                    pytrace=False)


def _checked() -> Generator[None, object, object]:
    result = yield
    _fail_on_logged_errors()
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _checked())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _checked())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, object, object]:
    return (yield from _checked())
