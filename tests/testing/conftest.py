"""A running FakeNomad with the default fleet, and an HTTP client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from llmgw.testing import FakeNomad


@pytest.fixture
def nomad() -> Iterator[FakeNomad]:
    with FakeNomad() as fake:
        yield fake


@pytest.fixture
def http(nomad: FakeNomad) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=nomad.address, timeout=30) as client:
        yield client
