"""Templates over the event for HTTP requests (the webhook's url, body and headers): the project's
safe Go-template engine (`steps.gotemplate`: no code, no attribute access, time linear in the
template's size), with bounds on the source and on what one event may make of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventspark.steps.gotemplate.compiler import Part, compile_parts
from eventspark.steps.gotemplate.errors import TemplateEvalError, TemplateSyntaxError

MAX_SOURCE_CHARS = 64 * 1024
"""Longest template source accepted."""


class TextTemplate:
    """A compiled template rendering text of at most `max_chars` characters per event."""

    __slots__ = ("_constant", "_parts", "max_chars", "source")

    def __init__(self, source: str, max_chars: int) -> None:
        if len(source) > MAX_SOURCE_CHARS:
            raise TemplateSyntaxError(f"template longer than {MAX_SOURCE_CHARS} characters", source, 0)
        self.source = source
        self.max_chars = max_chars
        parts = compile_parts(source)
        self._constant: str | None = None
        self._parts: tuple[tuple[bool, Part], ...] = ()
        if all(isinstance(part, str) for part in parts):
            self._constant = "".join(parts)  # type: ignore[arg-type]
        else:
            self._parts = tuple((isinstance(part, str), _callable(part)) for part in parts)

    @property
    def constant(self) -> str | None:
        """The output when the template has no actions, else None."""
        return self._constant

    def render(self, event: dict[str, Any], escape: Callable[[str], str] | None = None) -> str:
        """The template's output for `event`; TemplateEvalError when it fails or is too long.
        `escape` applies to what each action outputs (the event's values), not to the
        template's own text."""
        if self._constant is not None:
            return self._constant
        out: list[str] = []
        size = 0
        for literal, part in self._parts:
            text = part(event)
            if escape is not None and not literal:
                text = escape(text)
            size += len(text)
            if size > self.max_chars:
                raise TemplateEvalError(f"output longer than {self.max_chars} characters")
            out.append(text)
        return "".join(out)

    def __repr__(self) -> str:
        return f"TextTemplate({len(self.source)} characters)"  # the source may hold secrets


def _callable(part: str | Part) -> Part:
    if isinstance(part, str):
        return lambda event: part
    return part
