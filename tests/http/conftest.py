from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.http.recorder import Recorder


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    """A recording HTTP server on a free port, for one test."""
    server = Recorder().start()
    try:
        yield server
    finally:
        server.stop()
