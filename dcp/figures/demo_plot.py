"""The demo's plot (``dcp demo``, ``dcp demo --plot``): epoch time per method and speedup over bucket, drawn
from the demo's result rows (``dcp.demo.summarize``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcp.files import write_with


def plot(rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Left: epoch time per method (bar: median measured; dots: every repetition; diamond: predicted).
    Right: speedup over bucket (bar: median; whisker: min-max over repetitions; diamond: predicted)."""
    from dcp.experiments.plot import METHOD_COLORS
    from dcp.figures.common import pyplot

    plt = pyplot()
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(10, 4.2))
    names = [r["method"] for r in summary]
    xs = range(len(names))
    colors = [METHOD_COLORS.get(m, "#555555") for m in names]
    ax_t.bar(xs, [r["epoch_s_median"] for r in summary], 0.6, color=colors, label="median")
    for x, m in zip(xs, names, strict=True):
        pts = [float(r["epoch_time_s"]) for r in rows if r["method"] == m]
        ax_t.scatter([x] * len(pts), pts, s=14, color="black", zorder=3,
                     label="each repetition" if x == 0 else None)
    ax_t.scatter(xs, [r["predicted_epoch_s"] for r in summary], marker="D", s=40, facecolor="white",
                 edgecolor="black", zorder=4, label="predicted")
    ax_t.set_xticks(list(xs), names)
    ax_t.set_xlabel("method")
    ax_t.set_ylabel("epoch time (s), lower is better")
    ax_t.set_title("time to train the same epoch")
    top_t = max([float(r["epoch_time_s"]) for r in rows] + [r["predicted_epoch_s"] for r in summary])
    ax_t.set_ylim(0, 1.4 * top_t)  # the legend sits in the top band, above every point
    ax_t.legend(fontsize=8, loc="upper center", ncol=3)
    med = [r["speedup_median"] for r in summary]
    lo = [r["speedup_median"] - r["speedup_min"] for r in summary]
    hi = [r["speedup_max"] - r["speedup_median"] for r in summary]
    ax_s.bar(xs, med, 0.6, color=colors, yerr=[lo, hi], capsize=6, label="median, min-max")
    ax_s.scatter(xs, [r["predicted_speedup"] for r in summary], marker="D", s=40, facecolor="white",
                 edgecolor="black", zorder=4, label="predicted")
    ax_s.axhline(1.0, color="black", lw=0.8, ls=":")
    for x, r in zip(xs, summary, strict=True):
        ax_s.annotate(f"{r['speedup_median']:.2f}x", (x, max(r["speedup_max"], r["predicted_speedup"])), xytext=(0, 6), textcoords="offset points",
                      ha="center", va="bottom", fontsize=11, fontweight="bold")
    top = max([r["speedup_max"] for r in summary] + [r["predicted_speedup"] for r in summary])
    ax_s.set_ylim(0, 1.4 * top)
    ax_s.set_xticks(list(xs), names)
    ax_s.set_xlabel("method")
    ax_s.set_ylabel("speedup over bucket parallel (x), higher is better")
    ax_s.set_title("speedup (bucket epoch time / method's)")
    ax_s.legend(fontsize=8, loc="upper center", ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)
    return path
