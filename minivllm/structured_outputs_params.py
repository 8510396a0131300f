"""StructuredOutputsParams: the shape an answer must have (vLLM's `SamplingParams.structured_outputs`).

    >>> SamplingParams(structured_outputs=StructuredOutputsParams(json={"type": "object"}))
    >>> StructuredOutputsParams(regex=r"\\d{3}-\\d{4}")
    >>> StructuredOutputsParams(choice=["yes", "no"])
    >>> StructuredOutputsParams(grammar='root ::= "a" | "b"')       # EBNF, xgrammar's dialect
    >>> StructuredOutputsParams(json_object=True)                   # any JSON object

Exactly one of the five is set. Here only the types are checked (this layer knows no grammar library);
whether the schema, the regex or the grammar makes sense is checked when the request is added
(`minivllm.structured_output.check_structured_outputs`), so a bad one is a `ValueError` at the door.
"""
from __future__ import annotations

import json as _json
import reprlib
from dataclasses import dataclass

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutputsParams:
    json: str | dict | None = None      # a JSON schema: a dict, or its JSON text
    regex: str | None = None
    choice: list[str] | None = None     # the answer is one of these strings
    grammar: str | None = None          # an EBNF grammar whose start rule is `root`
    json_object: bool = False           # any JSON object (OpenAI's response_format json_object)

    def __post_init__(self):
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(given) or 'none'}")
        if not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object must be a bool, got {reprlib.repr(self.json_object)}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    schema = _json.loads(self.json)
                except ValueError as e:
                    raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
            else:
                schema = self.json
            if not isinstance(schema, dict):
                raise ValueError(f"structured_outputs.json must be a JSON schema (an object), "
                                 f"got {reprlib.repr(self.json)}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {reprlib.repr(value)}")
        if self.choice is not None and (not isinstance(self.choice, (list, tuple)) or not self.choice
                                        or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError(f"structured_outputs.choice must be a non-empty list of non-empty strings, "
                             f"got {reprlib.repr(self.choice)}")

    @property
    def key(self) -> tuple[str, str]:
        """(kind, text): what a compiled grammar is cached by."""
        if self.json is not None:
            # (keys not sorted: their order is the order of the properties in the answer)
            text = self.json if isinstance(self.json, str) else _json.dumps(self.json)
            return "json", text
        if self.choice is not None:
            return "choice", _json.dumps(list(self.choice))
        if self.json_object:
            return "json_object", ""
        kind = "regex" if self.regex is not None else "grammar"
        return kind, getattr(self, kind)
