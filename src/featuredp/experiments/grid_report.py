"""The human-readable report of a method × ε × seed grid: per-(method, ε) means and summary.md.

No torch import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from featuredp.experiments.protocols import PAPER_SENTENCE
from featuredp.methods import METHOD_NAMES, Method, get_method
from featuredp.methods import METHODS as METHOD_RECORDS
from featuredp.noise import DEFAULT_NOISE, NOISE_PLANS

__all__ = [
    "CLAIMED_DIFFERENCES",
    "LABELS",
    "REFERENCE_METHODS",
    "arm_label",
    "noise_label",
    "noise_order",
    "reference_epsilon",
    "render_summary_md",
    "row_noise",
    "summarize",
]

METHODS = METHOD_NAMES
REFERENCE_METHODS = tuple(name for name, m in METHOD_RECORDS.items() if m.reference)
LABELS = {name: m.label for name, m in METHOD_RECORDS.items()}
#: the differences summary.md reports (the paper's claims): (minuend, subtrahend, how the line names it)
CLAIMED_DIFFERENCES = (("fdp", "dpsgd", "FDP − DP-SGD"), ("fdp", "fdp_dpsgd", "FDP − FDP(DP-SGD)"),
                       ("fdp_dpsgd", "dpsgd", "FDP(DP-SGD) − DP-SGD"))  # fmt: skip


def noise_label(noise: str) -> str:
    """How a noise arm is named after its method (" + BandMF"); the default noise adds nothing."""
    cls = NOISE_PLANS.get(noise)
    if cls is None:
        return f" + {noise}"
    return f" + {cls.label}" if cls.label else ""


def noise_order(noise: str) -> int:
    """The order of the noise arms in tables and plots (the default first: the grids from before noises)."""
    cls = NOISE_PLANS.get(noise)
    return 9 if cls is None else cls.order


def arm_label(method: str, noise: str | None) -> str:
    """The report's name of a method with its noise: ``DP-SGD``, ``DP-SGD + BandMF``, ``DP-SGD + BLT``.

    >>> arm_label("fdp", "bandmf"), arm_label("dpsgd", "blt")
    ('FDP (Alg. 1) + BandMF', 'DP-SGD + BLT')
    """
    return LABELS[method] + noise_label(noise or DEFAULT_NOISE)


def row_noise(row: dict[str, Any]) -> str | None:
    """The noise of a grid row: None for a reference (it adds none), else the row's ``noise``; a private row
    written before noises were recorded used independent noise."""
    if get_method(str(row["method"])).reference:
        return None
    noise = row.get("noise")
    return noise if isinstance(noise, str) and noise else DEFAULT_NOISE


def reference_epsilon(record: Method) -> float:
    """The ε of a non-private method: 0 when its steps read only Ψ(S), else ∞ (no guarantee)."""
    return 0.0 if record.public_steps else math.inf


def _threads_note(rows: Sequence[dict[str, Any]]) -> str:
    """"; N torch thread(s) per run" from the cells (cells written before this was recorded say nothing)."""
    counts = sorted({int(r["torch_threads"]) for r in rows if r.get("torch_threads")})
    if not counts:
        return ""
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return f"; {span} torch thread(s) per run"


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± std of accuracy (and mean ε spent, σ, steps, wall time) per method, noise and target ε.

    Each entry has ``noise`` (None for the references) and ``bands`` (BandMF's b of its cells, sorted; None for
    independent noise and BLT)."""
    groups: dict[tuple[str, str | None, float | None], list[dict[str, Any]]] = {}
    for r in rows:
        eps = r["target_epsilon"]
        eps = None if eps is None or (isinstance(eps, float) and math.isnan(eps)) else float(eps)
        groups.setdefault((r["method"], row_noise(r), eps), []).append(r)
    out = []
    order = {m: i for i, m in enumerate(METHODS)}
    for (method, noise, eps), rs in sorted(groups.items(), key=lambda kv: (
            order[kv[0][0]], noise_order(kv[0][1] or DEFAULT_NOISE), kv[0][2] or 0.0)):  # fmt: skip
        acc = np.array([float(r["accuracy"]) for r in rs])
        sigma = [float(r["noise_multiplier"]) for r in rs if r.get("noise_multiplier") not in (None, "")]
        bands = sorted({int(r["bands"]) for r in rs if _number(r.get("bands"))})
        out.append({
            "method": method, "noise": noise, "bands": bands or None, "target_epsilon": eps, "n": len(rs),
            "accuracy_mean": float(acc.mean()), "accuracy_std": float(acc.std(ddof=1)) if len(rs) > 1 else 0.0,
            "epsilon_spent": float(np.mean([float(r["epsilon"]) for r in rs])),
            # a cell written before the column existed has none: then the summary has none either
            "replacement_epsilon_spent": float(np.mean(rep)) if (rep := _replacements(rs)) else None,
            "noise_multiplier": float(np.mean(sigma)) if sigma else None,
            "steps": float(np.mean([float(r["steps"] or 0) for r in rs])),
            "wall_s": float(np.mean([float(r["wall_s"]) for r in rs])),
            "cpu_s": float(np.mean([float(r.get("cpu_s") or 0.0) for r in rs])),
        })  # fmt: skip
    return out


def _replacements(rows: list[dict[str, Any]]) -> list[float]:
    """The rows' replace-one ε (all of them, or none when any row lacks it)."""
    vals = [r.get("replacement_epsilon") for r in rows]
    return [float(v) for v in vals if v is not None] if all(_number(v) for v in vals) else []


def _number(value: Any) -> bool:
    """A value read back from a row (a cell's JSON or results.csv) that holds a number, not None or NaN."""
    return isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))


def _arm_name(s: dict[str, Any]) -> str:
    """An arm's label with BandMF's bands: ``DP-SGD + BandMF (b = 8)``."""
    name = arm_label(s["method"], s.get("noise"))
    if s.get("bands"):
        name += f" (b = {', '.join(map(str, s['bands']))})"
    return name


def _fmt_acc(s: dict[str, Any]) -> str:
    # One seed has no spread to show: "± 0.0" would claim a certainty that one run cannot give.
    if s["n"] < 2:
        return f"{100 * s['accuracy_mean']:.1f}"
    return f"{100 * s['accuracy_mean']:.1f} ± {100 * s['accuracy_std']:.1f}"


def _budget_sentence(budget: dict[str, int]) -> str:
    """Whether every private method got the same tuning budget, in one sentence."""
    counts = set(budget.values())
    if len(counts) == 1:
        n = counts.pop()
        return (f"Tuned alike: each private method ({', '.join(LABELS[m] for m in budget)}) got the same budget of "
                f"{n} candidates, scored on the same validation split.")
    return ("**Unequal tuning budgets**: " + ", ".join(f"{LABELS[m]} {n}" for m, n in budget.items())
            + " candidates; differences between these methods partly reflect the search, not the method.")


#: a summary row by (method, noise, target ε)
_Cells = dict[tuple[str, str, Any], dict[str, Any]]


def _accuracy_rows(arms: list[tuple[str, str]], by: _Cells, eps_values: list[float]) -> list[str]:
    lines = []
    for m, noise in arms:
        if m in REFERENCE_METHODS:
            s = by.get((m, DEFAULT_NOISE, None))
            cell = "—" if s is None else _fmt_acc(s)
            note = " (ε = 0)" if reference_epsilon(get_method(m)) == 0 else " (ε = ∞)"
            lines.append(f"| {LABELS[m]}{note} | " + " | ".join(cell for _ in eps_values) + " |")
        else:
            lines.append(f"| {arm_label(m, noise)} | " + " | ".join(
                _fmt_acc(by[(m, noise, e)]) if (m, noise, e) in by else "—" for e in eps_values) + " |")
    return lines


def _differences_section(by: _Cells, eps_values: list[float], correlated: list[str]) -> list[str]:
    diffs = []
    for e in eps_values:
        parts = []
        for noise in (DEFAULT_NOISE, *correlated):
            for a, b, name in CLAIMED_DIFFERENCES:
                sa, sb = by.get((a, noise, e)), by.get((b, noise, e))
                if sa and sb:
                    both = "" if noise == DEFAULT_NOISE else f" (both{noise_label(noise)})"
                    parts.append(f"{name}{both} = {100 * (sa['accuracy_mean'] - sb['accuracy_mean']):+.1f}")
        if parts:
            diffs.append(f"* ε = {e:g}: " + "; ".join(parts) + " points")
    return ["## Differences (accuracy points, means)", "", *diffs, ""] if diffs else []


def _noise_gain_section(noise: str, arms: list[tuple[str, str]], by: _Cells, eps_values: list[float]) -> list[str]:
    gains = []
    for e in eps_values:
        pairs = [(m, by[(m, noise, e)], by[(m, DEFAULT_NOISE, e)]) for m, arm in arms
                 if arm == noise and (m, noise, e) in by and (m, DEFAULT_NOISE, e) in by]  # fmt: skip
        parts = [f"{LABELS[m]} {100 * (a['accuracy_mean'] - b['accuracy_mean']):+.1f}" for m, a, b in pairs]
        if parts:
            gains.append(f"* ε = {e:g}: " + "; ".join(parts) + " points")
    if not gains:
        return []
    name = noise_label(noise).removeprefix(" + ")
    return [f"## {name} − independent noise (accuracy points, means; same method, ε and seeds)", "",
            *gains, ""]  # fmt: skip


def render_summary_md(rows: Sequence[dict[str, Any]], summary: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The human-readable report of a grid."""
    eps_values = sorted({s["target_epsilon"] for s in summary if s["target_epsilon"] is not None})
    by = {(s["method"], s.get("noise") or DEFAULT_NOISE, s["target_epsilon"]): s for s in summary}
    arms = list(dict.fromkeys((s["method"], s.get("noise") or DEFAULT_NOISE) for s in summary))
    correlated = [n for n in dict.fromkeys(noise for _, noise in arms) if n != DEFAULT_NOISE]
    private = meta.get("private") or []
    priv_text = ", ".join(private) if len(private) <= 8 else f"{len(private)} columns ({', '.join(private[:4])}, ...)"
    lines = [
        f"# Privacy–utility comparison: {meta['dataset']}",
        "",
        f"{meta.get('description', '')}",
        "",
        f"* Private: {priv_text}. Train/test rows: {meta.get('train_rows')} / {meta.get('test_rows')}.",
        f"* Model: {meta.get('model')}" + (f" {meta.get('hidden')}" if meta.get("hidden") else "")
        + f"; loss split: {meta.get('loss_split') or 'default'}; δ = {meta.get('delta'):g}"
        + ("; **quick mode** (reduced data and epochs: a smoke test, not a result)" if meta.get("quick") else "")
        + ".",
        *([f"* The {PAPER_SENTENCE}, instead of each method's epochs and batch size with σ calibrated to ε; "
            "the references train as by default."] if meta.get("protocol") == "paper" else []),
        *([f"* Majority class of the test set: {100 * meta['majority']:.1f}% (a model at or below it learned "
            "nothing); the public-only row (Ψ alone, free under FDP) is the reference a private model must beat."]
          if meta.get("majority") is not None else []),
        f"* Command: `{meta.get('command') or 'featuredp compare'}`",
        "",
        "## Test accuracy (%), mean ± std over seeds" if max((s["n"] for s in summary), default=2) > 1
        else "## Test accuracy (%), one seed (no spread: run more seeds for one)",
        "",
        "| method | " + " | ".join(f"ε = {e:g}" for e in eps_values) + " |",
        "|---|" + "---|" * len(eps_values),
    ]
    lines += _accuracy_rows(arms, by, eps_values)
    n_seeds = sorted({s["n"] for s in summary})
    lines += ["", f"Seeds per cell: {', '.join(map(str, n_seeds))}.", ""]
    lines += _differences_section(by, eps_values, correlated)
    for noise in correlated:
        lines += _noise_gain_section(noise, arms, by, eps_values)
    lines += [
        "## Privacy actually spent and cost",
        "",
        "ε spent answers add/remove (the model is indistinguishable from one trained on only the public view of any "
        "one record); replacement ε answers replace-one (telling two values of one record's private part apart) for "
        "the same runs.",
        "",
        "| method | target ε | ε spent | replacement ε | σ | steps | wall s / run | CPU s / run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        eps = "—" if s["target_epsilon"] is None else f"{s['target_epsilon']:g}"
        spent = "∞" if math.isinf(s["epsilon_spent"]) else f"{s['epsilon_spent']:.3f}"
        rep = s.get("replacement_epsilon_spent")
        rep_txt = "—" if rep is None else ("∞" if math.isinf(rep) else f"{rep:.3f}")
        sigma = "—" if s["noise_multiplier"] is None else f"{s['noise_multiplier']:.3f}"
        lines.append(f"| {_arm_name(s)} | {eps} | {spent} | {rep_txt} | {sigma} | {s['steps']:.0f} | "
                     f"{s['wall_s']:.1f} | {s['cpu_s']:.1f} |")
    for noise in correlated:  # what each correlated arm's σ means (its noise plan's note)
        note = NOISE_PLANS[noise].sigma_note if noise in NOISE_PLANS else ""
        lines += ["", note] if note else []
    total = sum(float(r["wall_s"]) for r in rows)
    total_cpu = sum(float(r.get("cpu_s") or 0.0) for r in rows)
    lines += [
        "",
        f"Total training time of the {len(rows)} runs: {total / 60:.1f} min wall, {total_cpu / 60:.1f} min CPU "
        f"(sums over runs{_threads_note(rows)}; this invocation ran {meta.get('cells_run')} and reused "
        f"{meta.get('cells_reused')} finished cells"
        + (f"; **{meta['cells_missing']} cells of the grid are not finished yet**" if meta.get("cells_missing") else "")
        + ").",
        "",
        "## Hyperparameters",
        "",
    ]
    for m, p in meta.get("methods", {}).items():
        lines.append(f"* {LABELS[m]}: `{json.dumps(p, sort_keys=True)}`")
    for noise in meta.get("noises") or []:  # each noise arm as its noise plan describes it
        note = NOISE_PLANS[noise].grid_note(meta.get("bands")) if noise in NOISE_PLANS else ""
        if note:
            lines.append(f"* {note}")
    if meta.get("tuned"):
        lines += [
            "",
            "Tuned on a validation split carved from the training data (never the test set): "
            + "; ".join(f"{k}: `{json.dumps(v, sort_keys=True)}`" for k, v in meta.get("tuned_params", {}).items())
            + ".",
            *([_budget_sentence(meta["tuning_budget"])] if meta.get("tuning_budget") else []),
            "",
            "**Tuning is not accounted for**: the ε above covers each final training run only, not the "
            "hyperparameter search on the (private) training data (the research protocol of comparing methods "
            "tuned alike). For a model you release, `featuredp train --tune private` accounts the whole search in "
            "ε, and `--tune public` (FDP) tunes on the public view for free.",
        ]
    else:
        lines += ["", "Fixed per-dataset defaults (no tuning in this run)."]
    lines += [
        "",
        "ε spent is computed by the engine's accountant (PLD, add/remove) for the private steps actually run. "
        "FDP protects the private attributes only (not membership); DP-SGD's guarantee is record-level DP, "
        "which implies FDP with the same ε. The public-only model reads Ψ(S) only ((0, 0)-FDP).",
        "",
    ]
    return "\n".join(lines)
