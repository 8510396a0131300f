"""Prometheus metrics at `/metrics`, under vLLM's names with the `minivllm:` prefix.

Gauges (requests running and waiting, KV cache usage) are read from the engine on each scrape;
counters and histograms (TTFT, TPOT, end-to-end latency) are fed by the request handlers from the
engine's timestamps (`RequestOutput.metrics`).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()  # no `_created` series, as in vLLM

# Buckets around a reading-speed SLO (TTFT <= 1 s, TPOT <= 190 ms).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.19, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)


class ServerMetrics:
    def __init__(self, engine, model_name: str):
        self.engine = engine
        self.registry = registry = CollectorRegistry()  # per server: tests start several in one process
        labels = {"model_name": model_name}

        def make(cls, name, doc, **kw):
            return cls(f"minivllm:{name}", doc, labelnames=list(labels), registry=registry, **kw).labels(**labels)

        self.running = make(Gauge, "num_requests_running", "Requests in the running batch.")
        self.waiting = make(Gauge, "num_requests_waiting", "Requests queued, not yet scheduled.")
        self.kv_usage = make(Gauge, "kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).")
        self.prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens of the requests accepted.")
        self.generation_tokens = make(Counter, "generation_tokens", "Tokens generated.")
        # Counters the engine keeps: each grows by what the engine's count grew since the last read.
        self.engine_counters = {
            "num_preemptions": make(Counter, "num_preemptions", "Sequences preempted (recomputed later)."),
            "num_drafts": make(Counter, "spec_decode_num_drafts", "Speculative verify steps with guesses."),
            "num_draft_tokens": make(Counter, "spec_decode_num_draft_tokens", "Speculative guesses verified."),
            "num_accepted_tokens": make(Counter, "spec_decode_num_accepted_tokens", "Speculative guesses kept."),
        }
        self.mean_acceptance_length = make(Gauge, "spec_decode_mean_acceptance_length",
                                           "Tokens per verify step so far: 1 + guesses kept per step.")
        self.ttft = make(Histogram, "time_to_first_token_seconds", "Time to first token.", buckets=TTFT_BUCKETS)
        self.tpot = make(Histogram, "time_per_output_token_seconds", "Mean time between output tokens of a request.",
                         buckets=TPOT_BUCKETS)
        self.e2e = make(Histogram, "e2e_request_latency_seconds", "Arrival to last token.", buckets=E2E_BUCKETS)
        self._counts_seen = dict.fromkeys(self.engine_counters, 0)

    def on_output(self, out, previous) -> None:
        """One more output of a request (`previous` is the one before it, None for its first)."""
        if previous is None:
            self.prompt_tokens.inc(len(out.prompt_token_ids))
        done_before = 0 if previous is None else sum(len(a.token_ids) for a in previous.outputs)
        self.generation_tokens.inc(sum(len(a.token_ids) for a in out.outputs) - done_before)

    def on_finished(self, out) -> None:
        """A request's last output: its latencies go into the histograms."""
        m, n = out.metrics, len(out.outputs[0].token_ids)
        if m.first_token_time is not None:
            self.ttft.observe(m.first_token_time - m.arrival_time)
            if n > 1:
                self.tpot.observe((m.finished_time - m.first_token_time) / (n - 1))
        self.e2e.observe(m.finished_time - m.arrival_time)

    def render(self) -> bytes:
        stats = self.engine.get_stats()
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.kv_usage.set(1 - stats["num_free_blocks"] / stats["num_total_blocks"])
        for name, counter in self.engine_counters.items():
            counter.inc(stats[name] - self._counts_seen[name])
            self._counts_seen[name] = stats[name]
        if stats["num_drafts"]:
            self.mean_acceptance_length.set(1 + stats["num_accepted_tokens"] / stats["num_drafts"])
        return generate_latest(self.registry)
