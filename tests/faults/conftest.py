"""The fault suite (docs/reliability.md): each test records its figure with the `figure` fixture;
the figures are printed together at the end of the run ("fault figures"), so that CI shows them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

_FIGURES: list[tuple[str, str]] = []


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """`figure("acknowledged 12,000, lost 0")`: one line for this test in the summary."""

    def record(text: str) -> None:
        _FIGURES.append((request.node.name, text))
        print(f"FIGURE {request.node.name}: {text}")

    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("fault figures")
    for name, text in _FIGURES:
        terminalreporter.write_line(f"{name}: {text}")
