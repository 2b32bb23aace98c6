"""Lines of a training run's printed summary shared by ``featuredp train`` (tables) and ``--task text``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def privacy_lines(summary: Mapping[str, Any]) -> list[str]:
    """The ε line and, for a private run, the noise line: BandMF's bands and partitions, or DP-SGD's σ and rate."""
    eps = "inf (no privacy)" if summary["epsilon"] is None else f"{summary['epsilon']:.4g}"
    lines = [f"epsilon           {eps}" + (f" (delta={summary['delta']:g})" if summary["delta"] else "")]
    if summary["noise_multiplier"] is None:
        return lines
    if summary.get("noise") == "bandmf":
        lines.append(f"noise             bandmf, {summary['bands']} bands: correlated noise of std "
                     f"{summary['noise_multiplier']:.4g}·C (C={summary['max_grad_norm']:g}), cyclic Poisson sampling "
                     f"over {summary['bands']} partitions, {summary['steps']} private steps")
    else:
        lines.append(f"noise multiplier  {summary['noise_multiplier']:.4g}  (C={summary['max_grad_norm']:g}, "
                     f"sampling rate {summary['sampling_rate']:.4g}, {summary['steps']} private steps)")
    return lines
