"""``featuredp convex``: fit a DP convex model (featuredp.erm) or a label-DP baseline and report it.

Examples::

    featuredp convex --dataset breast_cancer --method objective --epsilon 1 --lam 1e-4
    featuredp convex --dataset adult --method noisy-sgd --label-private --epsilon 1 --delta 1e-5
    featuredp convex --dataset digits --method lp-2st --epsilon 2 --ledger budget.json --json
    featuredp convex --data people.csv --label income --method objective --epsilon 1 --json

Rows are L2-normalised (a per-row map, no privacy cost) so ``data_norm = 1`` holds exactly.
The class list comes from the dataset's definition (public), never from the training labels.
With ``--ledger`` the spend is reserved before training: an overspend exits 2 with the data unused.
Your own table (--data FILE --label COL): output/objective/noisy-sgd protect whole records, so
--private is optional (default: the label); rr, lp-2st and --label-private protect only the label,
so a --private that names another column is refused (its values would be unprotected).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from featuredp.cli._data_args import add_data_arguments, dataset_name, resolve_data

METHODS = ("output", "objective", "noisy-sgd", "rr", "lp-2st")
DATASETS = ("breast_cancer", "digits", "adult")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``convex`` subcommand."""
    p = subparsers.add_parser(
        "convex",
        help="DP logistic regression / Huber SVM (output, objective perturbation, noisy SGD) and label-DP baselines",
        description=__doc__.split("Examples::")[0].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --dat, --data: never silently taken as --dataset
    )
    p.add_argument("--dataset", type=dataset_name, choices=DATASETS, default=None,
                   help="bundled dataset (rows L2-normalised); this or --data FILE is required")
    p.add_argument("--method", choices=METHODS, required=True, help="training method")
    p.add_argument("--epsilon", type=float, required=True, help="privacy epsilon (> 0)")
    p.add_argument("--delta", type=float, default=None,
                   help="delta: 0 = pure epsilon-DP for output/objective (default); noisy-sgd default 1e-5")
    p.add_argument("--lam", type=float, default=1e-3, help="L2 regularisation lambda (output/objective; default 1e-3)")
    p.add_argument("--loss", choices=("logistic", "huber"), default="logistic", help="loss (default logistic)")
    p.add_argument("--label-private", action="store_true",
                   help="noisy-sgd: label-DP loss split (Algorithm 1); refused with output/objective")
    p.add_argument("--epochs", type=float, default=10.0, help="noisy-sgd epochs (default 10)")
    p.add_argument("--batch-size", type=int, default=256, help="noisy-sgd expected batch size (default 256)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed the mechanism's noise for a reproducible research run (warns: the seed must stay "
                   "secret; never written out). Default: fresh OS entropy")
    p.add_argument("--ledger", metavar="PATH",
                   help="reserve the spend in this existing budget ledger before training (exit 2 if it does not fit)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_data_arguments(p)  # --data FILE --label COL ... (your own table; docs/own-data.md)
    p.set_defaults(func=run)


def _data(name: str, options: dict[str, Any] | None = None) -> tuple[Any, Any, Any, Any, list[int]]:
    """(X_train, y_train, X_test, y_test, classes): rows L2-normalised, y as class indices, and the
    class list the dataset *defines* (fixed by its schema, so declaring it leaks nothing).

    ``options`` go to :func:`featuredp.data.load_dataset` (``--data FILE``: ``name`` is ``csv``)."""
    import numpy as np

    def unit(X: Any) -> Any:
        X = np.asarray(X, dtype=np.float64)
        nrm = np.linalg.norm(X, axis=1, keepdims=True)
        return X / np.where(nrm > 0, nrm, 1.0)

    if name not in ("breast_cancer", "digits"):
        from featuredp.data import load_dataset
        from featuredp.errors import warn_record_level_statistics

        train, test = load_dataset(name, **(options or {}))
        warn_record_level_statistics(train, "featuredp convex (DP-ERM or label-DP)")
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


#: noise-to-signal ratio above which `convex` says the accuracy will be low (and below which a suggested ε aims)
_NOTE_RATIO, _GOOD_RATIO = 0.05, 0.02


def _noise_ratio(method: str, epsilon: float, delta: float, n: int, d: int, lam: float, k: int, c: float) -> float:
    """E‖noise‖ over the largest possible data signal of output/objective perturbation (one problem of K).

    Objective: the linear term b/n against the data term's gradient (norm <= 1, as |l'| <= 1 and
    ‖z‖ <= 1). Output: the noise added to w* against ‖w*‖ <= 1/λ. Near 1 the model is noise.
    """
    import math

    from featuredp.erm._noise import gaussian_noise_multiplier
    from featuredp.erm.perturbation import objective_noise_plan

    if method == "objective":
        plan = objective_noise_plan(epsilon / k, delta / k, n, lam, c)
        return (d / plan["beta"] if delta == 0 else plan["sigma"] * math.sqrt(d)) / n
    if delta == 0:
        return d / (n * lam * (epsilon / k) / 2) * lam
    return gaussian_noise_multiplier(epsilon, delta) * 2 * math.sqrt(k) / (n * lam) * math.sqrt(d) * lam


def _accuracy_note(args: argparse.Namespace, est: Any, n: int, d: int, n_classes: int) -> str | None:
    """Why output/objective perturbation will be near chance at this ε, and what works, or None."""
    if args.method not in ("output", "objective"):
        return None
    k = 1 if n_classes == 2 else n_classes
    delta = float(est.delta_)
    c = float(est.privacy_.get("smoothness", 0.25))
    ratio = _noise_ratio(args.method, args.epsilon, delta, n, d, args.lam, k, c)
    if ratio <= _NOTE_RATIO:
        return None
    split = f"one-vs-rest splits ε = {args.epsilon:g} over {k} classes ({args.epsilon / k:.3g} each), and " if k > 1 \
        else ""  # fmt: skip
    measured = " (docs/convex.md: near chance on digits for ε <= 2, as in diffprivlib)" if args.dataset == "digits" \
        else ""  # fmt: skip
    if args.method == "objective":
        target = args.epsilon
        while target < 1e4 and _noise_ratio(args.method, target, delta, n, d, args.lam, k, c) > _GOOD_RATIO:
            target *= 1.25
        other = f"--epsilon {target:.2g} or more (noise at {_GOOD_RATIO:.0%} of the signal)"
    else:  # the bound ‖w*‖ <= 1/λ is loose: no ε can be promised from public quantities alone
        other = "--method objective (less noise at the same ε)"
    sgd = "; 0.71 on digits at ε = 1" if args.dataset == "digits" else ""
    return (
        f"{split}the noise is {ratio:.2g}x the largest possible data signal (n = {n}, d = {d}), so expect accuracy "
        f"far below non-private, near chance (1/{n_classes}) when that is >= 1: this is the method at this ε, not a "
        f"bug{measured}. Try --method noisy-sgd (one multinomial model spending the whole ε{sgd}), or {other}"
    )


def _check_label_only(args: argparse.Namespace, options: dict[str, Any]) -> None:
    """rr, lp-2st and --label-private protect only the label: refuse other private columns of --data."""
    if not (args.method in ("rr", "lp-2st") or args.label_private):
        return
    from featuredp.data.schema import read_schema

    schema = read_schema(options["schema"]) if options.get("schema") else None
    label = options.get("label") or (schema.label if schema else None)
    private = args.private or (schema.private if schema else [])
    others = [c for c in private if c != label]
    if others:
        what = "--label-private" if args.label_private else f"--method {args.method}"
        flag = f"--private {','.join(args.private)}" if args.private else f"--schema {args.schema}"
        raise ValueError(f"{flag}: {what} protects only the label {label!r}, not the private column {others[0]!r}; "
                         "use --method output, objective or noisy-sgd (whole records)")


def run(args: argparse.Namespace) -> int:
    """Fit, score on the test split, print the accuracy and the privacy spent."""
    from featuredp._validate import check_positive

    check_positive("--epsilon", args.epsilon)
    from featuredp.cli._flags import check_epsilon

    check_epsilon("--epsilon", args.epsilon)
    if args.dataset is None and args.data is None:
        raise ValueError("--dataset NAME or --data FILE is required (the data to train on)")
    if args.data is not None and args.private is None and args.schema is None and args.label is not None:
        args.private = [args.label]  # the label is private under every method
    args.dataset, dataset_options = resolve_data(args, args.dataset)  # bad --data/--label/...: exit 2, no work
    if args.data is not None:
        _check_label_only(args, dataset_options)
    if args.label_private and args.method in ("output", "objective"):  # rr and lp-2st are label-DP anyway
        raise ValueError(f"--label-private does not apply to --method {args.method} (it protects whole records); it "
                         "selects noisy-sgd's label-DP loss split, and rr / lp-2st are label-DP methods")
    ledger = None
    if args.ledger:
        from pathlib import Path

        from featuredp.accounting import BudgetLedger

        if not Path(args.ledger).exists():
            raise FileNotFoundError(f"--ledger {args.ledger} does not exist: create it with a total budget first")
        ledger = BudgetLedger(args.ledger)
    Xtr, ytr, Xte, yte, classes = _data(args.dataset, dataset_options)
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
        from featuredp.mechanisms.labeldp import LabelDPClassifier

        if args.delta not in (None, 0.0):
            raise ValueError(f"--delta must be 0 for {args.method} (pure epsilon-label-DP), got {args.delta}")
        est = LabelDPClassifier(epsilon=args.epsilon, method=args.method, **common)
    est.fit(Xtr, ytr)
    out = {"dataset": args.dataset, "method": args.method, "test_accuracy": float(est.score(Xte, yte)),
           "epsilon": float(est.epsilon_), "delta": float(est.delta_), "privacy": est.privacy_}
    if args.data is not None:
        out["data"] = {"path": dataset_options["path"], "label": args.label or dataset_options.get("label"),
                       "train_rows": len(Xtr), "test_rows": len(Xte)}  # fmt: skip
    if ledger is not None:
        out["ledger_spent_epsilon"] = ledger.spent()
    out["accuracy_note"] = _accuracy_note(args, est, len(Xtr), Xtr.shape[1] + 1, len(classes))  # +1: intercept
    if args.json:
        print(json.dumps(out, default=str))
    else:
        print(f"{args.method} on {args.dataset}: test accuracy {out['test_accuracy']:.4f}, "
              f"epsilon {out['epsilon']:.4g}, delta {out['delta']:.3g} ({est.privacy_.get('relation')})")
        if args.ledger:
            print(f"ledger {args.ledger}: {out['ledger_spent_epsilon']:.4g} epsilon spent")
        if out["accuracy_note"]:
            print(f"note: {out['accuracy_note']}")
    return 0
