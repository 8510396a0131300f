"""Latency and throughput metrics, timers that are honest on a GPU, and result tables and files.

Why this exists: a GPU runs asynchronously, so a naive ``time.perf_counter()`` around a CUDA call
measures how long it took to *queue* the work, not to do it. The timers here synchronize (or use
CUDA events), and ``summarize`` turns the per-request timestamps every ``RequestOutput`` carries into
the numbers serving papers report:

- TTFT (time to first token) = first_token_time - arrival_time: how long a user waits for anything;
- TPOT (time per output token) = (finished_time - first_token_time) / (tokens - 1): streaming speed;
- E2E (end-to-end latency) = finished_time - arrival_time;
- output tok/s = all generated tokens / wall time: what an offline batch job cares about.

Example::

    with Timer() as t:
        outputs = llm.generate(w.prompts, params)
    stats = summarize(outputs, wall_time_s=t.elapsed_s)
    print(format_table([stats], ["num_requests", "output_tok_s", "ttft_p50_s", "tpot_p50_s"]))
    save_json("figures/07_results.json", stats)
"""

import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import torch


def percentile(values, q: float) -> float:
    """The q-th percentile (q in [0, 100]) with linear interpolation between samples, as numpy's default."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("percentile of no values")
    return float(np.percentile(values, q))


def median(values) -> float:
    return percentile(values, 50)


def _stats(prefix: str, values: list[float]) -> dict:
    # None rather than NaN when there is nothing to measure: NaN is not valid JSON.
    if not values:
        return {f"{prefix}_p50_s": None, f"{prefix}_p99_s": None, f"{prefix}_mean_s": None}
    return {
        f"{prefix}_p50_s": percentile(values, 50),
        f"{prefix}_p99_s": percentile(values, 99),
        f"{prefix}_mean_s": float(np.mean(values)),
    }


def summarize(outputs, wall_time_s: float | None = None) -> dict:
    """Throughput and latency percentiles of finished requests, as one flat dict.

    ``outputs`` are request outputs with ``.outputs[0].token_ids`` and ``.metrics.arrival_time``,
    ``.first_token_time``, ``.finished_time`` (seconds on the ``time.perf_counter`` clock).

    Keys: ``num_requests``, ``output_tokens``, ``wall_s`` (``wall_time_s``, or when None the span from
    the first arrival to the last finish), ``output_tok_s``, and for each of ``ttft``, ``tpot``, ``e2e``
    the keys ``<name>_p50_s``, ``<name>_p99_s``, ``<name>_mean_s``. TPOT skips requests that produced a
    single token (no gap to measure); a statistic with no samples is None.
    """
    if not outputs:
        raise ValueError("summarize needs at least one request output")
    ttft, tpot, e2e = [], [], []
    output_tokens = 0
    for out in outputs:
        m = out.metrics
        n = len(out.outputs[0].token_ids)
        output_tokens += n
        ttft.append(m.first_token_time - m.arrival_time)
        e2e.append(m.finished_time - m.arrival_time)
        if n > 1:
            tpot.append((m.finished_time - m.first_token_time) / (n - 1))
    if wall_time_s is None:
        wall_time_s = max(o.metrics.finished_time for o in outputs) - min(o.metrics.arrival_time for o in outputs)
    return {
        "num_requests": len(outputs),
        "output_tokens": output_tokens,
        "wall_s": wall_time_s,
        "output_tok_s": output_tokens / wall_time_s if wall_time_s > 0 else None,
        **_stats("ttft", ttft),
        **_stats("tpot", tpot),
        **_stats("e2e", e2e),
    }


def _synchronize() -> None:
    # Only if CUDA is already in use: a process that never touched the GPU has no queued work,
    # and synchronizing would create a CUDA context (hundreds of ms and GPU memory) for nothing.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Timer:
    """Wall-clock time of a block, waiting for queued GPU work before starting and before stopping.

    ``with Timer() as t: ...`` then read ``t.elapsed_s``.
    """

    def __init__(self):
        self.elapsed_s: float | None = None

    def __enter__(self) -> "Timer":
        _synchronize()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        _synchronize()
        self.elapsed_s = time.perf_counter() - self._start


def cuda_time_ms(fn, warmup: int = 3, repeats: int = 10, device=None) -> list[float]:
    """Milliseconds of each of ``repeats`` calls of ``fn``, after ``warmup`` untimed calls.

    On a CUDA device, CUDA events time the GPU work itself, without the Python launch overhead
    between calls; elsewhere, ``time.perf_counter``. ``device=None`` means cuda if available.
    Report the median: the first calls after warm-up and stray interruptions make the mean lie.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = torch.device(device).type == "cuda"
    # Warm-up pays one-time costs (kernel selection, allocator growth, caches) outside the timing.
    for _ in range(warmup):
        fn()
    times = []
    if on_gpu:
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        # Throughputs read best as whole numbers, latencies in seconds need significant digits.
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def format_seconds(seconds: float) -> str:
    """A duration with digits that say something: '12.3 s', '0.4 s', '35 ms', '<1 ms' (never '0.0 s')."""
    if seconds >= 0.095:  # from here on it rounds to 0.1 s or more
        return f"{seconds:.1f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f} ms"
    return "<1 ms"


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain-text table of ``rows`` (dicts) showing ``columns``; missing values print as '-'.

    Numbers are right-aligned and text left-aligned, so it reads well in a terminal, a log file and a
    notebook cell alike.
    """
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row.get(c), (int, float)) or row.get(c) is None for row in rows) for c in columns]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    header = line(columns)
    return "\n".join([header, "-" * len(header)] + [line(r) for r in cells])


def hardware_name(device: str | None = None) -> str:
    """The GPU's name, or the CPU's (on a CPU `device`, even where there is a GPU): every number we save must
    say what it was measured on."""
    if torch.cuda.is_available() and (device is None or str(device).startswith("cuda")):
        return torch.cuda.get_device_name()
    try:  # Linux: platform.processor() is often empty, /proc/cpuinfo names the model
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        return f"CPU ({model}, {os.cpu_count()} cores)"
    except (OSError, StopIteration):
        return platform.processor() or "CPU"


def source_commit() -> str | None:
    """The commit the code that runs comes from: MINIVLLM_COMMIT where it is set (a copy of a checkout whose .git is
    not its own, as on a GPU machine), else the checkout's HEAD."""
    if os.environ.get("MINIVLLM_COMMIT"):
        return os.environ["MINIVLLM_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _json_default(obj):
    # numpy and torch scalars (np.int64, a 0-d tensor) are not JSON types; their .item() is.
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def save_json(path, obj: dict) -> Path:
    """Write ``obj`` as indented JSON to ``path`` (creating folders), with a ``"hardware"`` entry added.

    A ``"hardware"`` key already in ``obj`` is kept, so results measured elsewhere can be re-saved.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"hardware": hardware_name(), **obj}
    path.write_text(json.dumps(record, indent=2, default=_json_default) + "\n")
    return path
