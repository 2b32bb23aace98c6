"""The data-fitted defaults (``featuredp.experiments.presets.fitted_schedule``) against Adult's, on tables of
several sizes: Adult training samples (where the rule was set) and two tables it never saw.

``python benchmarks/fitted_defaults.py [adult|census|cancer ...]`` prints one line per table, size and method:
test accuracy of FDP and DP-SGD at ε = 2 with the fitted defaults and with Adult's (batches capped to fit), a
plain scaled logistic regression on the same encoded columns, and the majority class (docs/own-data.md).
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
import torch
from own_data_table import _cancer, _sample
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from featuredp.data import load_dataset
from featuredp.experiments.train_one import train_one


def _line(name: str, n: int, train, test, private: list[str], repeats: int) -> None:
    lr = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(train.X, train.y)
    majority = np.bincount(test.y).max() / test.n
    for label, dataset in (("fitted", "a-table-without-preset"), ("adult", "adult")):
        for method in ("fdp", "dpsgd"):
            capped = {"batch_size": min(512 if method == "fdp" else 1024, n // 2)}
            if method == "fdp":
                capped["public_batch_size"] = min(256, n // 2)
            accs, t0 = [], time.time()
            for seed in range(repeats):
                summary = train_one(method=method, dataset=dataset, data=(train, test), private=private, epsilon=2.0,
                                    progress=False, public_seed=seed, **(capped if label == "adult" else {})).summary
                accs.append(summary["accuracy"])
            print(f"{name} n={n} defaults={label} {method}: {np.mean(accs):.4f} ± {np.std(accs):.4f} (plain LR "
                  f"{lr.score(test.X, test.y):.4f}, majority {majority:.4f}, {summary['steps']} private steps, "
                  f"{time.time() - t0:.0f} s)", flush=True)


def main(which: list[str]) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if "adult" in which:
        train, test = load_dataset("adult")
        for n in (300, 1000, 3000, 10000):
            _line("adult", n, _sample(train, n), test.subset(np.arange(4000)), ["sex", "race"], 2)
    if "census" in which:
        train, test = load_dataset("census-income")
        for n in (2000, 20000):
            _line("census-income", n, _sample(train, n), test.subset(np.arange(10000)), ["sex", "race"], 2)
    if "cancer" in which:
        train, test, private = _cancer()
        _line("breast-cancer", train.n, train, test, private, 8)  # 114 test rows: one run is noisy


if __name__ == "__main__":
    main(sys.argv[1:] or ["adult", "census", "cancer"])
