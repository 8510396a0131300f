"""parse_request: every field of both request bodies checked at the door. Whatever the JSON, the
answer is a ParsedRequest or an APIError with status 400 that names the field, never another
exception (which the server would answer with a 500)."""
import math
import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm import SamplingParams
from minivllm.server.protocol import APIError, ParsedRequest, parse_request

MESSAGES = [{"role": "user", "content": "Hi"}]
CHAT = {"model": "m", "messages": MESSAGES}
COMPLETION = {"model": "m", "prompt": "Once"}


def base(chat: bool) -> dict:
    return dict(CHAT if chat else COMPLETION)


def refused(body, chat: bool) -> str:
    with pytest.raises(APIError) as e:
        parse_request(body, chat)
    assert e.value.status == 400 and e.value.body()["error"]["code"] == 400
    return e.value.message


def test_minimal_bodies_get_the_defaults():
    for chat in (False, True):
        p = parse_request(base(chat), chat)
        assert p.params == SamplingParams() and p.model == "m"
        assert (p.stream, p.include_usage, p.max_tokens_given) == (False, False, False)
    assert parse_request(COMPLETION, False).prompt == "Once"
    assert parse_request(CHAT, True).prompt == MESSAGES


def test_every_field_is_read():
    body = {**COMPLETION, "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "seed": -5,
            "stop": "\n", "stop_token_ids": [2, 3], "ignore_eos": True, "n": 1, "stream": True,
            "stream_options": {"include_usage": True}, "user": "u"}
    p = parse_request(body, False)
    assert p.params == SamplingParams(temperature=0.5, top_p=0.9, top_k=3, max_tokens=7, ignore_eos=True,
                                      stop_token_ids=[2, 3], seed=-5, stop=["\n"])
    assert (p.stream, p.include_usage, p.max_tokens_given) == (True, True, True)


def test_null_means_the_default_for_every_optional_field():
    optional = ["max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos",
                "n", "stream", "stream_options", "user", "presence_penalty", "frequency_penalty", "logprobs",
                "logit_bias"]
    for chat in (False, True):
        extra = ["max_completion_tokens", "top_logprobs", "tools", "tool_choice", "response_format"] if chat \
            else ["echo", "best_of", "suffix"]
        p = parse_request({**base(chat), **{name: None for name in optional + extra}}, chat)
        assert p.params == SamplingParams() and not p.stream and not p.max_tokens_given
    p = parse_request({**COMPLETION, "stream": True, "stream_options": {"include_usage": None}}, False)
    assert p.stream and not p.include_usage


@pytest.mark.parametrize("chat, field", [(False, "prompt"), (False, "model"), (True, "messages"), (True, "model")])
def test_required_fields(chat, field):
    body = base(chat)
    assert field in refused({k: v for k, v in body.items() if k != field}, chat)
    assert field in refused({**body, field: None}, chat)


@pytest.mark.parametrize("body", [None, [], "x", 1, [CHAT]])
def test_the_body_must_be_an_object(body):
    assert "object" in refused(body, True)


BAD = [  # (field, value): refused on both endpoints, with the field's name in the message
    ("model", 123), ("model", ["m"]), ("model", True), ("model", {"id": "m"}),
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", "many"), ("max_tokens", 1.5), ("max_tokens", 8.0),
    ("max_tokens", True), ("max_tokens", 10**30), ("max_tokens", [8]), ("max_tokens", {"n": 8}),
    ("temperature", -1), ("temperature", "hot"), ("temperature", True), ("temperature", math.nan),
    ("temperature", math.inf), ("temperature", 10**30), ("temperature", [0.5]), ("temperature", {}),
    ("top_p", 0), ("top_p", 1.5), ("top_p", math.nan), ("top_p", "1"), ("top_p", False),
    ("top_k", 0), ("top_k", -2), ("top_k", 2.0), ("top_k", 10**30), ("top_k", 2**31), ("top_k", True),
    ("top_k", [5]),
    ("seed", 10**30), ("seed", 2**63), ("seed", -2**63 - 1), ("seed", 1.5), ("seed", "7"), ("seed", True),
    ("stop", 5), ("stop", {"a": 1}), ("stop", [""]), ("stop", ""), ("stop", [["a"]]), ("stop", [1]),
    ("stop", True),
    ("stop_token_ids", 5), ("stop_token_ids", [True]), ("stop_token_ids", [-1]), ("stop_token_ids", [1.0]),
    ("stop_token_ids", [[1]]), ("stop_token_ids", [10**30]), ("stop_token_ids", "1"), ("stop_token_ids", {}),
    ("ignore_eos", 1), ("ignore_eos", "true"), ("ignore_eos", [True]),
    ("n", 0), ("n", -1), ("n", True), ("n", 1.0), ("n", "1"), ("n", 10**30),
    ("stream", 1), ("stream", "true"), ("stream", [True]), ("stream", {}),
    ("stream_options", True), ("stream_options", []), ("stream_options", "x"),
    ("user", 5), ("user", ["u"]), ("user", {}),
    ("presence_penalty", 2.5), ("presence_penalty", "0"), ("presence_penalty", False), ("presence_penalty", math.nan),
    ("frequency_penalty", -3), ("frequency_penalty", [0]), ("frequency_penalty", 10**30),
    ("logprobs", "1"), ("logprobs", [1]), ("logprobs", 1.5), ("logprobs", {}),
    ("logit_bias", []), ("logit_bias", {"a": 1}), ("logit_bias", {"-1": 1}), ("logit_bias", {"1": 1000}),
    ("logit_bias", {"1": "x"}), ("logit_bias", {"1": math.nan}), ("logit_bias", {"9" * 40: 1}),
    ("repetition_penalty", 0), ("repetition_penalty", -1), ("repetition_penalty", "1"),
    ("min_p", 1.5), ("min_p", -0.1), ("min_tokens", -1), ("min_tokens", 10**30), ("min_tokens", 100),
    ("min_tokens", 1.0),
]


def test_logits_processing_fields_reach_the_sampling_params():
    for chat in (False, True):
        body = {**base(chat), "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
                "min_p": 0.1, "min_tokens": 4, "logit_bias": {"7": -100, "12": 2.5}}
        params = parse_request(body, chat).params
        assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -1, 1.2)
        assert (params.min_p, params.min_tokens, params.logit_bias) == (0.1, 4, {7: -100.0, 12: 2.5})


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("field, value", BAD)
def test_a_bad_field_is_a_400_naming_it(chat, field, value):
    assert field in refused({**base(chat), field: value}, chat)


def test_include_usage_must_be_a_bool():
    message = refused({**COMPLETION, "stream": True, "stream_options": {"include_usage": 1}}, False)
    assert "include_usage" in message


def test_n_reaches_the_sampling_params():
    for chat in (False, True):
        assert parse_request({**base(chat), "n": 4}, chat).params.n == 4


def test_logprobs_fields():
    assert parse_request({**CHAT, "logprobs": True}, True).params.logprobs == 0
    assert parse_request({**CHAT, "logprobs": True, "top_logprobs": 5}, True).params.logprobs == 5
    assert parse_request({**CHAT, "logprobs": False, "top_logprobs": 0}, True).params.logprobs is None
    assert parse_request({**COMPLETION, "logprobs": 3}, False).params.logprobs == 3
    assert parse_request({**COMPLETION, "logprobs": 0}, False).params.logprobs == 0
    for value in (21, -1, True):  # out of range (vLLM's max_logprobs is 20), or a bool where a count belongs
        assert "logprobs" in refused({**COMPLETION, "logprobs": value}, False)
    for value in (21, -1, True, 1.0, "2"):
        assert "top_logprobs" in refused({**CHAT, "logprobs": True, "top_logprobs": value}, True)
    for value in (1, 0, "true"):
        assert "logprobs" in refused({**CHAT, "logprobs": value}, True)
    assert "requires 'logprobs'" in refused({**CHAT, "top_logprobs": 2}, True)


@pytest.mark.parametrize("field, value", [
    ("max_completion_tokens", 0), ("max_completion_tokens", "8"), ("max_completion_tokens", True),
    ("max_completion_tokens", 10**30), ("top_logprobs", 2), ("tools", [{"type": "function"}]),
    ("tool_choice", "auto"), ("tool_choice", {"type": "function"}), ("response_format", {"type": "xml"}),
    ("messages", []), ("messages", "Hi"), ("messages", {"role": "user"}), ("messages", [{"content": "no role"}]),
    ("messages", [{"role": "robot", "content": "x"}]), ("messages", [{"role": "user"}]),
    ("messages", [{"role": "user", "content": 5}]),
    ("messages", [{"role": "user", "content": [{"type": "image_url"}]}]),
    ("messages", [{"role": "user", "content": [{"type": "text", "text": 5}]}]), ("messages", ["Hi"]),
    ("messages", [{"role": ["user"], "content": "x"}]),
])
def test_a_bad_chat_field_is_a_400_naming_it(field, value):
    assert field in refused({**CHAT, field: value}, True)


@pytest.mark.parametrize("field, value", [
    ("echo", True), ("best_of", 2), ("best_of", True), ("suffix", "end"),
    ("prompt", 5), ("prompt", ["a", "b"]), ("prompt", [[1], [2]]), ("prompt", [1, "a"]), ("prompt", [[[1]]]),
    ("prompt", [True]), ("prompt", [-1]), ("prompt", [10**30]), ("prompt", [1.0]), ("prompt", {"text": "a"}),
    ("prompt", True),
])
def test_a_bad_completions_field_is_a_400_naming_it(field, value):
    assert field in refused({**COMPLETION, field: value}, False)


@pytest.mark.parametrize("prompt, expected", [("a", "a"), ("", ""), ([1, 2], [1, 2]), (["a"], "a"),
                                              ([[1, 2]], [1, 2]), ([], []), ([5], [5])])
def test_prompt_forms(prompt, expected):
    assert parse_request({**COMPLETION, "prompt": prompt}, False).prompt == expected


def test_content_as_text_parts_and_unknown_message_keys():
    messages = [{"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind"}]},
                {"role": "user", "content": "Hi", "name": "ann"}]
    assert parse_request({**CHAT, "messages": messages}, True).prompt == [
        {"role": "system", "content": "Be kind"}, {"role": "user", "content": "Hi"}]


def test_max_completion_tokens_wins_and_errors_name_it():
    p = parse_request({**CHAT, "max_completion_tokens": 5}, True)
    assert p.params.max_tokens == 5 and p.max_tokens_given
    assert parse_request({**CHAT, "max_tokens": 9, "max_completion_tokens": 5}, True).params.max_tokens == 5
    assert parse_request({**CHAT, "max_tokens": 9}, True).params.max_tokens == 9
    assert refused({**CHAT, "max_completion_tokens": 0}, True).startswith("max_completion_tokens")
    assert "max_tokens" in refused({**CHAT, "max_tokens": "x", "max_completion_tokens": 5}, True)
    # completions has no max_completion_tokens: an unknown field, ignored
    assert parse_request({**COMPLETION, "max_completion_tokens": "x"}, False).params.max_tokens == 16


@pytest.mark.parametrize("chat, field, value", [
    (True, "tools", []), (True, "tool_choice", "none"), (True, "logprobs", False), (True, "top_logprobs", 0),
    (True, "response_format", {"type": "text"}), (False, "logprobs", False), (False, "echo", False),
    (False, "best_of", 1), (False, "suffix", ""), (False, "presence_penalty", 0), (True, "frequency_penalty", 0.0),
    (True, "logit_bias", {}), (False, "repetition_penalty", 1.0), (False, "min_p", 0), (True, "min_tokens", 0),
])
def test_unsupported_fields_are_accepted_when_they_ask_for_nothing(chat, field, value):
    assert parse_request({**base(chat), field: value}, chat).params == SamplingParams()


def test_unknown_fields_are_ignored():
    for chat in (False, True):
        body = {**base(chat), "whatever": {"a": [1, {"b": math.nan}]}, "parallel_tool_calls": True, "": None}
        assert parse_request(body, chat).params == SamplingParams()


def test_messages_stay_short_for_huge_values():
    assert len(refused({**COMPLETION, "model": ["x" * 10**6]}, False)) < 300
    assert len(refused({**CHAT, "stop": [1] + ["x" * 10**6]}, True)) < 300


# ---- whatever the body: a ParsedRequest or a 400 ----------------------------------------------
ODD_INTS = st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -2**63 - 1, 2**64, 10**30, -10**30])
SCALARS = (st.none() | st.booleans() | st.integers() | ODD_INTS | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=6) | st.sampled_from(["", "user", "system", "assistant", "text", "none", "m"]))
KEYS = st.text(max_size=5) | st.sampled_from(["role", "content", "type", "text", "include_usage"])
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
                    max_leaves=8)
TEXT_PART = st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=5))
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                 "content": st.text(max_size=8) | st.lists(TEXT_PART, max_size=3)})
TOKEN_IDS = st.lists(st.integers(0, 2**63 - 1), max_size=4)
PLAUSIBLE = {  # values the server must accept, field by field
    "model": st.just("m"),
    "prompt": st.text(max_size=8) | TOKEN_IDS | st.builds(lambda p: [p], st.text(max_size=8) | TOKEN_IDS),
    "messages": st.lists(MESSAGE, min_size=1, max_size=3),
    "max_tokens": st.integers(1, 2**31 - 1), "max_completion_tokens": st.integers(1, 2**31 - 1),
    "temperature": st.floats(0, 100) | st.integers(0, 3), "top_p": st.floats(0.001, 1) | st.just(1),
    "top_k": st.just(-1) | st.integers(1, 2**31 - 1), "seed": st.integers(-2**63, 2**63 - 1),
    "stop": st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=3),
    "stop_token_ids": TOKEN_IDS, "ignore_eos": st.booleans(), "n": st.just(1), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "user": st.text(max_size=4), "presence_penalty": st.just(0.0), "frequency_penalty": st.just(0),
    "logprobs": st.just(False), "logit_bias": st.just({}), "top_logprobs": st.just(0), "tools": st.just([]),
    "tool_choice": st.just("none"), "response_format": st.just({"type": "text"}), "echo": st.just(False),
    "best_of": st.just(1), "suffix": st.just(""),
}
FIELDS = sorted(PLAUSIBLE)
OPTIONAL = st.dictionaries(st.sampled_from([f for f in FIELDS if f not in ("model", "messages", "prompt")]),
                           st.none(), max_size=8)  # which optional fields a body has
PLAUSIBLE_OR_NULL = {f: PLAUSIBLE[f] | st.none() for f in FIELDS}


@st.composite
def plausible_body(draw, chat: bool) -> dict:
    body = {f: draw(PLAUSIBLE_OR_NULL[f]) for f in draw(OPTIONAL)}
    body.pop("prompt" if chat else "messages", None)
    body["model"] = "m"
    body["messages" if chat else "prompt"] = draw(PLAUSIBLE["messages" if chat else "prompt"])
    return body


SPOILED = st.lists(st.sampled_from(FIELDS), min_size=1, max_size=2)  # more: the first one hides the rest
UNKNOWN = st.dictionaries(KEYS, JSON, max_size=2)


@st.composite
def any_body(draw, chat: bool):
    if draw(st.integers(0, 20)) == 0:
        return draw(JSON)  # not even an object
    body = draw(plausible_body(chat))
    for field in draw(SPOILED):  # spoil a few fields
        if draw(st.integers(0, 3)) == 0:
            body.pop(field, None)
        else:
            body[field] = draw(JSON)
    body.update(draw(UNKNOWN))  # unknown fields (or known ones, drawn again)
    return body


def check_parsed(p: ParsedRequest, chat: bool) -> None:
    """What the engine and the server rely on, for any request that got through."""
    assert isinstance(p.params, SamplingParams) and isinstance(p.model, str)
    assert isinstance(p.stream, bool) and isinstance(p.include_usage, bool)
    ints = [p.params.top_k, p.params.max_tokens, *p.params.stop_token_ids] + \
           ([p.params.seed] if p.params.seed is not None else [])
    struct.pack(f"{len(ints)}q", *ints)  # msgpack's int64 can carry them
    assert math.isfinite(p.params.temperature) and math.isfinite(p.params.top_p)
    assert all(isinstance(s, str) and s for s in p.params.stop)
    if chat:
        assert p.prompt and all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in p.prompt)
    else:
        assert isinstance(p.prompt, str) or all(type(t) is int and 0 <= t < 2**63 for t in p.prompt)


@settings(max_examples=150, deadline=None)
@given(chat=st.booleans(), data=st.data())
def test_plausible_bodies_are_accepted(chat, data):
    body = data.draw(plausible_body(chat))
    p = parse_request(body, chat)
    check_parsed(p, chat)
    if body.get("temperature") is not None:
        assert p.params.temperature == body["temperature"]
    if body.get("stop_token_ids") is not None:
        assert p.params.stop_token_ids == body["stop_token_ids"]


@settings(max_examples=300, deadline=None)
@given(chat=st.booleans(), data=st.data())
def test_any_body_parses_or_is_a_400_naming_a_field(chat, data):
    body = data.draw(any_body(chat))
    try:
        p = parse_request(body, chat)
    except APIError as e:
        assert e.status == 400 and e.body()["error"]["code"] == 400
        named = isinstance(body, dict) and any(re.search(rf"\b{re.escape(k)}\b", e.message) for k in body if k)
        assert named or "missing required field" in e.message or "JSON object" in e.message, e.message
    else:
        check_parsed(p, chat)
