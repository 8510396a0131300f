"""The serving benchmark's picture: TTFT and TPOT (median and p99) against request rate, one line
style per server, with the SLO drawn across, so where each server leaves the SLO reads at a glance.

    plot_serving([json.load(open("minivllm.json")), json.load(open("transformers.json"))], "figures/13_serving.png")
"""
from __future__ import annotations

import math
from pathlib import Path

from . import bench_extra

with bench_extra():
    import matplotlib.pyplot as plt

# (color, line style, marker) of the 1st, 2nd, ... server: told apart in black and white too.
STYLES = [("tab:orange", "-", "o"), ("tab:gray", "--", "s"), ("tab:blue", ":", "^"), ("tab:green", "-.", "D")]
# (metric key, panel title, SLO key)
PANELS = [("ttft_p50_s", "TTFT, median", "ttft_s"), ("ttft_p99_s", "TTFT, p99", "ttft_s"),
          ("tpot_p50_s", "TPOT, median", "tpot_s"), ("tpot_p99_s", "TPOT, p99", "tpot_s")]


def _points(result: dict, key: str) -> tuple[list[float], list[float]]:
    # Finite rates only: "all at once" has no place on a rate axis, and its latency depends on the
    # number of requests rather than on a rate; the table and the JSON keep it.
    rows = [r for r in result["rates"] if math.isfinite(float(r["rate"])) and r[key] is not None]
    return [float(r["rate"]) for r in rows], [1e3 * r[key] for r in rows]


def plot_serving(results: list[dict], path: str) -> str:
    """One figure of several benchmark JSONs (dicts), one panel per metric; returns ``path``."""
    rates = sorted({x for result in results for x in _points(result, "ttft_p50_s")[0]})
    counts = {r["workload"]["num_requests"] for r in results}
    # Servers measured with different numbers of requests say so in the legend, not in one shared title.
    labels = [r["label"] if len(counts) == 1 else f"{r['label']} ({r['workload']['num_requests']} requests per rate)"
              for r in results]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    for ax, (key, title, slo_key) in zip(axes.flat, PANELS):
        for result, label, (color, linestyle, marker) in zip(results, labels, STYLES * len(results)):
            x, y = _points(result, key)
            ax.plot(x, y, color=color, linestyle=linestyle, marker=marker, label=label)
            bound = result.get("sustainable_rate_req_s")  # rates right of it ask for more tokens than it makes
            if bound and x and min(x) <= bound <= max(x):
                ax.axvline(bound, color=color, linestyle=":", linewidth=1.5, label=f"{label}: the most it sustains")
        slo_ms = 1e3 * results[0]["slo"][slo_key]
        ax.axhline(slo_ms, color="black", linewidth=1, alpha=0.6, label="SLO (reading speed)")
        # Log scales: rates are swept in doublings, and past capacity the latency grows by orders of magnitude.
        ax.set_xscale("log", base=2)
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.tick_params(axis="x", labelrotation=45)  # rates a few percent apart on the log axis would overlap
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_title(f"{title} (SLO {slo_ms:.0f} ms)", fontsize=10)
        ax.set_ylabel("ms")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("request rate (requests / s)")
    # One legend under the panels, outside every plot area, so it never covers a point.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(labels), 2), fontsize=9)
    hardware = " / ".join(dict.fromkeys(r.get("hardware", "?") for r in results))
    work = results[0]["workload"]
    arrivals = "Poisson" if work["burstiness"] == 1 else f"gamma, burstiness {work['burstiness']}"
    requests = f"{work['num_requests']} requests, " if len(counts) == 1 else ""
    fig.suptitle(f"Serving {work['name']} ({requests}{arrivals} arrivals) on {hardware}", fontsize=11)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return path
