"""Issue 24's table: what a user gets on their own table, from the defaults, from tuning, and the references.

``python benchmarks/own_data_table.py [--repeats R] [adult cancer census2k census20k ...]`` prints one Markdown row
per table: default FDP, FDP tuned privately (``--tune private``: random search, E[K] = 5 geometric trials, the
whole search at ε = 2), FDP tuned on the public view (``--tune public``: free), DP-SGD with the defaults (all at
ε = 2, δ = 1e-5, sex and race or the named columns private), the public-only model (Ψ alone, free), the majority
class and a plain non-private scaled logistic regression on the same encoded columns. Every table is treated as a
user's file (no preset: the schedule is fitted to its size); "unseen" marks tables the fitted rule was not set on.
Test accuracy in %, mean ± sd over R runs (fresh noise and a new public seed each; the test split is used only to
report). Results go to stdout and, with ``--csv FILE``, to a CSV.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from featuredp.data import load_dataset
from featuredp.experiments.train_one import train_one
from featuredp.experiments.tuning import TuningSettings, tune

#: a dataset name without a preset: the schedule is fitted to the table's size, as for a user's file
_OWN = "own-table"
EPSILON = 2.0


def _sample(train: Any, n: int) -> Any:
    return train.subset(np.sort(np.random.default_rng(n).choice(train.n, n, replace=False)))


def _cancer() -> tuple[Any, Any, list[str]]:
    import pandas as pd
    from sklearn.datasets import load_breast_cancer

    frame = load_breast_cancer(as_frame=True).frame.rename(columns={"target": "label"})
    frame["label"] = np.where(frame["label"] == 1, "benign", "malignant")
    path = "/tmp/featuredp_breast_cancer.csv"
    pd.DataFrame(frame).to_csv(path, index=False)
    private = ["mean radius", "mean texture"]
    train, test = load_dataset("csv", path=path, label="label", private=private)
    return train, test, private


def _tables(which: list[str]) -> list[tuple[str, Callable[[], tuple[Any, Any, list[str]]]]]:
    def adult(n: int) -> Callable[[], tuple[Any, Any, list[str]]]:
        def load() -> tuple[Any, Any, list[str]]:
            train, test = load_dataset("adult")
            return _sample(train, n), test.subset(np.arange(4000)), ["sex", "race"]
        return load

    def census(n: int) -> Callable[[], tuple[Any, Any, list[str]]]:
        def load() -> tuple[Any, Any, list[str]]:
            train, test = load_dataset("census-income")
            return _sample(train, n), test.subset(np.arange(10000)), ["sex", "race"]
        return load

    known = {
        "adult": ("Adult sample, 3,000 rows (the rule was set on Adult samples)", adult(3000)),
        "cancer": ("breast cancer (sklearn), 455 rows, unseen", _cancer),
        "census2k": ("Census-Income sample, 2,000 rows, unseen", census(2000)),
        "census20k": ("Census-Income sample, 20,000 rows, unseen", census(20000)),
    }
    return [known[w] for w in which]


def _runs(fn: Callable[[int], dict[str, Any]], repeats: int) -> tuple[list[float], dict[str, Any]]:
    accs, last = [], {}
    for seed in range(repeats):
        last = fn(seed)
        accs.append(100 * float(last["accuracy"]))
    return accs, last


def _cell(accs: list[float]) -> str:
    return f"{np.mean(accs):.1f}" if len(accs) == 1 else f"{np.mean(accs):.1f} ± {np.std(accs):.1f}"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="*", default=["adult", "cancer", "census2k", "census20k"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", default=None)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    print("| table | rows | FDP, defaults | FDP, tuned privately (ε = 2 in all) | FDP, tuned on the public view "
          "(free) | DP-SGD, defaults | public only | majority | plain LR (non-private) | time s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name, load in _tables(args.tables):
        train, test, private = load()
        t0 = time.time()
        common = {"dataset": _OWN, "data": (train, test), "private": private, "epsilon": EPSILON,
                  "progress": False}
        default, last = _runs(lambda s, c=common: train_one(method="fdp", public_seed=s, baselines=True, **c).summary,
                              args.repeats)
        public_only = 100 * float(last["baselines"]["public_only"])
        majority = 100 * float(last["baselines"]["majority"])
        private_tuned, _ = _runs(lambda s, c=common: tune(TuningSettings("private"), method="fdp", public_seed=s,
                                                baselines=False, **c).summary, args.repeats)
        public_tuned, _ = _runs(lambda s, c=common: tune(TuningSettings("public"), method="fdp", public_seed=s,
                                               baselines=False, **c).summary, args.repeats)
        dpsgd, _ = _runs(lambda s, c=common: train_one(method="dpsgd", public_seed=s, **c).summary, args.repeats)
        plain = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(train.X, train.y)
        lr = 100 * plain.score(test.X, test.y)
        row = {"table": name, "rows": train.n, "fdp_default": _cell(default), "fdp_tuned_private": _cell(private_tuned),
               "fdp_tuned_public": _cell(public_tuned), "dpsgd_default": _cell(dpsgd),
               "public_only": f"{public_only:.1f}", "majority": f"{majority:.1f}", "plain_lr": f"{lr:.1f}",
               "seconds": f"{time.time() - t0:.0f}"}
        rows.append(row)
        print("| " + " | ".join(str(v) for v in row.values()) + " |", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
