"""``featuredp convex``: fit a DP convex model (featuredp.erm) or a label-DP baseline and report it.

Examples::

    featuredp convex --dataset breast_cancer --method objective --epsilon 1 --lam 1e-4
    featuredp convex --dataset adult --method noisy-sgd --label-private --epsilon 1 --delta 1e-5
    featuredp convex --dataset digits --method lp-2st --epsilon 2 --ledger budget.json --json

Rows are L2-normalised (a per-row map, no privacy cost) so ``data_norm = 1`` holds exactly.
The class list comes from the dataset's definition (public), never from the training labels.
With ``--ledger`` the spend is reserved before training: an overspend exits 2 with the data unused.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

METHODS = ("output", "objective", "noisy-sgd", "rr", "lp-2st")
DATASETS = ("breast_cancer", "digits", "adult")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``convex`` subcommand."""
    p = subparsers.add_parser(
        "convex",
        help="DP logistic regression / Huber SVM (output, objective perturbation, noisy SGD) and label-DP baselines",
        description=__doc__.split("Examples::")[0].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dataset", choices=DATASETS, required=True, help="bundled dataset (rows L2-normalised)")
    p.add_argument("--method", choices=METHODS, required=True, help="training method")
    p.add_argument("--epsilon", type=float, required=True, help="privacy epsilon (> 0)")
    p.add_argument("--delta", type=float, default=None,
                   help="delta: 0 = pure epsilon-DP for output/objective (default); noisy-sgd default 1e-5")
    p.add_argument("--lam", type=float, default=1e-3, help="L2 regularisation lambda (output/objective; default 1e-3)")
    p.add_argument("--loss", choices=("logistic", "huber"), default="logistic", help="loss (default logistic)")
    p.add_argument("--label-private", action="store_true", help="noisy-sgd: label-DP loss split (Algorithm 1)")
    p.add_argument("--epochs", type=float, default=10.0, help="noisy-sgd epochs (default 10)")
    p.add_argument("--batch-size", type=int, default=256, help="noisy-sgd expected batch size (default 256)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed the mechanism's noise for a reproducible research run (warns: the seed must stay "
                   "secret; never written out). Default: fresh OS entropy")
    p.add_argument("--ledger", metavar="PATH",
                   help="reserve the spend in this existing budget ledger before training (exit 2 if it does not fit)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _data(name: str) -> tuple[Any, Any, Any, Any, list[int]]:
    """(X_train, y_train, X_test, y_test, classes): rows L2-normalised, y as class indices, and the
    class list the dataset *defines* (fixed by its schema, so declaring it leaks nothing)."""
    import numpy as np

    def unit(X: Any) -> Any:
        X = np.asarray(X, dtype=np.float64)
        nrm = np.linalg.norm(X, axis=1, keepdims=True)
        return X / np.where(nrm > 0, nrm, 1.0)

    if name == "adult":
        from featuredp.data import load_dataset

        train, test = load_dataset("adult")
        # The loader fixes the classes by its spec (ADULT_CLASSES) and encodes y as their indices.
        return unit(train.X), train.y, unit(test.X), test.y, list(range(len(train.classes)))
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.model_selection import train_test_split

    bunch = {"breast_cancer": load_breast_cancer, "digits": load_digits}[name]()
    X, y = bunch.data, bunch.target
    # target holds indices into target_names, the dataset's documented class list.
    classes = list(range(len(bunch.target_names)))
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    return unit(Xtr), ytr, unit(Xte), yte, classes


def run(args: argparse.Namespace) -> int:
    """Fit, score on the test split, print the accuracy and the privacy spent."""
    from featuredp._validate import check_positive

    check_positive("--epsilon", args.epsilon)
    ledger = None
    if args.ledger:
        from pathlib import Path

        from featuredp.accounting import BudgetLedger

        if not Path(args.ledger).exists():
            raise FileNotFoundError(f"--ledger {args.ledger} does not exist: create it with a total budget first")
        ledger = BudgetLedger(args.ledger)
    Xtr, ytr, Xte, yte, classes = _data(args.dataset)
    # ledger=: the estimator reserves its spend before its mechanism runs, so an overspend raises
    # BudgetExceededError (exit 2) before training; recording after fit would refuse too late.
    common = {"random_state": args.seed, "classes": classes, "ledger": ledger}
    if args.method in ("output", "objective"):
        from featuredp.erm import ObjectivePerturbationClassifier, OutputPerturbationClassifier

        cls = OutputPerturbationClassifier if args.method == "output" else ObjectivePerturbationClassifier
        est = cls(epsilon=args.epsilon, delta=0.0 if args.delta is None else args.delta, lam=args.lam,
                  data_norm=1.0, loss=args.loss, **common)
    elif args.method == "noisy-sgd":
        from featuredp.erm import NoisySGDClassifier

        est = NoisySGDClassifier(epsilon=args.epsilon, delta=1e-5 if args.delta is None else args.delta,
                                 data_norm=1.0, loss=args.loss, label_private=args.label_private,
                                 batch_size=min(args.batch_size, len(Xtr)), epochs=args.epochs, lr_scale=50.0,
                                 radius=50.0, public_batch_size=min(1024, len(Xtr)) if args.label_private else None,
                                 **common)
    else:
        from featuredp.labeldp import LabelDPClassifier

        if args.delta not in (None, 0.0):
            raise ValueError(f"--delta must be 0 for {args.method} (pure epsilon-label-DP), got {args.delta}")
        est = LabelDPClassifier(epsilon=args.epsilon, method=args.method, **common)
    est.fit(Xtr, ytr)
    out = {"dataset": args.dataset, "method": args.method, "test_accuracy": float(est.score(Xte, yte)),
           "epsilon": float(est.epsilon_), "delta": float(est.delta_), "privacy": est.privacy_}
    if ledger is not None:
        out["ledger_spent_epsilon"] = ledger.spent()
    if args.json:
        print(json.dumps(out, default=str))
    else:
        print(f"{args.method} on {args.dataset}: test accuracy {out['test_accuracy']:.4f}, "
              f"epsilon {out['epsilon']:.4g}, delta {out['delta']:.3g} ({est.privacy_.get('relation')})")
        if args.ledger:
            print(f"ledger {args.ledger}: {out['ledger_spent_epsilon']:.4g} epsilon spent")
    return 0
