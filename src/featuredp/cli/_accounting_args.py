"""Arguments and output shared by ``featuredp account`` and ``featuredp calibrate``."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from featuredp.cli._flags import pld_time_note, whole_number


def add_rate_arguments(parser: argparse.ArgumentParser) -> None:
    """--sampling-rate, or --dataset-size with --batch-size (p = m/N)."""
    parser.add_argument("--sampling-rate", type=float, metavar="P", help="Poisson sampling rate p in (0, 1]")
    parser.add_argument(
        "--dataset-size", type=whole_number, metavar="N",
        help="number of records N; with --batch-size gives p = m/N (also checks delta < 1/N)",
    )
    parser.add_argument("--batch-size", type=whole_number, metavar="M",
                        help="expected batch size m (needs --dataset-size)")


def add_length_arguments(parser: argparse.ArgumentParser, *, required: bool) -> argparse._MutuallyExclusiveGroup:
    """--steps N or --epochs E (steps = ceil(E / p))."""
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--steps", type=whole_number, metavar="T",
                       help="number of training steps (with --accountant pld and sampling rate < 1: at most 1e7)")
    group.add_argument("--epochs", type=float, metavar="E", help="epochs instead of steps: steps = ceil(E / p)")
    return group


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--delta, --relation, --accountant, --json."""
    parser.add_argument("--delta", type=float, required=True, help="target delta in (0, 1), well below 1/N")
    parser.add_argument(
        "--relation", choices=("add-remove", "replace-one"), default="add-remove",
        help="neighbouring datasets: add/remove one record (default) or replace one record",
    )
    parser.add_argument(
        "--accountant", choices=("pld", "rdp"), default="pld",
        help="pld: tight privacy-loss distributions (default); rdp: Renyi DP (looser, for comparison)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def resolve_rate(args: argparse.Namespace) -> tuple[float, int | None]:
    """(sampling rate, dataset size or None), validated; errors name the flag and value."""
    from featuredp._validate import check_int, check_sampling_rate

    n = None
    if args.dataset_size is not None:
        n = check_int("--dataset-size", args.dataset_size, minimum=1)
    if args.batch_size is not None:
        if n is None:
            raise ValueError(f"--batch-size={args.batch_size} needs --dataset-size (p = batch size / dataset size)")
        if args.sampling_rate is not None:
            raise ValueError("give either --sampling-rate or --dataset-size with --batch-size, not both")
        m = check_int("--batch-size", args.batch_size, minimum=1)
        if m > n:
            raise ValueError(f"--batch-size must be <= --dataset-size={n}, got {m}")
        return m / n, n
    if args.sampling_rate is None:
        raise ValueError("give --sampling-rate P, or --dataset-size N with --batch-size M")
    return check_sampling_rate("--sampling-rate", args.sampling_rate), n


def resolve_steps(args: argparse.Namespace, p: float) -> tuple[int, float]:
    """(steps, epochs) from --steps or --epochs."""
    from featuredp._validate import check_int, check_positive

    if args.epochs is not None:
        epochs = check_positive("--epochs", args.epochs)
        # a hair of slack so that e.g. 3 epochs at p = 0.1 is 30 steps, not 31 from float rounding
        steps = max(1, math.ceil(epochs / p - 1e-9))
        return steps, epochs
    steps = check_int("--steps", args.steps, minimum=1)
    return steps, steps * p


def check_pld_steps(args: argparse.Namespace, steps: int, p: float, command: str, *, evaluations: int = 1) -> None:
    """Refuse more steps than the PLD accountant takes (naming --steps or --epochs); say when it will be slow."""
    from featuredp.accounting.accountant import MAX_PLD_STEPS

    if args.accountant != "pld" or p >= 1:
        return  # a full batch is accounted in closed form; RDP costs the same for any number of steps
    if steps > MAX_PLD_STEPS:
        given = f"--epochs must be <= {MAX_PLD_STEPS * p:.6g} here (= {MAX_PLD_STEPS:,} steps at sampling rate " \
                f"{p:g})" if args.epochs is not None else f"--steps must be <= {MAX_PLD_STEPS:,}"
        value = args.epochs if args.epochs is not None else steps
        raise ValueError(f"{given} with --accountant pld, whose cost grows with the steps (10 million take about "
                         f"2 min); --accountant rdp has no limit; got {value!r}")
    pld_time_note(command, steps, evaluations=evaluations)


def check_delta_arg(delta: float, n: int | None) -> float:
    """delta in (0, 1); PrivacyRiskWarning when delta >= 1/n."""
    from featuredp._validate import check_delta

    return check_delta(delta, n, name="--delta")


def emit(result: dict[str, Any], *, as_json: bool, title: str, rows: list[tuple[str, str]]) -> None:
    """Print the result as one JSON object or as a two-column table."""
    if as_json:
        print(json.dumps(result, sort_keys=False))
        return
    width = max(len(k) for k, _ in rows)
    print(title)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


def fmt(x: float) -> str:
    """A compact number for the table."""
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.6g}"
