"""Plots of privacy–utility grids (matplotlib, Agg backend, PNG written atomically)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np

from featuredp._io import atomic_save_png
from featuredp.experiments.grid_report import arm_label, noise_order, row_noise
from featuredp.methods import METHODS
from featuredp.noise import BLT, DEFAULT_NOISE, BandMF

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt

#: the line style of a correlated-noise arm, by its noise kind: both share the method's colour, so each kind needs a
#: style of its own to be told apart (presentation, kept here rather than in the noise plans)
NOISE_LINE_STYLES: dict[str, str] = {BandMF.kind: "-.", BLT.kind: ":"}
#: the line style of a correlated-noise kind without an entry above (a kind registered later)
OTHER_NOISE_LINE_STYLE = "--"


def privacy_utility_plot(
    rows: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    title: str = "accuracy vs ε",
    metric: str = "accuracy",
) -> dict[str, Any]:
    """Accuracy vs target ε per private method and noise (mean ± std over seeds as error bars), with the
    non-private and public-only means as horizontal reference lines (shaded ± std).

    A private method's correlated-noise arms (rows with ``noise`` = ``bandmf`` or ``blt``) are further lines in the
    method's colour with hollow markers, BandMF dash-dotted and BLT dotted, labelled "DP-SGD + BandMF" and
    "DP-SGD + BLT". Returns what was drawn:
    ``{"lines": {arm: (eps, means, stds)}, "references": {method: (mean, std)}}``, where an arm is the method's
    name for independent noise and ``<method>+<noise>`` otherwise.
    """
    by: dict[tuple[str, float | None], list[float]] = {}
    noises: dict[str, str] = {}  # arm → its noise
    for r in rows:
        eps = r.get("target_epsilon")
        eps = None if eps is None or (isinstance(eps, float) and math.isnan(eps)) else float(eps)
        noise = row_noise(r)
        arm = r["method"] if noise in (None, DEFAULT_NOISE) else f"{r['method']}+{noise}"
        noises[arm] = noise or DEFAULT_NOISE
        by.setdefault((arm, eps), []).append(100.0 * float(r[metric]))
    if not by:
        raise ValueError("rows must hold at least one result, got none")
    drawn: dict[str, Any] = {"lines": {}, "references": {}}
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    eps_all = sorted({e for (_, e) in by if e is not None})
    arms = [(method, record, arm) for method, record in METHODS.items() if not record.reference
            for arm in sorted((a for a in noises if a == method or a.startswith(f"{method}+")),
                              key=lambda a: noise_order(noises[a]))]
    for method, record, arm in arms:
        pts = sorted((e, v) for (m, e), v in by.items() if m == arm and e is not None)
        if not pts:
            continue
        xs = [e for e, _ in pts]
        means = [float(np.mean(v)) for _, v in pts]
        stds = [float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for _, v in pts]
        correlated = noises[arm] != DEFAULT_NOISE
        style = NOISE_LINE_STYLES.get(noises[arm], OTHER_NOISE_LINE_STYLE) if correlated else record.linestyle
        ax.errorbar(xs, means, yerr=stds, capsize=3, label=arm_label(method, noises[arm]), color=record.color,
                    marker=record.marker, linestyle=style,
                    markerfacecolor="none" if correlated else record.color)  # fmt: skip
        drawn["lines"][arm] = (xs, means, stds)
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
