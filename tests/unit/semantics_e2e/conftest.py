"""Fixtures of the semantics end-to-end tests; the brokers they start are described in e2e_brokers.py."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_brokers import SEMANTICS, SMALL_STORE


@pytest.fixture
def broker_defaults() -> tuple[dict[str, Any], dict[str, Any]]:
    """Overrides tests/unit/conftest.py's: its broker_factory, broker and endpoint start brokers configured so."""
    return SMALL_STORE, SEMANTICS
