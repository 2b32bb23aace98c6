"""``featuredp demo``: non-private vs DP-SGD vs FDP on bundled Adult (sex and race private), one ε."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from featuredp.cli._device import add_device_argument, check_device
from featuredp.methods import get_method

#: the comparison the demo shows: no privacy, record-level DP, feature DP
DEMO_METHODS = ("nonprivate", "dpsgd", "fdp")


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo",
        help="compare non-private training, DP-SGD and feature-DP SGD on bundled Adult at one epsilon",
        description="Trains three models on UCI Adult (bundled) with sex and race private and the income label "
        "public, at the same (epsilon, delta), and prints test accuracy side by side. Takes 1-3 minutes.",
    )
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget for dpsgd and fdp (default 1)")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--private", default="sex,race", help="comma-separated private columns (default sex,race)")
    p.add_argument("--public-seed", type=int, default=0,
                   help="seed of the public randomness: model initialisation and public batches (default 0); the "
                   "private randomness (noise, Poisson batches) is always fresh OS entropy")
    p.add_argument("--epochs", type=float, default=None, help=argparse.SUPPRESS)  # tests: shorten every method
    add_device_argument(p)
    p.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train the three methods and print the comparison."""
    import torch

    from featuredp.data import load_dataset
    from featuredp.experiments.train_one import train_one

    check_device(args.device)  # an absent device: exit 2 with one line, before loading anything
    torch.set_num_threads(1)  # small models: one intra-op thread is faster and steadier on shared CPUs
    private = [c.strip() for c in args.private.split(",") if c.strip()]
    data = load_dataset("adult")
    rows = []
    for method in DEMO_METHODS:
        if not (args.quiet or args.json):
            print(f"training {method} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        s = train_one(dataset="adult", data=data, private=private, method=method,
                      epsilon=args.epsilon if get_method(method).private else None, delta=args.delta,
                      public_seed=args.public_seed, progress=not (args.quiet or args.json), device=args.device,
                      epochs=args.epochs).summary  # fmt: skip
        s["seconds"] = time.perf_counter() - t0
        rows.append(s)
    if args.json:
        print(json.dumps({"epsilon": args.epsilon, "delta": args.delta, "private_columns": private, "rows": rows}))
        return 0
    print(f"\nUCI Adult (train {data[0].n:,}, test {data[1].n:,}); private: {', '.join(private)}; "
          f"label income public; target epsilon {args.epsilon:g}, delta {args.delta:g}\n")
    print(f"{'method':<12} {'test acc':>8} {'epsilon':>8} {'sigma':>7} {'steps':>6} {'time s':>7}  guarantee")
    for s in rows:
        eps = "inf" if s["epsilon"] is None else f"{s['epsilon']:.3f}"
        sig = "-" if s["noise_multiplier"] is None else f"{s['noise_multiplier']:.3f}"
        kind = _guarantee_kind(s)
        print(f"{s['method']:<12} {s['accuracy']:>8.4f} {eps:>8} {sig:>7} {s['steps']:>6} {s['seconds']:>7.1f}  {kind}")
    acc = {s["method"]: s["accuracy"] for s in rows}
    print(f"\nFDP is {100 * (acc['nonprivate'] - acc['fdp']):.2f} accuracy points below non-private; DP-SGD is "
          f"{100 * (acc['nonprivate'] - acc['dpsgd']):.2f} points below.")
    return 0


def _guarantee_kind(summary: dict[str, Any]) -> str:
    """What a row's guarantee protects, from its method's record."""
    record = get_method(summary["method"])
    if not record.private:
        return "none"
    if not record.needs_feature_map:
        return "DP (whole records)"
    return f"feature DP ({', '.join(summary['private_columns'])})"
