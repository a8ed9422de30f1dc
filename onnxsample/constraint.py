"""What a request's output must match (structured output): :class:`Constraint`.

A constraint is one of a JSON schema, any JSON object, a regular expression, a grammar (Lark, or
llama.cpp's GBNF) or a list of choices. Each step the engine asks the constraint's matcher
(llguidance) which tokens may come next and the graph forbids the others (``sampler.allowed``),
before penalties, temperature and the filters; end-of-sequence is allowed only where the grammar is
complete. A constraint is compiled when the request is submitted: a bad one raises
:class:`~onnxsample.errors.InvalidParameter` there, and nothing is queued.

JSON is written compactly by default (``", "`` and ``": "`` between items and keys, no other
whitespace), so a model cannot spend its tokens on runaway whitespace; a schema's own
``x-guidance`` options (llguidance's JSON options) override that.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from onnxsample.errors import InvalidParameter, check_unicode

__all__ = ["CONSTRAINT_KINDS", "Constraint", "one_constraint"]

ConstraintKind = Literal["json_schema", "json_object", "regex", "grammar", "choice"]
CONSTRAINT_KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "grammar", "choice")
# Compact JSON unless the schema's x-guidance says otherwise: no runaway whitespace.
_JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """One request's output constraint. Build it with the class methods:

    ``Constraint.json_schema(schema)`` (a dict or its JSON text; an object schema that names its
    properties takes no other keys unless ``additionalProperties`` says so, as llama.cpp and vLLM
    read it), ``Constraint.json_object()`` (any JSON object), ``Constraint.regex(pattern)``,
    ``Constraint.grammar(text)`` (Lark, or GBNF as llama.cpp writes it) and
    ``Constraint.choice(["yes", "no"])``.
    """

    kind: ConstraintKind
    value: Any = None

    @classmethod
    def json_schema(cls, schema: dict | str) -> Constraint:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise InvalidParameter(f"json_schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise InvalidParameter(
                f"json_schema must be a JSON object, got {type(schema).__name__}"
            )
        try:
            json.dumps(schema, allow_nan=False)
        except (TypeError, ValueError) as exc:  # a set, an object, NaN: no JSON value
            raise InvalidParameter(f"json_schema must hold JSON values only: {exc}") from None
        return cls("json_schema", schema)

    @classmethod
    def json_object(cls) -> Constraint:
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", _text("regex", pattern))

    @classmethod
    def grammar(cls, text: str) -> Constraint:
        return cls("grammar", _text("grammar", text))

    @classmethod
    def choice(cls, options: list[str]) -> Constraint:
        if (
            not isinstance(options, (list, tuple))
            or not options
            or not all(isinstance(o, str) and o for o in options)
        ):
            raise InvalidParameter("choice must be a non-empty list of non-empty strings")
        return cls("choice", tuple(_text("choice", o) for o in options))

    def validate(self) -> Constraint:
        """Raise :class:`InvalidParameter` unless this is a constraint the constructors make."""
        if self.kind not in CONSTRAINT_KINDS:
            kinds = ", ".join(CONSTRAINT_KINDS)
            raise InvalidParameter(f"unknown constraint kind {self.kind!r}; one of: {kinds}")
        made = {
            "json_schema": lambda: Constraint.json_schema(self.value),
            "json_object": lambda: Constraint.json_object() if self.value is None else None,
            "regex": lambda: Constraint.regex(self.value),
            "grammar": lambda: Constraint.grammar(self.value),
            "choice": lambda: Constraint.choice(self.value),
        }[self.kind]()
        if made is None:
            raise InvalidParameter("a json_object constraint takes no value")
        return self

    def grammar_text(self) -> str:
        """The constraint as an llguidance grammar (what the matcher compiles)."""
        import llguidance

        self.validate()
        if self.kind in ("json_schema", "json_object"):
            schema = _closed(self.value) if self.kind == "json_schema" else {"type": "object"}
            try:
                return llguidance.LLMatcher.grammar_from_json_schema(
                    schema, defaults=_JSON_DEFAULTS
                )
            except (ValueError, TypeError) as exc:
                raise InvalidParameter(f"invalid JSON schema: {exc}") from None
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.value)
        if self.kind == "choice":  # a regex of the literal options: a Lark rule of as many
            # alternatives compiled in time that grew with their square (22 s for 60k)
            return llguidance.LLMatcher.grammar_from_regex(
                "(" + "|".join(map(_literal, self.value)) + ")"
            )
        from llguidance.gbnf_to_lark import is_lark_syntax

        text = self.value if is_lark_syntax(self.value) else _spelled_out(self.value)
        try:
            return llguidance.grammar_from("grammar", text)
        except ValueError as exc:
            raise InvalidParameter(f"invalid grammar: {exc}") from None

    def __str__(self) -> str:
        if self.kind == "json_object":
            return "json_object"
        shown = json.dumps(self.value) if self.kind != "choice" else json.dumps(list(self.value))
        return f"{self.kind}({shown[:60]}{'…' if len(shown) > 60 else ''})"


def _closed(schema: Any, in_all_of: bool = False) -> Any:
    """`schema` with every object schema that names its properties closed to other keys where it
    says nothing of them (``additionalProperties: false``), as llama.cpp's converter and vLLM's
    default backend read it; JSON Schema's own default (other keys allowed) gave a small model
    room to add keys of its own. An ``allOf`` and its branches stay open: each branch names part
    of the object's keys."""
    if not isinstance(schema, dict):
        return schema
    closed: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _MAPS and isinstance(value, dict):  # name: schema
            closed[key] = {name: _closed(sub) for name, sub in value.items()}
        elif key in _LISTS and isinstance(value, list):
            closed[key] = [_closed(sub, key == "allOf") for sub in value]
        elif key in _SCHEMAS:
            closed[key] = _closed(value)
        else:  # a value (const, enum, default, x-guidance...), kept as it is
            closed[key] = value
    names = "properties" in schema or "patternProperties" in schema
    if names and not in_all_of and "additionalProperties" not in schema and "allOf" not in schema:
        closed["additionalProperties"] = False
    return closed


# a schema's keywords that hold schemas: by name, in a list, or one
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
            "propertyNames", "unevaluatedProperties", "unevaluatedItems", "additionalItems")  # fmt: skip


def _literal(text: str) -> str:
    """`text` as a regex that matches it alone (llguidance's regex syntax, Rust's: its meta
    characters escaped, every other character itself)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~")


# GBNF's escapes of a code point (llama.cpp's), and an escaped backslash, read as pairs
_CODE_POINT = re.compile(r"\\(\\|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")
_KEPT_ESCAPED = set('"\\[]^-')


def _spelled_out(gbnf: str) -> str:
    """`gbnf` with its ``\\uXXXX`` and ``\\UXXXXXXXX`` escapes written as the characters they
    stand for (``\\xHH`` where one must stay escaped), as llama.cpp reads them: llguidance's
    converter turns them into escapes its own lexer refuses (``\\ue9``)."""

    def written(match: re.Match) -> str:
        escape = match.group(1)
        if escape == "\\":
            return match.group(0)
        code = int(escape[1:], 16)
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            return match.group(0)  # no character: refused as it is
        char = chr(code)
        if char.isprintable() and not char.isspace() and char not in _KEPT_ESCAPED:
            return char
        if code < 0x100:
            return f"\\x{code:02X}"
        # the converter drops leading zeros (\\u0600 -> \\u600), which its lexer refuses
        return match.group(0) if escape[1] != "0" else char

    return _CODE_POINT.sub(written, gbnf)


def one_constraint(found: dict[str, Constraint | None], what: str) -> Constraint | None:
    """The one constraint among `found` (by the name the user gave it), or None;
    InvalidParameter naming them when there are several (`what`: where they came from)."""
    given = {name: c for name, c in found.items() if c is not None}
    if len(given) > 1:
        raise InvalidParameter(f"one output constraint per {what}, got {', '.join(given)}")
    return next(iter(given.values()), None)


def _text(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidParameter(f"{kind} must be a non-empty string, got {value!r}")
    check_unicode(value, kind)  # llguidance cannot take a lone surrogate
    return value
