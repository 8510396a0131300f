"""The serving benchmark: load-test any OpenAI-compatible server with W3 at a sweep of request rates.

    python -m minivllm_lab.bench.serve --label minivllm --request-rate 1,2,4,8,inf     # against :8000
    python -m minivllm_lab.bench.serve --endpoint chat --label transformers --extra-body '{"ignore_eos": true}'
    python -m minivllm_lab.bench.serve --request-rate 5,10,20,40,80 --stop-at-slo-break  # up to where it breaks
    python -m minivllm_lab.bench.serve --smoke                                          # 8 tiny requests
    python -m minivllm_lab.bench.serve plot a.json b.json --out figures/13_serving.png  # servers side by side

Offline throughput is a batch job's number; a service is judged at a request rate, by how long each
user waits. So requests are sent as customers come (Poisson arrivals, or all at once), streamed,
and timed on the client, as vLLM's ``benchmarks/benchmark_serving.py`` does, in one small client
that any server can be measured with. Each rate prints vLLM's table; the JSON keeps every rate, and
the capacity: the highest rate served within the reading-speed SLO (see ``serve_stats``), and the first
rate that broke it (None: the capacity is only at least the highest rate swept). ``--stop-at-slo-break``
ends the sweep at that rate: the rates above it do not count towards the capacity.

One Python process parsing a thousand streams is itself a limit: on the H200 a single client process
sat at 100% of its core while the server's frontend was half idle (scripts/gpu_profile_serve.sh), so it
measured itself. ``--num-clients N`` deals the requests out to N client processes (request i to process
i mod N), which keep the same arrival schedule on the same clock and send back their results.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from minivllm.utils import progress

from . import bench_extra
from .metrics import format_table, hardware_name, save_json
from .serve_client import ENDPOINTS, chat_payload, completions_payload, raise_open_file_limit, send_request
from .serve_plot import plot_serving
from .serve_stats import (
    READING_SPEED_SLO,
    arrival_times,
    breaks,
    capacity,
    first_break,
    format_report,
    summarize_requests,
    sustainable_rate,
)
from .workloads import w3

with bench_extra():
    import httpx

# W3's sizes spelled out, so that the JSON records them; --num-prompts sets the number of requests.
SIZES = dict(system_len=128, min_user=16, max_user=256, output_len=150)
SMOKE_SIZES = dict(num_requests=8, system_len=16, min_user=4, max_user=16, output_len=8)
SUMMARY_COLUMNS = ["rate", "successful", "failed", "request_throughput_req_s", "output_tok_s", "ttft_p50_s",
                   "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "goodput_req_s", "slo_met_pct"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m minivllm_lab.bench.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="default: the first model of GET /v1/models")
    p.add_argument("--endpoint", choices=list(ENDPOINTS), default="completions",
                   help="completions: prompts as token ids; chat: a system and a user message, as text")
    p.add_argument("--text-format", default="w{id}", help="chat: how a token id is written ({id}), joined by spaces")
    p.add_argument("--extra-body", default="{}", help="JSON fields added to every request")
    p.add_argument("--request-rate", default=None, help="requests/s, a comma-separated sweep; inf = all at once "
                                                        "(default 1,2,4,8,inf; 4,inf with --smoke)")
    p.add_argument("--stop-at-slo-break", action="store_true",
                   help="end the sweep at the first finite rate whose p99 TTFT or TPOT breaks the SLO")
    p.add_argument("--max-output-tok-s", type=float, default=None,
                   help="the server's best output tokens/s on this workload (offline, or all requests at once): a "
                        "rate asking for more counts as broken however its run fared (serve_stats.sustainable_rate)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 is Poisson")
    p.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most (default: no limit)")
    p.add_argument("--num-clients", type=int, default=1,
                   help="client processes the requests are dealt out to, so that the client is not the limit")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--vocab-size", type=int, default=32000,
                   help="token ids are drawn below it: at most the model's vocabulary (Llama-2, Mistral: 32000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may wait for its next bytes")
    p.add_argument("--label", default=None, help="the server's name in tables and plots (default: the base URL)")
    p.add_argument("--hardware", default=None, help="what the server runs on (default: this machine's GPU or CPU)")
    p.add_argument("--out", default=None, help="JSON path (default bench-results/serve.json, serve-smoke.json)")
    p.add_argument("--plot", default=None, help="PNG path (default: beside the JSON)")
    p.add_argument("--smoke", action="store_true", help=f"tiny sizes ({SMOKE_SIZES}), no progress bar")
    args = p.parse_args(argv)
    if args.max_output_tok_s is not None and not args.max_output_tok_s > 0:
        p.error(f"--max-output-tok-s must be positive, got {args.max_output_tok_s:g}")
    return args


def w3_sizes(args) -> dict:
    return dict(SMOKE_SIZES) if args.smoke else dict(SIZES, num_requests=args.num_prompts)


def make_requests(args, model: str, work, system_len: int) -> list[tuple[dict, int]]:
    """(payload, prompt tokens) of each prompt of the workload, for the chosen endpoint."""
    extra = json.loads(args.extra_body)
    if args.endpoint == "completions":
        payloads = [completions_payload(model, p, n, extra) for p, n in zip(work.prompts, work.max_tokens)]
    else:  # W3's prompts all start with the system prompt, so the split is at system_len
        payloads = [chat_payload(model, p[:system_len], p[system_len:], n, args.text_format, extra)
                    for p, n in zip(work.prompts, work.max_tokens)]
    return [(payload, len(p)) for payload, p in zip(payloads, work.prompts)]


async def run_rate(client, url: str, requests: list[tuple[dict, int]], arrivals: list[float],
                   max_concurrency: int | None, progress_desc: str | None, start: float | None = None):
    """Send each request at its arrival time (seconds after ``start``, a ``time.perf_counter()`` moment; default
    now); return the results (in request order) and the wall time. A progress bar counts finished requests
    unless ``progress_desc`` is None."""
    # The semaphore models a client with a fixed pool of workers; a request waiting for it is timed
    # from when it is sent, as in vLLM, since that wait is the client's, not the server's.
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    bar = progress(total=len(requests), desc=progress_desc, enabled=progress_desc is not None)

    async def one(i):
        await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
        async with limit:
            result = await send_request(client, url, *requests[i])
        bar.update(1)
        return result

    start = time.perf_counter() if start is None else start
    results = await asyncio.gather(*(one(i) for i in range(len(requests))))
    duration = time.perf_counter() - start
    bar.close()
    return results, duration


def _client_process(url: str, requests, arrivals, max_concurrency, timeout: float, start: float):
    """One of --num-clients: its share of a rate's requests, on its own event loop and connections.
    ``start`` is the parent's perf_counter moment: the same clock in every process of the machine."""
    raise_open_file_limit()

    async def share():
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            results, _ = await run_rate(client, url, requests, arrivals, max_concurrency, None, start)
        return results, time.perf_counter()

    return asyncio.run(share())


def start_client_processes(n: int) -> ProcessPoolExecutor:
    """N fresh interpreters (spawn), each with this module imported, before anything is timed."""
    pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(_ready, range(n)))
    return pool


def _ready(_) -> bool:
    return True


async def run_rate_in_processes(pool, n: int, url: str, requests, arrivals, max_concurrency: int | None,
                                timeout: float):
    """run_rate over N client processes: request i in process i mod N; the results back in request order,
    and the wall time from the common start to the last request's end."""
    start = time.perf_counter() + 0.5  # time for every process to receive its share before the first arrival
    per_client = -(-max_concurrency // n) if max_concurrency else None
    shares = await asyncio.gather(*(
        asyncio.wrap_future(pool.submit(_client_process, url, requests[k::n], arrivals[k::n], per_client, timeout,
                                        start)) for k in range(n)))
    results = [None] * len(requests)
    for k, (share, _) in enumerate(shares):
        results[k::n] = share
    return results, max(end for _, end in shares) - start


async def benchmark(args) -> dict:
    """The whole sweep against one server; returns what goes into the JSON."""
    rates = [float(r) for r in (args.request_rate or ("4,inf" if args.smoke else "1,2,4,8,inf")).split(",")]
    sizes = w3_sizes(args)
    max_rate = sustainable_rate(args.max_output_tok_s, sizes["output_len"]) if args.max_output_tok_s else None
    url = args.base_url.rstrip("/") + ENDPOINTS[args.endpoint]
    # No pool limit: the semaphore, not httpx's pool, decides how many requests are in flight; a pool
    # limit would queue requests inside the client after their clocks started.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with contextlib.AsyncExitStack() as stack:
        pool = stack.enter_context(start_client_processes(args.num_clients)) if args.num_clients > 1 else None
        client = await stack.enter_async_context(httpx.AsyncClient(limits=limits, timeout=args.timeout))
        model = args.model or (await client.get(args.base_url.rstrip("/") + "/v1/models")).json()["data"][0]["id"]
        label = args.label or args.base_url
        # One request first: it checks the server takes our requests before a thousand fail, and pays
        # one-time costs (compilation, CUDA graphs) outside the timing. Its seed is used by no rate.
        first = w3(args.vocab_size, seed=args.seed - 1, **dict(sizes, num_requests=1))
        warmup = await send_request(client, url, *make_requests(args, model, first, sizes["system_len"])[0])
        if not warmup.ok:
            raise SystemExit(f"the warm-up request to {url} failed: {warmup.error}")
        rows = []
        for i, rate in enumerate(rates):
            # Fresh prompts at each rate (seed + i): the same prompts again would find the previous
            # rate's KV blocks in the server's prefix cache and flatter its TTFT.
            work = w3(args.vocab_size, seed=args.seed + i, **sizes)
            arrivals = arrival_times(len(work.prompts), rate, args.burstiness, args.seed)
            requests = make_requests(args, model, work, sizes["system_len"])
            if pool is not None:
                results, duration = await run_rate_in_processes(pool, args.num_clients, url, requests, arrivals,
                                                                args.max_concurrency, args.timeout)
            else:
                results, duration = await run_rate(client, url, requests, arrivals, args.max_concurrency,
                                                   progress_desc=None if args.smoke else f"{rate:g} req/s")
            row = {"rate": rate if math.isfinite(rate) else "inf", "workload_seed": args.seed + i,
                   **summarize_requests(results, duration, READING_SPEED_SLO)}
            print(format_report(row, label), flush=True)
            for error, count in list(row["errors"].items())[:3]:
                print(f"  failed ({count}x): {error}")
            rows.append(row)
            if args.stop_at_slo_break and math.isfinite(rate) and breaks(row, READING_SPEED_SLO, max_rate):
                print(f"the SLO broke at {rate:g} req/s: the sweep stops here", flush=True)
                break
    workload = {"name": "W3", **sizes, "vocab_size": args.vocab_size, "seed": args.seed, "burstiness": args.burstiness,
                "max_concurrency": args.max_concurrency, "num_clients": args.num_clients,
                "extra_body": json.loads(args.extra_body), "text_format": args.text_format}
    return {"label": label, "base_url": args.base_url, "model": model, "endpoint": args.endpoint,
            "workload": workload, "slo": READING_SPEED_SLO, "hardware": args.hardware or hardware_name(),
            "sustainable_rate_req_s": max_rate, "rates": rows,
            "capacity_req_s": capacity(rows, READING_SPEED_SLO, max_rate),
            "slo_broken_at_req_s": first_break(rows, READING_SPEED_SLO, max_rate)}


def plot_main(argv) -> None:
    p = argparse.ArgumentParser(prog="python -m minivllm_lab.bench.serve plot",
                                description="TTFT and TPOT vs request rate of several servers, on one figure")
    p.add_argument("results", nargs="+", help="JSON files written by the benchmark")
    p.add_argument("--out", required=True, help="PNG path")
    args = p.parse_args(argv)
    print(f"plot: {plot_serving([json.loads(Path(f).read_text()) for f in args.results], args.out)}")


def main(argv=None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["plot"]:
        return plot_main(argv[1:])
    args = parse_args(argv)
    raise_open_file_limit()
    result = asyncio.run(benchmark(args))
    print(format_table(result["rates"], SUMMARY_COLUMNS))
    print(f"capacity within the SLO (TTFT <= {READING_SPEED_SLO['ttft_s']} s, TPOT <= "
          f"{READING_SPEED_SLO['tpot_s'] * 1e3:.0f} ms at p99): {result['capacity_req_s']} req/s; "
          + (f"broken at {result['slo_broken_at_req_s']:g} req/s" if result["slo_broken_at_req_s"] is not None
             else "not broken at any rate swept"))
    out = Path(args.out or f"bench-results/serve{'-smoke' if args.smoke else ''}.json")
    save_json(out, result)
    plot = plot_serving([result], args.plot or str(out.with_suffix(".png")))
    print(f"results: {out}, plot: {plot}")


if __name__ == "__main__":
    main()
