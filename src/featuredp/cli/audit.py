"""``featuredp audit``: attack a trained run and compare what leaks with what was promised."""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path
from typing import Any

from featuredp.cli._data_args import add_data_arguments, use_data_args_for_run
from featuredp.cli._flags import check_out_dir, note, whole_number

ATTACKS = ("attribute", "membership", "canary", "exposure", "extraction", "span")
#: the audits of a text run (``featuredp train --task text``): featuredp.experiments.text_lm.TEXT_ATTACKS
TEXT_ATTACKS = ("exposure", "extraction", "span")
CANARY_KINDS = ("feature", "mislabelled", "gradient")


def _columns(text: str) -> list[str]:
    cols = [c.strip() for c in text.split(",") if c.strip()]
    if not cols:
        raise argparse.ArgumentTypeError(f"expected comma-separated column names, got {text!r}")
    return cols


def register(subparsers: Any) -> None:
    """Add the ``audit`` subcommand."""
    p = subparsers.add_parser(
        "audit",
        help="audit a trained run: attribute / membership inference, canary ε lower bounds",
        description="Attack the model of RUN_DIR and report what leaks next to what its guarantee allows. "
        "Reports (Markdown + PNG + JSON) go to RUN_DIR/audit/. A small empirical ε lower bound is not a proof "
        "of privacy: every canary report prints the largest ε its design could certify.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `featuredp train --out`")
    p.add_argument("--attack", choices=ATTACKS, default=None,
                   help="tabular runs: attribute (default), membership, canary; text runs: span (span inference "
                   "against Theorem 4's bound; default), exposure (the canaries planted by train --canaries), "
                   "extraction")
    p.add_argument("--attribute", type=_columns, default=None,
                   help="private attribute(s) to infer, comma-separated: columns the run declared private (default: "
                   "all of them); a public column is refused (Ψ released it with the model: nothing to infer)")
    p.add_argument("--targets", type=whole_number, default=None,
                   help="member and non-member targets each (default 2000, or as many as the data has); at most half "
                   "the test split for attribute inference, the smaller split for membership inference")
    p.add_argument("--shadows", type=int, default=0,
                   help="membership: shadow models for LiRA and Shokri's attack (0 = loss attack only)")
    p.add_argument("--canaries", type=int, default=1000, help="canaries per audit model (default 1000)")
    p.add_argument("--runs", type=int, default=1, help="audit models to train (default 1: a one-run audit)")
    p.add_argument("--canary-kind", choices=CANARY_KINDS, default="feature",
                   help="feature: pairs differing only in private columns (FDP); mislabelled: record-level; "
                        "gradient: simulated white-box Dirac canaries through the run's (sigma, p, T)")
    p.add_argument("--train-size", type=int, default=None,
                   help="canary / shadow models: train on a random subset of this size (faster)")
    p.add_argument("--steps", type=int, default=None, help="canary / shadow models: training steps (faster)")
    p.add_argument("--epochs", type=float, default=None, help="canary / shadow models: training epochs")
    p.add_argument("--no-flip-label", action="store_true",
                   help="feature canaries keep their true label (default: a wrong label, same in both versions)")
    p.add_argument("--beta", type=float, default=0.05, help="1 - confidence of the epsilon lower bound")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--names-file", default=None, metavar="FILE",
                   help="text runs trained with --detect name: the same names list (run.json keeps only its count)")
    p.add_argument("--out", default=None, help="report directory (default RUN_DIR/audit)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_data_arguments(p)  # --data FILE ...: where the run's data is now (default: what run.json records)
    p.set_defaults(func=run)


def _plain(obj: Any) -> Any:
    """JSON-able copy without the plotting arrays; inf -> None."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items() if k != "_arrays"}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, float) and math.isinf(obj):
        return None
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    return obj


def run(args: argparse.Namespace) -> int:
    """Run the requested audit, write the reports, print a summary (or JSON)."""
    _check_values(args)
    run_dir = Path(args.run_dir)
    if not (run_dir / "run.json").exists():
        raise FileNotFoundError(f"RUN_DIR must be a run directory with run.json, got {str(run_dir)!r}")
    if _is_text_run(run_dir):
        return _audit_text(args, run_dir)
    if args.attack in TEXT_ATTACKS:
        raise ValueError(f"--attack {args.attack} audits a text run (featuredp train --task text); {run_dir} is "
                         "not one")
    args.attack = args.attack or "attribute"
    if args.attribute is not None and args.attack != "attribute":
        raise ValueError(f"--attribute is for --attack attribute, got --attribute {','.join(args.attribute)} with "
                         f"--attack {args.attack}")  # fmt: skip
    return _audit_tabular(args, run_dir)


def _check_values(args: argparse.Namespace) -> None:
    """The numeric flags and --out, before anything is read (one line naming the flag)."""
    from featuredp._validate import check_int, check_open_unit

    if args.targets is not None:
        check_int("--targets", args.targets, minimum=10)
    check_out_dir("--out", args.out)
    check_int("--shadows", args.shadows, minimum=0)
    check_int("--canaries", args.canaries, minimum=1)
    check_int("--runs", args.runs, minimum=1)
    check_open_unit("--beta", args.beta)
    if args.train_size is not None:
        check_int("--train-size", args.train_size, minimum=10)
    if args.steps is not None and args.epochs is not None:
        raise ValueError("give --steps or --epochs, not both")


def attribute_choices(args: argparse.Namespace, private_columns: list[str]) -> list[str]:
    """The attributes to attack: ``--attribute`` checked against the run's private columns (the columns its Ψ hid),
    or all of them by default.

    A public column was released with the model (Ψ(x) holds it): inferring it measures nothing, and Theorem 4 does
    not speak about it, so it is refused with one line that lists what can be attacked.

    >>> attribute_choices(argparse.Namespace(attribute=None), ["sex", "race"])
    ['sex', 'race']
    >>> attribute_choices(argparse.Namespace(attribute=["age"]), ["sex", "race"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --attribute must name the run's private columns (sex, race): 'age' is public in this run ...
    """
    if not private_columns:
        given = f", got --attribute {','.join(args.attribute)}" if args.attribute else ""
        raise ValueError("--attribute: this run declares no private columns (every column is public), so there is "
                         f"no private attribute to infer{given}")  # fmt: skip
    if args.attribute is None:
        return list(private_columns)
    public = [a for a in args.attribute if a not in private_columns]
    if public:
        raise ValueError(f"--attribute must name the run's private columns ({', '.join(private_columns)}): "
                         f"{public[0]!r} is public in this run (Ψ releases it), got --attribute "
                         f"{','.join(args.attribute)}")  # fmt: skip
    return list(dict.fromkeys(args.attribute))


def _audit_tabular(args: argparse.Namespace, run_dir: Path) -> int:
    """``--attack attribute|membership|canary`` on a tabular run: attack, write the reports, print."""
    import torch

    from featuredp.experiments.runs import check_data_fingerprint, load_run

    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    run_ = load_run(run_dir)
    attributes = attribute_choices(args, run_.private_columns) if args.attack == "attribute" else []
    use_data_args_for_run(run_, args)  # --data FILE ... or the files run.json names: checked before any attack
    if not (args.attack == "canary" and args.canary_kind == "gradient"):  # gradient canaries read no data
        # Other records at the same path would be audited as the run's members: refused before any attack.
        check_data_fingerprint(run_)
    out_dir = Path(args.out) if args.out else run_dir / "audit"
    eps = run_.epsilon
    title = f"{run_.info.get('method')}, ε = {'∞' if math.isinf(eps) else f'{eps:.3g}'}"
    progress = not (args.quiet or args.json)
    if args.attack == "canary":
        results, files = _canary(args, run_, out_dir, title, progress)
    else:
        train, test = run_.load_data()
        _settle_targets(args, train.n, test.n)  # more targets than the data holds: refused, not clamped
        if getattr(train, "X_cat", None) is not None and run_.info.get("model_spec", {}).get("kind") == "sparse_logreg":
            raise ValueError("featuredp audit supports dense models (mlp, logreg); this run uses sparse_logreg")
        if args.attack == "attribute":
            results, files = _attribute(args, run_, (train, test), attributes, out_dir, title)
        else:
            results, files = _membership(args, run_, (train, test), out_dir, title, progress)
    return _finish(args, run_, run_dir, out_dir, results, files)


def _delta(run_: Any) -> float:
    return float(run_.plan.delta) if run_.plan is not None and run_.plan.delta else 0.0


def _canary(args: argparse.Namespace, run_: Any, out_dir: Path, title: str, progress: bool
            ) -> tuple[list[dict[str, Any]], list[str]]:  # fmt: skip
    """The canary audit: audit models trained like the run, with and without canaries."""
    from featuredp.attacks import report, tabular
    from featuredp.experiments.train_one import retrain_like

    res = tabular.canary_audit(run_, kind=args.canary_kind, canaries=args.canaries, runs=args.runs,
                               train_size=args.train_size, flip_label=not args.no_flip_label, beta=args.beta,
                               seed=args.seed, progress=progress,
                               train_fn=functools.partial(retrain_like, run_, steps=args.steps, epochs=args.epochs,
                                                          progress=progress))  # fmt: skip
    return [res], report.write_canary_report(res, out_dir, title=title)


def _attribute(args: argparse.Namespace, run_: Any, data: tuple[Any, Any], attributes: list[str], out_dir: Path,
               title: str) -> tuple[list[dict[str, Any]], list[str]]:  # fmt: skip
    """Attribute inference of each private attribute against the run's model."""
    from featuredp.attacks import report, tabular

    train, test = data
    results: list[dict[str, Any]] = []
    files: list[str] = []
    for a in attributes:
        res = tabular.attribute_audit(
            run_.model, train, test, a, private_columns=run_.private_columns,
            label_public=not bool(run_.dataset.get("label_private")), epsilon=run_.epsilon, delta=_delta(run_),
            plan=run_.plan, steps=(run_.info.get("result") or {}).get("steps"), n_targets=args.targets,
            seed=args.seed,
        )  # fmt: skip
        files += report.write_attribute_report(res, out_dir, title=title)
        results.append(res)
    return results, files


def _membership(args: argparse.Namespace, run_: Any, data: tuple[Any, Any], out_dir: Path, title: str,
                progress: bool) -> tuple[list[dict[str, Any]], list[str]]:  # fmt: skip
    """Membership inference against the run's model (shadow models trained like the run)."""
    from featuredp.attacks import report, tabular
    from featuredp.experiments.train_one import retrain_like

    train, test = data
    counter = iter(range(10**6))

    def train_fn(ds: Any) -> Any:
        return retrain_like(run_, ds, steps=args.steps, epochs=args.epochs,
                            seed=args.seed + 1000 + next(counter))[0]  # fmt: skip

    res = tabular.membership_audit(run_.model, train, test, n_targets=args.targets, shadows=args.shadows,
                                   train_fn=train_fn, shadow_train_size=args.train_size, seed=args.seed,
                                   progress=progress)  # fmt: skip
    eps, method = run_.epsilon, run_.info.get("method")
    res["epsilon_claimed"] = None if math.isinf(eps) else eps
    res["method"] = method
    res["verdict"] = tabular.membership_verdict(res, method, eps, _delta(run_))
    return [res], report.write_membership_report(res, out_dir, title=title)


def _finish(args: argparse.Namespace, run_: Any, run_dir: Path, out_dir: Path, results: list[dict[str, Any]],
            files: list[str]) -> int:  # fmt: skip
    """Write the audit's JSON next to its reports and print the summary (or the JSON)."""
    from featuredp._io import atomic_write_json, inside, safe_filename

    eps = run_.epsilon
    plain = [_plain(r) for r in results]
    for r in plain:
        r.setdefault("epsilon_claimed", None if math.isinf(eps) else eps)
        r["method"] = run_.info.get("method")
        r["run_dir"] = str(run_dir)
    payload: dict[str, Any] = plain[0] if len(plain) == 1 else {"attack": args.attack, "results": plain}
    payload["report_files"] = [str(out_dir / f) for f in files]
    name = args.attack if args.attack != "canary" else f"canary_{args.canary_kind}"
    atomic_write_json(inside(out_dir, f"{safe_filename(name)}.json"), payload)
    if args.json:
        json.dump(payload, sys.stdout, indent=2, default=str)
        print()
    else:
        for r in plain:
            if r["attack"] == "attribute":
                _print_attribute(r)
            print(f"[{r['attack']}] {r['verdict']}")
        print(f"reports: {out_dir}")
    return 0


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _print_attribute(r: dict[str, Any]) -> None:
    """The numbers behind an attribute audit's verdict, one per line."""
    conf = f"{r.get('confidence', 0.95):.0%}"
    lo = r["groups"]["members"]["best_accuracy_ci"][0]
    print(f"[attribute] {r['attribute']}: success of the best attack ({r['best_attack']}) on {r['n_targets']:,} "
          f"training records {_pct(r['accuracy'])} (lower {conf} limit {_pct(lo)})")  # fmt: skip
    print(f"  baseline without the model ({r['baseline_imputer']}, {r['imputer_folds']}-fold cross-fitted on "
          f"{r['imputer_rows']:,} rows): {_pct(r['baseline_accuracy'])}, {conf} interval "
          f"[{_pct(r['baseline_lcl'])}, {_pct(r['baseline_ucl'])}]")  # fmt: skip
    print(f"  Theorem 4 bound from the baseline's upper limit: {r['bound']:.3f}")
    verdict = r["bound_verdict"] + (f": {r['reason']}" if r["reason"] else "")
    print(f"  verdict: {verdict}")


#: targets per group when --targets is not given
DEFAULT_TARGETS = 2000


def _settle_targets(args: argparse.Namespace, n_train: int, n_test: int) -> None:
    """Set ``args.targets``: refuse more than the data holds; clamp the default with a note."""
    if args.attack == "attribute":
        # non-member targets come from the half of the test split the imputation model is not fitted on
        most, why = min(n_train, n_test - n_test // 2), f"half of the {n_test:,}-row test split"
    else:
        most, why = min(n_train, n_test), f"the smaller of the training ({n_train:,}) and test ({n_test:,}) splits"
    if args.targets is None:
        args.targets = min(DEFAULT_TARGETS, most)
        if args.targets < DEFAULT_TARGETS and not args.json:
            note("audit", f"using {args.targets:,} targets per group (the data holds no more: {why})")
    elif args.targets > most:
        raise ValueError(f"--targets must be <= {most:,} for this run's data ({why}), got {args.targets:,}")


def _is_text_run(run_dir: Path) -> bool:
    """Whether run.json marks a text run (read without torch; a broken file is load_run's to report)."""
    try:
        return json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get("task") == "text"
    except (OSError, ValueError, AttributeError):
        return False


def _audit_text(args: argparse.Namespace, run_dir: Path) -> int:
    """``--attack exposure|extraction|span`` on a text run: the report to RUN_DIR/audit/text_<attack>.{json,md}."""
    import torch

    from featuredp.cli._text_args import read_names
    from featuredp.experiments.text_runs import audit_text_run, text_audit_lines

    attack = args.attack or "span"  # exposure needs canaries planted at training time (train --canaries)
    if attack not in TEXT_ATTACKS:
        raise ValueError(f"--attack {attack} is for tabular runs; a text run takes --attack {'|'.join(TEXT_ATTACKS)}")
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    names = read_names(args.names_file) if args.names_file else None
    payload = audit_text_run(run_dir, attack, out=args.out, names=names)
    if args.json:
        print(json.dumps(_plain(payload)))
        return 0
    print("\n".join(text_audit_lines(payload)))
    print(f"reports: {', '.join(payload['report_files'])}")
    return 0
