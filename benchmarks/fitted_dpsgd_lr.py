"""The learning rate of DP-SGD under the data-fitted schedule, chosen where the fitted rules are set: Adult samples.

``python benchmarks/fitted_dpsgd_lr.py`` trains DP-SGD at ε = 2 with the fitted schedule
(``featuredp.experiments.presets.fitted_schedule``) on random samples of Adult's *training* data of 300 to 10,000
rows, for several learning rates, and scores each on 4,000 other Adult training rows (never the test split).
Prints one Markdown row per size: mean validation accuracy (%) over 3 seeds for each learning rate.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import torch

from featuredp.data import load_dataset
from featuredp.experiments.train_one import train_one

LRS = (0.05, 0.1, 0.2, 0.5, 1.0)


def main(argv: list[str]) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    seeds = int(argv[0]) if argv else 3
    train, _ = load_dataset("adult")
    perm = np.random.default_rng(2024).permutation(train.n)
    val = train.subset(np.sort(perm[:4000]), name="validation")
    pool = perm[4000:]
    print("| rows | " + " | ".join(f"lr {lr:g}" for lr in LRS) + " |")
    print("|---|" + "---|" * len(LRS))
    for n in (300, 1000, 3000, 10000):
        sample = train.subset(np.sort(pool[:n]))
        cells = []
        for lr in LRS:
            accs = [100 * float(train_one(method="dpsgd", dataset="own-table", data=(sample, val), epsilon=2.0,
                                          public_seed=s, progress=False, lr=lr).summary["accuracy"])
                    for s in range(seeds)]  # fmt: skip
            cells.append(f"{np.mean(accs):.1f} ± {np.std(accs):.1f}")
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
