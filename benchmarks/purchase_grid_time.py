"""End-to-end effect of fast private gradients: wall time of the Purchase-style compare grid per strategy.

Usage (needs the Census-Income cache: ``featuredp data fetch census-income``)::

    nice python benchmarks/purchase_grid_time.py --out benchmarks/results/purchase_grid_time.json

Runs one cell per method (ε = 1, seed 0; the median of ``--repeats`` runs; every ε trains the same number of
steps, so the time of a run does not depend on ε) of the Purchase-style preset, once per strategy:

* ``vmap`` — per-example gradients with torch.func in physical batches of 256 (featuredp before ghost
  clipping);
* ``ghost-full-width`` — ghost clipping, with the zero-masked public passes multiplying every input column
  (the models' ``accepts_columns`` switched off: featuredp before ColumnLinear);
* ``ghost`` — the current default.

The full grid (``featuredp compare --dataset purchase-style --epsilons 1,2,4,8 --seeds 3``) trains each
private method 12 times and each reference 3 times, so its training time is estimated as
Σ_method runs × (seconds per run). Only the private methods change between strategies. The variants run in the
same process after one untimed warm-up run, one torch thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from featuredp._io import atomic_write_json
from featuredp.experiments import GridConfig, run_grid
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS
from featuredp.models import MLP, LogisticRegression

VARIANTS = ("vmap", "ghost-full-width", "ghost")
METHODS = METHOD_NAMES
# The full grid: 3 seeds, and 4 values of ε for the private methods (the references run once per seed).
RUNS_IN_FULL_GRID = {m: 3 * (4 if m in PRIVATE_METHODS else 1) for m in METHODS}


def run_variant(variant: str, methods: list[str], cache: str | None) -> dict[str, float]:
    """Seconds per training run of each method under ``variant`` (wall time of the cell)."""
    strategy = "vmap" if variant == "vmap" else "ghost"
    params = {m: {"strategy": strategy} for m in methods if m in PRIVATE_METHODS}
    saved = MLP.accepts_columns, LogisticRegression.accepts_columns
    if variant == "ghost-full-width":
        MLP.accepts_columns = LogisticRegression.accepts_columns = False
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = GridConfig(dataset="purchase-style", out=Path(tmp), methods=methods, epsilons=[1.0], seeds=[0],
                             method_params=params, progress=False,
                             dataset_options={"cache_dir": cache} if cache else {})
            res = run_grid(cfg)
            return {s["method"]: float(s["wall_s"]) for s in res["summary"]}
    finally:
        MLP.accepts_columns, LogisticRegression.accepts_columns = saved


def main(argv: list[str] | None = None) -> int:
    """Time the variants and print/save a table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--repeats", type=int, default=3, help="runs per variant, order rotated; median (vmap: 1)")
    ap.add_argument("--out", default=None, help="write the results as JSON here (atomically)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    variants = [v for v in args.variants.split(",") if v]
    methods = [m for m in args.methods.split(",") if m]
    samples: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
    started = time.perf_counter()
    run_variant("ghost", ["nonprivate"], args.cache_dir)  # warm-up: builds/loads the dataset, first imports
    for r in range(args.repeats):
        for v in variants[r % len(variants):] + variants[: r % len(variants)]:  # rotate the order
            if v == "vmap" and r > 0:
                continue  # minutes per run; its noise is negligible next to the difference
            print(f"{v} (repeat {r + 1}) ...", file=sys.stderr, flush=True)
            for m, sec in run_variant(v, methods, args.cache_dir).items():
                samples[v].setdefault(m, []).append(sec)
    per_run = {v: {m: statistics.median(xs) for m, xs in d.items()} for v, d in samples.items()}
    grid = {v: sum(RUNS_IN_FULL_GRID[m] * s for m, s in per_run[v].items()) for v in variants}
    out: dict[str, Any] = {"seconds_per_run": per_run, "samples": samples, "estimated_full_grid_s": grid,
                           "runs_in_full_grid": RUNS_IN_FULL_GRID, "torch": torch.__version__,
                           "elapsed_s": time.perf_counter() - started}
    if args.out:
        atomic_write_json(args.out, out)
    print("| method | " + " | ".join(f"{v} (s/run)" for v in variants) + " |")
    print("|---|" + "---|" * len(variants))
    for m in methods:
        print(f"| {m} | " + " | ".join(f"{per_run[v].get(m, float('nan')):.1f}" for v in variants) + " |")
    print("| **full grid (est., min)** | " + " | ".join(f"{grid[v] / 60:.1f}" for v in variants) + " |")
    print(json.dumps({"estimated_full_grid_min": {v: round(g / 60, 2) for v, g in grid.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
