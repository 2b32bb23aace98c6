"""The text comparison's report: summary.md (perplexity and the three audits per method and ε) and its plot."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

from featuredp._io import atomic_save_png
from featuredp.methods import METHODS

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt
from matplotlib import ticker

#: the expected exposure of a secret under a model that ranks candidates at random (≈ 1/ln 2 for large spaces)
CHANCE_EXPOSURE = 1.44

__all__ = ["render_text_summary", "text_privacy_plot"]


def _f(value: Any, fmt: str = ".2f") -> str:
    return "—" if value is None else format(value, fmt)


def _pct(value: Any) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def render_text_summary(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    """summary.md: what is private, the table (perplexity, exposure, extraction, span inference) and the notes."""
    ex = meta.get("audit", {})
    uncovered = "" if (meta.get("heldout") or {}).get("covered", True) else " (not covered by ε)"
    lines = [
        "# Feature DP for text: perplexity and what the model reveals of private spans",
        "",
        f"* Data: {meta['source']}.",
        f"* Private: {meta['disclosure']} (Ψ replaces each by its type's placeholder; the text around the spans, "
        "their number, types and places are public).",
        f"* Model: {meta['model'].get('kind')} (d = {meta['model'].get('d_model')}, {meta['model'].get('n_layers')} "
        f"layers, vocabulary {meta['model'].get('vocab_size')}, {meta['model'].get('max_len')} tokens); "
        f"δ = {meta['delta']:g}.",
        f"* {_capitalised((meta.get('heldout') or {}).get('note', 'held-out texts: see the data line'))}.",
        f"* Command: `{meta['command']}`",
        "",
        f"| method | ε | ε spent | replacement ε | record ε | perplexity ↓{uncovered} | exposure 10× (bits) "
        "| exposure 100× "
        "| extraction train / held-out | span inference (prior, bound) | control: 100× canary extracted / inferred |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        label = METHODS[r["method"]].label if r["method"] in METHODS else r["method"]
        if r.get("backstop") is not None:
            label += f" + backstop E={r['backstop']:g}"
        si = r.get("span_inference")
        si_txt = "—" if not si else (f"{_pct(si['accuracy'])} ({_pct(si['prior'])}, "
                                     f"{'—' if si['bound'] is None else _pct(si['bound'])})"
                                     + (" **exceeds the bound**" if si["violates"] else "")
                                     + (" (no power)" if si.get("no_power") and not si["violates"]
                                        else ""))  # fmt: skip
        e = r["extraction"]
        std = f" ± {r['perplexity_std']:.2f}" if r["seeds"] > 1 else ""
        lines.append(
            f"| {label} | {_f(r['epsilon'], 'g')} | {_f(r['epsilon_spent'], '.3f')} "
            f"| {_f(r.get('replacement_epsilon_spent'), '.3f')} | {_f(r.get('record_epsilon'), '.3f')} "
            f"| {r['perplexity']:.2f}{std} "
            f"| {_f(r['canary_exposure'], '.1f')}{' (no power)' if r.get('exposure_no_power') else ''} "
            f"| {_f(r['exposure_by_repeats'].get('100'), '.1f')} "
            f"| {_pct(e['rate'])} / {_pct(e['heldout_rate'])} | {si_txt} "
            f"| {_pct((e.get('canaries') or {}).get('100'))} / {_pct(((si or {}).get('canaries') or {}).get('100'))} |"
        )
    seeds = sorted({r["seeds"] for r in rows})
    lines += [
        "",
        f"Seeds per cell: {', '.join(map(str, seeds))} (means). ε spent is add/remove (the model is "
        "indistinguishable from one trained on only the public view of any one text); replacement ε is replace-one "
        "(telling two values of one text's private spans apart), same runs. Perplexity: exp of the mean token NLL "
        "of the held-out "
        "full texts (span contents included). Exposure (Carlini et al. 2019): log2|R| − log2 rank of a planted "
        f"secret among all {ex.get('digits', 4)}-digit strings (max {ex.get('digits', 4) * 3.3219:.1f} bits; a model "
        "that knows nothing scores about 1.44 bits); the canaries are spans of type `secret`, private like the rest. "
        "Extraction: greedy decoding after the text before each private span reproduces it exactly, on training "
        "records and on held-out ones (a value that is easy to guess scores on both). Span inference: given Ψ(x) of a "
        f"training record with one span to fill and {ex.get('span_k', 10)} candidates, the model's likeliest; the "
        "prior is the best guess without the model and the bound is Theorem 4's at the run's add/remove (ε, δ), the "
        "one it is stated for; the bound is exceeded only if the accuracy's 95% lower limit is above it. Control: the "
        "same two attacks on the canaries planted 100 times (extraction after their prefix; inference among k digit "
        "strings) show the attacks' power where a model memorises. Exposure \"(no power)\": the non-private model's "
        "exposure exceeds this model's by less than 3 bits at every repeat count (10×, 100×), so the canaries "
        "were not memorised enough for a low exposure to show privacy. Span inference \"(no power)\": its accuracy is "
        "no better than the prior without the model, so it cannot show a leak (\"within the bound\" would say "
        "nothing). Extraction and span-inference targets are "
        "drawn at random (OS entropy), the same "
        "number from training and held-out texts; span inference's prior is the best guess without the model (the "
        "likeliest candidate when values recur, 1/k when they are all distinct). Record ε: the run's ε for whole "
        "records — with a record-level backstop (`--record-epsilon E`) every pre-training, public and private step is "
        "clipped and noised, so it bounds what the model reveals about anything in a record, including PII that Ψ "
        "misses; — where the public view was read without noise (what Ψ misses is then public).",
        "",
        f"Wall time of this invocation: {meta.get('wall_s', 0):.0f} s ({meta.get('cells_run', 0)} cells trained, "
        f"{meta.get('cells_reused', 0)} reused); training time summed over the cells: "
        f"{meta.get('train_wall_s', 0):.0f} s (audits excluded).",
    ]
    return "\n".join(lines) + "\n"


def text_privacy_plot(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> dict[str, Any]:
    """Two panels: held-out perplexity vs ε and canary exposure (10×) vs ε; references as horizontal lines."""
    rows = [r for r in rows if r.get("backstop") is None]  # the backstop arms are in summary.md's table
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.2))
    drawn: dict[str, Any] = {"perplexity": {}, "canary_exposure": {}}
    panels = ((axes[0], "perplexity", "held-out perplexity (lower is better)"),
              (axes[1], "canary_exposure", "canary exposure, 10× (bits; lower is private)"))
    for ax, metric, title in panels:
        for method, record in METHODS.items():
            pts = sorted((r["epsilon"], r[metric]) for r in rows
                         if r["method"] == method and r["epsilon"] is not None and r[metric] is not None)  # fmt: skip
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=record.label, color=record.color,
                        marker=record.marker, linestyle=record.linestyle)  # fmt: skip
                drawn[metric][method] = pts
            ref = [r[metric] for r in rows if r["method"] == method and r["epsilon"] is None and r[metric] is not None]
            if ref:
                ax.axhline(ref[0], color=record.color, linestyle=record.linestyle,
                           label=f"{record.label} ({ref[0]:.2f})")  # fmt: skip
                drawn[metric][method] = ref[0]
        ax.set_xscale("log")
        if metric == "perplexity":  # the scrubbed model can be an order of magnitude off: ratios read best in log
            ax.set_yscale("log")
        eps = sorted({float(r["epsilon"]) for r in rows if r["epsilon"] is not None})
        if eps:
            ax.set_xticks(eps)
            ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
            ax.xaxis.set_minor_locator(ticker.NullLocator())
        if metric == "canary_exposure":  # what a model that knows nothing of the secrets scores (|R| = 10^4)
            ax.axhline(CHANCE_EXPOSURE, color="grey", linewidth=0.8, linestyle=":", label="chance (1.44)")
            ax.legend(fontsize=8)
        ax.set_xlabel("target ε")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    atomic_save_png(fig, path)
    plt.close(fig)
    return drawn


def _capitalised(text: str) -> str:
    """``text`` with its first letter in upper case (a note that starts a bullet)."""
    return text[:1].upper() + text[1:]
