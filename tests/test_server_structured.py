"""Structured outputs and tools at the server, with the official `openai` client and the real SmolLM2.

First the pieces without a server (the tools' schema, the calls read from a growing answer); then the server:
response_format json_schema validates, tool_choice named / required gives tool_calls whose arguments parse and
validate, a stream of tool calls reassembles to the whole answer's, bad values are 400s, and a constrained
request aborted mid-stream leaks no block.
"""
import asyncio
import json

import jsonschema
import openai
import pytest
from server_utils import running_server
from test_server import metrics, wait_idle

from minivllm.server.protocol import APIError, parse_request
from minivllm.server.tool_calls import ToolCallRequest

MODEL = "smollm2-135m"
TICKET = {"type": "object", "properties": {
    "subject": {"type": "string", "maxLength": 24},
    "priority": {"type": "string", "enum": ["low", "normal", "urgent"]}}, "required": ["subject", "priority"]}
ORDER = {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"}},
         "required": ["order_id"]}
TOOLS = [{"type": "function", "function": {"name": "open_ticket", "description": "Open a support ticket",
                                           "parameters": TICKET}},
         {"type": "function", "function": {"name": "get_order", "description": "Look up an order by its id",
                                           "parameters": ORDER}}]
SCHEMAS = {"open_ticket": TICKET, "get_order": ORDER}
ASK = [{"role": "user", "content": "My order AB1234 never arrived, please open an urgent ticket."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


def test_the_calls_are_read_from_a_growing_answer():
    request = ToolCallRequest([t["function"] for t in TOOLS], None)
    text = '[{"name": "get_order", "parameters": {"order_id": "AB1234"}}, {"name": "open_ticket", "parameters": ' \
           '{"subject": "late, {still} \\"lost\\"", "priority": "urgent"}}]'
    assert request.calls(text) == [("get_order", '{"order_id": "AB1234"}'),
                                   ("open_ticket", '{"subject": "late, {still} \\"lost\\"", "priority": "urgent"}')]
    sent, fragments = [], {}
    for end in range(len(text) + 1):  # one character at a time: the deltas join to the whole calls
        for d in request.into_delta({"delta": {}, "finish_reason": None}, text[:end], sent)["delta"].get(
                "tool_calls", []):
            if "id" in d:  # a call's first fragment names it
                fragments[d["index"]] = [d["function"]["name"], ""]
            fragments[d["index"]][1] += d["function"]["arguments"]
    assert [tuple(v) for _, v in sorted(fragments.items())] == request.calls(text)
    schema = request.structured_outputs.json
    assert schema["minItems"] == 1 and len(schema["items"]["anyOf"]) == 2


@pytest.mark.parametrize("body, problem", [
    ({"tools": TOOLS}, "auto"), ({"tools": TOOLS, "tool_choice": "auto"}, "auto"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in 'tools'"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}], "tool_choice": "required"}, r"tools\[0\]"),
    ({"tool_choice": "required"}, "needs 'tools'"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "not both|take no"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "json_schema"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
    ({"structured_outputs": {"xml": "a"}}, "structured_outputs"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "not both"),
])
def test_bad_structured_fields_are_400s(body, problem):
    with pytest.raises(APIError, match=problem):
        parse_request({"model": MODEL, "messages": ASK, **body}, True)


def test_tool_choice_none_is_a_plain_answer():
    parsed = parse_request({"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "none"}, True)
    assert parsed.tool_call is None and parsed.params.structured_outputs is None and parsed.prompt == ASK


@pytest.fixture(scope="module")
def base_url():
    with running_server(MODEL, "--max-model-len", "512", "--num-kv-blocks", "96", "--max-num-seqs", "8") as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def test_response_format_json_schema_validates(client):
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Invent a person. Answer in JSON."}], max_tokens=48,
        temperature=0.7, seed=3, response_format={"type": "json_schema",
                                                  "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)
    regex = client.completions.create(model=MODEL, prompt="A phone number:", max_tokens=16, temperature=0,
                                      extra_body={"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}})
    assert len(regex.choices[0].text) == 8 and regex.choices[0].text[3] == "-"


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "open_ticket"}}, "required"])
def test_tool_calls_parse_validate_and_stream_the_same(client, tool_choice):
    args = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, max_tokens=80, temperature=0,
                parallel_tool_calls=False)
    answer = client.chat.completions.create(**args)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].id.startswith("call_")
    if isinstance(tool_choice, dict):
        assert calls[0].function.name == "open_ticket"
    jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS[calls[0].function.name])

    streamed, reasons = {}, []
    for chunk in client.chat.completions.create(**args, stream=True):
        delta = chunk.choices[0].delta
        reasons.append(chunk.choices[0].finish_reason)
        for d in delta.tool_calls or []:
            if d.id is not None:  # a call's first fragment: its id and name
                streamed[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            streamed[d.index]["arguments"] += d.function.arguments or ""
    assert reasons[-1] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == [
        (c.function.name, c.function.arguments) for c in calls]


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
    {"structured_outputs": {"regex": "a("}},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                              "properties": 3}}}],
     "tool_choice": "required"},
])
def test_a_bad_schema_regex_or_tool_is_a_400_naming_the_problem(client, body):
    with pytest.raises(openai.BadRequestError, match="invalid (JSON schema|regex)"):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, extra_body=body)


def test_a_constrained_stream_aborted_mid_way_leaks_no_block(base_url):
    aclient = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)

    async def main():
        stream = await aclient.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, stream=True)
        n = 0
        async for _ in stream:
            n += 1
            if n == 3:
                await stream.close()
                return n

    assert asyncio.run(main()) == 3
    m = wait_idle(base_url)
    assert m["kv_cache_usage_perc"] == 0 and metrics(base_url)["num_requests_running"] == 0
