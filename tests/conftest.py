"""Fixtures for every test folder; shared plain helpers are in helpers.py (``from helpers import ...``)."""

from __future__ import annotations

import uuid

import pytest

# Failed asserts inside the helper modules show their values too, as in test modules.
pytest.register_assert_rewrite("helpers", "harness")

from helpers import ENGINES  # noqa: E402 - after the rewrite is registered

# Programs and data, not tests: workers run under the launcher and stand-ins under rendered
# scripts (importing either would run it); fixtures and golden hold captured data and scripts.
collect_ignore = ["workers", "fixtures", "standins", "golden"]


@pytest.fixture
def tag() -> str:
    """A unique string to find a test's processes by."""
    return f"mldist-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs once per CPU engine."""
    return str(request.param)
