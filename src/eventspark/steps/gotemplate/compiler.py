"""Parse tokens and compile them straight into closures over the event.

Grammar (Go's, minus variables, ``range``/``with``/``define``/``template``/``block``)::

    list      := { text | "{{" pipeline "}}" | if }
    if        := "{{if" pipeline "}}" list { "{{else if" pipeline "}}" list } ["{{else}}" list] "{{end}}"
    pipeline  := command { "|" command }          (each command's value is the next one's last argument)
    command   := operand { operand }              (a function, or a field chain with arguments)
    operand   := term { .field }                  (only when the fields follow without a space)
    term      := .field | . | $ | function | "str" | `raw` | 'c' | number | true | false | nil | ( pipeline )

Everything that can be checked before seeing an event is checked here, with the position:
unknown functions, argument counts, arguments given to something that is not a function or
``.Format``, literal printf formats and Format layouts. The dot is always the event (there is
no ``range``/``with``), so ``.`` and ``$`` are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .errors import TemplateEvalError, TemplateSyntaxError
from .funcs import ARITY, EAGER_FUNCS, MAX_LAYOUT_CHARS, equal, field_of, format_time, is_true, time_of
from .gofmt import go_type, parse_format, text_of
from .lexer import Token, tokenize
from .timefmt import Formatter, compile_layout, parse_rfc3339, significant_prefix

__all__ = ["MAX_DEPTH", "Part", "compile_parts"]

Value = Callable[[Any], Any]
Part = Callable[[Any], str]
MAX_DEPTH = 32
"""Deepest nesting of ``if`` blocks and parentheses."""
_FORMAT_CACHE_SIZE = 1024

_UNSUPPORTED_KEYWORDS = frozenset({"range", "with", "define", "template", "block", "break", "continue"})
_UNSUPPORTED_FUNCS = frozenset({"slice", "html", "js", "urlquery", "println", "call"})
_LITERALS = {"true": True, "false": False}


class _Operand(NamedTuple):
    kind: str  # "func" (value: its name), "field" (keys on getter or the dot), "value", "nil"
    start: int
    end: int
    value: Any = None
    getter: Value | None = None
    keys: tuple[str, ...] = ()
    constant: bool = False  # a literal: value holds it


def compile_parts(source: str) -> list[str | Part]:
    """The template as text pieces and closures ``event -> str``; TemplateSyntaxError if invalid."""
    parser = _Parser(source, tokenize(source))
    parts, stop = parser.parse_list()
    if stop is not None:
        raise parser.error(f"unexpected {{{{{stop.value}}}}}", stop)
    return parts


def _root(event: Any) -> Any:
    return event


class _Parser:
    def __init__(self, source: str, tokens: list[Token]) -> None:
        self.source = source
        self.tokens = tokens
        self.i = 0
        self.depth = 0
        self.eof = Token("eof", None, len(source), len(source))

    def error(self, message: str, token: Token | _Operand) -> TemplateSyntaxError:
        return TemplateSyntaxError(message, self.source, token.start)

    def peek(self) -> Token:
        return self.tokens[self.i] if self.i < len(self.tokens) else self.eof

    def next(self) -> Token:
        token = self.peek()
        self.i += 1
        return token

    def expect(self, kind: str, what: str) -> Token:
        token = self.next()
        if token.kind != kind:
            found = "end of template" if token.kind == "eof" else repr(self.source[token.start : token.end])
            raise self.error(f"expected {what}, found {found}", token)
        return token

    def nest(self, token: Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nesting deeper than {MAX_DEPTH}", token)

    # -- lists and actions ------------------------------------------------------------------

    def parse_list(self) -> tuple[list[str | Part], Token | None]:
        """Parts up to the end of input, or up to an ``end``/``else`` keyword (then returned)."""
        parts: list[str | Part] = []
        while True:
            token = self.next()
            if token.kind == "eof":
                return parts, None
            if token.kind == "text":
                _append(parts, token.value)
                continue
            keyword = self.peek()
            if keyword.kind == "ident" and keyword.value in ("end", "else"):
                return parts, self.next()
            _append(parts, self.parse_action())

    def parse_action(self) -> str | Part:
        first = self.peek()
        if first.kind == "ident" and first.value == "if":
            return self.parse_if(self.next())
        if first.kind == "ident" and first.value in _UNSUPPORTED_KEYWORDS:
            raise self.error(f"{{{{{first.value}}}}} is not supported in table_name_template", first)
        start = self.peek().start
        commands = self.parse_pipeline("command")
        end = self.expect("right", "'}}'")
        action = self.source[start : end.start].strip()
        if len(commands) == 1 and len(commands[0]) == 1:
            only = commands[0][0]
            if only.constant:
                return text_of(only.value)  # {{"literal"}} is just text
            if only.kind == "field" and only.getter is None and len(only.keys) == 1:
                return _print_key(only.keys[0], action)  # the most common action: {{.event_type}}
        return _printer(self.compile_pipeline(commands), action)

    def parse_if(self, if_token: Token) -> Part:
        self.nest(if_token)
        branches: list[tuple[Value, Part]] = []
        while True:
            condition = self.parse_condition()
            body, stop = self.parse_list()
            branches.append((condition, _joined(body)))
            if stop is None:
                raise self.error("unclosed {{if}}: missing {{end}}", if_token)
            if stop.value == "end" or self.peek().value != "if" or self.peek().kind != "ident":
                break
            self.next()  # {{else if ...}}
        otherwise: Part = _constant("")
        if stop.value == "else":
            self.expect("right", "'}}' after else")
            body, stop = self.parse_list()
            otherwise = _joined(body)
            if stop is None or stop.value != "end":
                raise self.error("expected {{end}} after {{else}}", stop or if_token)
        self.expect("right", "'}}' after end")
        self.depth -= 1
        return _if_part(branches, otherwise)

    def parse_condition(self) -> Value:
        start = self.peek().start
        if self.peek().kind == "right":
            raise self.error("missing value for if", self.peek())
        commands = self.parse_pipeline("if")
        end = self.expect("right", "'}}'")
        return _condition(self.compile_pipeline(commands), self.source[start : end.start].strip())

    # -- pipelines --------------------------------------------------------------------------

    def parse_pipeline(self, context: str) -> list[list[_Operand]]:
        commands = [self.parse_command(context)]
        while self.peek().kind == "pipe":
            self.next()
            commands.append(self.parse_command(context))
        return commands

    def parse_command(self, context: str) -> list[_Operand]:
        operands: list[_Operand] = []
        while self.peek().kind not in ("pipe", "right", "rparen", "eof"):
            operands.append(self.parse_operand())
        if not operands:
            raise self.error(f"missing value for {context}", self.peek())
        return operands

    def parse_operand(self) -> _Operand:
        term = self.parse_term()
        keys: list[str] = []
        end = term.end
        while self.peek().kind == "field" and self.peek().start == end:
            token = self.next()
            keys.append(token.value)
            end = token.end
        if not keys:
            return term
        if term.kind == "field":
            return term._replace(keys=term.keys + tuple(keys), end=end)
        if term.kind != "value" or term.constant:
            raise self.error(f"unexpected . after term {self.source[term.start : term.end]!r}", term)
        getter = None if term.getter is _root else term.getter
        return _Operand("field", term.start, end, getter=getter, keys=tuple(keys))

    def parse_term(self) -> _Operand:
        token = self.next()
        kind, value = token.kind, token.value
        if kind == "field":
            return _Operand("field", token.start, token.end, keys=(value,))
        if kind == "dot" or (kind == "var" and value == "$"):
            return _Operand("value", token.start, token.end, getter=_root)
        if kind == "var":
            raise self.error(f"undefined variable {value!r}: variables are not supported", token)
        if kind in ("string", "number"):
            return _Operand("value", token.start, token.end, value, _constant(value), constant=True)
        if kind == "ident":
            return self.parse_identifier(token)
        if kind == "lparen":
            return self.parse_parenthesized(token)
        found = "end of template" if kind == "eof" else repr(self.source[token.start : token.end])
        raise self.error(f"unexpected {found} in operand", token)

    def parse_identifier(self, token: Token) -> _Operand:
        name = token.value
        if name in _LITERALS:
            value = _LITERALS[name]
            return _Operand("value", token.start, token.end, value, _constant(value), constant=True)
        if name == "nil":
            return _Operand("nil", token.start, token.end, None, _constant(None))
        if name in ARITY:
            return _Operand("func", token.start, token.end, name)
        if name in _UNSUPPORTED_KEYWORDS or name in ("if", "else", "end"):
            raise self.error(f"unexpected keyword {name!r} in command", token)
        if name in _UNSUPPORTED_FUNCS:
            raise self.error(f"function {name!r} is not supported in table_name_template", token)
        raise self.error(f"function {name!r} not defined", token)

    def parse_parenthesized(self, token: Token) -> _Operand:
        self.nest(token)
        commands = self.parse_pipeline("parenthesized pipeline")
        if self.peek().kind != "rparen":
            raise self.error("unclosed left paren", token)
        end = self.next()
        self.depth -= 1
        return _Operand("value", token.start, end.end, getter=self.compile_pipeline(commands))

    # -- compiling --------------------------------------------------------------------------

    def compile_pipeline(self, commands: list[list[_Operand]]) -> Value:
        value: Value | None = None
        for command in commands:
            value = self.compile_command(command, value)
        assert value is not None
        return value

    def compile_command(self, operands: list[_Operand], final: Value | None) -> Value:
        head, args = operands[0], operands[1:]
        if head.kind == "func":
            return self.compile_call(head, args, final)
        if head.kind == "field":
            if args or final is not None:
                return self.compile_method(head, args, final)
            return _field_getter(head.getter, head.keys)
        if head.kind == "nil":
            raise self.error("nil is not a command", head)
        if args or final is not None:
            text = self.source[head.start : head.end]
            raise self.error(f"can't give argument to non-function {text}", args[0] if args else head)
        assert head.getter is not None
        return head.getter

    def argument(self, operand: _Operand) -> Value:
        if operand.kind == "func":
            return self.compile_call(operand, [], None)
        if operand.kind == "field":
            return _field_getter(operand.getter, operand.keys)
        assert operand.getter is not None
        return operand.getter

    def compile_call(self, head: _Operand, args: list[_Operand], final: Value | None) -> Value:
        name = head.value
        values = [self.argument(arg) for arg in args] + ([final] if final is not None else [])
        fewest, most = ARITY[name]
        if len(values) < fewest or (most is not None and len(values) > most):
            want = str(fewest) if fewest == most else f"at least {fewest}"
            raise self.error(f"wrong number of args for {name}: want {want} got {len(values)}", head)
        if name == "printf" and args and args[0].constant:
            self.check_format(args[0])
        if name in ("and", "or"):
            return _lazy_logic(name == "and", values)
        function = equal if name == "eq" and len(values) == 2 else EAGER_FUNCS[name]
        return _eager_call(function, values)

    def check_format(self, operand: _Operand) -> None:
        if type(operand.value) is not str:
            raise self.error(f"printf format must be a string, not {go_type(operand.value)}", operand)
        try:
            parse_format(operand.value)
        except TemplateEvalError as exc:
            raise self.error(exc.reason, operand) from None

    def compile_method(self, head: _Operand, args: list[_Operand], final: Value | None) -> Value:
        *path, method = head.keys
        if method != "Format":
            raise self.error(f"{method} is not a method but has arguments (only .Format takes one)", head)
        count = len(args) + (final is not None)
        if count != 1:
            raise self.error(f"wrong number of args for Format: want 1 got {count}", head)
        receiver = _field_getter(head.getter, tuple(path)) if path else (head.getter or _root)
        if args and args[0].constant:
            layout = args[0].value
            if type(layout) is not str or len(layout) > MAX_LAYOUT_CHARS:
                raise self.error("Format needs a layout string of at most 256 characters", args[0])
            return _literal_format(receiver, compile_layout(layout), significant_prefix(layout))
        layout_of = self.argument(args[0]) if args else final
        assert layout_of is not None
        return lambda event: format_time(receiver(event), layout_of(event))


def _append(parts: list[str | Part], part: str | Part) -> None:
    if isinstance(part, str) and parts and isinstance(parts[-1], str):
        parts[-1] += part
    elif part != "":
        parts.append(part)


def _constant(value: Any) -> Callable[[Any], Any]:
    return lambda event: value


def _joined(parts: list[str | Part]) -> Part:
    if not parts:
        return _constant("")
    if len(parts) == 1:
        only = parts[0]
        return _constant(only) if isinstance(only, str) else only
    callables = [_constant(part) if isinstance(part, str) else part for part in parts]
    return lambda event: "".join([part(event) for part in callables])


# Conditions and printed actions name themselves in errors, as Go's "executing ... at <.a.b>" does.


def _locate(error: TemplateEvalError, action: str) -> None:
    if error.action is None:  # the innermost action names itself
        error.action = action


def _condition(pipeline: Value, action: str) -> Value:
    def condition(event: Any) -> bool:
        try:
            return is_true(pipeline(event))
        except TemplateEvalError as exc:
            _locate(exc, action)
            raise

    return condition


def _printer(pipeline: Value, action: str) -> Part:
    def print_action(event: Any) -> str:
        try:
            value = pipeline(event)
            return value if type(value) is str else text_of(value)
        except TemplateEvalError as exc:
            _locate(exc, action)
            raise

    return print_action


def _print_key(key: str, action: str) -> Part:
    def print_key(event: Any) -> str:
        try:
            value = event.get(key) if type(event) is dict else field_of(event, key)
            return value if type(value) is str else text_of(value)
        except TemplateEvalError as exc:
            _locate(exc, action)
            raise

    return print_key


def _if_part(branches: list[tuple[Value, Part]], otherwise: Part) -> Part:
    def if_block(event: Any) -> str:
        for condition, body in branches:
            if condition(event):
                return body(event)
        return otherwise(event)

    return if_block


def _field_getter(receiver: Value | None, keys: tuple[str, ...]) -> Value:
    if receiver is None and len(keys) == 1:
        key = keys[0]
        return lambda event: event.get(key) if type(event) is dict else field_of(event, key)

    def field_chain(event: Any) -> Any:
        value = event if receiver is None else receiver(event)
        for key in keys:
            value = value.get(key) if type(value) is dict else field_of(value, key)
        return value

    return field_chain


def _literal_format(receiver: Value, formatter: Formatter, prefix: int | None) -> Value:
    """``.Format "layout"``, caching results by the part of the timestamp string that decides them."""
    results: dict[str, str] = {}

    def format_method(event: Any) -> str:
        value = receiver(event)
        if type(value) is str:  # the usual receiver: an RFC 3339 string such as _timestamp
            parsed = parse_rfc3339(value)  # validates the whole string even when cached
            if parsed is not None:
                if prefix is None:
                    return formatter(parsed)
                key = value[:prefix]
                result = results.get(key)
                if result is None:
                    if len(results) >= _FORMAT_CACHE_SIZE:
                        results.clear()
                    result = results[key] = formatter(parsed)
                return result
        return formatter(time_of(value))

    return format_method


def _lazy_logic(is_and: bool, values: list[Value]) -> Value:
    """Go's ``and``/``or``: the first argument that decides (falsy for and, truthy for or), else the last."""

    def logic(event: Any) -> Any:
        result = None
        for value in values:
            result = value(event)
            if is_true(result) != is_and:
                return result
        return result

    return logic


def _eager_call(function: Callable[..., Any], values: list[Value]) -> Value:
    if len(values) == 1:
        (only,) = values
        return lambda event: function(only(event))
    if len(values) == 2:
        first, second = values
        return lambda event: function(first(event), second(event))
    return lambda event: function(*[value(event) for value in values])
