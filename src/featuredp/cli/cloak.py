"""``featuredp cloak``: learn which input features a classifier needs and suppress the rest (Cloak).

Cloak (Mireshghallah et al., WWW 2021) adds learned noise N(μ, σ²) to a query before it is sent to a
model server and masks the features with large σ. The numbers it prints are measurements (suppression
ratio, accuracy loss, attribute inference by the server), not bounds. docs/cloak.md.

Examples::

    featuredp cloak --dataset adult --json
    featuredp cloak --dataset adult --lambdas 0.3,1,3,10,30,100 --compare-fdp --public-seed 0 --out results/cloak
    featuredp cloak --dataset fashion-mnist --lambda 3 --dataset-path DIR --out results/cloak
    featuredp cloak --data people.csv --label income --private sex --epochs 2 --json

Your own table (--data FILE --label COL --private A,B): the classifier predicts --label and the attribute
inference is measured for each --private column (categorical ones; --attributes picks some of them).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from featuredp.cli._data_args import add_data_arguments, dataset_name, resolve_data
from featuredp.cli._flags import check_epochs, check_epsilon, check_out_dir

DATASETS = ("adult", "fashion-mnist")
#: the most --repeats accepted (each trains a classifier: about 10 s on Adult, 30 s on Fashion-MNIST)
MAX_REPEATS = 50
#: what the command says under every table (and the JSON's ``guarantee``)
NO_GUARANTEE = ("No formal guarantee: Cloak's suppression is empirical only; nothing bounds what the model server "
                "can infer from a cloaked query (docs/cloak.md).")  # fmt: skip


def register(subparsers: Any) -> None:
    """Add the ``cloak`` subcommand."""
    p = subparsers.add_parser(
        "cloak",
        help="Cloak: learned noise that suppresses the input features a classifier does not need (no formal "
        "guarantee); suppression ratio, accuracy loss, attribute inference on cloaked queries",
        description=__doc__.split("Examples::")[0].strip() + "\n\n" + NO_GUARANTEE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --dat, --data: never silently taken as --dataset or --dataset-path
    )
    p.add_argument("--dataset", type=dataset_name, choices=DATASETS, default=None,
                   help="adult (bundled) or fashion-mnist (`featuredp data fetch fashion-mnist`, or --dataset-path); "
                   "this or --data FILE is required")
    p.add_argument("--lambda", dest="lam", type=float, default=10.0, metavar="L",
                   help="λ, the weight of the cross-entropy against the noise term: the cloak reported in detail "
                   "(default 10; larger keeps more features)")
    p.add_argument("--lambdas", default=None, metavar="L1,L2,...",
                   help="also fit a cloak at each of these λ (the suppression / accuracy-loss curve); --lambda is "
                   "always included")
    p.add_argument("--epochs", type=float, default=None,
                   help="epochs of fitting each cloak (default: adult 5, fashion-mnist 2)")
    p.add_argument("--attributes", default=None, metavar="A,B",
                   help="the attributes whose inference from the cloaked query is measured, comma-separated "
                   "(adult: default sex,race; --data: default the --private columns); the imputation baseline sees "
                   "every other column")
    p.add_argument("--threshold", type=float, default=2.0,
                   help="relative noise σ/std at or above which a feature is suppressed (masked; default 2)")
    p.add_argument("--max-noise", type=float, default=4.0, help="the largest relative noise σ/std (default 4)")
    p.add_argument("--repeats", type=int, default=0,
                   help="also train this many more classifiers, each with its cloak at --lambda: the run-to-run "
                   "spread (default 0)")
    p.add_argument("--compare-fdp", action="store_true",
                   help="adult: also train FDP (Algorithm 1) with the attributes private and run `featuredp audit`'s "
                   "attribute inference on it (about a minute)")
    p.add_argument("--fdp-epsilon", type=float, default=1.0, help="ε of the FDP model of --compare-fdp (default 1)")
    p.add_argument("--dataset-path", default=None, metavar="DIR",
                   help="fashion-mnist: a folder holding the four IDX files (default: $FEATUREDP_FASHION_MNIST, "
                   "/usr/share/datasets/fashion-mnist, the cache; else it is fetched, or with FEATUREDP_OFFLINE=1 "
                   "refused)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed the noise added to queries for a reproducible research run (warns: whoever knows it "
                   "can remove the noise; never written out). Default: fresh OS entropy for every query")
    p.add_argument("--public-seed", type=int, default=None,
                   help="seed what may be published: the classifier's training, the cloak's fitting and the audit's "
                   "population/target split (default: OS entropy; the split then uses 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write <dataset>.json, <dataset>_sweep.csv, plots and summary.md into DIR (--data: csv.json, "
                   "...)")
    add_data_arguments(p)  # --data FILE --label COL --private A,B ... (your own table; docs/own-data.md)
    p.set_defaults(func=run)


def _lambdas(text: str | None) -> list[float]:
    from featuredp._validate import check_positive

    if text is None:
        return []
    out = []
    for part in text.split(","):
        try:
            value = float(part.strip())
        except ValueError:
            raise ValueError(f"--lambdas must be comma-separated numbers > 0, got {text!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"--lambdas must be finite, got {text!r}")
        out.append(check_positive("--lambdas", value))
    return out


def _check(args: argparse.Namespace) -> tuple[list[float], list[str] | None]:
    """Every flag, each error naming its flag, before any work."""
    from featuredp._validate import check_int, check_positive

    lam = check_positive("--lambda", args.lam)
    if not math.isfinite(lam):
        raise ValueError(f"--lambda must be finite, got {args.lam!r}")
    lambdas = _lambdas(args.lambdas)
    check_epochs("--epochs", args.epochs)
    check_positive("--max-noise", args.max_noise)
    check_positive("--threshold", args.threshold)
    if not args.threshold < args.max_noise:
        raise ValueError(f"--threshold must be < --max-noise {args.max_noise:g} (else nothing can be suppressed), "
                         f"got {args.threshold!r}")  # fmt: skip
    if args.dataset is None and args.data is None:
        raise ValueError("--dataset NAME or --data FILE is required (the data the classifier is trained on)")
    attributes = _attributes(args)
    if args.compare_fdp and (args.data is not None or args.dataset != "adult"):
        raise ValueError("--compare-fdp applies to --dataset adult only")
    check_epsilon("--fdp-epsilon", args.fdp_epsilon)
    _check_dataset_path(args)
    check_int("--repeats", args.repeats, minimum=0)
    if args.repeats > MAX_REPEATS:
        raise ValueError(f"--repeats must be <= {MAX_REPEATS} (each repeat trains a classifier), got {args.repeats}")
    for flag, value in (("--seed", args.seed), ("--public-seed", args.public_seed)):
        if value is not None:
            check_int(flag, value, minimum=0)
    check_out_dir("--out", args.out)
    return lambdas, attributes


def _attributes(args: argparse.Namespace) -> list[str] | None:
    if args.attributes is None:
        return None
    attributes = [a.strip() for a in args.attributes.split(",") if a.strip()]
    if not attributes:
        raise ValueError(f"--attributes must name columns, comma-separated, got {args.attributes!r}")
    if args.data is not None:
        if args.private is None:
            args.private = attributes  # the attributes measured are the sensitive ones
        unknown = [a for a in attributes if a not in args.private]
        if unknown:
            raise ValueError(f"--attributes {args.attributes}: {unknown[0]!r} is not one of the --private columns "
                             f"{','.join(args.private)}")  # fmt: skip
    elif args.dataset != "adult":
        raise ValueError(f"--attributes applies to --dataset adult only (Fashion-MNIST has no attributes), "
                         f"got --attributes {args.attributes}")  # fmt: skip
    from featuredp.data.adult import ADULT_CATEGORIES

    for a in attributes:
        if a not in ADULT_CATEGORIES:
            raise ValueError(f"--attributes must be categorical Adult columns ({', '.join(ADULT_CATEGORIES)}), "
                             f"got {a!r}")  # fmt: skip
    return attributes


def _check_dataset_path(args: argparse.Namespace) -> None:
    if args.dataset_path is None:
        return
    if args.dataset != "fashion-mnist":
        raise ValueError(f"--dataset-path applies to --dataset fashion-mnist only, got --dataset-path "
                         f"{args.dataset_path}")  # fmt: skip
    if not Path(args.dataset_path).is_dir():
        raise FileNotFoundError(f"--dataset-path must be a folder holding the Fashion-MNIST IDX files, got "
                                f"{args.dataset_path!r}")  # fmt: skip


def _print(result: dict[str, Any]) -> None:
    r = result
    print(f"Cloak on {r['dataset']}, λ = {r['lambda']:g}: suppression ratio {100 * r['suppression_ratio']:.1f}% "
          f"({r['features'] - round(r['suppression_ratio'] * r['features'])}/{r['features']} features kept), accuracy "
          f"{100 * r['clean_accuracy']:.2f}% clean -> {100 * r['cloaked_accuracy']:.2f}% cloaked "
          f"(accuracy loss {100 * r['accuracy_loss']:.2f} points)")  # fmt: skip
    if r["dataset"] != "fashion-mnist":
        kept = [f"{t['column']}" + (f" ({', '.join(t['kept'])})" if t["status"] == "partly kept" else "")
                for t in r["feature_table"] if t["status"] != "suppressed"]  # fmt: skip
        gone = [t["column"] for t in r["feature_table"] if t["status"] == "suppressed"]
        print("kept: " + "; ".join(kept))
        print("suppressed: " + (", ".join(gone) if gone else "no whole column"))
    for a, v in r.get("attribute_inference", {}).items():
        print(f"{a} from the cloaked query: {v['best_attack']} attack {100 * v['attack_accuracy']:.1f}% vs imputation "
              f"baseline {100 * v['imputation_baseline']:.1f}% (majority {100 * v['majority_baseline']:.1f}%): "
              f"{v['verdict']}")  # fmt: skip
        for name, w in v.get("variants", {}).items():
            cost = f", f's accuracy {100 * w['cloaked_accuracy']:.1f}%" if "cloaked_accuracy" in w else ""
            print(f"  {name}: attack {100 * w['attack_accuracy']:.1f}%{cost} ({w['verdict']})")
    if len(r["sweep"]) > 1:
        print("λ          suppression  accuracy loss (points)")
        for row in r["sweep"]:
            print(f"{row['lambda']:<10g} {100 * row['suppression_ratio']:>10.1f}%  {100 * row['accuracy_loss']:>8.2f}")
    rep = r.get("repeats")
    if rep:
        s = rep["summary"]
        print(f"{rep['runs']} more runs at λ = {rep['lambda']:g}: suppression ratio "
              f"{100 * s['suppression_ratio']['min']:.1f}-{100 * s['suppression_ratio']['max']:.1f}%, accuracy loss "
              f"{100 * s['accuracy_loss']['min']:.2f}-{100 * s['accuracy_loss']['max']:.2f} points"
              + "".join(f"; {a} kept in {k}/{rep['runs']}" for a, k in rep["runs_keeping_attribute"].items()))
    fdp = r.get("fdp_comparison")
    if fdp:
        for a, f in fdp["attributes"].items():
            print(f"FDP (ε = {fdp['epsilon']:.2f}) {a}: {f['best_attack']} attack {100 * f['attack_accuracy']:.1f}% vs "
                  f"imputation {100 * f['imputation_accuracy']:.1f}% on training records; Theorem 4 bound "
                  f"{f['bound']:.3f} (a different threat model: the model, not the query)")  # fmt: skip
    for f in r.get("files", []):
        print(f"wrote {f}")
    print(NO_GUARANTEE)


def run(args: argparse.Namespace) -> int:
    """Check the flags, train the classifier, fit the cloak(s), measure, print (and write)."""
    lambdas, attributes = _check(args)

    import torch

    from featuredp.experiments.cloak_runs import load_cloak_data, run_cloak, write_results

    # The models are small (MLP 64 / 256): a second thread buys nothing and slows a shared machine down.
    torch.set_num_threads(1)
    args.dataset, options = resolve_data(args, args.dataset)  # bad --data/--label/--private: exit 2, no work
    # Fashion-MNIST missing: one line naming the fetch command
    data = (load_cloak_data(args.dataset, args.dataset_path, dataset_options=options) if options
            else load_cloak_data(args.dataset, args.dataset_path))  # fmt: skip
    result = run_cloak(args.dataset, lam=args.lam, lambdas=lambdas, epochs=args.epochs, attributes=attributes,
                       seed=args.seed, public_seed=args.public_seed, compare_fdp=args.compare_fdp,
                       fdp_epsilon=args.fdp_epsilon, threshold=args.threshold, max_noise=args.max_noise,
                       repeats=args.repeats, data=data)  # fmt: skip
    if options:
        result["data"] = {"path": options["path"], "label": data[0].label_name, "train_rows": data[0].n,
                          "test_rows": data[1].n}  # fmt: skip
    if args.out:
        result["files"] = write_results(result, args.out)
    if args.json:
        # The per-pixel arrays and example images are for the plots (and <dataset>.json), not for stdout.
        print(json.dumps({k: v for k, v in result.items() if k not in ("relative_noise", "keep", "examples")},
                         default=str))  # fmt: skip
    else:
        _print(result)
    return 0
