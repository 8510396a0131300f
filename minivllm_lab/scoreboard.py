"""The scoreboard: one chart of the series' climb on one workload, W1, from transformers one request at a
time to the whole engine.

Each notebook measures its own step on its own workload, so the steps' gains are hard to put side by
side. The scoreboard keeps one number per step: output tokens per second on W1 (the post's experiment:
60 requests, prompts of 16-256 tokens, 150 output tokens each; `minivllm_lab.bench.workloads.w1`). The
notebooks that measure W1 add their step's number at the end, keyed by step and hardware, and the chart
is drawn again: the committed run's bars (each named by its GPU), and beside them the reader's once a
notebook has run on the reader's machine.

    >>> from minivllm_lab import scoreboard
    >>> scoreboard.add(step="06 minivllm, continuous batching", tok_s=8763.5, hardware=env.hardware,
    ...                source="notebook 06", model=env.label)
    PosixPath('.../figures/scoreboard.png')

A step with no measured W1 number has no bar: the bars are measurements, never estimates. The committed
bars are built from the committed figures JSON by `committed_entries` (each entry names the file and the
key its number comes from, and carries the file's hardware): `python -m minivllm_lab.scoreboard --rebuild`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .reference import load_reference, pick

WORKLOAD = "W1: 60 requests, prompts of 16-256 tokens, 150 output tokens each"
COMMITTED = "figures/"  # the source of every committed bar starts so; a reader's run names its notebook


def scoreboard_path() -> Path:
    """Where a notebook's run writes the scoreboard: the figures folder of this machine's runs."""
    from .machine import figures_dir
    return figures_dir() / "scoreboard.json"


def load(path: Path) -> dict:
    """The scoreboard at `path`; a new one starts from the committed scoreboard (so the committed bars are
    there on a reader's first run), or empty where that cannot be had."""
    path = Path(path)
    if path.exists():
        return json.loads(path.read_text())
    committed = load_reference("scoreboard")
    if committed.found and path.resolve() != Path(committed.where).resolve():
        return committed.data
    return {"workload": WORKLOAD, "metric": "output tok/s", "entries": []}


def add(step: str, tok_s: float, hardware: str, source: str = "", model: str = "",
        path: Path | None = None, draw_png: bool = True) -> Path:
    """Record `step`'s W1 output tok/s on `hardware` (replacing that step's earlier number on the same
    hardware), save the JSON and redraw the chart; returns the chart's path (the JSON's without a chart)."""
    path = Path(path) if path is not None else scoreboard_path()
    board = load(path)
    entries = [e for e in board["entries"] if (e["step"], e["hardware"]) != (step, hardware)]
    entries.append({"step": step, "hardware": hardware, "tok_s": float(tok_s), "model": model, "source": source})
    board["entries"] = sorted(entries, key=lambda e: (_series_order(e["step"]), not _committed(e)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(board, indent=1) + "\n")
    return draw(board, path.with_suffix(".png")) if draw_png else path


def measure_switch(env, step: str, switch: dict, figures_json: str, work=None) -> tuple[list[dict], Path]:
    """A notebook's step that is one switch of the whole engine (10: the Triton kernels, 11: CUDA graphs),
    on W1: the engine built twice as the bench CLI builds it (`switch` off, then everything on), each run
    warmed up and timed by `runners.run_minivllm`. The two rows join the notebook's own JSON
    (`figures_json`, already saved) under "scoreboard_w1", the committed bars' source once re-run, and the
    step's bar is added. `work` defaults to the full W1. Returns the rows and the chart."""
    from minivllm.llm import LLM
    from minivllm.models.loader import resolve_model

    from .bench.metrics import save_json
    from .bench.runners import run_minivllm
    from .bench.workloads import w1
    from .machine import figures_dir, free_memory

    work = work or w1(resolve_model(env.model).config.vocab_size)
    rows = []
    for name, options in [(step, switch), ("the whole engine", {})]:
        llm = LLM(env.model, **env.engine_args(max_model_len=max(map(len, work.prompts)) + max(work.max_tokens),
                                               max_num_seqs=len(work.prompts), **options))
        rows.append(run_minivllm(llm, work, engine=name))
        del llm
        free_memory()
    saved = figures_dir() / figures_json
    save_json(saved, {**json.loads(saved.read_text()), "scoreboard_w1": rows})
    source = f"notebook {figures_json[:2]}: W1, {len(work.prompts)} requests x {work.max_tokens[0]} output tokens"
    return rows, add(step, rows[0]["output_tok_s"], env.hardware, source=source, model=env.label)


def draw(board: dict, png: Path) -> Path:
    """Horizontal bars, one row per step in the series' order (the steps' names start with their
    notebook's number), one bar per hardware; a log scale, since the climb spans three orders of magnitude."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed: the chart goes to a file
    import matplotlib.pyplot as plt

    steps = sorted({e["step"] for e in board["entries"]}, key=_series_order)
    committed = {e["hardware"] for e in board["entries"] if _committed(e)}
    machines = sorted({e["hardware"] for e in board["entries"]}, key=lambda h: (h not in committed, h))
    by_key = {(e["step"], e["hardware"]): e["tok_s"] for e in board["entries"]}
    height = 0.8 / max(len(machines), 1)
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.45 * max(len(steps), 1) * max(len(machines), 1) ** 0.5))
    colors = ["0.6", "tab:orange", "tab:blue", "tab:green", "tab:purple"]
    for m, machine in enumerate(machines):
        ys = [s - 0.4 + height * (m + 0.5) for s, step in enumerate(steps) if (step, machine) in by_key]
        values = [by_key[step, machine] for step in steps if (step, machine) in by_key]
        label = f"{machine} (committed)" if machine in committed else f"{machine} (yours)"
        ax.barh(ys, values, height=height * 0.95, color=colors[m % len(colors)], label=label)
        for y, value in zip(ys, values):
            ax.text(value * 1.05, y, f"{value:,.0f}" if value >= 100 else f"{value:.1f}", va="center", fontsize=8)
    ax.set_yticks(range(len(steps)), steps)
    ax.invert_yaxis()  # the series from the top down
    ax.set_xscale("log")
    ax.set_xlabel("output tokens per second (log scale)")
    ax.set_title(f"The scoreboard: output tokens per second on the same workload\n{board.get('workload', WORKLOAD)}",
                 fontsize=10)
    ax.margins(x=0.15)
    if machines:
        ax.legend(loc="upper right", fontsize=8)  # the top rows are the shortest bars: room for it there
    # A reader's machine may run smaller sizes of W1 (a CPU does): each entry's source in the JSON says which.
    fig.text(0.99, 0.005, "each bar's source and sizes: scoreboard.json", ha="right", va="bottom", fontsize=7,
             color="0.4")
    fig.tight_layout()
    png = Path(png)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


# ---- The committed bars ------------------------------------------------------------------------------
# (step, file in figures/, how to find the number in it, what the number is). Only numbers that are W1 on a
# GPU; W1's 60 requests are served one at a time at the rate of any few of them, so the first requests
# measure "one at a time".
COMMITTED_SOURCES = [
    ("00 transformers, one request at a time", "00_baseline.json", lambda d: d["summary"]["output_tok_s"],
     "notebook 00: summary.output_tok_s (HF generate, the first 3 requests of W1 one after another)"),
    ("02 minivllm's model, all 60 at once, no KV cache (recompute)", "bench_w1_engine.json",
     pick("rows", "output_tok_s", engine="minivllm recompute (no cache)"),
     "bench CLI, 2026-11-29 engine (torch attention, eager): rows[engine='minivllm recompute (no cache)']"),
    ("04 transformers, one static batch of all requests", "06_continuous_batching.json",
     pick("w1.rows", "output_tok_s", engine="transformers static batch"),
     "notebook 06: w1.rows[engine='transformers static batch'] (notebook 04's own benchmark is not W1)"),
    ("05 minivllm, KV cache in contiguous rows", "05_paged_kv.json",
     pick("benchmark", "output_tok_s", cache="contiguous (1024-token rows)"),
     "notebook 05: benchmark[cache='contiguous (1024-token rows)'] "
     "(a 2.25 GiB pool as 18 rows of 1024 tokens: 18 run at once)"),
    ("05 minivllm, KV cache in 16-token blocks (same memory)", "05_paged_kv.json",
     pick("benchmark", "output_tok_s", cache="paged (16-token blocks)"),
     "notebook 05: benchmark[cache='paged (16-token blocks)'] "
     "(the same 2.25 GiB as 1152 blocks of 16: all 60 at once)"),
    ("06 minivllm, static batching (contiguous KV)", "06_continuous_batching.json",
     pick("w1.rows", "output_tok_s", engine="minivllm static + contiguous"),
     "notebook 06: w1.rows[engine='minivllm static + contiguous']"),
    ("06 minivllm, continuous batching (paged KV)", "06_continuous_batching.json",
     pick("w1.rows", "output_tok_s", engine="minivllm (paged + continuous)"),
     "notebook 06: w1.rows[engine='minivllm (paged + continuous)']"),
    ("06 transformers' own continuous batching", "bench_w1.json",
     pick("rows", "output_tok_s", engine="transformers continuous batching"),
     "bench CLI, final engine (README's Numbers): rows[engine='transformers continuous batching']"),
    ("10 whole engine but torch attention (no Triton kernels)", "bench_w1.json",
     pick("rows", "output_tok_s", engine="minivllm, no Triton kernels (torch attention)"),
     "bench CLI ablation: rows[engine='minivllm, no Triton kernels (torch attention)']"),
    ("11 whole engine but eager (no CUDA graphs)", "bench_w1.json",
     pick("rows", "output_tok_s", engine="minivllm, no CUDA graphs (eager)"),
     "bench CLI ablation: rows[engine='minivllm, no CUDA graphs (eager)']"),
    ("12 whole engine but no CPU/GPU overlap", "bench_w1.json",
     pick("rows", "output_tok_s", engine="minivllm, no overlap (async_scheduling=False)"),
     "bench CLI ablation: rows[engine='minivllm, no overlap (async_scheduling=False)']"),
    ("12+ the whole engine (every step on)", "bench_w1.json", pick("rows", "output_tok_s", engine="minivllm"),
     "bench CLI, final engine (README's Numbers): rows[engine='minivllm']"),
]
# Notebooks 10, 11 and 12 measure their own switch on W1 and keep the rows, named by step, under
# "scoreboard_w1" in their figures JSON. Where the committed run has them, they are the bar: the same run as
# the notebook's other outputs. Until then the bench CLI's ablation stands in.
NOTEBOOK_SOURCES = {
    "10 whole engine but torch attention (no Triton kernels)": "10_kernels.json",
    "11 whole engine but eager (no CUDA graphs)": "11_cuda_graphs.json",
    "12 whole engine but no CPU/GPU overlap": "12_overlap.json",
    "12+ the whole engine (every step on)": "12_overlap.json",
}


def _series_order(step: str) -> tuple:
    """Steps by their notebook's number, then in the order of COMMITTED_SOURCES (the "before" of a notebook
    above its "after"), then by name."""
    known = [source[0] for source in COMMITTED_SOURCES]
    return step.split()[0], known.index(step) if step in known else len(known), step


def _committed(entry: dict) -> bool:
    return entry.get("source", "").startswith(COMMITTED)


def committed_entries(figures: Path) -> list[dict]:
    """The committed bars from the figures JSON, each with its source and its file's GPU; a file that is
    missing, not from a GPU, or without the step's row gives no bar."""
    entries = []
    for step, name, find, what in COMMITTED_SOURCES:
        own = NOTEBOOK_SOURCES.get(step)
        candidates = [(name, find, what)]
        if own:
            candidates.insert(0, (own, pick("scoreboard_w1", "output_tok_s", engine=step),
                                  f"notebook {own[:2]}: scoreboard_w1[engine={step!r}]"))
        for file, find_in, description in candidates:
            bar = _bar(Path(figures) / file, find_in)
            if bar is not None:
                tok_s, model, hardware = bar
                entries.append({"step": step, "hardware": hardware, "tok_s": tok_s, "model": model,
                                "source": f"{COMMITTED}{file}: {description}"})
                break
    return entries


def _bar(path: Path, find) -> tuple[float, str, str] | None:
    """(tok/s, model, GPU) of one step in one committed file, or None: missing, not a GPU's, no such row."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    hardware = str(data.get("hardware", ""))
    if not hardware.startswith("NVIDIA "):
        return None
    try:
        return float(find(data)), str(data.get("model", "")), hardware
    except (KeyError, StopIteration, TypeError):  # a file without this step's row (another run's layout)
        return None


def rebuild(figures: Path) -> Path:
    """figures/scoreboard.json and .png from the committed numbers alone."""
    board = {"workload": WORKLOAD, "metric": "output tok/s",
             "note": "committed bars: the figures JSON (each entry's source and GPU); a notebook run adds its "
                     "machine's bars (minivllm_lab.scoreboard.add)",
             "entries": committed_entries(figures)}
    path = Path(figures) / "scoreboard.json"
    path.write_text(json.dumps(board, indent=1) + "\n")
    return draw(board, path.with_suffix(".png"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rebuild", action="store_true", help="rebuild figures/scoreboard.* from the committed JSON")
    parser.add_argument("--figures", type=Path, default=Path(__file__).resolve().parent.parent / "figures")
    args = parser.parse_args()
    if args.rebuild:
        print(rebuild(args.figures))
