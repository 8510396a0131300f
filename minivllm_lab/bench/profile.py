"""Where a decode step's time goes: GPU kernels vs everything else (Python, launches, syncs).

A decode step of a 7B model on an H200 should take about as long as reading the weights
once (14.5 GB / 4.28 TB/s = 3.4 ms). If the wall-clock step is much longer than the sum of
its GPU kernels, the GPU sits idle waiting for Python to launch the next kernel: that gap
is what fused kernels and CUDA graphs remove.

    >>> decode_step_profile(llm, batch=1, context=128)
    {'wall_ms': ..., 'gpu_ms': ..., 'overhead_ms': ..., 'top_kernels': [...]}
"""
from __future__ import annotations

import inspect
import time
from unittest import mock

import torch

from minivllm.distributed.parallel_state import all_reduce
from minivllm.sampling_params import SamplingParams
from minivllm.worker.model_runner import SampledTokens

from .metrics import cuda_time_ms, median

HOST_LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                     "cudaGraphLaunch"}


def profiler(activities) -> torch.profiler.profile:
    """`torch.profiler.profile(activities=...)` for one `with` block, with `acc_events=True`: torch 2.10 to
    2.12 warn "Profiler clears events at the end of each cycle" on every profiler made without it, cycles
    or not (pytorch/pytorch#180348). A single `with` block is one cycle, so keeping events across cycles
    changes nothing. (torch before 2.5 has no such argument, and no such warning.) CUDA activity is asked for
    only where CUDA is available: elsewhere torch warns that it disables it."""
    if not torch.cuda.is_available():
        activities = [a for a in activities if a != torch.profiler.ProfilerActivity.CUDA]
    keep = {"acc_events": True} if "acc_events" in inspect.signature(torch.profiler.profile).parameters else {}
    return torch.profiler.profile(activities=activities, **keep)


def _start_decoding(engine, batch: int, context: int) -> list:
    """Add `batch` requests of `context` tokens and step until every one is decoding; return their
    sequences. Each may grow to max_model_len tokens, so that none finishes while later prompts are
    still being prefilled (a batch x context over the step budget takes several steps): the steps
    that follow are decode steps of the whole batch. The caller ends them with `_stop`."""
    params = SamplingParams(temperature=0, max_tokens=engine.max_model_len - context, ignore_eos=True)
    vocab = engine.model_config.vocab_size
    ids = [f"profile-{time.perf_counter_ns()}-{i}" for i in range(batch)]
    for i, request_id in enumerate(ids):
        engine.add_request(request_id, [(7 * i + j) % (vocab - 1) + 1 for j in range(context)], params)
    seqs = [engine.scheduler.requests[request_id] for request_id in ids]
    while not all(seq.num_output_tokens for seq in seqs):
        engine.step()
    engine.step()  # one decode step to warm up
    return seqs


def _stop(engine, seqs: list) -> None:
    """Abort the requests, which gives back their KV blocks. One that finished by itself left the
    timed steps with a smaller batch than asked for: an error, not a number."""
    finished = [seq.request_id for seq in seqs if seq.is_finished]
    for seq in seqs:
        engine.abort_request(seq.request_id)
    if finished:
        raise RuntimeError(f"{len(finished)} of {len(seqs)} requests reached max_model_len "
                           f"({engine.max_model_len}) during the timed steps: raise max_model_len")


def decode_step_times_ms(llm, batch: int, context: int, steps: int = 20) -> list[float]:
    """Wall time of each of `steps` decode steps at this batch size and context length. Each `step()`
    waits for sampled tokens on the host (with async scheduling, those of the step before), so in a
    run of steps each one's wall time is the steady-state time per step, GPU work included."""
    engine = llm.llm_engine
    seqs = _start_decoding(engine, batch, context)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - t0) * 1e3)
    _stop(engine, seqs)
    return times


def decode_step_profile(llm, batch: int, context: int, steps: int = 5, top: int = 8) -> dict:
    """Median wall time of a decode step next to the GPU time of its kernels (CUDA only)."""
    wall_ms = median(decode_step_times_ms(llm, batch, context, steps=10))
    engine = llm.llm_engine
    seqs = _start_decoding(engine, batch, context)
    with profiler([torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the kernels of the last step launched are recorded too
    _stop(engine, seqs)
    averages = prof.key_averages()
    events = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA]
    # What the CPU launched: kernels one by one, or whole CUDA graphs (one call replays hundreds).
    launches = sum(e.count for e in averages if e.key in HOST_LAUNCH_CALLS)
    gpu_us = sum(e.self_device_time_total for e in events)
    kernels = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:top]
    gpu_ms = gpu_us / 1e3 / steps
    # wall_ms and gpu_ms come from different steps (the median of bare ones, the mean of profiled ones), and
    # the sum counts twice what ran side by side (a copy on the copy stream beside a kernel): when the GPU is
    # busy the whole step, gpu_ms can come out a little above wall_ms. Time without a kernel is then 0.
    overhead_ms = max(0.0, wall_ms - gpu_ms)
    return {
        "batch": batch, "context": context, "wall_ms": wall_ms, "gpu_ms": gpu_ms,
        "overhead_ms": overhead_ms, "overhead_fraction": overhead_ms / wall_ms,
        "kernels_per_step": sum(e.count for e in events) / steps,
        "host_launches_per_step": launches / steps,
        "top_kernels": [{"name": e.key[:80], "ms_per_step": e.self_device_time_total / 1e3 / steps}
                        for e in kernels],
    }


def launch_count(fn) -> dict:
    """What one call of `fn` asks of the device, counted by torch.profiler: the GPU kernels it launched and
    their GPU time (None on a CPU), the torch operations it ran (nested ones included: on a CPU each is
    roughly one kernel), its copies from host to device and its waits for the GPU, and the operations it ran
    most often. When a call does little arithmetic (a one-token forward), these counts, not its bytes, set
    its time."""
    on_gpu = torch.cuda.is_available()
    fn()  # warm-up: one-time work (allocations, autotuning) is not what a step repeats
    with profiler([torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        if on_gpu:
            torch.cuda.synchronize()
    events = prof.key_averages()
    ops = sorted((e for e in events if e.key.startswith("aten::")), key=lambda e: -e.count)
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"gpu_kernels": sum(e.count for e in kernels) if on_gpu else None,
            "gpu_ms": sum(e.self_device_time_total for e in kernels) / 1e3 if on_gpu else None,
            "torch_ops": sum(e.count for e in ops),
            "host_to_device_copies": sum(e.count for e in events if e.key == "cudaMemcpyAsync"),
            "gpu_waits": sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "aten::item",
                                                                  "aten::nonzero")),
            "top_ops": [(e.key.removeprefix("aten::"), e.count) for e in ops[:6]]}


def decode_step_cpu_ms(llm, batch: int, context: int, steps: int = 20) -> list[dict]:
    """Per decode step: its wall time, the part of it the CPU spent waiting for the GPU's sampled tokens
    (`SampledTokens.tolist`), and the rest, the CPU's own work (scheduling, preparing, launching,
    bookkeeping). Without overlap the GPU idles through all of the CPU's work; with it, through none
    as long as the CPU's work is shorter than the GPU's."""
    engine = llm.llm_engine
    seqs = _start_decoding(engine, batch, context)
    waited = []
    wait = SampledTokens.tolist

    def timed_wait(self):
        t0 = time.perf_counter()
        try:
            return wait(self)
        finally:
            waited.append((time.perf_counter() - t0) * 1e3)

    rows = []
    with mock.patch.object(SampledTokens, "tolist", timed_wait):
        for _ in range(steps):
            waited.clear()
            t0 = time.perf_counter()
            engine.step()
            wall = (time.perf_counter() - t0) * 1e3
            rows.append({"wall_ms": wall, "wait_ms": sum(waited), "cpu_ms": wall - sum(waited)})
    _stop(engine, seqs)
    return rows


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted intervals, overlapping ones joined (a copy on the side stream may run beside a kernel)."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def decode_timeline(llm, batch: int, context: int, steps: int = 4) -> dict:
    """What the CPU and the GPU do during `steps` decode steps, from the torch profiler: the interval
    of each `step()` call on the CPU, of each wait for sampled tokens in it, and when the GPU was busy
    (kernels and copies, overlapping ones joined), in ms from the first step's start (CUDA only)."""
    engine = llm.llm_engine
    seqs = _start_decoding(engine, batch, context)
    wait = SampledTokens.tolist

    def marked_wait(self):
        with torch.profiler.record_function("wait for sampled tokens"):
            return wait(self)

    with mock.patch.object(SampledTokens, "tolist", marked_wait), profiler(
            [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with torch.profiler.record_function("engine.step"):
                engine.step()
        torch.cuda.synchronize()
    _stop(engine, seqs)
    events = prof.events()
    spans = lambda keep: sorted((e.time_range.start, e.time_range.end) for e in events if keep(e))  # noqa: E731
    step_spans = spans(lambda e: e.name == "engine.step" and e.device_type == torch.autograd.DeviceType.CPU)
    t0 = step_spans[0][0]
    to_ms = lambda intervals: [((a - t0) / 1e3, (b - t0) / 1e3) for a, b in intervals]  # noqa: E731
    return {"batch": batch, "context": context, "steps": to_ms(step_spans),
            "waits": to_ms(spans(lambda e: e.name == "wait for sampled tokens"
                                 and e.device_type == torch.autograd.DeviceType.CPU)),
            "gpu": _merged(to_ms(spans(lambda e: e.device_type == torch.autograd.DeviceType.CUDA
                                       and e.time_range.start >= t0)))}


@torch.inference_mode()
def time_all_reduce(runner, num_tokens: int, repeats: int = 20) -> list[float]:
    """Milliseconds of each of `repeats` all-reduces of a [num_tokens, hidden_size] activation, the
    collective a row-parallel layer ends with. Every rank must run it at once, so it goes through
    the executor: `llm.llm_engine.executor.collective_rpc(time_all_reduce, num_tokens)` (it is pickled
    by reference for the workers: it must live in an importable module, not in `__main__`)."""
    # zeros: summed in place call after call, they stay zeros (ones would grow by N each time)
    x = torch.zeros(num_tokens, runner.model_config.hidden_size, dtype=runner.dtype, device=runner.device)
    return cuda_time_ms(lambda: all_reduce(x), repeats=repeats, device=runner.device)
