"""``featuredp account``: the ε of given DP-SGD / Algorithm 1 settings."""

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
from featuredp.cli._flags import ACCOUNTING_FLAGS, flag_names


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``account`` subcommand."""
    parser = subparsers.add_parser(
        "account",
        help="epsilon of given noise / sampling rate / steps",
        description=(
            "Compute the (epsilon, delta) guarantee of T steps of DP-SGD or Algorithm 1 "
            "(Poisson-subsampled Gaussian). Example: featuredp account --noise-multiplier 1.0 "
            "--sampling-rate 0.0625 --steps 1000 --delta 1e-5"
        ),
    )
    parser.add_argument("--noise-multiplier", type=float, required=True, metavar="SIGMA",
                        help="noise std / clipping norm")
    add_rate_arguments(parser)
    add_length_arguments(parser, required=True)
    add_common_arguments(parser)
    parser.add_argument("--tradeoff-plot", metavar="PNG",
                        help="also draw the f-DP trade-off curve next to the (epsilon, delta) line into this PNG")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate everything first, then account (and plot)."""
    from featuredp._validate import check_positive

    sigma = check_positive("--noise-multiplier", args.noise_multiplier)
    p, n = resolve_rate(args)
    steps, epochs = resolve_steps(args, p)
    delta = check_delta_arg(args.delta, n)
    if args.tradeoff_plot is not None and not str(args.tradeoff_plot).lower().endswith(".png"):
        raise ValueError(f"--tradeoff-plot must be a .png path, got {args.tradeoff_plot!r}")
    check_pld_steps(args, steps, p, "account", evaluations=2 if args.tradeoff_plot is not None else 1)

    from featuredp.accounting import dpsgd_event, epsilon_for

    with flag_names(ACCOUNTING_FLAGS):
        eps = epsilon_for(sigma, p, steps, delta, relation=args.relation, accountant=args.accountant)
    result = {
        "epsilon": eps,
        "delta": delta,
        "noise_multiplier": sigma,
        "sampling_rate": p,
        "steps": steps,
        "epochs": epochs,
        "relation": args.relation,
        "accountant": args.accountant,
    }
    if n is not None:
        result["dataset_size"] = n
    if args.batch_size is not None:
        result["batch_size"] = args.batch_size
    if args.tradeoff_plot is not None:
        from featuredp.accounting import plot_tradeoff, tradeoff_curve

        with flag_names(ACCOUNTING_FLAGS):
            alphas, betas = tradeoff_curve(
                dpsgd_event(sigma, p, steps), relation=args.relation, accountant=args.accountant
            )
        plot_tradeoff(
            args.tradeoff_plot, alphas, betas, epsilon=eps, delta=delta,
            title=f"σ={sigma:g}, p={p:.4g}, T={steps} ({args.relation}, {args.accountant})",
        )
        result["tradeoff_plot"] = str(args.tradeoff_plot)
    rows = [
        ("epsilon", fmt(eps)),
        ("delta", fmt(delta)),
        ("noise multiplier", fmt(sigma)),
        ("sampling rate", fmt(p)),
        ("steps", str(steps)),
        ("epochs", fmt(epochs)),
        ("relation", args.relation),
        ("accountant", args.accountant),
    ]
    if "tradeoff_plot" in result:
        rows.append(("trade-off plot", result["tradeoff_plot"]))
    emit(result, as_json=args.json, title="Privacy guarantee", rows=rows)
    return 0
