"""``featuredp calibrate``: the noise multiplier (or the number of steps) for a target ε."""

from __future__ import annotations

import argparse

from featuredp.cli._accounting_args import (
    add_common_arguments,
    add_length_arguments,
    add_rate_arguments,
    check_delta_arg,
    check_pld_steps,
    emit,
    fmt,
    resolve_rate,
    resolve_steps,
)
from featuredp.cli._flags import ACCOUNTING_FLAGS, MAX_EPSILON, check_epsilon, flag_names, note, pld_time_note


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
    parser.add_argument("--epsilon", type=float, required=True, help=f"target epsilon in (0, {MAX_EPSILON:g}]")
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

    target = check_epsilon("--epsilon", args.epsilon)
    p, n = resolve_rate(args)
    delta = check_delta_arg(args.delta, n)
    sigma = None if args.noise_multiplier is None else check_positive("--noise-multiplier", args.noise_multiplier)
    if sigma is None:
        steps, epochs = resolve_steps(args, p)
        check_pld_steps(args, steps, p, "calibrate", evaluations=4)  # a calibration is a few fine evaluations

    from featuredp.accounting import calibrate_noise_multiplier, calibrate_steps, epsilon_for
    from featuredp.accounting.accountant import MAX_PLD_STEPS

    with flag_names(ACCOUNTING_FLAGS):
        if sigma is not None:
            if args.accountant == "pld" and p < 1:
                # RDP (instant, a lower answer) says whether the PLD search will reach millions of steps
                rough = calibrate_steps(target, delta, p, sigma, relation="add-remove", accountant="rdp",
                                        max_steps=10**7) if args.relation == "add-remove" else 0
                if 10**6 <= rough < 10**7:
                    note("calibrate", f"the answer is above {rough:,} steps; PLD accounting of that many steps takes "
                                      "a few minutes (--accountant rdp answers at once, a looser bound)")
            steps = calibrate_steps(target, delta, p, sigma, relation=args.relation, accountant=args.accountant)
            epochs = steps * p
            if args.accountant == "pld" and p < 1 and steps >= MAX_PLD_STEPS:
                note("calibrate", f"{steps:,} steps is the PLD accountant's limit, not the largest number the target "
                                  "allows: --accountant rdp solves without a limit")
            if args.accountant == "pld" and p < 1:
                pld_time_note("calibrate", steps)  # the achieved epsilon below is one more evaluation
            solved = "steps"
        else:
            sigma = calibrate_noise_multiplier(target, delta, p, steps, relation=args.relation,
                                               accountant=args.accountant)
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
