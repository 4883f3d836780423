"""The two ways a template fails: when it is compiled, and when it runs on one event."""

from __future__ import annotations

__all__ = ["TemplateEvalError", "TemplateSyntaxError"]


class TemplateSyntaxError(ValueError):
    """The template source is not valid (or uses something unsupported); raised when compiling.

    ``position`` is the 0-based character offset of the problem, ``line`` and ``column`` are
    1-based; the message already names them.
    """

    def __init__(self, message: str, source: str = "", position: int = 0) -> None:
        self.position = position
        self.line = source.count("\n", 0, position) + 1
        self.column = position - (source.rfind("\n", 0, position) + 1) + 1
        self.reason = message
        super().__init__(f"table_name_template: line {self.line}, column {self.column}: {message}")


class TemplateEvalError(ValueError):
    """Running the template on one event failed; the event goes to ``events/failed``.

    ``action`` is the source of the action that failed (filled in once, innermost first).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.action: str | None = None

    def __str__(self) -> str:
        if self.action is None:
            return self.reason
        return f"executing table_name_template at <{self.action}>: {self.reason}"
