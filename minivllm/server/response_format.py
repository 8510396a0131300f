"""OpenAI's `response_format` and vLLM's `structured_outputs` body field -> `StructuredOutputsParams`.

    {"response_format": {"type": "json_object"}}                                   any JSON object
    {"response_format": {"type": "json_schema",
                         "json_schema": {"name": "order", "schema": {...}, "strict": true}}}
    {"structured_outputs": {"json": {...}} | {"regex": "..."} | {"choice": [...]} | {"grammar": "..."}}

`strict` is accepted either way: the grammar always enforces the schema. Whether the schema makes a
grammar is checked when the request is added (a 400 naming the problem).
"""
from __future__ import annotations

import reprlib

from ..structured_outputs_params import KINDS, StructuredOutputsParams


def parse_structured_outputs(body: dict) -> StructuredOutputsParams | None:
    """None when the body asks for no format; ValueError naming the field when it is malformed."""
    response_format, extra = body.get("response_format"), body.get("structured_outputs")
    if response_format is not None and extra is not None:
        raise ValueError("give 'response_format' or 'structured_outputs', not both")
    if extra is not None:
        if not isinstance(extra, dict) or not set(extra) <= set(KINDS):
            raise ValueError(f"'structured_outputs' must be an object with one of {', '.join(KINDS)}, "
                             f"got {reprlib.repr(extra)}")
        return StructuredOutputsParams(**extra)
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ValueError("'response_format.json_schema' must be an object with a 'name' and a 'schema'")
        if not isinstance(spec.get("schema"), dict):
            raise ValueError(f"'response_format.json_schema.schema' must be a JSON schema (an object), "
                             f"got {reprlib.repr(spec.get('schema'))}")
        if not isinstance(spec.get("strict", False), (bool, type(None))):
            raise ValueError("'response_format.json_schema.strict' must be a boolean")
        return StructuredOutputsParams(json=spec["schema"])
    raise ValueError(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', "
                     f"got {reprlib.repr(response_format)}")
