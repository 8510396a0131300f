"""The client half of the serving benchmark: build OpenAI-style requests, stream them, time each chunk.

Any OpenAI-compatible server streams its answer as server-sent events (SSE): lines ``data: {json}``,
one chunk per few tokens, ending with ``data: [DONE]``. Timing those chunks on the client, the way
a user sees them, is what makes numbers from different servers comparable: no server gets to
report its own latency. The SSE lines are parsed here by hand (a few lines), so nothing hides how.

    payload = completions_payload("m", [101, 102], max_tokens=8)
    result = await send_request(client, base_url + "/v1/completions", payload, prompt_tokens=2)
    result.ttft_s, result.itl_s, result.output_tokens
"""
from __future__ import annotations

import contextlib
import resource
import time
from dataclasses import dataclass, field

import msgspec

from . import bench_extra

with bench_extra():
    import httpx

_decode_json = msgspec.json.Decoder().decode
DONE = "[DONE]"
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class RequestResult:
    """What the client saw of one request; times in seconds on ``time.perf_counter``'s clock."""

    prompt_tokens: int
    ok: bool = False
    output_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between the chunks that carried tokens
    e2e_s: float | None = None
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; None with a single token (no gap to measure)."""
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def completions_payload(model: str, ids: list[int], max_tokens: int, extra: dict | None = None) -> dict:
    """/v1/completions with the prompt as token ids: the server skips tokenization, so every server
    sees exactly the same tokens, whatever its tokenizer. ignore_eos pins the output length."""
    return {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}


def ids_to_text(ids: list[int], text_format: str = "w{id}") -> str:
    """Token ids as text for chat requests: with the default, a word-level tokenizer whose token i is
    "w{i}" reads back exactly these ids, so a random-weight model served by another server (which
    only takes text in chat) sees the same prompt."""
    return " ".join(text_format.format(id=i) for i in ids)


def chat_payload(model: str, system_ids: list[int], user_ids: list[int], max_tokens: int, text_format: str = "w{id}",
                 extra: dict | None = None) -> dict:
    """/v1/chat/completions with a system and a user message. No ignore_eos: it is not OpenAI's, and
    some servers refuse unknown fields; pass it with ``extra`` where the server takes it."""
    messages = [{"role": "system", "content": ids_to_text(system_ids, text_format)},
                {"role": "user", "content": ids_to_text(user_ids, text_format)}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {})}


def parse_sse_line(line: str):
    """One line of an SSE stream: its JSON object, ``DONE`` for the end marker, or None for lines
    that carry no data (blank separators, ``: comments``, ``event:`` fields)."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:"):].strip()
    if data == DONE:
        return DONE
    return _decode_json(data)  # msgspec: the load generator's own CPU time is in every served number


def carries_tokens(chunk: dict) -> bool:
    """Whether a chunk reports newly generated tokens.

    Completions: every chunk with a choice is one engine step's output, even when its text is empty
    (bytes of an unfinished character held back, or a model served without a tokenizer); vLLM's
    client counts them the same way. Chat: only a delta with content, since chat streams open with
    an empty ``{"role": "assistant"}`` chunk sent before any work, and some close with an empty one.
    The usage chunk has no choices.
    """
    choices = chunk.get("choices") or []
    if not choices:
        return False
    return "text" in choices[0] or bool((choices[0].get("delta") or {}).get("content"))


def chunk_completion_tokens(chunk: dict) -> int | None:
    """``usage.completion_tokens`` if the chunk carries the usage (the last one does, when asked)."""
    return (chunk.get("usage") or {}).get("completion_tokens")


async def send_request(client: httpx.AsyncClient, url: str, payload: dict, prompt_tokens: int) -> RequestResult:
    """POST one streaming request and time it. Never raises: a failure is a result with its error,
    so one bad request cannot end a run of a thousand."""
    result = RequestResult(prompt_tokens)
    token_chunks, usage_tokens, last = 0, None, None
    start = time.perf_counter()
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                raise RuntimeError(f"HTTP {response.status_code}: {body[:300]}")
            end = finished_at = None
            async for line in response.aiter_lines():
                now = time.perf_counter()  # the moment the line arrived, before any work on it
                event = parse_sse_line(line)
                if event is None:
                    continue
                if event == DONE:
                    end = now
                    break
                if event.get("error"):
                    raise RuntimeError(f"error chunk: {event['error']}")
                if carries_tokens(event):
                    if result.ttft_s is None:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last)
                    last = now
                    token_chunks += 1
                usage_tokens = chunk_completion_tokens(event) or usage_tokens
                if any(c.get("finish_reason") for c in event.get("choices") or []) or finished_at is not None:
                    finished_at = now  # the finishing chunk, or the usage chunk after it
        # Some servers (transformers serve) close the stream after the finishing chunk, with no [DONE].
        end = end if end is not None else finished_at
        if end is None:
            raise RuntimeError("stream ended before data: [DONE] or a finish_reason")
        if token_chunks == 0:
            raise RuntimeError("no chunk carried a token")
    except Exception as error:  # noqa: BLE001 - one request's failure is a result, its message kept
        result.error = f"{type(error).__name__}: {error}"
        return result
    result.e2e_s = end - start
    # The usage counts tokens; chunks miscount when a server sends several tokens in one chunk, or in
    # chat holds back text that is not whole yet.
    result.output_tokens = usage_tokens or token_chunks
    result.ok = True
    return result


def raise_open_file_limit() -> None:
    """One connection per request in flight: at rate inf that is all of them, and the usual soft limit
    of 1024 open files would fail requests in the client, not in the server."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
