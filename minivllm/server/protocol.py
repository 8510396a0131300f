"""OpenAI's request and response shapes, read and written by hand.

Plain dicts rather than pydantic models, so that what the server accepts and answers is readable in
one file, and every bad value gets OpenAI's error shape with status 400 (FastAPI's validation
would answer 422 in its own shape).

Requests: `/v1/completions` (a text or token-id prompt) and `/v1/chat/completions` (messages).
Fields read: model, prompt | messages, max_tokens (chat: also max_completion_tokens), temperature,
top_p, top_k, seed, stop, n (1 only), stream, stream_options.include_usage, and vLLM's ignore_eos.
Fields OpenAI defines that change nothing here (user, ...) are ignored, as OpenAI's clients send them.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from ..sampling_params import SamplingParams


class APIError(Exception):
    """An error for one request, answered as {"error": {"message", "type", "code"}}."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.status, self.type = message, status, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.status}}


@dataclass
class ParsedRequest:
    prompt: object                 # str | list[int] for completions; the messages for chat
    params: SamplingParams
    stream: bool
    include_usage: bool
    max_tokens_given: bool         # chat without max_tokens: the answer may fill the context


def _or(value, default):
    return default if value is None else value


def _get(body: dict, name: str, kind, default=None):
    """A field that is not a sampling value (n, stream, ...): its type checked here."""
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise APIError(f"'{name}' must be of type {kind.__name__}, got {value!r}")
    return value


def parse_request(body, chat: bool) -> ParsedRequest:
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    key = "messages" if chat else "prompt"
    if key not in body:
        raise APIError(f"missing required field '{key}'")
    if "model" not in body:
        raise APIError("missing required field 'model'")
    prompt = body[key] if chat else _completion_prompt(body[key])
    if _get(body, "n", int, 1) != 1:
        raise APIError("only n=1 is supported")
    max_tokens = body.get("max_tokens")
    if chat and max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    stream_options = _get(body, "stream_options", dict, {})
    try:  # SamplingParams checks the sampling values' types and ranges; null means "the default"
        params = SamplingParams(
            temperature=_or(body.get("temperature"), 1.0),
            top_p=_or(body.get("top_p"), 1.0),
            top_k=_or(body.get("top_k"), -1),
            max_tokens=_or(max_tokens, 16),  # OpenAI's default for completions
            ignore_eos=_get(body, "ignore_eos", bool, False),
            seed=body.get("seed"),
            stop=body.get("stop"),
        )
    except ValueError as e:
        raise APIError(str(e)) from None
    return ParsedRequest(prompt, params, _get(body, "stream", bool, False),
                         bool(stream_options.get("include_usage")), max_tokens is not None)


def _completion_prompt(prompt):
    """A str or a list of token ids; OpenAI's batched forms only with one prompt in them."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) or (isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        return prompt
    raise APIError("'prompt' must be a string or a list of token ids (one prompt per request)")


# ---- responses -------------------------------------------------------------------------
def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(num_prompt_tokens: int, num_output_tokens: int) -> dict:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens,
            "total_tokens": num_prompt_tokens + num_output_tokens}


def choice(chat: bool, text: str, finish_reason: str | None, delta: bool, first: bool = False) -> dict:
    """One entry of `choices`: a message or a streamed delta (chat), or a text (completions)."""
    if not chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if delta:
        content = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {"index": 0, "delta": content, "logprobs": None, "finish_reason": finish_reason}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
            "finish_reason": finish_reason}


def response(request_id: str, model: str, chat: bool, choices: list, stream: bool, usage_: dict | None) -> dict:
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if chat and stream else "")
    body = {"id": request_id, "object": kind, "created": int(time.time()), "model": model, "choices": choices}
    if usage_ is not None or not stream:
        body["usage"] = usage_
    return body
