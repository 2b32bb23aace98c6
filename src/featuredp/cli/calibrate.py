"""``featuredp calibrate``: the noise multiplier (or the number of steps) for a target ε."""

from __future__ import annotations

import argparse

from featuredp.cli._accounting_args import (
    add_common_arguments,
    add_length_arguments,
    add_rate_arguments,
    check_delta_arg,
    emit,
    fmt,
    resolve_rate,
    resolve_steps,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` subcommand."""
    parser = subparsers.add_parser(
        "calibrate",
        help="noise multiplier (or steps) for a target epsilon",
        description=(
            "Find the noise multiplier that meets a target (epsilon, delta) for the given sampling rate "
            "and steps/epochs, never exceeding the target and within 1%% of it. Give --noise-multiplier "
            "instead of --steps/--epochs to solve for the largest number of steps instead. Example: "
            "featuredp calibrate --epsilon 8 --delta 1e-5 --sampling-rate 0.0625 --epochs 20"
        ),
    )
    parser.add_argument("--epsilon", type=float, required=True, help="target epsilon > 0")
    add_rate_arguments(parser)
    group = add_length_arguments(parser, required=True)
    group.add_argument(
        "--noise-multiplier", type=float, metavar="SIGMA",
        help="solve for steps instead: the largest number of steps with this noise multiplier",
    )
    add_common_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate everything first, then calibrate."""
    from featuredp._validate import check_positive

    target = check_positive("--epsilon", args.epsilon)
    p, n = resolve_rate(args)
    delta = check_delta_arg(args.delta, n)

    from featuredp.accounting import calibrate_noise_multiplier, calibrate_steps, epsilon_for

    if args.noise_multiplier is not None:
        sigma = check_positive("--noise-multiplier", args.noise_multiplier)
        steps = calibrate_steps(target, delta, p, sigma, relation=args.relation, accountant=args.accountant)
        epochs = steps * p
        solved = "steps"
    else:
        steps, epochs = resolve_steps(args, p)
        sigma = calibrate_noise_multiplier(target, delta, p, steps, relation=args.relation, accountant=args.accountant)
        solved = "noise_multiplier"
    eps = epsilon_for(sigma, p, steps, delta, relation=args.relation, accountant=args.accountant)
    result = {
        "epsilon": eps,
        "target_epsilon": target,
        "delta": delta,
        "noise_multiplier": sigma,
        "sampling_rate": p,
        "steps": steps,
        "epochs": epochs,
        "relation": args.relation,
        "accountant": args.accountant,
        "solved_for": solved,
    }
    if n is not None:
        result["dataset_size"] = n
    if args.batch_size is not None:
        result["batch_size"] = args.batch_size
    rows = [
        ("noise multiplier", fmt(sigma) + ("  (solved)" if solved == "noise_multiplier" else "")),
        ("steps", str(steps) + ("  (solved)" if solved == "steps" else "")),
        ("epochs", fmt(epochs)),
        ("sampling rate", fmt(p)),
        ("epsilon achieved", fmt(eps)),
        ("epsilon target", fmt(target)),
        ("delta", fmt(delta)),
        ("relation", args.relation),
        ("accountant", args.accountant),
    ]
    emit(result, as_json=args.json, title="Calibrated setting", rows=rows)
    return 0
