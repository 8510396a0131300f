"""The OpenAI-compatible HTTP server: FastAPI routes over one `AsyncLLM`.

    POST /v1/completions, /v1/chat/completions   outputs, streamed as server-sent events or whole
    GET  /v1/models, /health, /metrics, /         the model, liveness, Prometheus text, the chat page

The engine core runs in its own process, so requests are coroutines on one event loop. A client that
hangs up aborts its request; a slow stream reader gets the missed steps merged into one event.
"""
from __future__ import annotations

import asyncio
import json
import time
from importlib import resources

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from ..chat import encode_chat
from ..engine.async_llm import AsyncLLM, EngineDeadError
from . import protocol
from .metrics import ServerMetrics
from .protocol import APIError


def build_app(engine: AsyncLLM, served_model_name: str) -> FastAPI:
    app = FastAPI(title="minivllm", docs_url=None, redoc_url=None)
    metrics = ServerMetrics(engine, served_model_name)
    max_model_len = engine.max_model_len
    chat_page = resources.files("minivllm.server").joinpath("static/chat.html").read_text()

    @app.exception_handler(APIError)
    async def api_error(_, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(EngineDeadError)
    async def engine_dead(request, e: EngineDeadError):
        return await api_error(request, _engine_stopped(e))

    @app.get("/health")
    async def health():
        if not engine.is_running:
            raise _engine_stopped(f"engine stopped: {engine.error!r}")
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "minivllm", "max_model_len": max_model_len}]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", response_class=HTMLResponse)
    async def chat_ui():
        return chat_page

    async def serve(request: Request, chat: bool):
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(f"invalid JSON body: {e}") from None
        parsed = protocol.parse_request(body, chat)
        if body["model"] != served_model_name:
            raise APIError(f"model {body['model']!r} does not exist; this server has {served_model_name!r}",
                           404, "not_found_error")
        try:
            prompt = encode_chat(engine.tokenizer, parsed.prompt) if chat else parsed.prompt
            if chat and not parsed.max_tokens_given:  # as vLLM: the output may fill the context
                parsed.params.max_tokens = max(1, max_model_len - len(prompt))
            request_id = protocol.new_id(chat)
            stream = await engine.add_request(request_id, prompt, parsed.params)
        except ValueError as e:  # bad messages, over-long prompt, ids outside the vocabulary ...
            raise APIError(str(e)) from None
        if parsed.stream:
            return StreamingResponse(_sse(stream, request_id, chat, parsed.include_usage, parsed.params,
                                          parsed.tool_call),
                                     media_type="text/event-stream", background=BackgroundTask(stream.close))
        try:
            final = await _unless_disconnected(request, _last(stream))
        except ValueError as e:  # refused by the engine core, e.g. a grammar it cannot build
            raise APIError(str(e)) from None
        finally:
            stream.close()
        if final is None:  # the client is gone
            return Response(status_code=499)
        choices = []
        for a in final.outputs:
            choice = protocol.choice(chat, a.text, a.finish_reason, False, index=a.index,
                                     logprobs=protocol.logprobs_of(chat, a.logprobs, parsed.params.logprobs))
            choices.append(parsed.tool_call.into_choice(choice, a.text) if parsed.tool_call is not None else choice)
        return protocol.response(request_id, served_model_name, chat, choices, False,
                                 protocol.usage(len(final.prompt_token_ids), _num_tokens(final)))

    async def _last(stream):
        last = None
        async for out in stream.merged():
            metrics.on_output(out, last)
            last = out
        metrics.on_finished(last)
        return last

    async def _sse(stream, request_id: str, chat: bool, include_usage: bool, params, tool_call=None):
        """Server-sent events: one chunk per engine step and output (`index`) with the new text, logprobs or
        tool calls, then usage, then [DONE]."""
        def event(choices, usage=None):
            body = protocol.response(request_id, served_model_name, chat, choices, True, usage)
            if include_usage and usage is None:
                body["usage"] = None  # OpenAI's shape: null on every chunk but the last
            return _sse_bytes(body)

        try:
            if chat:  # OpenAI's streams open with the role
                for i in range(params.n):
                    yield event([protocol.choice(chat, "", None, delta=True, first=True, index=i)])
            # Per output: text, tokens and text offset sent, finished, tool call arguments sent.
            sent, last = [["", 0, 0, False, []] for _ in range(params.n)], None
            async for out in stream.merged():  # the steps a slow reader missed come as one event
                metrics.on_output(out, last)
                last = out
                for a, (text, tokens, offset, done, arguments) in zip(out.outputs, sent):
                    if done or (len(a.token_ids) == tokens and a.finish_reason is None):
                        continue  # nothing new for this output
                    new = a.logprobs[tokens:] if a.logprobs is not None else None
                    logprobs = protocol.logprobs_of(chat, new, params.logprobs, offset)
                    choice = protocol.choice(chat, a.text[len(text):], a.finish_reason, True, index=a.index,
                                             logprobs=logprobs)
                    if tool_call is not None:
                        choice = tool_call.into_delta(choice, a.text, arguments)
                    yield event([choice])
                    offset += sum(len(next(iter(d.values())).decoded_token) for d in new or [])
                    sent[a.index] = [a.text, len(a.token_ids), offset, a.finish_reason is not None, arguments]
            metrics.on_finished(last)
            if include_usage:
                yield event([], protocol.usage(len(last.prompt_token_ids), _num_tokens(last)))
            yield b"data: [DONE]\n\n"
        except EngineDeadError as e:
            yield _sse_bytes(_engine_stopped(e).body())
        except ValueError as e:  # refused by the engine core
            yield _sse_bytes(APIError(str(e)).body())
        finally:
            stream.close()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, chat=True)

    return app


_encode = msgspec.json.Encoder().encode


def _sse_bytes(data) -> bytes:
    return b"data: " + _encode(data) + b"\n\n"


def _num_tokens(out) -> int:
    """The tokens generated for a request, summed over its n outputs as OpenAI's usage counts them."""
    return sum(len(a.token_ids) for a in out.outputs)


def _engine_stopped(reason) -> APIError:
    return APIError(str(reason), 503, "server_error")


async def _unless_disconnected(request: Request, work):
    """Run `work`; if the client hangs up first, cancel it and return None."""
    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watcher = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    return None
