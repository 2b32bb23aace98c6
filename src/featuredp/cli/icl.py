"""``featuredp icl``: DP in-context learning (disjoint prompts vote, noisy argmax), accuracy and a membership attack.

Examples::

    featuredp icl --epsilon 1 --json
    featuredp icl --epsilon inf --prompts 1 --json          # ordinary 4-shot ICL: the attack's power
    featuredp icl --dataset breast_cancer --learner logreg --epsilon 3
    featuredp icl --learner hf --model-dir ./my-local-llm --prompts 20 --shots 2 --queries 50 --epsilon 8
    featuredp icl --table --epsilons 1,3,8,inf --repeats 5 --diagnostics --out results/icl
    featuredp icl --data people.csv --label income --learner logreg --epsilon 3 --json

The private data are the demonstrations (the dataset's 70% split); the queries come from the public
30%. One run answers --queries test queries from M disjoint prompts of N shots within the budget
--epsilon (all queries together; inf = plain majority vote), then attacks a fresh deployment with the
same settings. The model (or offline learner) and the queries are public; only labels are released.
Baselines computed from the demonstrations without noise (non-private learner, one noiseless prompt)
are shown only with --diagnostics, marked "not covered by epsilon".

Your own table (--data FILE --label COL): its encoded training rows are the private demonstrations and
its test split (--test-data, else a fixed 20% of the file) the public queries; --label gives the classes.
The whole demonstration is private, so --private is optional (default: the label).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from featuredp.cli._data_args import add_data_arguments, dataset_name, resolve_data
from featuredp.cli._flags import whole_number

DATASETS = ("digits", "breast_cancer")
LEARNERS = ("knn", "logreg", "hf")


def _epsilon(text: str) -> float:
    """An argparse ``type``: a number or ``inf``."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'inf', got {text!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``icl`` subcommand."""
    p = subparsers.add_parser(
        "icl",
        help="DP in-context learning: disjoint prompts vote, noisy argmax; accuracy and a membership attack",
        description=__doc__.split("Examples::")[0].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --dat, --data: never silently taken as --dataset
    )
    p.add_argument("--dataset", type=dataset_name, choices=DATASETS, default="digits",
                   help="offline dataset (default digits; your own table: --data FILE)")
    p.add_argument("--learner", choices=LEARNERS, default="knn",
                   help="in-context learner: knn (1-NN, default), logreg, or hf (a local causal LM, --model-dir)")
    p.add_argument("--model-dir", metavar="DIR",
                   help="--learner hf: directory of a locally saved causal LM and tokenizer (never downloaded)")
    p.add_argument("--label-words", metavar="W1,W2,...",
                   help="--learner hf: one word per class (default: the dataset's class names as words)")
    p.add_argument("--prompts", type=whole_number, metavar="M",
                   help="number of disjoint prompts (default: as many as fit, demonstrations // shots)")
    p.add_argument("--shots", type=whole_number, default=4, metavar="N", help="demonstrations per prompt (default 4)")
    p.add_argument("--queries", type=whole_number, default=100, metavar="Q",
                   help="queries the budget pays for, answered from the test split (default 100)")
    p.add_argument("--epsilon", type=_epsilon, metavar="E",
                   help="budget for all queries together (> 0, or inf: no noise); required unless --table")
    p.add_argument("--delta", type=float, default=1e-5, help="delta of the budget (default 1e-5)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed the partition, the noise and the experiment for a reproducible research run (warns: "
                   "the seed must stay secret; never written out). Default: fresh OS entropy")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="DIR",
                   help="write result.json (one run) or results.csv, summary.md and icl.png (--table) there")
    p.add_argument("--diagnostics", action="store_true",
                   help="also show the baselines computed from the private demonstrations WITHOUT noise, marked "
                   "\"not covered by epsilon\" (non-private learner, one noiseless prompt and its attack; with "
                   "--table their rows and epsilon=inf): a research run's, never to publish")
    p.add_argument("--table", action="store_true",
                   help="measure accuracy and attack AUC at every --epsilons value, --repeats times")
    p.add_argument("--epsilons", metavar="E1,E2,...",
                   help="--table: the budgets (default 1,3,8; with --diagnostics 1,3,8,inf)")
    p.add_argument("--repeats", type=whole_number, metavar="R", help="--table: repeats (default 5)")
    p.add_argument("--prompt-sweep", metavar="M1,M2,...",
                   help="--table: also run every epsilon with each of these numbers of prompts (e.g. 1,3,10,30,100)")
    add_data_arguments(p)  # --data FILE --label COL ... (your own table; docs/own-data.md)
    p.set_defaults(func=run)


def _parse_epsilons(text: str) -> list[float]:
    from featuredp.cli._flags import check_epsilon

    out = []
    for part in text.split(","):
        try:
            value = float(part.strip())
        except ValueError:
            raise ValueError(f"--epsilons must be numbers > 0 or inf, separated by commas, got {text!r}") from None
        if math.isnan(value) or value <= 0:
            raise ValueError(f"--epsilons must be numbers > 0 or inf, got {part.strip()!r} in {text!r}")
        out.append(value if math.isinf(value) else check_epsilon("--epsilons", value))
    return out


def _parse_sweep(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        try:
            out.append(whole_number(part.strip()))
        except argparse.ArgumentTypeError:
            raise ValueError(f"--prompt-sweep must be whole numbers >= 1 separated by commas, got {text!r}") from None
        if out[-1] < 1:
            raise ValueError(f"--prompt-sweep must be whole numbers >= 1, got {part.strip()!r} in {text!r}")
    return out


def _check(args: argparse.Namespace) -> dict[str, Any]:
    """Every flag, before any work; returns the parsed extras. Messages name the flag and the value."""
    from featuredp._validate import check_int, check_open_unit, check_positive
    from featuredp.cli._flags import check_epsilon, check_out_dir

    extras: dict[str, Any] = {}
    if args.table:
        if args.epsilon is not None:
            raise ValueError(f"--table measures every --epsilons value; drop --epsilon {args.epsilon:g} (or --table)")
        extras["epsilons"] = _parse_epsilons(args.epsilons or ("1,3,8,inf" if args.diagnostics else "1,3,8"))
        extras["repeats"] = check_int("--repeats", 5 if args.repeats is None else args.repeats, minimum=1)
        extras["sweep"] = _parse_sweep(args.prompt_sweep) if args.prompt_sweep else []
    else:
        for flag, value in (("--prompt-sweep", args.prompt_sweep), ("--epsilons", args.epsilons),
                            ("--repeats", args.repeats)):  # fmt: skip
            if value is not None:
                raise ValueError(f"{flag} applies to --table only, got {flag} {value}")
        if args.epsilon is None:
            raise ValueError("--epsilon is required (a number > 0, or inf for the noiseless majority vote), unless "
                             "--table")  # fmt: skip
        check_positive("--epsilon", args.epsilon, allow_inf=True)
        if math.isfinite(args.epsilon):
            check_epsilon("--epsilon", args.epsilon)
    check_open_unit("--delta", args.delta)
    check_int("--shots", args.shots, minimum=1)
    if check_int("--queries", args.queries, minimum=1) < 2:
        raise ValueError(f"--queries must be >= 2 (the membership attack queries a member and a non-member within "
                         f"the budget), got {args.queries}")  # fmt: skip
    if args.prompts is not None:
        check_int("--prompts", args.prompts, minimum=1)
    if args.seed is not None:
        check_int("--seed", args.seed, minimum=0)
    check_out_dir("--out", args.out)
    extras.update(_learner_extras(args))
    return extras


def _learner_extras(args: argparse.Namespace) -> dict[str, Any]:
    if args.learner != "hf":
        for flag, value in (("--model-dir", args.model_dir), ("--label-words", args.label_words)):
            if value is not None:
                raise ValueError(f"{flag} applies to --learner hf only, got {flag} {value} with --learner "
                                 f"{args.learner}")  # fmt: skip
        return {}
    if args.model_dir is None:
        raise ValueError("--learner hf needs --model-dir DIR, a locally saved causal LM (nothing is downloaded)")
    from featuredp.icl.hf import check_model_dir

    check_model_dir(args.model_dir, name="--model-dir")
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise ValueError("--learner hf needs transformers: pip install 'featuredp[llm]'")
    if args.label_words is not None:
        return {"label_words": [w.strip() for w in args.label_words.split(",")]}
    return {}


def run(args: argparse.Namespace) -> int:
    """Validate, run (one deployment or the table), print, and write --out."""
    extras = _check(args)
    from featuredp._validate import check_delta
    from featuredp.cli._flags import flag_names
    from featuredp.experiments.icl_runs import load_icl_data, make_predictor, run_icl, run_table

    if args.data is not None and args.private is None and args.schema is None and args.label is not None:
        args.private = [args.label]  # the whole demonstration is private: nothing more to declare
    args.dataset, options = resolve_data(args, args.dataset or "digits")  # bad --data/--label/...: exit 2, no work
    data = load_icl_data(args.dataset, dataset_options=options)
    n, n_test = len(data.y_pool), len(data.y_test)
    check_delta(args.delta, n, name="--delta")
    prompts = args.prompts if args.prompts is not None else n // args.shots
    if prompts < 1 or prompts * args.shots > n:
        raise ValueError(f"--prompts × --shots = {prompts} × {args.shots} = {prompts * args.shots} must be <= the "
                         f"{n} demonstrations of {args.dataset}")  # fmt: skip
    for m in extras.get("sweep", []):
        if m * args.shots > n:
            raise ValueError(f"--prompt-sweep value {m} × --shots {args.shots} = {m * args.shots} is more than the {n} "
                             f"demonstrations of {args.dataset}")  # fmt: skip
    if args.queries > n_test:
        raise ValueError(f"--queries must be <= {n_test}, the size of {args.dataset}'s public split, got "
                         f"{args.queries}")  # fmt: skip
    if "label_words" in extras and len(extras["label_words"]) != data.n_classes:
        raise ValueError(f"--label-words must hold {data.n_classes} words (one per class of {args.dataset}), got "
                         f"{args.label_words!r}")  # fmt: skip
    flags = {"model_dir": "--model-dir", "label_words": "--label-words", "shots": "--shots", "prompts": "--prompts",
             "queries": "--queries", "epsilon": "--epsilon", "delta": "--delta"}  # fmt: skip
    with flag_names(flags):
        predictor = make_predictor(args.learner, data, model_dir=args.model_dir, label_words=extras.get("label_words"))
        if args.table:
            result = run_table(data, predictor, learner=args.learner, epsilons=extras["epsilons"],
                               prompts=args.prompts, shots=args.shots, queries=args.queries, delta=args.delta,
                               repeats=extras["repeats"], prompt_sweep=extras["sweep"], seed=args.seed, out=args.out,
                               progress=not args.json, diagnostics=args.diagnostics)
            return _print_table(args, result)
        result = run_icl(data, predictor, learner=args.learner, prompts=args.prompts, shots=args.shots,
                         queries=args.queries, epsilon=args.epsilon, delta=args.delta, seed=args.seed,
                         diagnostics=args.diagnostics)
    if args.out:
        from pathlib import Path

        from featuredp._io import atomic_write_json

        atomic_write_json(Path(args.out) / "result.json", result)
    if options:
        result["data"] = {"path": options["path"], "label": args.label or options.get("label"),
                          "demonstrations": n, "query_pool": n_test}  # fmt: skip
    if args.json:
        print(json.dumps(result))
        return 0
    eps = result["epsilon"]
    print(f"DP-ICL on {result['dataset']} ({result['learner']}): {result['prompts']} prompts × {result['shots']} "
          f"shots, {result['queries_answered']}/{result['queries']} queries answered")
    print(f"  accuracy {result['accuracy']:.3f}   epsilon spent {eps if eps == 'inf' else format(eps, '.4g')} "
          f"(budget {result['epsilon_budget']}, delta {result['delta']:g})"
          + ("" if result["sigma"] is None else f", GNMax sigma {result['sigma']:.3g} votes"))
    print(f"  baseline: zero-shot (no demonstrations) {result['zero_shot_accuracy']:.3f}")
    print(f"  membership attack AUC {result['mia_auc']:.3f} ({result['mia_members']} members vs "
          f"{result['mia_nonmembers']} non-members)")
    diag = result.get("diagnostics")
    if diag:
        base = "n/a" if diag["nonprivate_accuracy"] is None else f"{diag['nonprivate_accuracy']:.3f}"
        print("  diagnostics (NOT covered by epsilon: computed from the private demonstrations without noise; do not "
              "publish)")
        print(f"    non-private (all demonstrations) {base}, one {result['shots']}-shot prompt at epsilon=inf "
              f"{diag['single_prompt_accuracy']:.3f} (membership attack AUC {diag['single_prompt_mia_auc']:.3f})")
    if args.out:
        print(f"  wrote {args.out}/result.json")
    return 0


def _print_table(args: argparse.Namespace, result: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps({"settings": result["settings"], "summary": result["summary"], "seconds": result["seconds"]}))
        return 0
    s = result["settings"]
    print(f"DP-ICL on {s['dataset']} ({s['learner']}): {s['prompts']} prompts × {s['shots']} shots, {s['queries']} "
          f"queries, {s['repeats']} repeats, {result['seconds']:.0f} s")
    print(f"  {'setting':<36} {'accuracy %':>14} {'MIA AUC %':>14}")
    for label, e in result["summary"].items():
        acc = "—" if e["accuracy"] is None else f"{100 * e['accuracy']:.1f} ± {100 * (e['accuracy_std'] or 0):.1f}"
        auc = "—" if e["mia_auc"] is None else f"{100 * e['mia_auc']:.1f} ± {100 * (e['mia_auc_std'] or 0):.1f}"
        print(f"  {label + ('' if e['covered_by_epsilon'] else ' †'):<36} {acc:>14} {auc:>14}")
    if any(not e["covered_by_epsilon"] for e in result["summary"].values()):
        print("  † NOT covered by epsilon: computed from the private demonstrations without noise")
    if args.out:
        print(f"  wrote {args.out}/results.csv, summary.md, icl.png")
    return 0
