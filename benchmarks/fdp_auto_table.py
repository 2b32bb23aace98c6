"""Issue 25: ``--method fdp_auto`` against its two ends, on the own-data tables of ``own_data_table.py``.

``python benchmarks/fdp_auto_table.py [--repeats R] [cancer census2k adult census20k]`` prints one Markdown row per
table: test accuracy (%) at ε = 2 of FDP (Alg. 1) and FDP (DP-SGD) with the data-fitted defaults, and of
``fdp_auto`` (the public weight w, α and lr chosen on the public view: free; or, with ``--mode private``, by the
accounted random search, whose cost is inside the ε = 2), with the w it chose in each run.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Any

import torch
from own_data_table import _OWN, EPSILON, _cell, _tables

from featuredp.experiments.train_one import train_one
from featuredp.experiments.tuning import TuningSettings, tune


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="*", default=["cancer", "census2k", "adult", "census20k"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", choices=("public", "private"), default="public",
                        help="how fdp_auto chooses: on the public view (free) or by the accounted search")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    how = "public view, free" if args.mode == "public" else "accounted search, inside ε"
    print(f"| table | rows | FDP (Alg. 1), defaults | FDP (DP-SGD), defaults | fdp_auto ({how}) | "
          "w chosen | time s |")
    print("|---|---|---|---|---|---|---|")
    for name, load in _tables(args.tables):
        train, test, private = load()
        t0 = time.time()
        common: dict[str, Any] = {"dataset": _OWN, "data": (train, test), "private": private, "epsilon": EPSILON,
                                  "progress": False}
        cols, chosen = [], []
        for method in ("fdp", "fdp_dpsgd"):
            cols.append(_cell([100 * float(train_one(method=method, public_seed=s, **common).summary["accuracy"])
                               for s in range(args.repeats)]))
        auto = []
        for s in range(args.repeats):
            summary = tune(TuningSettings(args.mode), method="fdp_auto", public_seed=s, baselines=False,
                           **common).summary
            auto.append(100 * float(summary["accuracy"]))
            chosen.append(f"{summary['ran']['public_weight']:g}")
        cols.append(_cell(auto))
        print(f"| {name} | {train.n} | " + " | ".join(cols) + f" | {', '.join(chosen)} | {time.time() - t0:.0f} |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
