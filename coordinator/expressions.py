"""CEL expressions and the `${...}` templates that embed them in node fields.

A node's request (HTTP) or input (CODE) is a JSON value in which any string may
hold expressions: a string that is exactly `"${expr}"` becomes the value of
`expr` (of any JSON type), and `${expr}` inside a longer string is replaced by
the value's text. Expressions are CEL (never Python `eval`) over two variables:
`input`, the run input, and `steps`, the outputs of completed upstream nodes.

Everything is compiled once, at registration, so a bad expression is refused
with the node and field that hold it, and evaluating a run's events does no
parsing.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cel

from coordinator.errors import InvalidDefinition

__all__ = ["VARIABLES", "Expression", "ExpressionError", "Template"]

#: The only names an expression may use.
VARIABLES = frozenset({"input", "steps"})
_STEP_REFERENCE = re.compile(r"""\bsteps\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*(?:'([^']*)'|"([^"]*)")\s*\])""")
_MAX_EXPRESSION_CHARS = 4096


class ExpressionError(Exception):
    """An expression failed while a run was evaluated (e.g. a missing key)."""


@dataclass(frozen=True, slots=True)
class Expression:
    """A compiled CEL expression."""

    source: str
    program: Any
    step_references: frozenset[str]

    @classmethod
    def compile(cls, source: str, *, node: str, field: str) -> Expression:
        """Compiles `source`, refusing syntax errors and unknown variables.

        Raises:
            InvalidDefinition: names `node` and `field`.
        """
        if not source.strip():
            raise InvalidDefinition("empty expression", node=node, field=field)
        if len(source) > _MAX_EXPRESSION_CHARS:
            raise InvalidDefinition(
                f"expression longer than {_MAX_EXPRESSION_CHARS} characters", node=node, field=field
            )
        try:
            program = cel.compile(source)
        except ValueError as exc:
            first_line = str(exc).splitlines()[0] if str(exc) else "syntax error"
            raise InvalidDefinition(f"bad expression {source!r}: {first_line}", node=node, field=field) from None
        unknown = sorted(set(program.variables()) - VARIABLES)
        if unknown:
            raise InvalidDefinition(
                f"bad expression {source!r}: unknown variable {', '.join(unknown)} (use input or steps)",
                node=node,
                field=field,
            )
        refs = frozenset(a or b or c for a, b, c in _STEP_REFERENCE.findall(source))
        return cls(source=source, program=program, step_references=refs)

    def evaluate(self, variables: Mapping[str, Any]) -> Any:
        """Returns the expression's value as JSON-compatible data.

        Raises:
            ExpressionError: evaluation failed; the message quotes the expression.
        """
        try:
            value = self.program.execute(dict(variables))
        except Exception as exc:  # the CEL engine raises many builtin types; all mean "this expression failed"
            raise ExpressionError(f"expression {self.source!r} failed: {type(exc).__name__}: {exc}") from None
        return _to_json(value)


def _to_json(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return str(value)


def _split(text: str, *, node: str, field: str) -> list[str | Expression]:
    """Splits a string into literal parts and `${...}` expressions.

    The scanner tracks string literals and nested braces, so CEL map literals
    and quoted braces inside an expression do not end it early.
    """
    parts: list[str | Expression] = []
    i = 0
    literal_start = 0
    while True:
        start = text.find("${", i)
        if start < 0:
            break
        depth, j, quote = 1, start + 2, ""
        while j < len(text) and depth:
            ch = text[j]
            if quote:
                if ch == "\\":
                    j += 1
                elif ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            j += 1
        if depth:
            raise InvalidDefinition(f"unterminated '${{' in {text!r}", node=node, field=field)
        if start > literal_start:
            parts.append(text[literal_start:start])
        parts.append(Expression.compile(text[start + 2 : j - 1], node=node, field=field))
        i = literal_start = j
    if literal_start < len(text):
        parts.append(text[literal_start:])
    return parts


@dataclass(frozen=True, slots=True)
class Template:
    """A JSON value whose strings may embed expressions, compiled."""

    value: Any
    step_references: frozenset[str]

    @classmethod
    def compile(cls, value: Any, *, node: str, field: str) -> Template:
        """Compiles every `${...}` in `value`.

        Raises:
            InvalidDefinition: a bad expression; names `node` and the field path.
        """
        refs: set[str] = set()

        def walk(v: Any, path: str) -> Any:
            if isinstance(v, str):
                if "${" not in v:
                    return v
                parts = _split(v, node=node, field=path)
                for p in parts:
                    if isinstance(p, Expression):
                        refs.update(p.step_references)
                return (
                    parts[0] if len(parts) == 1 and isinstance(parts[0], Expression) else _Interpolation(tuple(parts))
                )
            if isinstance(v, dict):
                return {k: walk(item, f"{path}.{k}") for k, item in v.items()}
            if isinstance(v, list):
                return [walk(item, f"{path}[{n}]") for n, item in enumerate(v)]
            return v

        return cls(value=walk(value, field), step_references=frozenset(refs))

    def render(self, variables: Mapping[str, Any]) -> Any:
        """Evaluates every expression and returns plain JSON data.

        Raises:
            ExpressionError: an expression failed.
        """
        return _render(self.value, variables)


@dataclass(frozen=True, slots=True)
class _Interpolation:
    parts: tuple[str | Expression, ...]


def _render(v: Any, variables: Mapping[str, Any]) -> Any:
    if isinstance(v, Expression):
        return v.evaluate(variables)
    if isinstance(v, _Interpolation):
        out = []
        for p in v.parts:
            if isinstance(p, str):
                out.append(p)
            else:
                value = p.evaluate(variables)
                out.append(value if isinstance(value, str) else json.dumps(value, separators=(",", ":")))
        return "".join(out)
    if isinstance(v, dict):
        return {k: _render(item, variables) for k, item in v.items()}
    if isinstance(v, list):
        return [_render(item, variables) for item in v]
    return v
