"""The shared test data: the `shared` folder beside the checkout (`../shared`: the EventNative
fixtures and vectors in `testdata/`, the specs, the emulators' notes), found from the repository
root so that the tests run wherever the checkout is."""

from __future__ import annotations

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
"""The checkout: the folder holding pyproject.toml and tests/."""


def shared_dir() -> Path:
    """`../shared` beside the checkout; a clear error naming the expected path when it is missing."""
    found = REPOSITORY.parent / "shared"
    if not (found / "testdata").is_dir():
        raise FileNotFoundError(
            f"the shared test data is missing: expected {found}/testdata beside the checkout {REPOSITORY} "
            "(the `shared` folder that comes with the project: put it there, or check the checkout out beside it)"
        )
    return found


def eventnative_data() -> Path:
    """`../shared/testdata/eventnative`: EventNative 1.41's fixtures and recorded vectors."""
    return shared_dir() / "testdata" / "eventnative"
