"""Audit reports: ROC curves on log axes, bar plots, Markdown — all written atomically.

A name that comes from the data (an attribute's column name) enters a file name only through
:func:`~featuredp._io.safe_filename`, and every report file is checked to land inside ``out_dir``:
a column named ``../../x`` or ``a/b`` must not write outside the run folder or create folders.
The reports' text still names the original column.

matplotlib is imported lazily with the Agg backend (no display needed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from featuredp._io import atomic_save_png, atomic_write_text, inside, safe_filename
from featuredp.attacks.metrics import roc_curve


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_roc(
    path: str | os.PathLike[str],
    curves: Mapping[str, tuple[object, object]],
    *,
    title: str = "Membership inference ROC",
) -> None:
    """Write a log-log ROC plot; ``curves`` maps a name to (scores, labels)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5))
    floor = 1.0
    for name, (scores, labels) in curves.items():
        fpr, tpr, _ = roc_curve(scores, labels)
        n_neg = int(np.sum(~np.asarray(labels).astype(bool)))
        floor = min(floor, 0.5 / max(n_neg, 1))
        ax.plot(np.maximum(fpr, 0.5 / max(n_neg, 1)), np.maximum(tpr, 1e-6), label=name)
    grid = np.logspace(np.log10(floor), 0, 50)
    ax.plot(grid, grid, "k--", lw=0.8, label="chance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    atomic_save_png(fig, path)


def plot_bars(
    path: str | os.PathLike[str],
    labels: Sequence[str],
    values: Sequence[float],
    *,
    errors: Sequence[tuple[float, float]] | None = None,
    hlines: Mapping[str, float] | None = None,
    ylabel: str = "",
    title: str = "",
) -> None:
    """Write a bar plot (optional asymmetric error bars and labelled horizontal lines)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(labels) + 2), 4))
    vals = np.asarray(values, dtype=float)
    yerr = None
    if errors is not None:
        lo = np.array([v - e[0] for v, e in zip(vals, errors)])
        hi = np.array([e[1] - v for v, e in zip(vals, errors)])
        yerr = np.vstack([np.maximum(lo, 0), np.maximum(hi, 0)])
    ax.bar(range(len(vals)), vals, yerr=yerr, capsize=3, color="tab:blue")
    for i, (name, y) in enumerate((hlines or {}).items()):
        ax.axhline(y, ls="--", color=f"C{i + 1}", label=f"{name} = {y:.3f}")
    ax.set_xticks(range(len(vals)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if hlines:
        ax.legend(fontsize=8)
    atomic_save_png(fig, path)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub Markdown table; floats are shown with 4 significant digits."""

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_markdown(path: str | os.PathLike[str], sections: Sequence[str]) -> None:
    """Join ``sections`` with blank lines and write them atomically."""
    atomic_write_text(path, "\n\n".join(s.strip() for s in sections) + "\n")


# --- the three audit reports (used by ``featuredp audit``) --------------------------------------------------


def _f(v: object) -> str:
    if v is None:
        return "∞ (none)"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_attribute_report(result: dict, out_dir: str | os.PathLike[str], *, title: str = "") -> list[str]:
    """Markdown + bar plot of an attribute-inference audit; returns the written file names."""
    from pathlib import Path

    out = Path(out_dir)
    attr = result["attribute"]
    stem = f"attribute_{safe_filename(str(attr))}"
    mem = result["groups"]["members"]
    labels, vals, errs = [], [], []
    for group in ("members", "non-members"):
        for a in result["groups"][group]["attacks"]:
            labels.append(f"{a['attack']} ({group[:3]})")
            vals.append(a["accuracy"])
            errs.append(tuple(a["accuracy_ci"]))
    plot_bars(inside(out, f"{stem}.png"), labels, vals, errors=errs,
              hlines={"Theorem 4 bound": result["bound"], "Ball (upper)": result["ball"]},
              ylabel="attack accuracy", title=f"Attribute inference of {attr!r}")  # fmt: skip
    rows = []
    for group in ("members", "non-members"):
        for a in result["groups"][group]["attacks"]:
            rows.append([group, a["attack"], a["accuracy"], f"[{a['accuracy_ci'][0]:.3f}, {a['accuracy_ci'][1]:.3f}]",
                         a["balanced_accuracy"], a["mcc"], a["advantage"],
                         f"[{a['advantage_ci'][0]:.3f}, {a['advantage_ci'][1]:.3f}]"])  # fmt: skip
    ball = mem["ball"]
    md = [
        f"# Attribute-inference audit: `{attr}`" + (f" — {title}" if title else ""),
        f"**Verdict.** {result['verdict']}",
        markdown_table(["targets", "attack", "accuracy", "95% CI", "balanced acc.", "MCC", "advantage", "adv. CI"],
                       rows),
        "\n".join(
            [
                f"- Claimed ε: {_f(result['epsilon_claimed'])}, δ = {result['delta']:g}; Theorem 4 applies: "
                f"{result['theorem4_applies']}",
                f"- Ball (best success without the model): estimate {ball['estimate']:.4f}, CI "
                f"[{ball['lower']:.4f}, {ball['upper']:.4f}], imputation accuracy {ball['imputation_accuracy']:.4f}; "
                f"method: {result['ball_method']}",
                f"- Imputers' cross-fitted accuracy on {result.get('imputer_rows', '?')} rows: "
                + ", ".join(f"{k} {v:.4f}" for k, v in result.get("imputer_cv_accuracy", {}).items())
                + f"; baseline: {result.get('baseline_imputer', '?')}",
                f"- Theorem 4 bound on attack success (members), from the baseline's upper limit: "
                f"**{result['bound']:.4f}** ({mem['bound_method']})",
                f"- Theorem 4 verdict: **{result.get('bound_verdict', '?')}**"
                + (f" ({result['reason']})" if result.get("reason") else "")
                + " (\"exceeds\" needs the best attack's lower limit above the bound, \"within\" its upper limit "
                "below a bound under 0.95; otherwise inconclusive)",
                f"- Hidden from the adversary: {result['hidden_columns']}; label public: {result['label_public']}",
                f"- Advantage = attack accuracy − imputation accuracy on the same {result['n_targets']} targets.",
            ]
        ),
        f"![bars]({stem}.png)",
    ]
    write_markdown(inside(out, f"{stem}.md"), md)
    return [f"{stem}.md", f"{stem}.png"]


def write_membership_report(result: dict, out_dir: str | os.PathLike[str], *, title: str = "") -> list[str]:
    """Markdown + log-log ROC plot of a membership audit."""
    from pathlib import Path

    out = Path(out_dir)
    arrays = result["_arrays"]
    curves = {k: (v, arrays["labels"]) for k, v in arrays.items() if k != "labels"}
    plot_roc(inside(out, "membership_roc.png"), curves,
             title="Membership inference ROC" + (f" ({title})" if title else ""))
    rows = []
    for name, m in result["metrics"].items():
        t = m["tpr_at_fpr"]
        rows.append([name, m["auc"], m["advantage"], t.get("0.1"), t.get("0.01"), t.get("0.001")])
    y = result["yeom"]
    verdict = result.get("verdict", "")
    md = [
        "# Membership-inference audit" + (f" — {title}" if title else ""),
        f"**Verdict.** {verdict}",
        markdown_table(["attack", "ROC AUC", "advantage", "TPR@FPR=0.1", "TPR@0.01", "TPR@0.001"], rows),
        f"- Yeom's fixed threshold (mean training loss {y['threshold']:.4f}): TPR {y['tpr']:.4f}, FPR {y['fpr']:.4f}, "
        f"advantage {y['advantage']:.4f}\n- {result['n_members']} members (training split) and "
        f"{result['n_nonmembers']} non-members (test split). TPR at FPR below "
        f"1/{result['n_nonmembers']} is not measurable.",
        "![roc](membership_roc.png)",
    ]
    write_markdown(inside(out, "membership.md"), md)
    return ["membership.md", "membership_roc.png"]


def write_canary_report(result: dict, out_dir: str | os.PathLike[str], *, title: str = "") -> list[str]:
    """Markdown + score histogram of a canary audit."""
    from pathlib import Path

    out = Path(out_dir)
    stem = f"canary_{safe_filename(str(result['kind']))}"
    scores, bits = result["_arrays"]["scores"], result["_arrays"]["bits"]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    bins = np.histogram_bin_edges(scores, bins=40)
    ax.hist(scores[bits], bins=bins, alpha=0.6, label="bit 1 (in / version 1)")
    ax.hist(scores[~bits], bins=bins, alpha=0.6, label="bit 0 (out / version 0)")
    ax.set_xlabel("attack score")
    ax.set_ylabel("canaries")
    ax.set_title(f"{result['kind']} canaries: ε_lb = {result['epsilon_lower_bound']:.3f}")
    ax.legend(fontsize=8)
    atomic_save_png(fig, inside(out, f"{stem}.png"))
    one = result["one_run"]
    if one is not None:
        grid = markdown_table(["guesses r", "correct v", "ε lower bound"],
                              [[g["r"], g["v"], g["epsilon_lower_bound"]] for g in one["grid"]])  # fmt: skip
        method_text = ("One-run audit (Steinke, Nasr, Jagielski 2023, Theorem 3, with δ): the attacker guesses the "
                       "r/2 highest scores as bit 1 and the r/2 lowest as bit 0; each r is tested at β/|grid| "
                       "(Bonferroni).")  # fmt: skip
    else:
        grid = ""
        method_text = ("Multi-run audit: one canary per run, in exactly half of the runs; Clopper–Pearson upper "
                       "bounds on FPR and FNR, threshold chosen on half of the runs, certified on the other.")
    md = [
        f"# Canary audit ({result['kind']} canaries)" + (f" — {title}" if title else ""),
        f"**Verdict.** {result['verdict']}",
        markdown_table(
            ["empirical ε lower bound", "claimed ε", "claim", "design ceiling", "canaries", "runs", "δ", "β"],
            [[result["epsilon_lower_bound"], _f(result["epsilon_claimed"]), result["claim_relation"],
              result["ceiling"], result["canaries_per_run"], result["runs"], result["delta"], result["beta"]]],
        ),
        method_text,
        grid,
        f"![scores]({stem}.png)",
    ]
    if "multi_run" in result:
        mr = result["multi_run"]
        md.insert(3, f"Multi-run (Clopper–Pearson, threshold chosen on half the runs): ε_lb = "
                     f"{mr['epsilon_lower_bound']:.4f}, ceiling {mr['ceiling']:.3f}.")  # fmt: skip
    write_markdown(inside(out, f"{stem}.md"), md)
    return [f"{stem}.md", f"{stem}.png"]
