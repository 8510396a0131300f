"""The benchmark's picture: output tok/s of every engine on each workload against its roofline,
and the ablation (everything on, then one optimization off at a time).

    >>> plot_bench(result, "figures/bench_w1_w2.png")   # result: the CLI's JSON, as a dict
"""
from __future__ import annotations

from . import bench_extra
from .workloads import base_workload

with bench_extra():
    import matplotlib.pyplot as plt


def plot_bench(result: dict, path: str) -> str:
    rows = [r for r in result["rows"] if "output_tok_s" in r]
    ablation = [r for r in rows if r["engine"].startswith("minivllm, no ")]
    # (workload, title, rows): one panel per workload, and one for the ablation
    panels = [(w, w, [r for r in rows if base_workload(r["workload"]) == w and r not in ablation])
              for w in result["workloads"]]
    if ablation:
        work = ablation[0]["workload"]
        everything_on = [r for r in rows if r["engine"] == "minivllm" and r["workload"] == work]
        panels.append((work, f"{work}: ablation", everything_on + ablation))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (work, title, panel_rows) in zip(axes[0], panels):
        labels = [r["engine"].replace("minivllm, ", "") + ("\n(" + r["workload"].split("(")[1] if "(" in r["workload"]
                                                          else "") for r in panel_rows]
        values = [r["output_tok_s"] for r in panel_rows]
        ax.barh(labels, values, color=["tab:orange" if "minivllm" in r["engine"] else "tab:gray" for r in panel_rows])
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
        limit = result["ceilings"].get(f"{base_workload(work)}_roofline_tok_s")
        if limit:
            ax.axvline(limit, color="black", linestyle="--", label=f"roofline {limit:,.0f} tok/s")
            ax.legend(loc="lower right", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("output tokens / s")
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"{result['model']} ({result['dtype']}) on {result.get('hardware', '?')}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
