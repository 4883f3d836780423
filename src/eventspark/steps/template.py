"""The ``table_name_template`` step: which table an event goes to in one destination.

A template is Go ``text/template`` source, as in EventNative:
``{{.event_type}}_{{._timestamp.Format "2006_01"}}``. It is compiled once (``compile_template``)
by a safe interpreter of the subset EventNative users rely on (see ``gotemplate``): text and
``{{ }}`` actions with ``{{-``/``-}}`` trimming and ``{{/* comments */}}``; fields ``.a.b``,
``.`` and ``$`` (the event); ``if``/``else if``/``else``/``end``; the functions ``eq ne lt le
gt ge and or not index len print printf`` and EventNative's ``json`` (a value as JSON); pipes
``|`` and parentheses; ``.Format LAYOUT`` on a timestamp. There are no variables, ``range``,
``with``, ``define`` or ``template``, so running a template takes time linear in its size. Event
data is only read with ``dict.get`` and list indexing: a template cannot reach Python attributes
or run code (``{{.__class__}}`` is just a missing key).

``render`` then makes a table name the way EventNative did: trimmed, lower-cased, with
``( ) $ [ ] { } @ ! # % & , . ; : ^ -`` and spaces turned into ``_``. eventspark goes further so
that a name can never carry quotes, slashes or control characters: whitespace becomes ``_``,
control and format characters are dropped, and every other character that is not ``a-z``,
``0-9``, ``_`` or a Unicode letter or digit (kept, NFC-normalised, so that non-English event
types still get distinct tables) becomes ``_``. An empty name means: skip the event for this
destination. Truncating to a warehouse's identifier length is the destination's job.

Differences from Go worth knowing: a missing key and a JSON null both print ``null`` (Go
prints ``<no value>``, which EventNative replaced by ``null``); ``.a.b`` on a null ``.a`` is
``null``, not an error; ``.Format`` works on RFC 3339 strings (event timestamps are strings
here, they were ``time.Time`` in EventNative) and on a missing ``_timestamp`` it is an error,
as in EventNative; ints and floats compare with each other; ``nil`` may be an argument
(``eq .a nil``).
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Any

from .gotemplate.compiler import Part, compile_parts
from .gotemplate.errors import TemplateEvalError, TemplateSyntaxError

__all__ = [
    "MAX_OUTPUT_CHARS",
    "MAX_SOURCE_CHARS",
    "TableNameTemplate",
    "TemplateEvalError",
    "TemplateSyntaxError",
    "clean_table_name",
    "compile_template",
    "is_reserved_table",
]

MAX_SOURCE_CHARS = 4096
"""Longest template source accepted."""
MAX_OUTPUT_CHARS = 1024
"""Longest text a template may produce for one event (before clean-up); longer is an error."""

_NAME_CACHE_SIZE = 4096
_NAME_CACHE_MAX_KEY = 256  # long outputs are rare; keeping them out bounds the cache's memory
# EventNative's replacements, and every other ASCII character that is not [a-z0-9_]:
# whitespace and punctuation become "_", control characters are dropped.
_ASCII_NAME = {
    code: (
        None
        if (code < 0x20 or code == 0x7F) and chr(code) not in "\t\n\v\f\r"
        else chr(code)
        if chr(code).isalnum() or code == ord("_")
        else "_"
    )
    for code in range(128)
}


def _clean_char(ch: str) -> str:
    if ch.isascii():
        return ch.translate(_ASCII_NAME)
    if ch.isalpha() or ch.isdecimal():
        return ch
    if ch.isspace():
        return "_"
    # control, format (bidi overrides, zero-width), surrogate, private and unassigned: drop
    return "" if unicodedata.category(ch)[0] == "C" else "_"


LOADS_TABLE = "_eventspark_loads"
"""eventspark's own table in each destination schema: one row per (destination, log, table) loaded."""
STAGE_PREFIX = "_es_stage_"
"""Names of eventspark's staging tables begin with this."""


def is_reserved_table(name: str) -> bool:
    """True for the names of eventspark's own tables, which events cannot write into."""
    return name == LOADS_TABLE or name.startswith(STAGE_PREFIX)


def clean_table_name(raw: str) -> str:
    """Turn template output into a table name ("" = skip); see the module docstring."""
    name = raw.strip().lower()
    if name.isascii():
        return name.translate(_ASCII_NAME)
    name = unicodedata.normalize("NFC", name)
    return "".join([_clean_char(ch) for ch in name])


class TableNameTemplate:
    """A compiled ``table_name_template``. Immutable and thread-safe; pickles as its source."""

    __slots__ = ("_constant_name", "_constant_raw", "_names", "_parts", "source")

    def __init__(self, source: str, parts: list[str | Part]) -> None:
        """Use ``compile_template``; ``parts`` is the compiler's output for ``source``."""
        self.source = source
        self._constant_raw: str | None = None
        self._constant_name: str | None = None
        self._parts: tuple[Part, ...] = ()
        self._names: dict[str, str] = {}  # raw output -> cleaned name, bounded
        if all(isinstance(part, str) for part in parts):
            self._constant_raw = "".join(parts)  # type: ignore[arg-type]
            self._constant_name = clean_table_name(self._constant_raw)
        else:
            self._parts = tuple(_as_callable(part) for part in parts)

    @property
    def constant_name(self) -> str | None:
        """The table name when the template has no actions (same for every event), else None."""
        return self._constant_name

    def render_raw(self, event: dict[str, Any]) -> str:
        """The template's output for ``event``, before clean-up; TemplateEvalError on failure."""
        if self._constant_raw is not None:
            return self._constant_raw
        parts = self._parts
        out = parts[0](event) if len(parts) == 1 else "".join([part(event) for part in parts])
        if len(out) > MAX_OUTPUT_CHARS:
            raise TemplateEvalError(f"table name template output longer than {MAX_OUTPUT_CHARS} characters")
        return out

    def render(self, event: dict[str, Any]) -> str:
        """The table name for ``event``; "" means skip it; TemplateEvalError means send it to failed."""
        if self._constant_name is not None:
            return self._constant_name
        raw = self.render_raw(event)
        name = self._names.get(raw)
        if name is None:
            name = clean_table_name(raw)
            if len(raw) <= _NAME_CACHE_MAX_KEY:
                if len(self._names) >= _NAME_CACHE_SIZE:
                    self._names.clear()
                self._names[raw] = name
        return name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # closures do not pickle; Spark ships templates to executors, which recompile them
        return compile_template, (self.source,)

    def __repr__(self) -> str:
        return f"TableNameTemplate({self.source!r})"


def _as_callable(part: str | Part) -> Part:
    if isinstance(part, str):
        return lambda event: part
    return part


def compile_template(source: str) -> TableNameTemplate:
    """Parse ``source`` once; TemplateSyntaxError (naming line and column) when it is invalid.

    Compiled templates are cached by source, so executors that rebuild their steps per
    partition (or unpickle templates) do not parse again.
    """
    if not isinstance(source, str):
        raise TemplateSyntaxError(f"template must be a string, not {type(source).__name__}")
    if len(source) > MAX_SOURCE_CHARS:
        raise TemplateSyntaxError(f"template longer than {MAX_SOURCE_CHARS} characters", source, 0)
    return _compile_cached(source)


@lru_cache(maxsize=128)
def _compile_cached(source: str) -> TableNameTemplate:
    return TableNameTemplate(source, compile_parts(source))
