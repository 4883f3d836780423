"""Split a template into tokens, following Go's ``text/template/parse`` lexer.

Text outside ``{{ }}`` becomes one ``text`` token (already trimmed by ``{{-`` / ``-}}``
markers); comments ``{{/* */}}`` vanish. Inside an action the tokens are ``field`` (``.name``,
value the name), ``dot``, ``var`` (``$`` or ``$name``), ``ident`` (functions, keywords,
``true``/``false``/``nil``), ``string``, ``number`` (int or float), ``lparen``, ``rparen`` and
``pipe``, between ``left`` and ``right``. Tokens carry their start and end offsets so that the
parser can tell ``.a.b`` (one chain) from ``.a .b`` (two operands).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .errors import TemplateSyntaxError

__all__ = ["Token", "tokenize"]

_SPACE = " \t\r\n"  # Go's isSpace: the characters a trim marker removes
_SPACE_CHARS = frozenset(_SPACE)
_TERMINATORS = _SPACE + ".,|:()"
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
_PUNCTUATION = {"(": "lparen", ")": "rparen", "|": "pipe"}


class Token(NamedTuple):
    kind: str
    value: Any
    start: int
    end: int


def tokenize(source: str) -> list[Token]:
    """All tokens of ``source``; raises TemplateSyntaxError with the offending position."""
    return _Lexer(source).run()


def _is_ident_char(ch: str) -> bool:
    return ch == "_" or ch.isalpha() or ch.isdecimal()


class _Lexer:
    def __init__(self, source: str) -> None:
        self.src = source
        self.pos = 0
        self.tokens: list[Token] = []
        self.trim_text_start = False  # the previous action ended with ``-}}``

    def error(self, message: str, position: int) -> TemplateSyntaxError:
        return TemplateSyntaxError(message, self.src, position)

    def run(self) -> list[Token]:
        src = self.src
        while self.pos < len(src):
            left = src.find("{{", self.pos)
            end = len(src) if left < 0 else left
            trim_left = left >= 0 and src.startswith("{{-", left) and src[left + 3 : left + 4] in _SPACE_CHARS
            self.add_text(self.pos, end, trim_end=trim_left)
            if left < 0:
                break
            self.pos = left + (4 if trim_left else 2)
            self.lex_action(left)
        return self.tokens

    def add_text(self, start: int, end: int, trim_end: bool) -> None:
        text = self.src[start:end]
        if self.trim_text_start:
            text = text.lstrip(_SPACE)
        if trim_end:
            text = text.rstrip(_SPACE)
        if text:
            self.tokens.append(Token("text", text, start, end))

    def close_at(self, pos: int) -> int:
        """Length of the closing delimiter at ``pos`` (``}}`` or `` -}}``), 0 if none."""
        if self.src.startswith("}}", pos):
            return 2
        if self.src[pos : pos + 1] in _SPACE_CHARS and self.src.startswith("-}}", pos + 1):
            return 4
        return 0

    def lex_action(self, left: int) -> None:
        if self.src.startswith("/*", self.pos):
            self.lex_comment(left)
            return
        self.tokens.append(Token("left", None, left, self.pos))
        while True:
            self.skip_spaces()
            if self.pos >= len(self.src):
                raise self.error("unclosed action", left)
            closing = self.close_at(self.pos)
            if closing:
                self.trim_text_start = closing == 4
                self.tokens.append(Token("right", None, self.pos, self.pos + closing))
                self.pos += closing
                return
            self.lex_item()

    def skip_spaces(self) -> None:
        src = self.src
        while self.pos < len(src) and src[self.pos] in _SPACE and not self.close_at(self.pos):
            self.pos += 1

    def lex_comment(self, left: int) -> None:
        end = self.src.find("*/", self.pos + 2)
        if end < 0:
            raise self.error("unclosed comment", left)
        closing = self.close_at(end + 2)
        if not closing:
            raise self.error("comment ends before closing delimiter", end)
        self.trim_text_start = closing == 4
        self.pos = end + 2 + closing

    def lex_item(self) -> None:
        src, start = self.src, self.pos
        ch = src[start]
        nxt = src[start + 1 : start + 2]
        if ch in _PUNCTUATION:
            self.emit(_PUNCTUATION[ch], ch, start + 1)
        elif ch == '"' or ch == "'":
            value, end = self.scan_quoted(start, ch)
            self.emit("string" if ch == '"' else "number", value, end)
        elif ch == "`":
            end = src.find("`", start + 1)
            if end < 0:
                raise self.error("unterminated raw quoted string", start)
            self.emit("string", src[start + 1 : end].replace("\r", ""), end + 1)
        elif ch == "." and not nxt.isdecimal():
            self.lex_word(start + 1, "field" if nxt and _is_ident_char(nxt) else "dot")
        elif ch == "$":
            self.lex_word(start + 1, "var")
        elif ch in "+-." or ch.isdecimal():
            self.lex_number(start)
        elif ch == "_" or ch.isalpha():
            self.lex_word(start, "ident")
        elif ch == ":" or ch == "=":
            raise self.error("variable declarations are not supported", start)
        else:
            raise self.error(f"unexpected {ch!r} in action", start)

    def emit(self, kind: str, value: Any, end: int) -> None:
        self.tokens.append(Token(kind, value, self.pos, end))
        self.pos = end

    def lex_word(self, name_start: int, kind: str) -> None:
        src, end = self.src, name_start
        while end < len(src) and _is_ident_char(src[end]):
            end += 1
        if end < len(src) and src[end] not in _TERMINATORS and not src.startswith("}}", end):
            raise self.error(f"bad character {src[end]!r}", end)
        value = "" if kind == "dot" else src[name_start:end]
        if kind == "var":
            value = "$" + value
        self.emit(kind, value, end)

    def lex_number(self, start: int) -> None:
        src, end = self.src, start
        while end < len(src) and (_is_ident_char(src[end]) or src[end] in ".+-"):
            # a sign is part of the number only at the start or right after an exponent
            if src[end] in "+-" and end > start and src[end - 1] not in "eE":
                break
            end += 1
        text = src[start:end]
        value = _number_value(text)
        if value is None:
            raise self.error(f"bad number syntax: {text!r}", start)
        self.emit("number", value, end)

    def scan_quoted(self, start: int, quote: str) -> tuple[Any, int]:
        """A Go interpreted string ("...") or rune ('x'); returns (value, end offset)."""
        src, pos, out = self.src, start + 1, []
        while True:
            if pos >= len(src) or src[pos] == "\n":
                raise self.error("unterminated quoted string", start)
            ch = src[pos]
            if ch == quote:
                break
            if ch == "\\":
                decoded, pos = self.scan_escape(pos, quote)
                out.append(decoded)
            else:
                out.append(ch)
                pos += 1
        text = "".join(out)
        if quote == "'":
            if len(text) != 1:
                raise self.error("malformed character constant", start)
            return ord(text), pos + 1
        return text, pos + 1

    def scan_escape(self, pos: int, quote: str) -> tuple[str, int]:
        src = self.src
        kind = src[pos + 1 : pos + 2]
        if kind in _SIMPLE_ESCAPES or kind == quote:
            return _SIMPLE_ESCAPES.get(kind, quote), pos + 2
        digits = {"x": 2, "u": 4, "U": 8}.get(kind)
        base = 16
        if digits is None and kind in "01234567" and kind:
            digits, base, pos = 3, 8, pos - 1
        text = src[pos + 2 : pos + 2 + (digits or 0)]
        try:
            code = int(text, base) if digits and len(text) == digits and text.isascii() and text.isalnum() else -1
        except ValueError:
            code = -1
        # \x and octal escapes are bytes in Go; only ASCII bytes map cleanly onto text
        limit = 0x80 if kind in "x01234567" else 0x110000
        if code < 0 or code >= limit or 0xD800 <= code <= 0xDFFF:
            raise self.error("invalid escape sequence in quoted string", pos)
        return chr(code), pos + 2 + digits


def _number_value(text: str) -> int | float | None:
    """Go's number syntax: decimal, 0x/0o/0b, legacy octal 017, floats with . or exponent."""
    body = text.lstrip("+-")
    if len(text) - len(body) > 1 or not body or body[-1] == "_":
        return None
    try:
        if body[:2].lower() in ("0x", "0o", "0b"):
            value: int | float = int(body, 0)
        elif any(ch in body for ch in ".eE"):
            value = float(body)
            if not math.isfinite(value):
                return None
        elif len(body) > 1 and body[0] == "0":
            value = int(body, 8)
        else:
            value = int(body)
    except ValueError:
        return None
    return -value if text.startswith("-") else value
