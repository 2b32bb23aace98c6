"""Reference: diffprivlib 0.6.6's LogisticRegression (objective perturbation, one-vs-rest with ε/K)
on the same rows as convex_accuracy.py.

diffprivlib 0.6.6 needs scikit-learn 1.7.x, which conflicts with this project's environment, so
it runs in a separate throwaway virtual environment; it is *not* a dependency of featuredp::

    python3 -m venv /tmp/dplib && /tmp/dplib/bin/pip install diffprivlib==0.6.6 scikit-learn==1.7.2
    nice python benchmarks/convex_diffprivlib.py --python /tmp/dplib/bin/python

The data is handed over as a temporary .npz file. C ∈ {0.1, 1, 10} (diffprivlib's C; λ = 1/(nC))
is picked per (dataset, ε) by mean test accuracy (non-private selection, as in convex_accuracy.py).
Writes results/convex/diffprivlib.csv.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from convex_common import EPSILONS, RESULTS, load, write_csv

_WORKER = r"""
import json, sys, warnings
import numpy as np
from diffprivlib.models import LogisticRegression
warnings.simplefilter("ignore")
d = np.load(sys.argv[1])
eps_list, seeds, Cs = json.loads(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
out = []
for eps in eps_list:
    for C in Cs:
        for s in range(seeds):
            clf = LogisticRegression(epsilon=eps, data_norm=1.0, C=C, random_state=s, max_iter=1000)
            clf.fit(d["Xtr"], d["ytr"])
            out.append({"epsilon": eps, "C": C, "seed": s, "accuracy": float(clf.score(d["Xte"], d["yte"]))})
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="/tmp/dplib/bin/python", help="interpreter of the diffprivlib venv")
    ap.add_argument("--datasets", default="breast_cancer,digits,adult")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if not Path(args.python).exists():
        raise SystemExit(f"--python {args.python} not found: create the venv first (see the module docstring)")
    rows = []
    for name in args.datasets.split(","):
        Xtr, ytr, Xte, yte = load(name)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "data.npz"
            np.savez(path, Xtr=Xtr, ytr=ytr, Xte=Xte, yte=yte)
            res = subprocess.run(
                [args.python, "-c", _WORKER, str(path), json.dumps(list(EPSILONS)), str(args.seeds),
                 json.dumps([0.1, 1.0, 10.0])],
                check=True, capture_output=True, text=True,
            )
        for r in json.loads(res.stdout):
            rows.append({"dataset": name, "method": "diffprivlib 0.6.6 (obj. pert.)", **r})
        print(name, "done", flush=True)
    df = pd.DataFrame(rows)
    write_csv(df, Path(args.out) / "diffprivlib.csv")
    g = df.groupby(["dataset", "epsilon", "C"])["accuracy"].mean().reset_index()
    best = g.loc[g.groupby(["dataset", "epsilon"])["accuracy"].idxmax()]
    print(best.pivot_table(index="dataset", columns="epsilon", values="accuracy").to_string())


if __name__ == "__main__":
    main()
