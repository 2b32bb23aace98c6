"""Plots of privacy–utility grids (matplotlib, Agg backend, PNG written atomically)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np

from featuredp._io import atomic_save_png
from featuredp.methods import METHODS

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt


def privacy_utility_plot(
    rows: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    title: str = "accuracy vs ε",
    metric: str = "accuracy",
) -> dict[str, Any]:
    """Accuracy vs target ε per private method (mean ± std over seeds as error bars), with the
    non-private and public-only means as horizontal reference lines (shaded ± std).

    Returns what was drawn: ``{"lines": {method: (eps, means, stds)}, "references": {method: (mean, std)}}``.
    """
    by: dict[tuple[str, float | None], list[float]] = {}
    for r in rows:
        eps = r.get("target_epsilon")
        eps = None if eps is None or (isinstance(eps, float) and math.isnan(eps)) else float(eps)
        by.setdefault((r["method"], eps), []).append(100.0 * float(r[metric]))
    if not by:
        raise ValueError("rows must hold at least one result, got none")
    drawn: dict[str, Any] = {"lines": {}, "references": {}}
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    eps_all = sorted({e for (_, e) in by if e is not None})
    for method, record in METHODS.items():
        if record.reference:
            continue
        pts = sorted((e, v) for (m, e), v in by.items() if m == method and e is not None)
        if not pts:
            continue
        xs = [e for e, _ in pts]
        means = [float(np.mean(v)) for _, v in pts]
        stds = [float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for _, v in pts]
        ax.errorbar(xs, means, yerr=stds, capsize=3, label=record.label, color=record.color, marker=record.marker,
                    linestyle=record.linestyle)
        drawn["lines"][method] = (xs, means, stds)
    for method, record in METHODS.items():
        vals = by.get((method, None)) if record.reference else None
        if not vals:
            continue
        mean = float(np.mean(vals))
        std = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        ax.axhline(mean, color=record.color, linestyle=record.linestyle, label=f"{record.label} ({mean:.1f}%)")
        drawn["references"][method] = (mean, std)
        if std > 0:
            ax.axhspan(mean - std, mean + std, color=record.color, alpha=0.08)
    if eps_all:
        ax.set_xscale("log", base=2)
        ax.set_xticks(eps_all)
        ax.set_xticklabels([f"{e:g}" for e in eps_all])
    ax.set_xlabel("ε (target; δ fixed)")
    ax.set_ylabel(f"test {metric} (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    atomic_save_png(fig, path)
    return drawn
