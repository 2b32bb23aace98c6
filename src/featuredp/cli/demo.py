"""``featuredp demo``: the main job. FDP vs DP-SGD vs non-private on bundled Adult at a tight and a loose ε,
then an attribute-inference audit of the FDP model, with a table and a PNG.

Adult is easy: at ε = 1 every method reaches the non-private ceiling, so the demo also trains at a tight
ε = 0.1, where DP-SGD loses about 5 points and FDP (which protects sex and race, not whole records) loses
almost nothing. The audit then asks whether the FDP model gives away a private column: the best attribute-
inference attack against the imputation baseline (what the public columns and the label already tell) and
the bound of Theorem 4. About 30 s on 2 CPU cores (every model trains on one thread).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from featuredp.cli._device import add_device_argument, check_device
from featuredp.cli._flags import number_list, whole_number
from featuredp.methods import get_method

#: the comparison the demo shows: no privacy, record-level DP, feature DP
DEMO_METHODS = ("nonprivate", "dpsgd", "fdp")
#: the default targets: a tight one (where FDP wins clearly on Adult) and a loose one (every method at the ceiling)
DEMO_EPSILONS = (0.1, 1.0)
#: where the demo writes results.md, results.json and demo.png by default
DEFAULT_OUT = "featuredp-demo"



def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo",
        help="the main job: non-private vs DP-SGD vs FDP on bundled Adult at a tight and a loose epsilon, "
        "an attribute-inference audit of the FDP model, a table and a PNG (about 30 s)",
        description="Trains non-private SGD, DP-SGD and FDP-SGD on UCI Adult (bundled) with sex and race private and "
        "the income label public, at each target epsilon (default 0.1 and 1), prints test accuracy side by side, "
        "then audits the FDP model at the tightest epsilon: can an attacker infer a private column better than the "
        "imputation baseline, and is the success within Theorem 4's bound? Writes results.md, results.json and "
        f"demo.png to --out (default ./{DEFAULT_OUT}, replaced on every run). About 30 s on 2 CPU cores.",
    )
    p.add_argument("--epsilons", type=number_list, default=None,
                   help="comma-separated targets for dpsgd and fdp (default 0.1,1: a tight and a loose one)")
    p.add_argument("--epsilon", type=float, default=None, help="a single target (alias of --epsilons E)")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--private", default="sex,race", help="comma-separated private columns (default sex,race)")
    p.add_argument("--audit-attribute", default=None,
                   help="the private column the audit tries to infer (default: the first of --private)")
    p.add_argument("--audit-targets", type=whole_number, default=2000,
                   help="members and non-members the audit attacks (default 2000; at most 8141 on Adult)")
    p.add_argument("--no-audit", action="store_true", help="train and compare only")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"folder for results.md, results.json and demo.png (default ./{DEFAULT_OUT})")
    p.add_argument("--public-seed", type=int, default=0,
                   help="seed of the public randomness: model initialisation and public batches (default 0); the "
                   "private randomness (noise, Poisson batches) is always fresh OS entropy")
    p.add_argument("--epochs", type=float, default=None, help=argparse.SUPPRESS)  # tests: shorten every method
    add_device_argument(p)
    p.add_argument("--json", action="store_true", help="print the rows and the audit as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> tuple[list[float], list[str], str | None, Path]:
    """Every flag, before any data is read: (target epsilons, private columns, audited column, out folder)."""
    from featuredp._validate import check_int, check_open_unit
    from featuredp.cli._flags import check_epochs, check_epsilon, check_out_dir

    if args.epsilon is not None and args.epsilons is not None:
        raise ValueError(f"give --epsilons or --epsilon, not both (got {args.epsilons} and {args.epsilon})")
    flag = "--epsilon" if args.epsilon is not None else "--epsilons"
    given = [args.epsilon] if args.epsilon is not None else args.epsilons or list(DEMO_EPSILONS)
    epsilons = sorted({check_epsilon(flag, e) for e in given})
    check_open_unit("--delta", args.delta)
    check_epochs("--epochs", args.epochs)
    private = [c.strip() for c in args.private.split(",") if c.strip()]
    if not private:
        raise ValueError(f"--private must name at least one column, got {args.private!r}")
    attribute = None
    if not args.no_audit:
        attribute = args.audit_attribute or private[0]
        if attribute not in private:
            raise ValueError(f"--audit-attribute must be one of the --private columns {private} (Theorem 4 bounds "
                             f"only private ones), got {attribute!r}")
        check_int("--audit-targets", args.audit_targets, minimum=10)
    out = check_out_dir("--out", args.out)
    assert out is not None
    try:  # an unwritable --out: refused now, not after the training
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".featuredp-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {str(out)!r} is not a writable folder ({exc.strerror or exc})") from None
    return epsilons, private, attribute, out


def run(args: argparse.Namespace) -> int:
    """Train the methods at each ε, audit the FDP model, print and write the comparison (errors name flags)."""
    from featuredp.cli._flags import TRAIN_FLAGS, flag_names

    with flag_names(TRAIN_FLAGS):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    check_device(args.device)  # an absent device: exit 2 with one line, before loading anything
    epsilons, private, attribute, out = _check(args)

    import torch

    from featuredp.data import load_dataset
    from featuredp.experiments.train_one import train_one

    torch.set_num_threads(1)  # small models: one intra-op thread is faster and steadier on shared CPUs
    started = time.perf_counter()
    talk = not (args.quiet or args.json)
    data = load_dataset("adult")
    if attribute is not None:
        limit = min(data[0].n, data[1].n - data[1].n // 2)  # non-members: the half of test the imputer does not see
        if args.audit_targets > limit:
            raise ValueError(f"--audit-targets must be <= {limit:,} (half of Adult's test split), "
                             f"got {args.audit_targets:,}")
    plan = [("nonprivate", None)] + [(m, e) for e in epsilons for m in DEMO_METHODS if get_method(m).private]
    rows, models = [], {}
    for i, (method, eps) in enumerate(plan, 1):
        if talk:
            at = "" if eps is None else f" at epsilon {eps:g}"
            print(f"[{i}/{len(plan)}] training {method}{at} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        trained = train_one(dataset="adult", data=data, private=private, method=method, epsilon=eps,
                            delta=args.delta, public_seed=args.public_seed, progress=talk, device=args.device,
                            epochs=args.epochs)  # fmt: skip
        row = {**trained.summary, "target_epsilon": eps, "seconds": time.perf_counter() - t0}
        rows.append(row)
        models[(method, eps)] = trained
    audit = None
    if attribute is not None:
        if talk:
            print(f"auditing the fdp model at epsilon {epsilons[0]:g}: can {attribute} be inferred? ...",
                  file=sys.stderr, flush=True)
        audit = _audit(models[("fdp", epsilons[0])], data, attribute, private, args.delta, args.audit_targets)
    seconds = time.perf_counter() - started
    payload = {"epsilon": epsilons[0], "target_epsilons": epsilons, "delta": args.delta, "private_columns": private,
               "rows": rows, "audit": audit, "seconds": seconds, "out": str(out)}  # fmt: skip
    text = _report(rows, audit, data, private, epsilons, args.delta)
    files = _write(out, payload, text, rows, audit, epsilons)
    payload["files"] = files
    if args.json:
        print(json.dumps(payload, default=str))
        return 0
    print(text)
    print(f"wrote {', '.join(files)} ({seconds:.0f} s in all)")
    return 0


def _audit(trained: Any, data: tuple[Any, Any], attribute: str, private: list[str], delta: float, targets: int
           ) -> dict[str, Any]:
    """The attribute-inference audit of one model (featuredp audit --attack attribute), summarised."""
    from featuredp.attacks.tabular import attribute_audit

    train, test = data
    result = trained.result
    res = attribute_audit(trained.model, train, test, attribute, private_columns=private, label_public=True,
                          epsilon=result.epsilon, delta=delta, plan=result.plan, steps=result.steps,
                          n_targets=targets)  # fmt: skip
    members = res["groups"]["members"]
    baseline = next(a for a in members["attacks"] if a["attack"] == "imputation")
    best = next(a for a in members["attacks"] if a["attack"] == members["best_attack"])
    return {
        "attribute": attribute,
        "method": "fdp",
        "epsilon": result.epsilon,
        "success": float(res["accuracy"]),  # the best attack's accuracy on training records
        "success_ci": [float(v) for v in best["accuracy_ci"]],
        "best_attack": members["best_attack"],
        "baseline": float(baseline["accuracy"]),  # the imputation model: Ψ(x) and the label only
        "advantage": float(res["advantage"]),
        "bound": float(res["bound"]),  # Theorem 4: the most any attack may reach at this (ε, δ) run
        "ball": float(res["ball"]),
        # None when the audit cannot tell (bound >= 0.95, or the success interval contains it)
        "within_bound": members["within_bound"],
        "bound_verdict": res["bound_verdict"],
        "targets": int(res["n_targets"]),
        "verdict": res["verdict"],
    }


def _report(rows: list[dict[str, Any]], audit: dict[str, Any] | None, data: tuple[Any, Any], private: list[str],
            epsilons: list[float], delta: float) -> str:
    """The table and the story, as printed and as results.md."""
    lines = [f"UCI Adult (train {data[0].n:,}, test {data[1].n:,}); private: {', '.join(private)}; label income "
             f"public; target epsilons {', '.join(f'{e:g}' for e in epsilons)}, delta {delta:g}", "",
             f"{'method':<12} {'target':>6} {'test acc':>8} {'epsilon':>8} {'sigma':>7} {'steps':>6} {'time s':>7}"
             "  guarantee"]  # fmt: skip
    for s in rows:
        target = "-" if s["target_epsilon"] is None else f"{s['target_epsilon']:g}"
        eps = "inf" if s["epsilon"] is None else f"{s['epsilon']:.3f}"
        sig = "-" if s["noise_multiplier"] is None else f"{s['noise_multiplier']:.3f}"
        lines.append(f"{s['method']:<12} {target:>6} {s['accuracy']:>8.4f} {eps:>8} {sig:>7} {s['steps']:>6} "
                     f"{s['seconds']:>7.1f}  {_guarantee_kind(s)}")
    acc = {(s["method"], s["target_epsilon"]): s["accuracy"] for s in rows}
    top = acc[("nonprivate", None)]
    lines.append("")
    for e in epsilons:
        fdp, dp = acc[("fdp", e)], acc[("dpsgd", e)]
        lines.append(f"At epsilon {e:g}: FDP {100 * fdp:.2f}%, DP-SGD {100 * dp:.2f}% (FDP {100 * (fdp - dp):+.2f} "
                     f"points), non-private {100 * top:.2f}%.")
    lines.append(f"FDP protects only what is private ({', '.join(private)}), DP-SGD whole records: the tighter the "
                 "budget, the more that difference is worth.")
    if audit is not None:
        verdict = {True: "within", False: "ABOVE"}.get(audit["within_bound"], "cannot tell whether it is within")
        lines += ["", f"Audit of the FDP model at epsilon {audit['epsilon']:.2g}: inferring {audit['attribute']} of "
                  f"{audit['targets']:,} training records, the best attack ({audit['best_attack']}) is right "
                  f"{100 * audit['success']:.1f}% of the time, the imputation baseline (public columns and label "
                  f"only) {100 * audit['baseline']:.1f}% (advantage {100 * audit['advantage']:+.1f} points); "
                  f"Theorem 4 allows at most {100 * audit['bound']:.1f}%: {verdict} the bound."]  # fmt: skip
    return "\n".join(lines)


def _write(out: Path, payload: dict[str, Any], text: str, rows: list[dict[str, Any]], audit: dict[str, Any] | None,
           epsilons: list[float]) -> list[str]:
    """results.md, results.json and demo.png in ``out``, each written atomically; returns their paths."""
    from featuredp._io import atomic_write_json, atomic_write_text

    atomic_write_text(out / "results.md", "# featuredp demo\n\n```\n" + text + "\n```\n")
    atomic_write_json(out / "results.json", payload)
    _plot(out / "demo.png", rows, audit, epsilons)
    return [str(out / name) for name in ("results.md", "results.json", "demo.png")]


def _plot(path: Path, rows: list[dict[str, Any]], audit: dict[str, Any] | None, epsilons: list[float]) -> None:
    """Left: test accuracy per method at each target ε. Right: the audit's success, baseline and bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from featuredp._io import atomic_save_png

    fig, axes = plt.subplots(1, 2 if audit else 1, figsize=(11 if audit else 6, 4.2), squeeze=False)
    ax = axes[0][0]
    top = next(100 * r["accuracy"] for r in rows if r["method"] == "nonprivate")
    ax.axhline(top, color=get_method("nonprivate").color, linestyle="--", label=f"non-private ({top:.1f}%)")
    for method in DEMO_METHODS[1:]:
        record = get_method(method)
        pts = sorted((r["target_epsilon"], 100 * r["accuracy"]) for r in rows if r["method"] == method)
        ax.plot([e for e, _ in pts], [a for _, a in pts], marker=record.marker, color=record.color,
                label=record.label)
        for e, a in pts:
            ax.annotate(f"{a:.1f}", (e, a), textcoords="offset points", xytext=(4, -12 if method == "dpsgd" else 6),
                        fontsize=8, color=record.color)
    ax.set_xscale("log")
    ax.set_xticks(epsilons)
    ax.set_xticklabels([f"{e:g}" for e in epsilons])
    ax.set_xlabel("target ε (δ fixed)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Adult, sex and race private: accuracy vs ε")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if audit:
        ax = axes[0][1]
        names = ["imputation\nbaseline", f"best attack\n({audit['best_attack']})", "Theorem 4\nbound"]
        values = [100 * audit["baseline"], 100 * audit["success"], 100 * audit["bound"]]
        lo, hi = (100 * v for v in audit["success_ci"])
        bars = ax.bar(names, values, color=["#999999", "#d62728", "#1f77b4"])
        ax.errorbar([1], [values[1]], yerr=[[values[1] - lo], [hi - values[1]]], color="black", capsize=4)
        for bar, v, top_of in zip(bars, values, (values[0], hi, values[2])):
            ax.annotate(f"{v:.1f}%", (bar.get_x() + bar.get_width() / 2, top_of), ha="center", va="bottom",
                        fontsize=9, xytext=(0, 2), textcoords="offset points")
        ax.set_ylim(max(0.0, min(values) - 15), min(100.0, max(values) + 6))
        ax.set_ylabel(f"accuracy inferring {audit['attribute']} (%)")
        ax.set_title(f"Audit of the FDP model (ε = {audit['epsilon']:.2g}): {audit['attribute']}")
        ax.grid(True, axis="y", alpha=0.3)
    atomic_save_png(fig, path, dpi=110)


def _guarantee_kind(summary: dict[str, Any]) -> str:
    """What a row's guarantee protects, from its method's record."""
    record = get_method(summary["method"])
    if not record.private:
        return "none"
    if not record.needs_feature_map:
        return "DP (whole records)"
    return f"feature DP ({', '.join(summary['private_columns'])})"
