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
    BandMF's bands and partitions, BLT's buffers and epochs (from the summary's ``correlated_noise``, the privacy
    report's block), or DP-SGD's σ and rate. Which one is read from the summary's ``noise`` field (the run plan's
    noise kind, ``plan.noise.kind``), never guessed from which keys the block happens to hold."""
    eps = "inf (no privacy)" if summary["epsilon"] is None else f"{summary['epsilon']:.4g}"
    lines = [f"epsilon           {eps}" + (f" (delta={summary['delta']:g})" if summary["delta"] else "")]
    if summary.get("epsilon") is not None and summary["epsilon"] > 0 and "replacement_epsilon" in summary:
        lines.extend(_question_lines(summary))
    if summary["noise_multiplier"] is None:
        return lines
    lines.append(_noise_line(summary))
    return lines


def _noise_line(summary: Mapping[str, Any]) -> str:
    """The noise line of a private run, by the kind the summary names (``noise``; the default noise if absent)."""
    from featuredp.noise import BLT, DEFAULT_NOISE, NOISE_PLANS, BandMF

    block = summary.get("correlated_noise") or {}
    kind = summary.get("noise") or block.get("noise") or DEFAULT_NOISE
    cls = NOISE_PLANS.get(kind)
    if cls is None:
        raise ValueError(f"the run summary's noise must be one of {', '.join(NOISE_PLANS)}, got {kind!r}")
    described = {BandMF: _bandmf_line, BLT: _blt_line}.get(cls)
    if described is not None:
        return described(summary, block)
    if cls.correlated:  # a kind registered after this table: say what is certain, point to the report's block
        return (f"noise             {kind}: correlated noise of std {summary['noise_multiplier']:.4g}·C "
                f"(C={summary['max_grad_norm']:g}), {summary['steps']} private steps (its privacy report's "
                "correlated_noise block has the strategy and the accounting)")  # fmt: skip
    return (f"noise multiplier  {summary['noise_multiplier']:.4g}  (C={summary['max_grad_norm']:g}, "
            f"sampling rate {summary['sampling_rate']:.4g}, {summary['steps']} private steps)")


def _bandmf_line(summary: Mapping[str, Any], block: Mapping[str, Any]) -> str:
    bands = summary.get("bands") or block["bands"]
    return (f"noise             bandmf, {bands} bands: correlated noise of std {summary['noise_multiplier']:.4g}·C "
            f"(C={summary['max_grad_norm']:g}), cyclic Poisson sampling over {bands} partitions, "
            f"{summary['steps']} private steps")


def _blt_line(summary: Mapping[str, Any], block: Mapping[str, Any]) -> str:
    d, b, k = block["buffers"], block["min_separation"], block["participations"]
    # BLT gives up amplification: its ε is one Gaussian's at the min-sep sensitivity, which the line must say, or σ
    # would read as a multiplier amplified by sampling.
    return (f"noise             blt, {d} buffer{'' if d == 1 else 's'}, epochs of {b} steps: correlated noise of std "
            f"{summary['noise_multiplier']:.4g}·C (C={summary['max_grad_norm']:g}), cyclic sampling over {b} "
            f"partitions (each record in at most {k} step{'' if k == 1 else 's'}), {summary['steps']} private steps, "
            f"one Gaussian at sensitivity {block['sensitivity']:.4g} (no amplification)")


def _question_lines(summary: Mapping[str, Any]) -> list[str]:
    """Which question the ε above answers, and the replace-one ε (two values of one record's private part)."""
    whole = not get_method(summary["method"]).needs_feature_map  # DP-SGD: whole records
    if summary.get("unit") == "user":  # --user-field: the unit is every record of one user
        part = "one user's records" if whole else "the private parts of one user's records"
        unit = "user (all of that user's records)"
    else:
        part = "one record" if whole else "one record's private part"
        unit = "one record"
    if summary.get("relation") == "replace-one":
        return [f"  question        replace-one: telling two values of {part} apart (it also bounds add/remove)"]
    r = summary["replacement_epsilon"]
    simulated = f"without any {unit}" if whole else f"on only the public view of any {unit}"
    return [f"  question        add/remove: the model is indistinguishable from one trained {simulated}",
            f"replacement eps   {'inf' if r is None else f'{r:.4g}'} (replace-one: telling two values of {part} "
            "apart)"]
