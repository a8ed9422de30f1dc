"""Structured output in the API's shapes: from a request's fields to one :class:`Constraint`.

Accepted, one per request:

- OpenAI's ``response_format``: ``text``, ``json_object``, ``json_schema`` (``strict`` checked by
  OpenAI's rules: every object lists all its properties in ``required`` and sets
  ``additionalProperties: false``);
- llama-server's ``json_schema`` (a schema) and ``grammar`` (GBNF, or Lark);
- vLLM's ``structured_outputs`` (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``)
  and its older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``.

Two of them in one request is refused: the output could not match both.
"""

from __future__ import annotations

import json
from typing import Any

from onnxsample.constraint import Constraint, one_constraint
from onnxsample.errors import InvalidParameter
from onnxsample.serve.schemas import SamplingFields

__all__ = ["check_strict", "constraint_field", "constraint_of"]


def constraint_of(body: SamplingFields) -> Constraint | None:
    """The constraint the request's fields ask for, or None; InvalidParameter for a malformed or
    contradictory one."""
    outputs = body.structured_outputs
    whitespace = "JSON is written compactly; a schema's x-guidance options set its whitespace"
    unsupported = {  # name: (value, why it is refused)
        "guided_whitespace_pattern": (body.guided_whitespace_pattern, whitespace),
        "structured_outputs.whitespace_pattern": (
            getattr(outputs, "whitespace_pattern", None),
            whitespace,
        ),
        "structured_outputs.structural_tag": (
            getattr(outputs, "structural_tag", None),
            "use a JSON schema, a regex or a grammar",
        ),
    }
    for name, (value, why) in unsupported.items():
        if value is not None:
            raise InvalidParameter(f"{name} is not supported ({why})")
    found: list[tuple[str, Constraint]] = []
    fmt = body.response_format
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object" and fmt.schema_ is not None:  # llama-server's extension
            found.append(("response_format", Constraint.json_schema(fmt.schema_)))
        elif fmt.type == "json_object":
            found.append(("response_format", Constraint.json_object()))
        else:
            spec = fmt.json_schema
            if spec is None or spec.schema_ is None:
                raise InvalidParameter(
                    "response_format: type json_schema needs json_schema.schema (a JSON schema)"
                )
            if spec.strict:
                if spec.schema_.get("type") != "object":  # OpenAI's: the root is an object
                    raise InvalidParameter(
                        "response_format.json_schema.schema: with strict, the root must be an "
                        "object schema (type: object)"
                    )
                check_strict(spec.schema_, "response_format.json_schema.schema")
            found.append(("response_format", Constraint.json_schema(spec.schema_)))
    if body.json_schema is not None:
        found.append(("json_schema", Constraint.json_schema(body.json_schema)))
    if body.grammar is not None:
        found.append(("grammar", Constraint.grammar(body.grammar)))
    if outputs is not None:
        found += [(f"structured_outputs.{k}", c) for k, c in _vllm(outputs.model_dump()).items()]
    legacy = {k: getattr(body, f"guided_{k}") for k in _GUIDED}
    found += [(f"guided_{k}", c) for k, c in _vllm(legacy).items()]
    return one_constraint(dict(found), "request")


def constraint_field(body: SamplingFields, tools: bool = False) -> str | None:
    """The field the request's constraint comes from (``tools`` where a chat's tool calls make
    it), or None: the field an error about the constraint names. The fields are read as
    :func:`constraint_of` reads them."""
    if tools:
        return "tools"
    fmt = body.response_format
    if fmt is not None and fmt.type != "text":
        return "response_format"
    outputs = body.structured_outputs
    given = {
        "json_schema": body.json_schema is not None,
        "grammar": body.grammar is not None,
        "structured_outputs": outputs is not None
        and any(map(_given, outputs.model_dump().values())),
        **{f"guided_{k}": _given(getattr(body, f"guided_{k}")) for k in _GUIDED},
    }
    return next((field for field, there in given.items() if there), None)


_GUIDED = ("json", "regex", "choice", "grammar")


def _given(value: Any) -> bool:
    """Whether a vLLM constraint field asks for a constraint (None and false do not)."""
    return value is not None and value is not False


def _vllm(fields: dict[str, Any]) -> dict[str, Constraint]:
    out = {}
    for key, value in fields.items():
        if not _given(value):
            continue
        if key == "json":
            out[key] = Constraint.json_schema(value)
        elif key == "json_object":
            out[key] = Constraint.json_object()
        elif key == "regex":
            out[key] = Constraint.regex(value)
        elif key == "choice":
            out[key] = Constraint.choice(value)
        elif key == "grammar":
            out[key] = Constraint.grammar(value)
    return out


def check_strict(schema: Any, where: str) -> None:
    """OpenAI's structured-outputs rules for ``strict: true``: every object schema sets
    ``additionalProperties`` false and lists each of its properties in ``required``."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            check_strict(item, f"{where}[{i}]")
        return
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "object" or "properties" in schema:
        properties, required = schema.get("properties", {}), schema.get("required", [])
        if not isinstance(properties, dict):
            raise InvalidParameter(f"{where}: 'properties' must be an object")
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise InvalidParameter(f"{where}: 'required' must be a list of property names")
        if schema.get("additionalProperties") is not False:
            raise InvalidParameter(
                f"{where}: with strict, 'additionalProperties' must be present and false"
            )
        missing = sorted(set(properties) - set(required))
        if missing:
            raise InvalidParameter(
                f"{where}: with strict, 'required' must list every property; missing "
                f"{json.dumps(missing)}"
            )
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            for name, sub in value.items():
                check_strict(sub, f"{where}.{key}.{name}")
        elif key in ("items", "anyOf", "allOf", "oneOf", "prefixItems", "not"):
            check_strict(value, f"{where}.{key}")
