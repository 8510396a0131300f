"""The `minivllm` command: `minivllm serve MODEL [--engine-flags] [--host H --port P]`.

Every field of `EngineConfig` is a kebab-case flag (`--max-model-len 1024`, `--no-enable-prefix-caching`).
Ctrl-C or SIGTERM stops the engine and exits 0; if the engine core dies, open streams get an error
event and the server exits 1, so that a supervisor restarts it.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
import typing

from .config import KV_CACHE_DTYPES, QUANTIZATIONS, EngineConfig

CHOICES = {"quantization": QUANTIZATIONS, "kv_cache_dtype": KV_CACHE_DTYPES}  # shown by --help, checked by argparse


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        if f.name == "model":
            continue
        flag, kind = "--" + f.name.replace("_", "-"), hints[f.name]
        if kind is bool or kind == bool | None:  # None: the engine decides (e.g. prefix caching off for a window)
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            # `int | None` -> int: the flag's value is parsed, None stays the default.
            base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
            if base is dict:  # a JSON object, as vLLM's --speculative-config takes it
                parser.add_argument(flag, type=json.loads, default=f.default, metavar="JSON")
            else:
                parser.add_argument(flag, type=base, default=f.default, choices=CHOICES.get(f.name),
                                    metavar=base.__name__.upper() if f.name not in CHOICES else None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minivllm", description="minivllm: a small vLLM.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("model", help="an HF-format folder, a hub id, or a preset (smollm2-135m, mistral-7b)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=None, help="the name clients ask for (default: MODEL)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.add_argument("--engine-core-process", action=argparse.BooleanOptionalAction, default=True,
                       help="run the engine core in a process of its own; --no-engine-core-process runs it in a "
                            "thread of the server's process (the ablation: both then share one GIL)")
    _add_engine_flags(serve)
    return parser


ENGINE_DEAD_GRACE_S = 2.0   # time for the open streams' error events to go out


class _StopSignal(Exception):
    """SIGTERM or Ctrl-C, re-raised by uvicorn after its graceful shutdown, so the engine core is stopped."""


def _raise_stop(signum, frame):
    raise _StopSignal(signal.Signals(signum).name)


def _fast_event_loop():
    """uvloop's event loop (libuv, in C) when installed, as `uvicorn.run` would pick; else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from .engine.async_llm import AsyncLLM
    from .engine.core import freeze_startup_objects, unfreeze_startup_objects
    from .server.api_server import build_app

    engine_args = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig) if f.name != "model"}
    try:
        engine = AsyncLLM(args.model, engine_core_process=args.engine_core_process, **engine_args)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"minivllm serve: {e}") from None
    app = build_app(engine, args.served_model_name or args.model)
    freeze_startup_objects()  # keep startup objects out of the garbage collector's full collections
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=3))

    async def stop_when_the_engine_dies():
        while engine.is_running:
            await asyncio.sleep(0.2)
        await asyncio.sleep(ENGINE_DEAD_GRACE_S)
        server.should_exit = True

    async def run():
        watchdog = asyncio.create_task(stop_when_the_engine_dies())
        try:
            await server.serve()
        finally:
            watchdog.cancel()

    before = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with asyncio.Runner(loop_factory=_fast_event_loop()) as runner:
            runner.run(run())
    except _StopSignal:
        pass
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        died = engine.error
        engine.shutdown()
        unfreeze_startup_objects()
    if died is not None:
        print(f"minivllm serve: {died}; exiting", file=sys.stderr)
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        serve(args)


if __name__ == "__main__":
    main()
