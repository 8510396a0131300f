"""The arithmetic of the serving benchmark, with no server in sight: when requests arrive, what a
run's timings add up to, and the highest request rate a server sustains within a latency target.

Offline throughput says how fast a batch job ends; a service is judged by its users, who each wait
for a first token (TTFT) and then read the stream at some pace (TPOT). So a run is summarized as
vLLM's ``benchmark_serving.py`` does, plus goodput: the requests per second that met the SLO.

The SLO here is reading speed: a first token within 1 s, then tokens at least as fast as people
read. 240 words a minute is 4 words/s, about 5.3 tokens/s at ~1.33 tokens per English word, so one
token every 190 ms; a faster stream is not noticed, a slower one makes the reader wait. (The post's
reading speed and the tokens per word are `minivllm_lab.constants`; 1 / `reading_tok_s()` is 0.1875 s.)

    arrival_times(4, rate=2.0, burstiness=1.0, seed=0)   # [0.0, 0.6..., ...] seconds
    row = summarize_requests(results, duration_s=12.5, slo=READING_SPEED_SLO)
    capacity([{"rate": 1.0, **row1}, {"rate": 2.0, **row2}], READING_SPEED_SLO)   # 1.0, 2.0 or None
    first_break([{"rate": 1.0, **row1}, {"rate": 2.0, **row2}], READING_SPEED_SLO)  # 1.0, 2.0 or None
    capacity(rows, READING_SPEED_SLO, max_rate=sustainable_rate(15_576.0, 150))    # rates above 103.8 break
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .metrics import _stats

READING_SPEED_SLO = {"ttft_s": 1.0, "tpot_s": 0.19}


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """When each of n requests is sent, in seconds from the start of the run.

    The first goes at 0, then gaps are drawn from a gamma distribution with shape ``burstiness`` and
    mean 1/rate, as vLLM does: burstiness 1 gives exponential gaps (a Poisson process, customers who
    come independently), below 1 burstier, above 1 more regular. rate=inf sends all at once.
    """
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"need rate > 0 and burstiness > 0, got {rate} and {burstiness}")
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(n - 1, 0))
    return [0.0] + np.cumsum(gaps).tolist() if n else []


def meets_slo(result, slo: dict) -> bool:
    """A successful request whose TTFT and TPOT are within the SLO (one token: no TPOT to miss)."""
    if not result.ok or result.ttft_s > slo["ttft_s"]:
        return False
    return result.tpot_s is None or result.tpot_s <= slo["tpot_s"]


def summarize_requests(results: list, duration_s: float, slo: dict) -> dict:
    """One rate's numbers, as one flat dict (latencies in seconds, None where nothing was measured).

    ``results`` are ``RequestResult``s; ``duration_s`` is the run's wall time, from its start to the
    end of its last request. Tokens and latencies count successful requests only; a failed request
    counts in ``failed``, in ``errors`` (each distinct message with how often it came) and against
    the SLO. ITL pools every gap of every request, as vLLM does.
    """
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    ok = [r for r in results if r.ok]
    good = sum(meets_slo(r, slo) for r in results)
    input_tokens = sum(r.prompt_tokens for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "num_requests": len(results),
        "successful": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "request_throughput_req_s": len(ok) / duration_s,
        "output_tok_s": output_tokens / duration_s,
        "total_tok_s": (input_tokens + output_tokens) / duration_s,
        "goodput_req_s": good / duration_s,
        "slo_met_pct": 100.0 * good / len(results) if results else 0.0,
        **_stats("ttft", [r.ttft_s for r in ok]),
        **_stats("tpot", [r.tpot_s for r in ok if r.tpot_s is not None]),
        **_stats("itl", [gap for r in ok for gap in r.itl_s]),
        **_stats("e2e", [r.e2e_s for r in ok]),
        "errors": dict(Counter(r.error for r in results if not r.ok)),
    }


def within_slo(row: dict, slo: dict) -> bool:
    """One rate's row met the SLO: no request failed, and p99 TTFT and p99 TPOT are within it."""
    return (row["failed"] == 0 and row["ttft_p99_s"] is not None and row["ttft_p99_s"] <= slo["ttft_s"]
            and (row["tpot_p99_s"] is None or row["tpot_p99_s"] <= slo["tpot_s"]))


def sustainable_rate(max_output_tok_s: float, output_len: int) -> float:
    """The highest request rate whose answers the engine can make at all: its best output tokens per second on
    the same requests (offline, or served with every request at once) over the tokens of one answer. Above it
    requests arrive faster than any batch answers them, so the backlog grows for as long as the run lasts; a
    finite run can end before that breaks the SLO, and such a rate must not count as capacity."""
    if max_output_tok_s <= 0 or output_len <= 0:
        raise ValueError(f"need positive tokens/s and answer length, got {max_output_tok_s} and {output_len}")
    return max_output_tok_s / output_len


def breaks(row: dict, slo: dict, max_rate: float | None = None) -> bool:
    """One rate's row counts against the capacity: it missed the SLO, or its rate is above `max_rate`."""
    return not within_slo(row, slo) or (max_rate is not None and float(row["rate"]) > max_rate)


def _finite_rows(rows: list[dict]) -> list[dict]:
    return sorted((r for r in rows if math.isfinite(float(r["rate"]))), key=lambda r: float(r["rate"]))


def capacity(rows: list[dict], slo: dict, max_rate: float | None = None) -> float | None:
    """The highest finite rate up to which every rate swept succeeded with p99 TTFT and p99 TPOT within the SLO.

    The sweep stops counting at the first rate that breaks: a higher rate that happens to pass (an overloaded
    server whose queue drains differently) is not capacity. A rate above `max_rate` (`sustainable_rate`) breaks
    too, however its run fared. All-at-once (rate "inf") is left out: a burst of N requests is not a sustained
    rate, and how it fares depends on N. None if the lowest rate breaks.
    """
    best = None
    for row in _finite_rows(rows):
        if breaks(row, slo, max_rate):
            break
        best = float(row["rate"])
    return best


def first_break(rows: list[dict], slo: dict, max_rate: float | None = None) -> float | None:
    """The lowest finite rate swept that broke the SLO (or lies above `max_rate`), or None if none did (then the
    capacity is only a lower bound: at least the highest rate swept)."""
    return next((float(r["rate"]) for r in _finite_rows(rows) if breaks(r, slo, max_rate)), None)


def _ms(value) -> str:
    return "-" if value is None else f"{1e3 * value:.2f}"


def format_report(row: dict, label: str) -> str:
    """One rate's results as vLLM's benchmark_serving prints them (same rows, same layout), plus the
    failures and the share of requests that met the SLO."""
    title = f" {label} at {row['rate']} req/s "
    lines = [f"{title:=^50}"]

    def add(name, value):
        lines.append(f"{name:<40} {value}")

    add("Successful requests:", row["successful"])
    add("Failed requests:", row["failed"])
    add("Benchmark duration (s):", f"{row['duration_s']:.2f}")
    add("Total input tokens:", row["input_tokens"])
    add("Total generated tokens:", row["output_tokens"])
    add("Request throughput (req/s):", f"{row['request_throughput_req_s']:.2f}")
    add("Request goodput (req/s):", f"{row['goodput_req_s']:.2f}")
    add("Requests meeting the SLO (%):", f"{row['slo_met_pct']:.1f}")
    add("Output token throughput (tok/s):", f"{row['output_tok_s']:.2f}")
    add("Total Token throughput (tok/s):", f"{row['total_tok_s']:.2f}")
    sections = [("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
                ("itl", "ITL", "Inter-token Latency"), ("e2e", "E2EL", "End-to-end Latency")]
    for key, short, title in sections:
        lines.append(f"{title:-^50}")
        add(f"Mean {short} (ms):", _ms(row[f"{key}_mean_s"]))
        add(f"Median {short} (ms):", _ms(row[f"{key}_p50_s"]))
        add(f"P99 {short} (ms):", _ms(row[f"{key}_p99_s"]))
    lines.append("=" * 50)
    return "\n".join(lines)
