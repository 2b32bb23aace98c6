"""``featuredp benchmark``: samples/s of full training steps, interleaved in rounds, and ratios to non-private."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from featuredp.cli._device import add_device_argument, check_device
from featuredp.methods import METHOD_NAMES

#: what is timed by default: the non-private reference, DP-SGD and FDP (any registered method can be asked for)
DEFAULT_METHODS = ("nonprivate", "dpsgd", "fdp")


def _methods(text: str) -> list[str]:
    items = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in items if m not in METHOD_NAMES]
    if not items or bad:
        raise argparse.ArgumentTypeError(f"methods must be a subset of {','.join(METHOD_NAMES)}, got {text!r}")
    return list(dict.fromkeys(items))


def register(subparsers: Any) -> None:
    """Add the ``benchmark`` subcommand."""
    p = subparsers.add_parser(
        "benchmark",
        help="throughput of training steps (samples/s, ratio to non-private); default nonprivate, DP-SGD, FDP",
        description="Times the engine's full training step of each method, interleaved in rounds, on synthetic "
        "Purchase100-shaped data (600 binary inputs, 100 public; MLP 600-300-100; 100 classes). Ratios to "
        "non-private are computed within each round; medians over rounds are reported.",
    )
    p.add_argument("--model", choices=("mlp",), default="mlp", help="model (the paper's Purchase100 MLP)")
    p.add_argument("--batch-size", type=int, default=1024, help="expected private batch size m (default 1024)")
    p.add_argument("--methods", type=_methods, default=list(DEFAULT_METHODS),
                   help=f"comma-separated subset of {','.join(METHOD_NAMES)} (default {','.join(DEFAULT_METHODS)}; "
                   "nonprivate is always timed as reference)")
    p.add_argument("--strategy", choices=("ghost", "vmap"), default="ghost",
                   help="per-example gradient strategy of the private methods (default ghost)")
    p.add_argument("--loss-split", choices=("zero", "padding"), default="zero",
                   help="FDP's loss split: zero masking of the private columns (featuredp's Purchase preset; "
                   "default) or the paper's N(0,1) padding")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--min-time", type=float, default=0.5, help="seconds per method per round (default 0.5)")
    p.add_argument("--dataset-size", type=int, default=None,
                   help="records of synthetic data (default 16 x batch size, sampling rate 1/16 as in the paper)")
    p.add_argument("--secure-rng", action="store_true",
                   help="also time each private method with the secure noise mode (ChaCha20 CSPRNG, float64 noise) "
                   "and report its cost relative to the normal mode")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the synthetic data, model initialisation and public batches (the private "
                   "randomness is always fresh OS entropy)")
    add_device_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (samples/s and ratios)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print a table or JSON."""
    from featuredp._validate import check_int, check_positive

    check_device(args.device)  # an absent device: exit 2 with one line, before any work
    batch = check_int("batch_size", args.batch_size, minimum=1)
    threads = check_int("threads", args.threads, minimum=1)
    rounds = check_int("rounds", args.rounds, minimum=1)
    min_time = check_positive("min_time", args.min_time)
    n = check_int("dataset_size", args.dataset_size if args.dataset_size is not None else 16 * batch, minimum=batch)

    from featuredp.experiments import throughput

    throughput.set_threads(threads)
    data, public = throughput.synthetic_purchase(n, seed=args.seed)
    methods = ["nonprivate"] + [m for m in args.methods if m != "nonprivate"]
    variants = [(m, False) for m in methods]
    if args.secure_rng:
        variants += [(m, True) for m in methods[1:]]
    runners = [
        throughput.engine_runner(
            m, data, public, batch_size=batch, strategy=args.strategy, seed=args.seed,
            name=f"{m}_secure" if secure else m, loss_split=args.loss_split, secure_rng=secure, device=args.device,
        )
        for m, secure in variants
    ]
    res = throughput.interleaved(runners, rounds=rounds, min_time=min_time, progress=not args.json)
    names = [r.name for r in runners]
    out: dict[str, Any] = {name: res.median(name) for name in names}
    for name in names[1:]:
        out[f"ratio_{name}"] = res.median_ratio(name)
    if args.secure_rng:
        for m in methods[1:]:
            out[f"secure_vs_normal_{m}"] = res.median_ratio_to(f"{m}_secure", m)
    out.update({
        "batch_size": batch, "threads": threads, "rounds": rounds, "strategy": args.strategy, "model": args.model,
        "loss_split": args.loss_split, "dataset_size": n, "spread_nonprivate": res.spread("nonprivate"),
        "secure_rng": args.secure_rng, "device": args.device or "cpu",
    })
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return 0
    print(f"MLP 600-300-100, batch {batch}, {threads} thread(s), strategy {args.strategy}, "
          f"FDP split {args.loss_split}, {rounds} rounds (medians; ratios within rounds)")
    print(f"{'method':<16}{'samples/s':>12}{'ratio':>8}{'spread':>9}")
    for name in names:
        ratio = 1.0 if name == "nonprivate" else res.median_ratio(name)
        print(f"{name:<16}{res.median(name):>12,.0f}{ratio:>8.3f}{res.spread(name):>8.0%}")
    for m in methods[1:] if args.secure_rng else []:
        print(f"secure mode costs {m}: {out[f'secure_vs_normal_{m}']:.3f} x the normal mode's samples/s")
    print("spread = (max - min) / median of samples/s over rounds (machine noise)")
    return 0
