"""Audit Adult models (sex and race private): attribute inference vs Theorem 4, membership AUC,
and one-run canary audits. Writes results/audit/adult_audit.{json,md} (and the per-run reports
under each run directory).

    nice python benchmarks/audit_adult.py                # everything (~25 CPU-minutes on 1 core)
    nice python benchmarks/audit_adult.py --skip-canary  # attribute + membership only

Run directories (with private checkpoints) go to --runs-dir, not into results/.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path

import torch

from featuredp._io import atomic_write_json, atomic_write_text
from featuredp.attacks import report, tabular
from featuredp.experiments.runs import load_run
from featuredp.experiments.train_one import retrain_like, train_one
from featuredp.methods import get_method

# (name, method, target ε, options): the default Adult runs, then an overfitting regime on 2,000
# training records with a wide MLP, where membership is visible: a non-private positive control, and
# FDP vs DP-SGD at ε = 1 (FDP's free public pre-training and public gradient may memorise Ψ(x), y).
WIDE = {"hidden": [256, 256], "small": True}
CONFIGS: list[tuple[str, str, float | None, dict]] = [
    ("nonprivate", "nonprivate", None, {}),
    ("public", "public", None, {}),
    ("dpsgd_eps1", "dpsgd", 1.0, {}),
    ("dpsgd_eps4", "dpsgd", 4.0, {}),
    ("fdp_eps1", "fdp", 1.0, {}),
    ("fdp_eps4", "fdp", 4.0, {}),
    ("overfit_nonprivate", "nonprivate", None, {**WIDE, "epochs": 300}),
    ("overfit_fdp_eps1", "fdp", 1.0, {**WIDE, "epochs": 30, "batch_size": 256, "pretrain_epochs": 300}),
    ("overfit_dpsgd_eps1", "dpsgd", 1.0, {**WIDE, "epochs": 30, "batch_size": 256}),
]
SMALL_N = 2000


def _small_data(seed: int):
    import numpy as np

    from featuredp.data import load_dataset

    full, test = load_dataset("adult")
    return full.subset(np.random.default_rng(seed).choice(full.n, SMALL_N, replace=False)), test


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs-dir", default="/tmp/featuredp_audit_runs")
    ap.add_argument("--out", default="results/audit")
    ap.add_argument("--targets", type=int, default=2000)
    ap.add_argument("--canaries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-canary", action="store_true")
    ap.add_argument("--shadows", type=int, default=0, help="shadow models for LiRA/Shokri on the small (overfit) runs")
    ap.add_argument("--only", default=None, help="comma-separated run names to (re)do")
    ap.add_argument("--markdown-only", action="store_true", help="only rewrite adult_audit.md from the JSON")
    args = ap.parse_args()
    torch.set_num_threads(1)
    runs_dir, out = Path(args.runs_dir), Path(args.out)
    res_path = out / "adult_audit.json"
    results = json.loads(res_path.read_text()) if res_path.exists() else {"runs": {}, "canary": {}}
    only = set(args.only.split(",")) if args.only else None
    if args.markdown_only:
        atomic_write_text(out / "adult_audit.md", to_markdown(results))
        return
    for name, method, eps, opts in CONFIGS:
        if only and name not in only:
            continue
        t0 = time.time()
        rd = runs_dir / name
        opts = dict(opts)
        small = opts.pop("small", False)
        data = _small_data(args.seed) if small else None
        if not (rd / "run.json").exists():
            train_one(method=method, epsilon=eps, out=rd, progress=False, public_seed=args.seed, data=data, **opts)
        run = load_run(rd)
        train, test = data if data is not None else run.load_data()
        delta = float(run.plan.delta) if run.plan is not None and run.plan.delta else 0.0
        entry = {"method": method, "small": small, "epsilon": None if math.isinf(run.epsilon) else run.epsilon,
                 "accuracy": run.metrics.get("accuracy"), "attribute": {}}  # fmt: skip
        for attr in ("sex", "race"):
            r = tabular.attribute_audit(run.model, train, test, attr, private_columns=["sex", "race"],
                                        epsilon=0.0 if get_method(method).public_steps else run.epsilon, delta=delta,
                                        plan=run.plan, steps=run.info["result"].get("steps"),
                                        n_targets=args.targets, seed=args.seed)  # fmt: skip
            report.write_attribute_report(r, rd / "audit", title=name)
            mem, non = r["groups"]["members"], r["groups"]["non-members"]
            entry["attribute"][attr] = {
                "imputation_accuracy": mem["attacks"][0]["accuracy"],
                "best_attack": mem["best_attack"], "best_accuracy": mem["best_accuracy"],
                "advantage_members": mem["best_advantage"],
                "advantage_ci": next(a["advantage_ci"] for a in mem["attacks"] if a["attack"] == mem["best_attack"]),
                "advantage_nonmembers": non["best_advantage"],
                "ball_upper": r["ball"], "bound": r["bound"], "within_bound": mem["within_bound"],
                "verdict": r["verdict"],
            }  # fmt: skip
        m = tabular.membership_audit(run.model, train, test, n_targets=args.targets, seed=args.seed, progress=False)
        m["verdict"] = tabular.membership_verdict(m, method, run.epsilon, delta)
        report.write_membership_report(m, rd / "audit", title=name)
        entry["membership"] = {"auc": m["auc"], "advantage": m["advantage"], "tpr_at_fpr": m["tpr_at_fpr"],
                               "verdict": m["verdict"]}  # fmt: skip
        if args.shadows and small:
            counter = iter(range(10**6))
            ms = tabular.membership_audit(
                run.model, train, test, n_targets=args.targets, seed=args.seed, progress=False, shadows=args.shadows,
                shadow_train_size=SMALL_N,
                train_fn=lambda ds: retrain_like(run, ds, seed=args.seed + 1000 + next(counter))[0],  # noqa: B023
            )
            ms["verdict"] = tabular.membership_verdict(ms, method, run.epsilon, delta)
            report.write_membership_report(ms, rd / "audit", title=f"{name}, {args.shadows} shadows")
            entry["membership_shadows"] = {
                k: {"auc": v["auc"], "advantage": v["advantage"], "tpr_at_fpr": v["tpr_at_fpr"]}
                for k, v in ms["metrics"].items()
            }
        entry["seconds"] = time.time() - t0
        results["runs"][name] = entry
        atomic_write_json(res_path, results)
        print(name, json.dumps({k: entry[k] for k in ("accuracy", "epsilon")}), flush=True)
    if not args.skip_canary:
        for name, kind in (("fdp_eps4", "feature"), ("nonprivate", "feature"), ("fdp_eps4", "mislabelled"),
                           ("dpsgd_eps4", "mislabelled"), ("fdp_eps4", "gradient"), ("fdp_eps1", "feature"),
                           ("overfit_nonprivate", "feature"), ("overfit_nonprivate", "mislabelled"),
                           ("overfit_fdp_eps1", "feature"), ("overfit_fdp_eps1", "mislabelled"),
                           ("overfit_dpsgd_eps1", "mislabelled")):
            key = f"{name}/{kind}"
            if only and key not in only and name not in only:
                continue
            t0 = time.time()
            run = load_run(runs_dir / name)
            data = _small_data(args.seed) if name.startswith("overfit") else None  # audit models like the run
            c = tabular.canary_audit(run, kind=kind, canaries=args.canaries, seed=args.seed, progress=False,
                                     data=data, train_fn=functools.partial(retrain_like, run))  # fmt: skip
            report.write_canary_report(c, runs_dir / name / "audit", title=name)
            results["canary"][key] = {k: c[k] for k in ("kind", "method", "epsilon_lower_bound", "epsilon_claimed",
                                                        "claim_relation", "ceiling", "verdict")}  # fmt: skip
            results["canary"][key]["r_v"] = [c["one_run"]["r"], c["one_run"]["v"]]
            results["canary"][key]["seconds"] = time.time() - t0
            atomic_write_json(res_path, results)
            print(key, c["epsilon_lower_bound"], c["epsilon_claimed"], flush=True)
    atomic_write_text(out / "adult_audit.md", to_markdown(results))


def _f(v, nd=3):
    return "∞" if v is None else f"{v:.{nd}f}"


def to_markdown(results: dict) -> str:
    """The tables of docs/auditing.md."""
    rows = []
    for name, e in results["runs"].items():
        for attr, a in e["attribute"].items():
            rows.append([name, _f(e["epsilon"], 2), _f(e["accuracy"]), attr, _f(a["imputation_accuracy"]),
                         f"{a['best_attack']} {_f(a['best_accuracy'])}",
                         f"{100 * a['advantage_members']:+.1f} [{100 * a['advantage_ci'][0]:+.1f}, "
                         f"{100 * a['advantage_ci'][1]:+.1f}]",
                         f"{100 * a['advantage_nonmembers']:+.1f}", _f(a["ball_upper"]), _f(a["bound"]),
                         "yes" if a["within_bound"] else "NO"])  # fmt: skip
    t1 = report.markdown_table(
        ["run", "ε", "test acc.", "attribute", "imputation acc.", "best attack acc.", "adv. members (pts, 95% CI)",
         "adv. non-members", "Ball (upper)", "Thm 4 bound", "within"], rows)  # fmt: skip
    rows2 = [[n, _f(e["epsilon"], 2), _f(e["membership"]["auc"]), _f(e["membership"]["advantage"]),
              _f(e["membership"]["tpr_at_fpr"]["0.01"]), _f(e["membership"]["tpr_at_fpr"]["0.001"])]
             for n, e in results["runs"].items()]  # fmt: skip
    t2 = report.markdown_table(["run", "ε", "AUC", "advantage", "TPR@1%FPR", "TPR@0.1%FPR"], rows2)
    rows2b = [[n, _f(e["epsilon"], 2), a, _f(m["auc"]), _f(m["advantage"]), _f(m["tpr_at_fpr"]["0.01"]),
               _f(m["tpr_at_fpr"]["0.001"])]
              for n, e in results["runs"].items() for a, m in e.get("membership_shadows", {}).items()]  # fmt: skip
    if rows2b:
        t2 += "\n\nWith shadow models (the small-data runs):\n\n" + report.markdown_table(
            ["run", "ε", "attack", "AUC", "advantage", "TPR@1%FPR", "TPR@0.1%FPR"], rows2b)  # fmt: skip
    rows3 = [[k, _f(c["epsilon_lower_bound"]), _f(c["epsilon_claimed"]), c["claim_relation"], _f(c["ceiling"], 2),
              f"{c['r_v'][1]}/{c['r_v'][0]}" if c["epsilon_lower_bound"] > 0 else "—"]
             for k, c in results.get("canary", {}).items()]  # fmt: skip
    t3 = report.markdown_table(["run / canaries", "ε lower bound", "claimed ε", "claim", "ceiling", "correct/guesses"],
                               rows3)  # fmt: skip
    return "\n\n".join(["## Attribute inference", t1, "## Membership inference (loss threshold)", t2,
                        "## One-run canary audits", t3]) + "\n"  # fmt: skip


if __name__ == "__main__":
    main()
