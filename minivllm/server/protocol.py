"""OpenAI's request and response shapes, read and written by hand.

Plain dicts rather than pydantic, so every bad value gets OpenAI's error shape with status 400
(FastAPI would answer 422): `parse_request` returns a `ParsedRequest` or raises `APIError` naming the
field. null means "the default" for every field but model and the prompt; unknown fields are
ignored, as in vLLM; unimplemented fields that would change the output (echo, best_of, suffix) are
refused unless their value asks for nothing. Structured outputs are in `response_format.py`, tools
in `tool_calls.py`.
"""
from __future__ import annotations

import reprlib
import time
import uuid
from dataclasses import dataclass

from ..chat import check_messages
from ..sampling_params import INT64_MAX, SamplingParams
from .response_format import parse_structured_outputs
from .tool_calls import ToolCallRequest, parse_tools


class APIError(Exception):
    """An error for one request, answered as {"error": {"message", "type", "code"}}."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.status, self.type = message, status, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.status}}


@dataclass
class ParsedRequest:
    prompt: object                 # str | list[int] for completions; messages for chat
    params: SamplingParams
    stream: bool
    include_usage: bool
    max_tokens_given: bool         # chat without max_tokens: the output may fill the context
    model: str = ""
    tool_call: ToolCallRequest | None = None  # chat with tools: the output becomes tool_calls


# Unimplemented fields and the values that ask for nothing (matched with their type: 1.0 is not 1).
_UNSUPPORTED_COMPLETIONS = {"echo": (False,), "best_of": (1,), "suffix": ("",)}


def parse_request(body, chat: bool) -> ParsedRequest:
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    key = "messages" if chat else "prompt"
    for name in (key, "model"):
        if body.get(name) is None:
            raise APIError(f"missing required field '{name}'")
    model = _get(body, "model", str)
    _get(body, "user", str)
    for name, harmless in ({} if chat else _UNSUPPORTED_COMPLETIONS).items():
        value = body.get(name)
        if value is not None and not any(type(value) is type(h) and value == h for h in harmless):
            raise APIError(f"'{name}' is not supported by this server, got {_show(value)}")
    prompt = _chat_messages(body["messages"]) if chat else _completion_prompt(body["prompt"])
    try:
        tool_call = parse_tools(body) if chat else None
        structured = parse_structured_outputs(body)
        if tool_call is not None:
            if structured is not None:
                raise ValueError("'tools' with a 'tool_choice' that calls them take no 'response_format' or "
                                 "'structured_outputs'")
            structured, prompt = tool_call.structured_outputs, tool_call.describe(prompt)
    except ValueError as e:
        raise APIError(str(e)) from None
    stream = _get(body, "stream", bool, False)
    include_usage = _get(_get(body, "stream_options", dict, {}), "include_usage", bool, False,
                         "stream_options.include_usage")
    # max_completion_tokens wins over max_tokens, as in vLLM; both are type-checked.
    newer = chat and body.get("max_completion_tokens") is not None
    tokens_name = "max_completion_tokens" if newer else "max_tokens"
    for name in ("max_tokens", "max_completion_tokens") if chat else ("max_tokens",):
        _get(body, name, int)
    max_tokens = body.get(tokens_name)
    logprobs, logprobs_name = _logprobs(body, chat)
    try:  # SamplingParams checks the values' types and ranges
        params = SamplingParams(
            temperature=_or(body.get("temperature"), 1.0),
            top_p=_or(body.get("top_p"), 1.0),
            top_k=_or(body.get("top_k"), -1),
            max_tokens=_or(max_tokens, 16),  # OpenAI's default for completions
            ignore_eos=_or(body.get("ignore_eos"), False),
            stop_token_ids=body.get("stop_token_ids"),
            seed=body.get("seed"),
            stop=body.get("stop"),
            presence_penalty=_or(body.get("presence_penalty"), 0.0),
            frequency_penalty=_or(body.get("frequency_penalty"), 0.0),
            repetition_penalty=_or(body.get("repetition_penalty"), 1.0),
            min_p=_or(body.get("min_p"), 0.0),
            min_tokens=_or(body.get("min_tokens"), 0),
            logit_bias=_logit_bias(_get(body, "logit_bias", dict)),
            structured_outputs=structured,
            logprobs=logprobs,
            n=_or(body.get("n"), 1),
        )
    except ValueError as e:  # rename fields to the client's names
        message = str(e)
        for ours, theirs in (("max_tokens", tokens_name), ("logprobs", logprobs_name)):
            if message.startswith(ours + " ") and theirs != ours:
                message = theirs + message[len(ours):]
        raise APIError(message) from None
    return ParsedRequest(prompt, params, stream, include_usage, max_tokens is not None, model, tool_call)


def _logprobs(body: dict, chat: bool) -> tuple[int | None, str]:
    """SamplingParams.logprobs (None: off) and the field that gave it: chat's `logprobs: true` with
    `top_logprobs`, or completions' integer `logprobs`."""
    if not chat:
        return (None if body.get("logprobs") is False else _get(body, "logprobs", int)), "logprobs"
    on, top = _get(body, "logprobs", bool, False), _get(body, "top_logprobs", int)
    if top and not on:
        raise APIError("'top_logprobs' requires 'logprobs': true")
    return (_or(top, 0) if on else None), "top_logprobs"


def _logit_bias(bias: dict | None) -> dict | None:
    """logit_bias keys are token ids as strings ("50256"); SamplingParams checks the rest."""
    if bias is None:
        return None
    ids = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 19):
            raise APIError(f"'logit_bias' keys must be token ids (digits), got {_show(key)}")
        ids[int(key)] = value
    return ids


def _or(value, default):
    return default if value is None else value


def _show(value) -> str:
    return reprlib.repr(value)  # bounded length


def _get(body: dict, name: str, kind: type, default=None, label: str | None = None):
    """A field's value if of type `kind` (a bool is no int); null or absent: the default."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise APIError(f"'{label or name}' must be of type {_JSON_NAMES[kind]}, got {_show(value)}")
    return value


_JSON_NAMES = {str: "string", int: "integer", bool: "boolean", dict: "object"}


def _chat_messages(messages) -> list[dict]:
    try:
        return check_messages(messages)
    except ValueError as e:
        raise APIError(str(e)) from None


def _completion_prompt(prompt):
    """A str or a list of token ids; OpenAI's batched forms only with one prompt in them."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) or (isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT64_MAX for t in prompt)):
        return prompt
    raise APIError(f"'prompt' must be a string or a list of token ids (integers >= 0), one prompt "
                   f"per request; got {_show(prompt)}")


# ---- responses -------------------------------------------------------------------------
def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(num_prompt_tokens: int, num_output_tokens: int) -> dict:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens,
            "total_tokens": num_prompt_tokens + num_output_tokens}


def choice(chat: bool, text: str, finish_reason: str | None, delta: bool, first: bool = False,
           logprobs: dict | None = None, index: int = 0) -> dict:
    """One entry of `choices`: a message or a streamed delta (chat), or a text."""
    if not chat:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    if delta:
        content = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {"index": index, "delta": content, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish_reason}


def logprobs_of(chat: bool, logprobs: list[dict] | None, top_n: int, text_offset: int = 0) -> dict | None:
    """CompletionOutput.logprobs (or a streamed slice) in OpenAI's chat or completions shape;
    `text_offset` is the first token's offset in the output text."""
    if logprobs is None:
        return None
    chosen = [next(iter(d.items())) for d in logprobs]
    if chat:
        return {"content": [{**_chat_token(*c), "top_logprobs": [
            _chat_token(*t) for t in sorted(d.items(), key=lambda t: t[1].rank)[:top_n]]}
            for c, d in zip(chosen, logprobs)]}
    offsets = []
    for _, lp in chosen:
        offsets.append(text_offset)
        text_offset += len(lp.decoded_token)
    return {"tokens": [lp.decoded_token for _, lp in chosen], "token_logprobs": [_finite(lp) for _, lp in chosen],
            "top_logprobs": [{lp.decoded_token: _finite(lp) for lp in d.values()} for d in logprobs],
            "text_offset": offsets}


def _chat_token(_, lp) -> dict:
    return {"token": lp.decoded_token, "logprob": _finite(lp), "bytes": list(lp.decoded_token.encode())}


def _finite(lp) -> float:
    return max(lp.logprob, -9999.0)  # JSON has no -inf; vLLM's floor


def response(request_id: str, model: str, chat: bool, choices: list, stream: bool, usage_: dict | None) -> dict:
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if chat and stream else "")
    body = {"id": request_id, "object": kind, "created": int(time.time()), "model": model, "choices": choices}
    if usage_ is not None or not stream:
        body["usage"] = usage_
    return body
