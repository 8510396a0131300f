"""What serving costs over the offline engine: the same streams, offline and through the HTTP server.

    python -m minivllm_lab.bench.serve_overhead                          # 256 streams x 64 tokens, both modes
    python -m minivllm_lab.bench.serve_overhead --modes thread --plot figures/13_engine_core_process.png
    python -m minivllm_lab.bench.serve_overhead --smoke                  # 8 streams x 8 tokens (tests, CI)

A tiny random Llama (2 layers, hidden 64) keeps the arithmetic small, so the Python around it is a
large share of each step: scheduling, detokenizing, and in the server the HTTP frontend (parsing
requests, one SSE chunk per stream per step, encoded as JSON and written to a socket). N streams
start at once, each a random prompt and ``--output-len`` tokens (ignore_eos, greedy), and run:

- offline: ``LLM.generate`` on the prompts (with the tokenizer, so it detokenizes as the server does);
- served, for each mode: the engine core in its own process (``--engine-core-process``), or in a
  thread of the server's process (``--no-engine-core-process``); for each endpoint: completions
  (token-id prompts) and chat (the same ids as words, through the chat template).

Why the modes: in thread mode the engine thread and the asyncio frontend share one interpreter,
and so one GIL. While the frontend turns a step's outputs into N chunks, the engine cannot
schedule the next step, and the other way round: the two take turns on one core whatever the
machine has. With the engine core in a process of its own, each has an interpreter (and a core),
and they meet only through a socket (ZMQ, msgpack). The table gives each served run's output
tokens/s against offline, and the gaps between a stream's chunks (ITL) and its first token (TTFT)
as the client saw them (tokens_per_chunk > 1: the server sent several steps in one chunk).

The client runs in this process, the server is a subprocess: the same for both modes, and on a
small machine the client's own CPU time is in every served number. The engine gets ``--threads``
torch threads (default 1) offline and served (OMP_NUM_THREADS): its tensors are tiny, and on a
2-core machine a second torch thread only fights the frontend and the client for the cores.
Prefix caching is off, as every run sends the same prompts. Every server is started once; then
``--repeats`` rounds each run offline and every served case, one after the other, and each row of the
table is its median round (on a shared machine one run can be twice as fast as the next). Results go to
bench-results/serve_overhead.json unless ``--out`` says otherwise; ``--plot`` draws them.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from . import bench_extra
from .metrics import _stats, format_table, hardware_name, save_json
from .serve_client import ENDPOINTS, chat_payload, completions_payload, raise_open_file_limit, send_request
from .word_model import write_word_model

with bench_extra():
    import httpx

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 2048, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "float32",
}
MAX_MODEL_LEN = 512
BLOCK_SIZE = 16
SMOKE = {"streams": 8, "output_len": 8, "min_prompt": 8, "max_prompt": 16, "repeats": 1}
MODES = {"process": "--engine-core-process", "thread": "--no-engine-core-process"}
SYSTEM_LEN = 4  # chat: the first ids of each prompt are the system message, the rest the user's
COLUMNS = ["run", "output_tokens", "output_tok_s", "vs_offline", "itl_p50_ms", "itl_p99_ms", "tokens_per_chunk",
           "ttft_p50_s", "ttft_p99_s", "failed"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m minivllm_lab.bench.serve_overhead",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=256, help="requests at once (and max_num_seqs)")
    p.add_argument("--output-len", type=int, default=64, help="tokens per stream")
    p.add_argument("--min-prompt", type=int, default=16)
    p.add_argument("--max-prompt", type=int, default=64)
    p.add_argument("--modes", default="process,thread", help=f"comma-separated, of {list(MODES)}")
    p.add_argument("--endpoints", default="completions,chat", help=f"comma-separated, of {list(ENDPOINTS)}")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of the engine, offline and in the server (OMP_NUM_THREADS)")
    p.add_argument("--warmup", type=int, default=4, help="requests sent before each timed served run")
    p.add_argument("--repeats", type=int, default=5, help="rounds of every run; each row is the median round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may wait for its next bytes")
    p.add_argument("--out", default="bench-results/serve_overhead.json")
    p.add_argument("--plot", default=None, help="PNG path of the bar chart (default: none)")
    p.add_argument("--smoke", action="store_true", help=f"tiny sizes: {SMOKE}")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    args.modes = [m for m in args.modes.split(",") if m]
    args.endpoints = [e for e in args.endpoints.split(",") if e]
    for name, chosen, known in [("mode", args.modes, MODES), ("endpoint", args.endpoints, ENDPOINTS)]:
        if unknown := [c for c in chosen if c not in known]:
            p.error(f"unknown {name} {unknown}: choose from {list(known)}")
    return args


def make_prompts(n: int, min_len: int, max_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)]


def engine_args(args) -> dict:
    """The same engine offline and served: room for every stream at once (its longest prompt and
    output, plus a block), and no prefix caching, so a run cannot find the last run's KV blocks."""
    blocks_per_seq = math.ceil((args.max_prompt + args.output_len) / BLOCK_SIZE) + 1
    return dict(load_format="dummy", device="cpu", dtype="float32", max_num_seqs=args.streams,
                num_kv_blocks=args.streams * blocks_per_seq + 16, block_size=BLOCK_SIZE,
                max_model_len=MAX_MODEL_LEN, enable_prefix_caching=False)


def serve_flags(engine: dict) -> list[str]:
    flags = []
    for name, value in engine.items():
        flag = "--" + name.replace("_", "-")
        flags += ([flag] if value else ["--no-" + flag[2:]]) if isinstance(value, bool) else [flag, str(value)]
    return flags


def offline_runner(args, folder: Path):
    """An LLM on the same engine as the servers; returns a function that times one offline run."""
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.engine.core import freeze_startup_objects

    torch.set_num_threads(args.threads)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm = LLM(str(folder), **engine_args(args))
    freeze_startup_objects()  # as the engine core and the server do: the baseline gets the same GC treatment
    llm.generate(make_prompts(args.warmup, args.min_prompt, args.max_prompt, MODEL_CONFIG["vocab_size"],
                              args.seed - 1), params, use_tqdm=False)

    def run(prompts: list[list[int]]) -> dict:
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        assert all(o.outputs[0].text for o in outputs), "offline: no text, so no detokenizing was measured"
        return {"output_tokens": tokens, "wall_s": wall, "output_tok_s": tokens / wall, "failed": 0}
    return run


def payload(endpoint: str, model: str, ids: list[int], output_len: int) -> dict:
    if endpoint == "completions":
        return completions_payload(model, ids, output_len)
    return chat_payload(model, ids[:SYSTEM_LEN], ids[SYSTEM_LEN:], output_len, extra={"ignore_eos": True})


async def run_served(args, base_url: str, model: str, endpoint: str, prompts: list[list[int]]) -> dict:
    url = base_url + ENDPOINTS[endpoint]
    limits = httpx.Limits(max_connections=args.streams + 8, max_keepalive_connections=args.streams + 8)
    async with httpx.AsyncClient(limits=limits, timeout=args.timeout) as client:
        warm = make_prompts(args.warmup, args.min_prompt, args.max_prompt, MODEL_CONFIG["vocab_size"], args.seed - 1)
        for result in await asyncio.gather(*(send_request(client, url, payload(endpoint, model, p, args.output_len),
                                                          len(p)) for p in warm)):
            if not result.ok:
                raise SystemExit(f"the warm-up request to {url} failed: {result.error}")

        async def timed(ids):
            start = time.perf_counter()
            result = await send_request(client, url, payload(endpoint, model, ids, args.output_len), len(ids))
            return start, time.perf_counter(), result

        runs = await asyncio.gather(*(timed(p) for p in prompts))
    results = [r for _, _, r in runs]
    ok = [r for r in results if r.ok]
    wall = max(end for _, end, _ in runs) - min(start for start, _, _ in runs)
    tokens = sum(r.output_tokens for r in ok)
    itl = _stats("itl", [gap for r in ok for gap in r.itl_s])
    errors = sorted({r.error for r in results if not r.ok})
    # More than 1 when the server sends several steps' tokens in one chunk (a frontend behind the
    # engine): fewer, longer gaps, which ITL alone would not show.
    chunks = sum(len(r.itl_s) + 1 for r in ok)
    return {"output_tokens": tokens, "wall_s": wall, "output_tok_s": tokens / wall, "failed": len(results) - len(ok),
            "tokens_per_chunk": tokens / chunks if chunks else None,
            "itl_p50_ms": None if itl["itl_p50_s"] is None else 1e3 * itl["itl_p50_s"],
            "itl_p99_ms": None if itl["itl_p99_s"] is None else 1e3 * itl["itl_p99_s"],
            **_stats("ttft", [r.ttft_s for r in ok]), "errors": errors[:5]}


def median_run(runs: list[dict]) -> dict:
    """The run of median throughput (its latencies with it), and every run's throughput."""
    ranked = sorted(runs, key=lambda r: r["output_tok_s"])
    return {**ranked[(len(ranked) - 1) // 2], "output_tok_s_runs": [r["output_tok_s"] for r in runs]}


def measure(args, folder: Path, prompts: list[list[int]]) -> list[dict]:
    """Offline and every served run, `--repeats` rounds, interleaved: a machine that slows down for a
    while (a shared VM, a CPU that warms up) slows every row alike, and each row is its median."""
    from minivllm.engine.core import unfreeze_startup_objects
    from minivllm.server.launcher import running_server

    with contextlib.ExitStack() as stack:
        stack.callback(unfreeze_startup_objects)  # offline_runner froze this process's objects
        offline = offline_runner(args, folder)
        urls = {mode: stack.enter_context(running_server(
                    [str(folder), *serve_flags(engine_args(args)), MODES[mode], "--log-level", "warning"],
                    env={"OMP_NUM_THREADS": str(args.threads)}))
                for mode in args.modes}   # every server up for the whole run; an idle one costs nothing
        served = [(mode, endpoint) for mode in args.modes for endpoint in args.endpoints]
        runs: dict = {"offline": [], **{f"{m} {e}": [] for m, e in served}}
        for round_ in range(args.repeats):
            runs["offline"].append(offline(prompts))
            for mode, endpoint in served:
                runs[f"{mode} {endpoint}"].append(asyncio.run(run_served(args, urls[mode], str(folder), endpoint,
                                                                         prompts)))
            print(f"round {round_ + 1}/{args.repeats}: " + ", ".join(
                f"{name} {r[-1]['output_tok_s']:,.0f}" for name, r in runs.items()) + " tok/s", flush=True)
    rows = [{"run": "offline", "mode": None, "endpoint": None, **median_run(runs["offline"])}]
    rows += [{"run": f"{m} {e}", "mode": m, "endpoint": e, **median_run(runs[f"{m} {e}"])} for m, e in served]
    return rows


def plot(result: dict, path: str) -> str:
    """Served/offline throughput and the p99 (and median) inter-token gap of each mode and endpoint."""
    with bench_extra():
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    served = [r for r in result["rows"] if r["mode"]]
    labels = [r["run"].replace(" ", "\n") for r in served]
    colors = ["tab:blue" if r["mode"] == "process" else "tab:orange" for r in served]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(labels, [r["vs_offline"] for r in served], color=colors)
    left.axhline(1.0, color="black", linewidth=1, label="offline")
    left.set_ylabel("served tok/s / offline tok/s")
    left.set_title(f"Throughput (offline {result['rows'][0]['output_tok_s']:,.0f} tok/s)", fontsize=10)
    left.legend(fontsize=9)
    right.bar(labels, [r["itl_p99_ms"] or 0 for r in served], color=colors, alpha=0.5, label="p99")
    right.bar(labels, [r["itl_p50_ms"] or 0 for r in served], color=colors, label="median")
    right.set_ylabel("ms")
    right.set_title("Gap between a stream's chunks (ITL)", fontsize=10)
    right.legend(fontsize=9)
    s = result["sizes"]
    fig.suptitle(f"{s['streams']} streams x {s['output_len']} tokens, tiny Llama, on {result['hardware']}",
                 fontsize=11)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv=None) -> dict:
    args = parse_args(argv)
    raise_open_file_limit()
    prompts = make_prompts(args.streams, args.min_prompt, args.max_prompt, MODEL_CONFIG["vocab_size"], args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args, write_word_model(Path(tmp) / "tiny-llama-words", MODEL_CONFIG), prompts)
    for row in rows:
        row["vs_offline"] = row["output_tok_s"] / rows[0]["output_tok_s"]
    print(format_table(rows, COLUMNS))
    for row in rows:
        for error in row.get("errors", []):
            print(f"  {row['run']} failed: {error}")
    sizes = dict(streams=args.streams, output_len=args.output_len, min_prompt=args.min_prompt,
                 max_prompt=args.max_prompt, seed=args.seed, torch_threads=args.threads, cpu_count=os.cpu_count(),
                 repeats=args.repeats)
    result = {"hardware": hardware_name(), "model": MODEL_CONFIG, "engine_args": engine_args(args), "sizes": sizes,
              "command": [sys.executable, "-m", "minivllm_lab.bench.serve_overhead", *(sys.argv[1:] if argv is None
                                                                                    else argv)],
              "rows": rows}
    print(f"results: {save_json(args.out, result)}")
    if args.plot:
        print(f"plot: {plot(result, args.plot)}")
    return result


if __name__ == "__main__":
    main()
