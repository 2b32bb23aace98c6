"""Issue 25: does a larger public batch m' help Algorithm 1 once pre-training has its own batch size?

``python benchmarks/public_batch.py [--seeds S] [adult census-income purchase-style ...]`` trains, on a validation
split carved from each bundled table's training data (20%, fixed permutation, as ``compare --tune`` does; the
test split is never read), ``fdp`` with the preset's m' and with m' = 4·m (capped at the fit part's size), both
pre-training on the preset's m' (``pretrain_batch_size``, so the number of pre-training steps is the same), and
``fdp_dpsgd`` with its preset, at ε = 1 and 4. Prints one Markdown row per table and ε: validation accuracy in %,
mean ± sd over the seeds (fresh noise, public seed = the seed). Each method uses its dataset preset.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch

from featuredp.data import load_dataset
from featuredp.experiments.presets import PRESETS
from featuredp.experiments.train_one import train_one


def _validation(dataset: str) -> tuple[Any, Any, dict[str, Any]]:
    preset = PRESETS[dataset]
    train, _ = load_dataset(dataset, **preset["load"])
    perm = np.random.default_rng(12345).permutation(train.n)
    n_val = round(train.n * 0.2)
    return train.subset(np.sort(perm[n_val:])), train.subset(np.sort(perm[:n_val]), name="validation"), preset


def _acc(dataset: str, data: tuple[Any, Any], preset: dict[str, Any], method: str, eps: float, seed: int,
         **params: Any) -> float:  # fmt: skip
    s = train_one(method=method, dataset=dataset, data=data, epsilon=eps, public_seed=seed, progress=False,
                  preset=dataset, model=preset["model"], hidden=preset.get("hidden"),
                  loss_split=preset.get("loss_split"), delta=preset["delta"], **params).summary  # fmt: skip
    return 100 * float(s["accuracy"])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("datasets", nargs="*", default=["adult", "census-income", "purchase-style"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilons", default="1,4")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    print("| table | ε | m (private) | fdp, preset m' | fdp, m' = 4m (same pre-training) | fdp_dpsgd | time s |")
    print("|---|---|---|---|---|---|---|")
    for dataset in args.datasets:
        fit, val, preset = _validation(dataset)
        p = preset["methods"]["fdp"]
        m, m_pub = int(p["batch_size"]), int(p.get("public_batch_size") or p["batch_size"])
        big = min(4 * m, fit.n)
        for eps in (float(e) for e in args.epsilons.split(",")):
            t0 = time.time()
            cols = []
            for method, extra in (("fdp", {}), ("fdp", {"public_batch_size": big, "pretrain_batch_size": m_pub}),
                                  ("fdp_dpsgd", {})):
                accs = [_acc(dataset, (fit, val), preset, method, eps, s, **extra) for s in range(args.seeds)]
                cols.append(f"{np.mean(accs):.1f} ± {np.std(accs):.1f}")
            print(f"| {dataset} | {eps:g} | {m} (m' {m_pub} → {big}) | " + " | ".join(cols)
                  + f" | {time.time() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
