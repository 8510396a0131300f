"""OpenAI's function tools, by grammar: `tools` with `tool_choice` "required" or a named function.

As in vLLM, the tools are described to the model and its output is constrained by a JSON schema built
from them: a named function's arguments, or for "required" a JSON array of
`{"name", "parameters"}` calls (`parallel_tool_calls: false`: one call). The output comes back as
`message.tool_calls` (streamed as `delta.tool_calls`) with finish_reason "tool_calls".
`tool_choice: "auto"` is refused (it needs a chat template with a tool format; SmolLM2's has none),
and so are role "tool" messages.
"""
from __future__ import annotations

import json
import re
import reprlib
import uuid
from dataclasses import dataclass, field

from ..structured_outputs_params import StructuredOutputsParams

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
# A call's opening in the array of "required", with json.dumps's separators.
_CALL_START = re.compile(r'\s*[\[,]\s*\{"name": "((?:[^"\\]|\\.)*)", "parameters": ')


@dataclass
class ToolCallRequest:
    functions: list[dict]             # each {"name", "description", "parameters"}
    named: str | None                 # tool_choice's function; None for "required"
    parallel: bool = True             # parallel_tool_calls
    ids: list[str] = field(default_factory=list)  # one per call

    @property
    def structured_outputs(self) -> StructuredOutputsParams:
        if self.named is not None:
            return StructuredOutputsParams(json=_parameters(self._function(self.named)))
        calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [f["name"]]},
                                                   "parameters": _parameters(f)},
                  "required": ["name", "parameters"]} for f in self.functions]
        schema = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not self.parallel:
            schema["maxItems"] = 1
        return StructuredOutputsParams(json=schema)

    def _function(self, name: str) -> dict:
        return next(f for f in self.functions if f["name"] == name)

    def describe(self, messages: list[dict]) -> list[dict]:
        """The messages with the tools described as text in the system message."""
        listing = json.dumps([{"name": f["name"], "description": f.get("description", ""),
                               "parameters": _parameters(f)} for f in self.functions])
        if self.named is not None:
            text = (f"Call the function {self.named}: answer with its arguments only, as a JSON object. "
                    f"The functions:\n{listing}")
        else:
            text = ("Call one or more of these functions: answer only with a JSON list of calls, each "
                    f'{{"name": <function name>, "parameters": <its arguments>}}. The functions:\n{listing}')
        if messages[0]["role"] == "system":
            return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
        return [{"role": "system", "content": text}, *messages]

    def calls(self, text: str) -> list[tuple[str, str]]:
        """(name, arguments so far) of each call in the output; the last may still be growing."""
        if self.named is not None:
            return [(self.named, text)]
        calls, pos = [], 0
        while (m := _CALL_START.match(text, pos)) is not None:
            name = json.loads(f'"{m[1]}"')
            end = _value_end(text, m.end())
            if end is None:  # its arguments are still being written
                calls.append((name, text[m.end():]))
                break
            calls.append((name, text[m.end():end]))
            pos = end + 1  # past the '}' that closes the call
        return calls

    def _id(self, index: int) -> str:
        while len(self.ids) <= index:
            self.ids.append(f"call_{uuid.uuid4().hex[:24]}")
        return self.ids[index]

    def into_choice(self, choice: dict, text: str) -> dict:
        """A whole output's choice, its text turned into `message.tool_calls`."""
        choice["message"] = {"role": "assistant", "content": None, "tool_calls": [
            {"id": self._id(i), "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(self.calls(text))]}
        choice["finish_reason"] = _finish_reason(choice["finish_reason"])
        return choice

    def into_delta(self, choice: dict, text: str, sent: list[int]) -> dict:
        """A stream's chunk: what the calls gained since `sent` (arguments' lengths sent, updated here)."""
        deltas = []
        for i, (name, arguments) in enumerate(self.calls(text)):
            if i == len(sent):  # a new call
                deltas.append({"index": i, "id": self._id(i), "type": "function",
                               "function": {"name": name, "arguments": arguments}})
                sent.append(len(arguments))
            elif len(arguments) > sent[i]:
                deltas.append({"index": i, "function": {"arguments": arguments[sent[i]:]}})
                sent[i] = len(arguments)
        choice["delta"] = {"tool_calls": deltas} if deltas else {}
        choice["finish_reason"] = _finish_reason(choice["finish_reason"])
        return choice


def _finish_reason(reason: str | None) -> str | None:
    return "tool_calls" if reason == "stop" else reason  # "length": the arguments were cut


def _parameters(function: dict) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}


def _value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value that starts at `start`, or None if it is not complete yet."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            if depth == 0:
                return i  # the end of a bare value (a number, true...) at the call's closing brace
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == "," and depth == 0:
            return i
    return None


def parse_tools(body: dict) -> ToolCallRequest | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat body -> what to constrain, or None;
    ValueError naming a bad field."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if tools is not None and not isinstance(tools, list):
            raise ValueError(f"'tools' must be a list of function tools, got {reprlib.repr(tools)}")
        if choice not in (None, "none"):
            raise ValueError(f"'tool_choice' {reprlib.repr(choice)} needs 'tools'")
        return None
    if not isinstance(tools, list):
        raise ValueError(f"'tools' must be a list of function tools, got {reprlib.repr(tools)}")
    functions = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not _NAME.match(function["name"]):
            raise ValueError(f"'tools[{i}]' must be {{'type': 'function', 'function': {{'name': <letters, digits, "
                             f"_ or -, at most 64>, 'description', 'parameters'}}}}, got {reprlib.repr(tool)}")
        if not isinstance(function.get("description", ""), str):
            raise ValueError(f"'tools[{i}].function.description' must be a string")
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            raise ValueError(f"'tools[{i}].function.parameters' must be a JSON schema (an object)")
        functions.append(function)
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise ValueError(f"'tools' names a function twice: {names}")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ValueError(f"'parallel_tool_calls' must be a boolean, got {reprlib.repr(parallel)}")
    if choice == "none":
        return None
    if choice == "required":
        return ToolCallRequest(functions, None, parallel is not False)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise ValueError(f"'tool_choice' names the function {reprlib.repr(name)}, which is not in 'tools' "
                             f"({', '.join(names)})")
        return ToolCallRequest(functions, name)
    if choice in (None, "auto"):
        raise ValueError("'tool_choice' \"auto\" (the default with tools) is not supported: this server does not "
                         "parse free-form tool calls (SmolLM2's chat template has no tools); use \"required\" or "
                         "{'type': 'function', 'function': {'name': ...}}")
    raise ValueError(f"'tool_choice' must be \"none\", \"required\", \"auto\" or {{'type': 'function', "
                     f"'function': {{'name': ...}}}}, got {reprlib.repr(choice)}")
