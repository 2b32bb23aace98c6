"""Lines of a training run's printed summary shared by ``featuredp train`` (tables) and ``--task text``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from featuredp.methods import get_method


def record_line(summary: Mapping[str, Any]) -> str:
    """The ``record ε`` line: the run's ε for whole records, or why there is none (what Ψ misses is public)."""
    rec = summary.get("record_epsilon")
    if rec is not None:
        kind = "backstop: every step clipped and noised" if summary.get("record_backstop") else "no public step"
        return f"record ε          {rec:.4g} for whole records ({kind})"
    if summary.get("method") == "nonprivate":
        return "record ε          none (non-private)"
    return "record ε          none: what Ψ misses is public (set --record-epsilon E for a record-level backstop)"


def privacy_lines(summary: Mapping[str, Any]) -> list[str]:
    """The ε line, the question each ε answers (add/remove; replace-one), and for a private run the noise line:
    BandMF's bands and partitions, BLT's buffers and epochs
    (from the summary's ``correlated_noise``, the privacy report's block), or DP-SGD's σ and rate."""
    eps = "inf (no privacy)" if summary["epsilon"] is None else f"{summary['epsilon']:.4g}"
    lines = [f"epsilon           {eps}" + (f" (delta={summary['delta']:g})" if summary["delta"] else "")]
    if summary.get("epsilon") is not None and summary["epsilon"] > 0 and "replacement_epsilon" in summary:
        lines.extend(_question_lines(summary))
    if summary["noise_multiplier"] is None:
        return lines
    block = summary.get("correlated_noise") or {}
    # The report's correlated_noise block (its noise plan's) says which strategy ran: BandMF's has bands, BLT's
    # buffers.
    if summary.get("bands") is not None:
        lines.append(f"noise             bandmf, {summary['bands']} bands: correlated noise of std "
                     f"{summary['noise_multiplier']:.4g}·C (C={summary['max_grad_norm']:g}), cyclic Poisson sampling "
                     f"over {summary['bands']} partitions, {summary['steps']} private steps")
    elif "buffers" in block:
        d, b, k = block["buffers"], block["min_separation"], block["participations"]
        # BLT gives up amplification: its ε is one Gaussian's at the min-sep sensitivity, which the line must say,
        # or σ would read as a multiplier amplified by sampling.
        lines.append(f"noise             blt, {d} buffer{'' if d == 1 else 's'}, epochs of {b} steps: correlated noise "
                     f"of std {summary['noise_multiplier']:.4g}·C (C={summary['max_grad_norm']:g}), cyclic sampling "
                     f"over {b} partitions (each record in at most {k} step{'' if k == 1 else 's'}), "
                     f"{summary['steps']} private steps, one Gaussian at sensitivity {block['sensitivity']:.4g} "
                     "(no amplification)")
    else:
        lines.append(f"noise multiplier  {summary['noise_multiplier']:.4g}  (C={summary['max_grad_norm']:g}, "
                     f"sampling rate {summary['sampling_rate']:.4g}, {summary['steps']} private steps)")
    return lines


def _question_lines(summary: Mapping[str, Any]) -> list[str]:
    """Which question the ε above answers, and the replace-one ε (two values of one record's private part)."""
    whole = not get_method(summary["method"]).needs_feature_map  # DP-SGD: whole records
    part = "one record" if whole else "one record's private part"
    if summary.get("relation") == "replace-one":
        return [f"  question        replace-one: telling two values of {part} apart (it also bounds add/remove)"]
    r = summary["replacement_epsilon"]
    simulated = "without any one record" if whole else "on only the public view of any one record"
    return [f"  question        add/remove: the model is indistinguishable from one trained {simulated}",
            f"replacement eps   {'inf' if r is None else f'{r:.4g}'} (replace-one: telling two values of {part} "
            "apart)"]
