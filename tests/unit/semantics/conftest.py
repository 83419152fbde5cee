"""The ``box`` fixture: a StoreBox (store_box.py) per test, checked for consistency when the test ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from store_box import StoreBox


@pytest.fixture
def box(tmp_path: object) -> Iterator[StoreBox]:
    b = StoreBox(str(tmp_path))
    b.open()
    try:
        yield b
        assert b.store is not None
        assert b.store.wait_dispatched()
        assert b.store.check() == []
    finally:
        b.close()
