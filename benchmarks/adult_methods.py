"""Adult, sex and race private: test accuracy of the five methods over ε and seeds.

    nice -n 10 python benchmarks/adult_methods.py                      # the table in docs/engine.md
    nice -n 10 python benchmarks/adult_methods.py --tune               # the validation grid behind the presets
    python benchmarks/adult_methods.py --epsilons 1 --seeds 0 --methods fdp,dpsgd   # a quick look

Every run uses the per-method defaults of ``featuredp.experiments.presets`` (overridable with
``--set key=value``). ``--validation`` (implied by ``--tune``) carves 20% of the
*training* set (fixed seed) as the evaluation set, so tuning never sees the test
set. Results are written atomically to ``--out`` (JSON) and printed as a
markdown table of mean ± std.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from featuredp._io import atomic_write_json
from featuredp.data import load_dataset
from featuredp.experiments.train_one import train_one
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS

METHODS = METHOD_NAMES
PRIVATE = PRIVATE_METHODS

#: the validation grid of --tune (each entry overrides the presets)
TUNE_GRID: dict[str, dict[str, list]] = {
    "nonprivate": {"lr": [0.02, 0.05, 0.1], "epochs": [3, 5]},
    "public": {"lr": [0.02, 0.05, 0.1], "epochs": [3, 5]},
    "dpsgd": {"lr": [0.2, 0.5, 1.0], "batch_size": [512, 1024], "epochs": [3, 5]},
    "fdp_dpsgd": {"lr": [0.05, 0.2, 0.5], "batch_size": [512, 1024]},
    "fdp": {"lr": [0.02, 0.05, 0.1], "alpha": [0.5, 1.0, 2.0]},
}


def _parse_set(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key.strip()] = json.loads(value)
    return out


def _data(validation: bool):
    train, test = load_dataset("adult")
    if not validation:
        return train, test
    rng = np.random.default_rng(1234)  # fixed carve-out of the training set
    perm = rng.permutation(train.n)
    cut = int(0.8 * train.n)
    return train.subset(perm[:cut], name="adult-train80"), train.subset(perm[cut:], name="adult-val20")


def _runs(args):
    if args.tune:
        for method in args.methods:
            grid = TUNE_GRID.get(method, {})
            for values in itertools.product(*grid.values()):
                yield method, 1.0, 0, dict(zip(grid, values))
        return
    for method in args.methods:
        for eps in args.epsilons if method in PRIVATE else [None]:
            for seed in args.seeds:
                yield method, eps, seed, {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epsilons", default="0.5,1,2,4")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--validation", action="store_true", help="evaluate on a validation split of the train set")
    p.add_argument("--tune", action="store_true", help="run the validation grid at epsilon 1, seed 0")
    p.add_argument("--set", nargs="*", default=[], help="override presets, e.g. --set lr=0.1 epochs=3")
    p.add_argument("--out", default="benchmarks/results/adult_methods.json")
    args = p.parse_args(argv)
    args.epsilons = [float(e) for e in args.epsilons.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.methods = [m for m in args.methods.split(",") if m]
    torch.set_num_threads(1)
    overrides = _parse_set(args.set)
    data = _data(args.validation or args.tune)
    jobs = list(_runs(args))
    rows = []
    for i, (method, eps, seed, extra) in enumerate(jobs, 1):
        t0 = time.perf_counter()
        s = train_one(data=data, dataset="adult", private=["sex", "race"], method=method, epsilon=eps,
                      delta=args.delta, public_seed=seed, progress=False, **{**overrides, **extra}).summary  # fmt: skip
        row = {"method": method, "target_epsilon": eps, "seed": seed, "overrides": {**overrides, **extra},
               "accuracy": s["accuracy"], "epsilon": s["epsilon"], "noise_multiplier": s["noise_multiplier"],
               "steps": s["steps"], "seconds": time.perf_counter() - t0}  # fmt: skip
        rows.append(row)
        print(f"[{i}/{len(jobs)}] {method:<10} eps={eps} seed={seed} {extra} acc={s['accuracy']:.4f} "
              f"({row['seconds']:.0f}s)", file=sys.stderr, flush=True)  # fmt: skip
        atomic_write_json(Path(args.out), {"evaluated_on": "validation" if (args.validation or args.tune) else "test",
                                           "delta": args.delta, "rows": rows})  # fmt: skip
    print(_table(rows, args))
    return 0


def _table(rows, args) -> str:
    if args.tune:
        lines = ["| method | overrides | validation accuracy |", "|---|---|---|"]
        for r in sorted(rows, key=lambda r: (r["method"], -r["accuracy"])):
            lines.append(f"| {r['method']} | {json.dumps(r['overrides'])} | {r['accuracy']:.4f} |")
        return "\n".join(lines)
    eps_list = args.epsilons
    head = "| method | " + " | ".join(f"ε = {e:g}" for e in eps_list) + " |"
    lines = [head, "|---|" + "---|" * len(eps_list)]
    for method in args.methods:
        cells = []
        for e in eps_list:
            accs = [r["accuracy"] for r in rows if r["method"] == method and (r["target_epsilon"] in (e, None))]
            cells.append(f"{100 * np.mean(accs):.2f} ± {100 * np.std(accs):.2f}" if accs else "-")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
