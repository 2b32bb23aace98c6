"""``featuredp train --task text``: one causal LM whose training texts' private spans are protected."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from featuredp.cli._device import check_device
from featuredp.cli._flags import is_default_noise
from featuredp.cli._summary import privacy_lines, record_line
from featuredp.cli._text_args import text_data_options, user_settings

#: train flags of the tabular task that --task text refuses (one line each, before any work)
_TABULAR_ONLY = {"--dataset": "dataset", "--private": "private", "--label": "label", "--model": "model",
                 "--hidden": "hidden", "--loss-split": "loss_split", "--tune": "tune", "--resume": "resume",
                 "--accept-legacy-checkpoint": "accept_legacy_checkpoint",
                 "--ledger": "ledger", "--schema": "schema", "--seed": "seed"}  # fmt: skip
_TEXT_METHODS = ("nonprivate", "public", "dpsgd", "fdp_dpsgd", "fdp")


def train_text(args: argparse.Namespace) -> int:
    """Check the flags, train, save the run and print the summary."""
    import torch

    from featuredp.experiments.text_runs import train_text_run

    for flag, name in _TABULAR_ONLY.items():
        value = getattr(args, name, None)
        if value and not (flag == "--dataset" and value == "adult"):
            raise ValueError(f"{flag} is not for --task text (it takes --data FILE.jsonl --spans ...)")
    if args.method not in _TEXT_METHODS:
        raise ValueError(f"--method for --task text must be one of {', '.join(_TEXT_METHODS)}, got {args.method!r}")
    check_device(args.device, args.precision)
    options = text_data_options(args, train=True)
    options.setdefault("canary_repeats", [])
    torch.set_num_threads(1)
    overrides = {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                 "max_grad_norm": args.max_grad_norm, "alpha": args.alpha, "public_batch_size": args.public_batch_size,
                 "public_weight": args.public_weight, "pretrain_epochs": args.pretrain_epochs,
                 "pretrain_batch_size": args.pretrain_batch_size, "momentum": args.momentum,
                 "optimizer": args.optimizer}  # fmt: skip
    settings: dict[str, Any] = {}
    if args.noise_multiplier is not None:
        settings["noise_multiplier"] = args.noise_multiplier
    if args.secure_rng:
        settings["secure_rng"] = True
    if not is_default_noise(args.noise):
        settings.update(noise=args.noise, bands=args.bands)
    if args.record_epsilon is not None:
        settings["record_epsilon"] = args.record_epsilon
    settings.update(user_settings(args))
    if getattr(args, "sharding", "none") != "none":
        settings["sharding"] = args.sharding
    for name in ("accountant", "relation"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    summary = train_text_run(out=args.out, method=args.method, epsilon=args.epsilon, delta=args.delta,
                             given=options, overrides=overrides, public_seed=args.public_seed,
                             device=args.device, progress=not (args.quiet or args.json),
                             group_stats=bool(getattr(args, "group_stats", False)), **settings)  # fmt: skip
    if args.json:
        print(json.dumps(summary))
        return 0
    lines = [
        f"method            {summary['method']} (task text)",
        f"data              {summary['data']}; private: {summary['private']}",
        f"perplexity        {summary['perplexity']:.4g} held-out, full text ({summary['public_perplexity']:.4g} on the "
        "redacted text)" + ("" if summary["heldout_covered"] else " — not covered by ε"),
        f"held-out          {summary['heldout_note']}",
        *privacy_lines(summary),
        record_line(summary),
    ]
    lines.append(f"guarantee         {summary['guarantee']}")
    lines += boundary_lines(summary)
    if summary["truncated"]:
        lines.append(f"note              {summary['truncated']} redacted training texts were longer than --max-len "
                     "and were cut")
    if summary["out"]:
        lines.append(f"saved             {summary['out']} (audit: featuredp audit {summary['out']} --attack "
                     "exposure|extraction|span)")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


#: printed without --group-stats: the same words whatever the data (no statistic of the private values)
GROUP_HINT = ("ε covers one record; a private value repeated in k records is a group of k, covered at a larger ε_k "
              "(--group-stats computes k and ε_k from the private values, outside ε)")


#: the group line of a user-level run (--user-field)
USER_HINT = ("ε covers one user: every record of one --user-field value, however many; a private value shared by k "
             "users is a group of k users")


def boundary_lines(summary: dict[str, Any]) -> list[str]:
    """What Ψ hid in the training texts (spans per type: annotated, detected); with ``--group-stats``, each type's
    largest repeat, the warning that these read the private values, and the group sentences (a value in k > 1
    records is a group of k); without it, one fixed hint."""
    b = summary.get("boundary") or {}
    types = list(dict.fromkeys([*b.get("annotated", {}), *b.get("detected", {}), *b.get("largest_repeat", {})]))
    cells = []
    for t in types:
        det = b.get("detected", {}).get(t)
        rep = b.get("largest_repeat", {}).get(t)
        cells.append(f"{t} {b.get('annotated', {}).get(t, 0)} annotated"
                     + ("" if det is None else f", {det} detected")
                     + ("" if rep is None else f", largest repeat {rep}"))  # fmt: skip
    lines = [f"boundary          {'; '.join(cells)} (training texts)"] if cells else []
    if summary.get("unit") == "user":  # the unit is the person: a value repeated in one user's records is covered
        return [*lines, f"group             {USER_HINT}"]
    if not summary.get("group_stats"):
        return [*lines, f"group             {GROUP_HINT}"]
    lines.append(f"WARNING           {summary.get('group_stats_warning', '')}")
    lines += [f"group             {g}" for g in summary.get("group_notes") or ()]
    return lines
