"""The serving benchmark: W3, arrivals, the arithmetic of a run, SSE parsing and timing (against
httpx's mock transport), the plot, and one smoke run against the real server."""
import asyncio
import json
import math

import httpx
import numpy as np
import pytest

from minivllm_lab.bench import serve
from minivllm_lab.bench.serve import main
from minivllm_lab.bench.serve_client import (
    DONE,
    RequestResult,
    carries_tokens,
    chat_payload,
    chunk_completion_tokens,
    completions_payload,
    parse_sse_line,
    send_request,
)
from minivllm_lab.bench.serve_plot import plot_serving
from minivllm_lab.bench.serve_stats import (
    READING_SPEED_SLO,
    arrival_times,
    capacity,
    first_break,
    format_report,
    summarize_requests,
    sustainable_rate,
    within_slo,
)
from minivllm_lab.bench.workloads import w3


def test_w3_shares_one_system_prompt_then_draws_each_user_part():
    w = w3(vocab_size=32000)
    assert (w.name, len(w.prompts), set(w.max_tokens)) == ("W3", 1000, {150})
    system = w.prompts[0][:128]
    assert all(p[:128] == system for p in w.prompts)
    assert all(16 <= len(p) - 128 <= 256 for p in w.prompts)
    assert all(100 <= t < 32000 for p in w.prompts for t in p)
    assert w3(32000) == w and w3(32000, seed=1).prompts[0][:128] != system
    small = w3(211, num_requests=5, system_len=4, min_user=2, max_user=3, output_len=8)
    assert all(p[:4] == small.prompts[0][:4] and 6 <= len(p) <= 7 and min(p) >= 100 for p in small.prompts)
    assert small.num_output_tokens == 40


def test_arrival_times_are_seeded_gaps_with_mean_one_over_rate():
    times = arrival_times(20000, rate=4.0, burstiness=1.0, seed=0)
    assert len(times) == 20000 and times[0] == 0.0 and times == sorted(times)
    assert times == arrival_times(20000, rate=4.0, burstiness=1.0, seed=0)
    assert times != arrival_times(20000, rate=4.0, burstiness=1.0, seed=1)
    assert np.mean(np.diff(times)) == pytest.approx(1 / 4, rel=0.05)
    assert arrival_times(5, math.inf) == [0.0] * 5 and arrival_times(0, 2.0) == []


def test_burstiness_below_one_spreads_the_gaps_and_above_one_evens_them():
    def coefficient_of_variation(burstiness):
        gaps = np.diff(arrival_times(20000, rate=2.0, burstiness=burstiness, seed=0))
        return np.std(gaps) / np.mean(gaps)
    # A gamma distribution of shape k has a coefficient of variation 1/sqrt(k): 1 for Poisson.
    assert coefficient_of_variation(0.25) > 1.5
    assert coefficient_of_variation(1.0) == pytest.approx(1.0, abs=0.1)
    assert coefficient_of_variation(4.0) < 0.6
    with pytest.raises(ValueError):
        arrival_times(3, rate=0.0)


def _done(prompt_tokens, output_tokens, ttft, e2e):
    gap = (e2e - ttft) / max(output_tokens - 1, 1)
    return RequestResult(prompt_tokens, ok=True, output_tokens=output_tokens, ttft_s=ttft,
                         itl_s=[gap] * (output_tokens - 1), e2e_s=e2e)


def test_summarize_requests_counts_tokens_latencies_failures_and_goodput():
    results = [
        _done(10, 5, ttft=0.5, e2e=0.9),        # TPOT 0.1 s: within the SLO
        _done(20, 3, ttft=2.0, e2e=2.4),        # TTFT 2 s: too late
        _done(30, 11, ttft=0.2, e2e=3.2),       # TPOT 0.3 s: reads slower than a person
        _done(40, 1, ttft=0.3, e2e=0.3),        # one token: no TPOT, within the SLO
        RequestResult(50, error="RuntimeError: HTTP 500: boom"),
    ]
    row = summarize_requests(results, duration_s=2.0, slo=READING_SPEED_SLO)
    assert (row["num_requests"], row["successful"], row["failed"]) == (5, 4, 1)
    assert (row["input_tokens"], row["output_tokens"]) == (100, 20)
    assert row["request_throughput_req_s"] == pytest.approx(2.0)
    assert row["output_tok_s"] == pytest.approx(10.0) and row["total_tok_s"] == pytest.approx(60.0)
    assert row["goodput_req_s"] == pytest.approx(1.0) and row["slo_met_pct"] == pytest.approx(40.0)
    assert row["ttft_p50_s"] == pytest.approx(0.4) and row["ttft_mean_s"] == pytest.approx(0.75)
    assert row["tpot_p50_s"] == pytest.approx(0.2) and row["tpot_mean_s"] == pytest.approx(0.2)
    assert row["itl_mean_s"] == pytest.approx((4 * 0.1 + 2 * 0.2 + 10 * 0.3) / 16)
    assert row["e2e_p50_s"] == pytest.approx((0.9 + 2.4) / 2)
    assert row["errors"] == {"RuntimeError: HTTP 500: boom": 1}
    json.dumps(row)  # nothing in it that JSON cannot hold
    report = format_report({"rate": 4.0, **row}, "test server")
    for name in ("Successful requests:", "Total Token throughput (tok/s):", "P99 TTFT (ms):", "Median TPOT (ms):",
                 "Mean ITL (ms):", "P99 E2EL (ms):", "Request goodput (req/s):"):
        assert name in report


def test_summarize_with_every_request_failed_has_no_latencies():
    row = summarize_requests([RequestResult(5, error="x")] * 2, duration_s=1.0, slo=READING_SPEED_SLO)
    assert row["successful"] == 0 and row["ttft_p99_s"] is None and row["slo_met_pct"] == 0.0
    assert row["errors"] == {"x": 2}


def _row(rate, ttft_p99, tpot_p99, failed=0):
    return {"rate": rate, "ttft_p99_s": ttft_p99, "tpot_p99_s": tpot_p99, "failed": failed}


def test_capacity_is_the_highest_finite_rate_within_the_slo():
    rows = [_row(1.0, 0.2, 0.05), _row(2.0, 0.9, 0.18), _row(4.0, 0.5, 0.25), _row(8.0, 3.0, 0.1),
            _row("inf", 0.5, 0.1)]
    assert capacity(rows, READING_SPEED_SLO) == 2.0
    assert capacity([_row(1.0, 0.2, 0.05), _row(2.0, 0.2, 0.05, failed=1)], READING_SPEED_SLO) == 1.0
    assert capacity([_row(1.0, 1.5, 0.05), _row("inf", 0.1, 0.01)], READING_SPEED_SLO) is None
    assert capacity([_row(1.0, None, None, failed=3)], READING_SPEED_SLO) is None
    # A rate above the first break does not count, even where it passes.
    broken = [_row(3.0, 0.2, 0.05), _row(1.0, 0.2, 0.05), _row(2.0, 1.5, 0.05)]
    assert capacity(broken, READING_SPEED_SLO) == 1.0


def test_within_slo_needs_no_failure_and_both_p99s_within_it():
    slo = READING_SPEED_SLO
    assert within_slo(_row(1.0, slo["ttft_s"], slo["tpot_s"]), slo)
    assert not within_slo(_row(1.0, slo["ttft_s"] * 1.01, 0.05), slo)
    assert not within_slo(_row(1.0, 0.2, slo["tpot_s"] * 1.01), slo)
    assert not within_slo(_row(1.0, 0.2, 0.05, failed=1), slo)
    assert within_slo(_row(1.0, 0.2, None), slo)  # one-token answers have no TPOT
    assert not within_slo(_row(1.0, None, None), slo)  # nothing came back


def test_first_break_is_the_lowest_finite_rate_that_broke():
    rows = [_row(8.0, 3.0, 0.1), _row(2.0, 0.9, 0.18), _row(4.0, 0.5, 0.25), _row(1.0, 0.2, 0.05),
            _row("inf", 9.0, 0.1)]
    assert first_break(rows, READING_SPEED_SLO) == 4.0
    assert first_break([_row(1.0, 0.2, 0.05), _row("inf", 9.0, 0.1)], READING_SPEED_SLO) is None
    assert first_break([_row(1.0, 0.2, 0.05, failed=2)], READING_SPEED_SLO) == 1.0


def test_a_rate_asking_for_more_tokens_than_the_engine_makes_is_not_capacity():
    # Notebook 13's committed H100 sweep: every rate met the SLO in its 1000-request run, but W3 offline made
    # 15,576 output tok/s, 103.8 requests a second of 150 tokens.
    rows = [_row(r, 0.1, 0.03) for r in (60.0, 80.0, 100.0, 120.0, 140.0, 160.0)]
    bound = sustainable_rate(15_576.0, 150)
    assert bound == pytest.approx(103.84, abs=0.01)
    assert capacity(rows, READING_SPEED_SLO) == 160.0 and first_break(rows, READING_SPEED_SLO) is None
    assert capacity(rows, READING_SPEED_SLO, max_rate=bound) == 100.0
    assert first_break(rows, READING_SPEED_SLO, max_rate=bound) == 120.0
    # The SLO still decides below the bound, and a rate exactly at it counts.
    assert capacity([_row(50.0, 0.1, 0.03), _row(80.0, 2.0, 0.03)], READING_SPEED_SLO, max_rate=bound) == 50.0
    assert capacity([_row(60.0, 0.1, 0.03)], READING_SPEED_SLO, max_rate=60.0) == 60.0
    with pytest.raises(ValueError):
        sustainable_rate(0.0, 150)


@pytest.mark.parametrize("stop", [False, True])
def test_stop_at_slo_break_ends_the_sweep_at_the_first_broken_rate(monkeypatch, stop):
    """The server is faked: each rate's summary is drawn here, rate 4 breaks TTFT."""
    swept = []

    async def fake_send_request(client, url, payload, prompt_tokens):
        return RequestResult(ok=True, prompt_tokens=prompt_tokens)

    async def fake_run_rate(client, url, requests, arrivals, max_concurrency, progress_desc):
        return [], 1.0

    def fake_summary(results, duration, slo):
        rate = [1.0, 2.0, 4.0, 8.0][len(swept)]
        swept.append(rate)
        return {"successful": 8, "failed": 0, "ttft_p99_s": 5.0 if rate >= 4 else 0.1, "tpot_p99_s": 0.05,
                "errors": {}}

    monkeypatch.setattr(serve, "send_request", fake_send_request)
    monkeypatch.setattr(serve, "run_rate", fake_run_rate)
    monkeypatch.setattr(serve, "summarize_requests", fake_summary)
    monkeypatch.setattr(serve, "format_report", lambda row, label: "")
    args = serve.parse_args(["--smoke", "--model", "m", "--request-rate", "1,2,4,8", "--base-url", "http://127.0.0.1:9"]
                            + (["--stop-at-slo-break"] if stop else []))
    result = asyncio.run(serve.benchmark(args))
    assert swept == ([1.0, 2.0, 4.0] if stop else [1.0, 2.0, 4.0, 8.0])
    assert result["capacity_req_s"] == 2.0 and result["slo_broken_at_req_s"] == 4.0
    assert result["sustainable_rate_req_s"] is None

    # The engine makes 12 output tokens/s at best: at the smoke answers' 8 tokens, 1.5 requests a second.
    swept.clear()
    args = serve.parse_args(["--smoke", "--model", "m", "--request-rate", "1,2,4,8", "--base-url", "http://127.0.0.1:9",
                             "--max-output-tok-s", "12"] + (["--stop-at-slo-break"] if stop else []))
    result = asyncio.run(serve.benchmark(args))
    assert swept == ([1.0, 2.0] if stop else [1.0, 2.0, 4.0, 8.0])
    assert result["capacity_req_s"] == 1.0 and result["slo_broken_at_req_s"] == 2.0
    assert result["sustainable_rate_req_s"] == 1.5


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_a_bound_that_is_not_positive_is_refused_at_the_command_line(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve.parse_args(["--max-output-tok-s", value])
    assert exit_info.value.code == 2 and "--max-output-tok-s must be positive" in capsys.readouterr().err


def test_sse_lines_and_chunks():
    assert parse_sse_line('data: {"choices": []}') == {"choices": []}
    assert parse_sse_line('data:{"a": 1}') == {"a": 1}
    assert parse_sse_line("data: [DONE]") == DONE
    assert parse_sse_line("") is None and parse_sse_line(": keep-alive") is None
    assert parse_sse_line("event: message") is None
    assert carries_tokens({"choices": [{"index": 0, "text": " w5", "finish_reason": None}]})
    assert carries_tokens({"choices": [{"index": 0, "text": ""}]})  # a step whose text is held back
    assert carries_tokens({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    assert not carries_tokens({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    assert not carries_tokens({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    usage_chunk = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}
    assert not carries_tokens(usage_chunk) and chunk_completion_tokens(usage_chunk) == 7
    assert chunk_completion_tokens({"choices": [], "usage": None}) is None


def test_payloads_carry_token_ids_or_word_text():
    payload = completions_payload("m", [101, 102], 8, {"top_k": 1})
    assert payload["prompt"] == [101, 102] and payload["ignore_eos"] and payload["stream"]
    assert payload["stream_options"] == {"include_usage": True} and payload["top_k"] == 1
    chat = chat_payload("m", [101, 102], [103], 8, extra={"ignore_eos": True})
    assert chat["messages"] == [{"role": "system", "content": "w101 w102"}, {"role": "user", "content": "w103"}]
    assert chat["ignore_eos"] and "prompt" not in chat
    assert chat_payload("m", [7], [8], 1, text_format="<{id}>")["messages"][1]["content"] == "<8>"


def _send(handler, payload=None):
    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await send_request(client, "http://test/v1/completions", payload or {}, prompt_tokens=3)
    return asyncio.run(go())


def _sse(*chunks) -> bytes:
    return "".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks).encode()


def _text(text):
    return {"choices": [{"index": 0, "text": text, "finish_reason": None}]}


def test_send_request_times_the_chunks_and_counts_tokens_from_the_usage():
    body = _sse(_text(" a"), _text(""), _text(" b c"), {"choices": [], "usage": {"completion_tokens": 4}}, "[DONE]")
    result = _send(lambda request: httpx.Response(200, content=body))
    assert result.ok and result.error is None and result.output_tokens == 4 and len(result.itl_s) == 2
    assert 0 <= result.ttft_s <= result.e2e_s and result.tpot_s == pytest.approx((result.e2e_s - result.ttft_s) / 3)
    # without a usage chunk, each chunk that carried tokens counts as one
    assert _send(lambda request: httpx.Response(200, content=_sse(_text("x"), _text("y"), "[DONE]"))).output_tokens == 2
    # transformers serve ends with a finish_reason chunk and closes the stream, with no [DONE]
    last = {"choices": [{"index": 0, "text": "z", "finish_reason": "length"}], "usage": {"completion_tokens": 3}}
    assert _send(lambda request: httpx.Response(200, content=_sse(_text("x"), _text("y"), last))).output_tokens == 3


def test_send_request_turns_every_failure_into_a_failed_result():
    refused = _send(lambda request: httpx.Response(400, json={"error": "bad prompt"}))
    assert not refused.ok and "HTTP 400" in refused.error and "bad prompt" in refused.error
    assert "[DONE]" in _send(lambda request: httpx.Response(200, content=_sse(_text("x")))).error
    dead = _sse({"error": {"message": "engine dead"}})
    assert "engine dead" in _send(lambda request: httpx.Response(200, content=dead)).error
    assert "no chunk" in _send(lambda request: httpx.Response(200, content=_sse("[DONE]"))).error

    async def broken_stream():
        yield _sse(_text("x"))
        raise httpx.ReadError("connection reset")

    broken = _send(lambda request: httpx.Response(200, content=broken_stream()))
    assert not broken.ok and "ReadError" in broken.error and broken.tpot_s is None


def test_plot_of_two_servers(tmp_path):
    rows = [{"rate": r, "ttft_p50_s": 0.1 * r, "ttft_p99_s": 0.2 * r, "tpot_p50_s": 0.02, "tpot_p99_s": 0.05}
            for r in (1.0, 2.0, 4.0)] + [{"rate": "inf", "ttft_p50_s": 2.0, "ttft_p99_s": None, "tpot_p50_s": 0.1,
                                         "tpot_p99_s": 0.2}]
    result = {"label": "a", "hardware": "test GPU", "slo": READING_SPEED_SLO, "rates": rows,
              "workload": {"name": "W3", "num_requests": 8, "burstiness": 1.0}}
    path = plot_serving([result, {**result, "label": "b", "rates": rows[1:]}], str(tmp_path / "out" / "serve.png"))
    assert (tmp_path / "out" / "serve.png").stat().st_size > 0 and path.endswith("serve.png")


def test_plot_marks_the_most_a_server_sustains_where_it_lies_among_the_rates(tmp_path, monkeypatch):
    import matplotlib.axes
    drawn, axvline = [], matplotlib.axes.Axes.axvline
    monkeypatch.setattr(matplotlib.axes.Axes, "axvline", lambda ax, x, **kw: drawn.append(x) or axvline(ax, x, **kw))
    rows = [{"rate": r, "ttft_p50_s": 0.1, "ttft_p99_s": 0.2, "tpot_p50_s": 0.02, "tpot_p99_s": 0.05}
            for r in (1.0, 2.0, 4.0)]
    result = {"label": "a", "hardware": "test GPU", "slo": READING_SPEED_SLO, "rates": rows,
              "workload": {"name": "W3", "num_requests": 8, "burstiness": 1.0}}
    for bound, marked in ((3.0, [3.0] * 4), (40.0, []), (None, [])):  # one line per panel, or none
        drawn.clear()
        plot_serving([{**result, "sustainable_rate_req_s": bound}], str(tmp_path / "serve.png"))
        assert drawn == marked


@pytest.mark.slow
def test_smoke_run_against_the_real_server(tiny_llama, tmp_path, capsys):
    """One client process, then the requests dealt out to two (--num-clients): the same requests, all answered."""
    from server_utils import running_server
    outs = {n: tmp_path / f"serve{n}.json" for n in (1, 2)}
    with running_server(tiny_llama[0], "--max-model-len", "256", "--num-kv-blocks", "64") as base_url:
        for n, out in outs.items():
            main(["--smoke", "--base-url", base_url, "--vocab-size", "211", "--label", "minivllm", "--out", str(out),
                  "--num-clients", str(n)])
    for n, out in outs.items():
        result = json.loads(out.read_text())
        assert result["model"] and result["label"] == "minivllm" and len(result["rates"]) == 2
        assert result["workload"]["num_clients"] == n
        for row in result["rates"]:
            assert row["errors"] == {} and row["successful"] == 8
            assert row["output_tokens"] == 8 * 8 and row["input_tokens"] == sum(
                len(p) for p in w3(211, seed=row["workload_seed"], num_requests=8, system_len=16, min_user=4,
                                   max_user=16, output_len=8).prompts)
            assert row["ttft_p50_s"] > 0 and row["tpot_p50_s"] > 0
        assert out.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "minivllm at inf req/s" in printed and "P99 TPOT (ms):" in printed and "capacity within the SLO" in printed
