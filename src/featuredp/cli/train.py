"""``featuredp train``: train one method on a dataset with declared private columns."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from featuredp.cli._data_args import add_data_arguments, resolve_data
from featuredp.cli._device import add_device_argument, add_precision_argument, check_device
from featuredp.cli._flags import (
    NOISES,
    TRAIN_FLAGS,
    check_run_out,
    check_training_values,
    flag_names,
    is_default_noise,
    noise_kind,
    takes_bands,
    whole_number,
)
from featuredp.cli._summary import privacy_lines, record_line
from featuredp.cli._text_args import add_text_arguments, user_settings
from featuredp.methods import METHOD_NAMES


def _columns(text: str) -> list[str]:
    cols = [c.strip() for c in text.split(",") if c.strip()]
    if not cols:
        raise argparse.ArgumentTypeError(f"expected comma-separated column names, got {text!r}")
    return cols


def _ints(text: str) -> list[int]:
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def register(subparsers: Any) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train",
        allow_abbrev=False,
        help="train a model with feature DP (or a baseline) and report accuracy and epsilon",
        description=f"Train {' | '.join(METHOD_NAMES)} on a tabular dataset whose --private columns are "
        "protected. Unset hyperparameters use tuned per-method defaults (docs/engine.md).",
    )
    p.add_argument("--task", choices=("tabular", "text"), default="tabular",
                   help="tabular (default); text: a causal LM on --data FILE.jsonl (or the generated support corpus) "
                   "whose --spans are private (docs/text.md)")
    p.add_argument("--dataset", default="adult", help="dataset name (default: adult, bundled)")
    p.add_argument("--private", type=_columns, default=None,
                   help="comma-separated private raw columns (default: the dataset's, sex,race for adult); "
                        "naming the label makes it private")
    p.add_argument("--method", choices=(*METHOD_NAMES, "fdp_auto"), default="fdp",
                   help="fdp_auto: Algorithm 1 with its public weight w (w = 0, α = 1: FDP (DP-SGD)), α and lr "
                        "chosen per run by --tune (default public: free); the output says which it ran")
    p.add_argument("--epsilon", type=float, default=None, help="target epsilon (sigma is calibrated)")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--noise-multiplier", type=float, default=None, help="sigma (with --epsilon: budget stop)")
    p.add_argument("--noise", choices=NOISES, default="independent", metavar="KIND",
                   help="noise of the private steps: independent (DP-SGD's fresh Gaussian each step, default), "
                   "bandmf (banded matrix-factorization correlated noise with cyclic Poisson sampling: less noise at "
                   "the same epsilon for larger epsilon; docs/accounting.md) or blt (buffered linear Toeplitz "
                   "correlated noise, d <= 4 buffers chosen for the run, cyclic sampling over epochs of n/m steps, "
                   "one Gaussian at the min-sep sensitivity, no amplification; featuredp.noise.blt)")
    p.add_argument("--bands", type=whole_number, default=None, metavar="B",
                   help="--noise bandmf only (blt chooses its own strategy): the number of bands b (at most the "
                   "private steps, and n/m). Default: the b of 1, 2, 4, ..., 64 with the least noise at --epsilon "
                   "(bandmf.best_bands, a few seconds); with --noise-multiplier alone, 8")
    p.add_argument("--record-epsilon", type=float, default=None, metavar="E",
                   help="record-level backstop: make the whole run also (E, delta)-DP for whole records. Every step "
                   "that reads the public view (pre-training, the public method's steps, fdp's public batches) is "
                   "Poisson-sampled from a secret stream, clipped at C and noised, so what Psi misses (e.g. PII no "
                   "annotation or detector marks) is covered at E. Default: none (what Psi misses is public). "
                   "public, fdp_dpsgd, fdp; dpsgd: its epsilon already is record-level; not with --noise bandmf/blt")
    p.add_argument("--epochs", type=float, default=None)
    p.add_argument("--max-grad-norm", type=float, default=None, help="clipping norm C")
    p.add_argument("--batch-size", type=int, default=None, help="expected private batch size m (p = m/n)")
    p.add_argument("--public-batch-size", type=int, default=None,
                   help="public batch size m' (the preset's; the engine's default for fdp is 4 × the batch size: "
                        "it costs compute, not privacy)")
    p.add_argument("--alpha", type=float, default=None, help="weight of the private gradient (fdp)")
    p.add_argument("--public-weight", type=float, default=None, metavar="W",
                   help="fdp: g = W·g_pub + alpha·g_priv with ∇(ℓ − W·ℓ_pub) clipped (default 1; 0: no public "
                        "batch, with --alpha 1 exactly fdp_dpsgd)")
    p.add_argument("--pretrain-batch-size", type=int, default=None, metavar="N",
                   help="batch size of public pre-training (default: the preset's, else --public-batch-size if "
                        "given, else --batch-size)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--momentum", type=float, default=None)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default=None)
    p.add_argument("--pretrain-epochs", type=float, default=None, help="public pre-training epochs (fdp, fdp_dpsgd)")
    p.add_argument("--model", choices=("mlp", "logreg", "sparse_logreg"), default=None)
    p.add_argument("--hidden", type=_ints, default=None, help="MLP widths, e.g. 64 or 128,64")
    p.add_argument("--loss-split", choices=("padding", "zero", "mean", "labeldp"), default=None)
    p.add_argument("--accountant", choices=("pld", "rdp"), default=None)
    p.add_argument("--relation", choices=("add-remove", "replace-one"), default=None)
    p.add_argument("--seed", type=int, default=None,
                   help="seed EVERY random stream, the noise included, for a reproducible research run; the seed "
                   "must then stay as secret as the data (it is never written out). Default: fresh OS entropy")
    p.add_argument("--public-seed", type=int, default=None,
                   help="seed only the public randomness (model initialisation, public batches); safe to publish")
    p.add_argument("--secure-rng", action="store_true",
                   help="noise and private sampling from a ChaCha20 CSPRNG keyed by the OS, noise drawn and added "
                   "in float64 (docs/engine.md)")
    p.add_argument("--ledger", metavar="FILE", default=None,
                   help="budget ledger: reserve the planned spend before training (an overspend is refused before "
                   "any work) and settle what was spent at the end or on a crash")
    p.add_argument("--out", default=None,
                   help="run directory (run.json, model.pt). The resume checkpoint (RNG states, keys) goes to a "
                   "private folder outside it, under $FEATUREDP_PRIVATE_DIR (default ~/.local/state/featuredp/"
                   "private), keyed by --out's absolute path; it is deleted when the run finishes")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its private checkpoint (same settings and the same --out "
                   "path: a moved run directory cannot be resumed; refused without a checkpoint)")
    p.add_argument("--accept-legacy-checkpoint", action="store_true",
                   help="--resume from a checkpoint.pt an older featuredp left in --out itself (refused otherwise: "
                   "the run directory is shareable, so its noise keys may be known; the noise after the resume is "
                   "re-keyed either way)")
    p.add_argument("--keep-checkpoint", action="store_true",
                   help="keep the private checkpoint when the run finishes (mode 0600 in a 0700 folder; the output "
                   "says where). Default: deleted once run.json and model.pt are written")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --out: its model, run.json, private checkpoint and audit reports "
                   "are removed once the new run has finished (and kept if it fails). Without --resume or "
                   "--overwrite an --out holding a run is refused")
    add_device_argument(p)
    add_precision_argument(p)
    p.add_argument("--sharding", choices=("none", "fsdp"), default="none",
                   help="fsdp: under torchrun, shard the model with FSDP2 (each rank holds a shard of every parameter "
                        "and its optimiser state; the release is that of one process; docs/distributed.md)")
    add_data_arguments(p)  # --data FILE --label COL --schema ... (your own table)
    p.add_argument("--no-baselines", action="store_true",
                   help="skip the references (majority class; public only, a second, free training run on Ψ alone)")
    p.add_argument("--tune", choices=("private", "public"), default=None,
                   help="tune lr, C and alpha before training. private: a random search with a secret, random "
                        "number of trials (Papernot & Steinke 2022) whose whole cost is --epsilon (and the "
                        "ledger's spend); public (fdp, fdp_dpsgd): every candidate scored on the public view "
                        "alone, free under feature DP, then one run at --epsilon (docs/own-data.md)")
    p.add_argument("--tune-trials", type=float, default=5.0, metavar="MEAN",
                   help="--tune private: the mean number of trials E[K] (default 5)")
    p.add_argument("--tune-distribution", choices=("geometric", "logarithmic"), default="geometric",
                   help="--tune private: the distribution of the number of trials (default geometric; "
                        "logarithmic costs less ε for the same mean but has a heavier tail of long searches)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_text_arguments(p)
    p.set_defaults(func=run, resume_hint=_resume_hint)


def run(args: argparse.Namespace) -> int:
    """Check the flags and --out up front, then train (replacing the run in --out with --overwrite)."""
    from featuredp.experiments.runs import replacing_run

    _check_flags(args)
    if args.task == "text":
        from featuredp.cli._train_text import train_text

        with flag_names(TRAIN_FLAGS):
            if args.overwrite and args.out:
                with replacing_run(args.out):
                    return train_text(args)
            return train_text(args)
    with flag_names(TRAIN_FLAGS):
        if args.overwrite and args.out:
            with replacing_run(args.out):
                return _train(args)
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    """Train and print the result."""
    import torch

    from featuredp.experiments.train_one import train_one

    check_device(args.device, args.precision)  # an absent device: exit 2 with one line, before loading anything
    args.dataset, dataset_options = resolve_data(args, args.dataset)  # bad --data/--label/...: exit 2, no work
    torch.set_num_threads(1)  # small models: one intra-op thread is faster and steadier on shared CPUs
    if args.resume and not args.out:
        raise ValueError("--resume needs --out DIR (the run to continue)")
    # What the run reads, and its Trainer parameters: the same for a plain run and for a tuned one.
    common: dict[str, Any] = dict(
        dataset_options=dataset_options, dataset=args.dataset, private=args.private, epsilon=args.epsilon,
        delta=args.delta, seed=args.seed, public_seed=args.public_seed, secure_rng=args.secure_rng,
        ledger=args.ledger, model=args.model, hidden=args.hidden, loss_split=args.loss_split, out=args.out,
        progress=not (args.quiet or args.json), baselines=not args.no_baselines, device=args.device,
        precision=args.precision, epochs=args.epochs, max_grad_norm=args.max_grad_norm, batch_size=args.batch_size,
        public_batch_size=args.public_batch_size, alpha=args.alpha, lr=args.lr, public_weight=args.public_weight,
        pretrain_batch_size=args.pretrain_batch_size, momentum=args.momentum, optimizer=args.optimizer,
        pretrain_epochs=args.pretrain_epochs, accountant=args.accountant, relation=args.relation,
    )  # fmt: skip
    if not is_default_noise(args.noise):
        common.update(noise=args.noise, bands=args.bands)
    if args.record_epsilon is not None:
        common["record_epsilon"] = args.record_epsilon
    if args.sharding != "none":
        common["sharding"] = args.sharding
    users = user_settings(args)
    if users and "user_column" not in dataset_options:
        flag = "--records-per-user" if "records_per_user" in users else "--num-users"
        raise ValueError(f"{flag} is for user-level privacy: give --user-column COL too")
    common.update(users)
    if args.tune or args.method == "fdp_auto":
        from featuredp.experiments.tuning import TuningSettings, tune

        settings = TuningSettings(args.tune or "public", mean_trials=args.tune_trials,
                                  distribution=args.tune_distribution)  # fmt: skip
        summary = tune(settings, method=args.method, **common).summary
    else:
        summary = train_one(method=args.method, noise_multiplier=args.noise_multiplier, resume=args.resume,
                            accept_legacy_checkpoint=args.accept_legacy_checkpoint,
                            keep_checkpoint=args.keep_checkpoint, **common).summary  # fmt: skip
    return _print_summary(args, summary)


def _print_summary(args: argparse.Namespace, summary: dict[str, Any]) -> int:
    """Print the run's summary: a table of lines, or one JSON object with --json."""
    summary.setdefault("checkpoint", None)  # where the private checkpoint is (was, once deleted); null: no --out
    summary.setdefault("checkpoint_kept", False)
    if args.json:
        print(json.dumps(summary))
        return 0
    lines = [
        f"method            {summary['method']}",
        f"dataset           {summary['dataset']} (private: {', '.join(summary['private_columns']) or '-'}"
        f"{', label' if summary['label_private'] else ''})",
        f"test accuracy     {summary['accuracy']:.4f}",
        *privacy_lines(summary),
        record_line(summary),
    ]
    if summary["stopped_early"]:
        lines.append(f"stopped early     {summary['stop_reason']}")
    lines.append(f"guarantee         {summary['guarantee']}")
    if summary.get("ran"):
        ran = summary["ran"]
        lines.append(f"ran               {ran['label']} (chosen by {ran['chosen_by']}; the choice's epsilon "
                     f"{ran['choice_epsilon']:.4g} is included above)")
    lines.extend(_tuning_lines(summary.get("tuning")))
    lines.extend(_reference_lines(summary))
    if summary.get("ledger"):
        book = summary["ledger"]
        spent = "inf" if book["spent_epsilon"] is None else f"{book['spent_epsilon']:.4g}"
        lines.append(f"ledger            {book['path']}: epsilon spent {spent}, left {book['left_epsilon']:.4g} of "
                     f"{book['total_epsilon']:g} (delta={book['delta']:g})")
    if summary.get("out"):
        lines.append(f"saved             {summary['out']}")
    if summary["checkpoint"]:
        fate = "kept: --keep-checkpoint" if summary["checkpoint_kept"] else "deleted at the end"
        lines.append(f"checkpoint        {summary['checkpoint']} (private, {fate})")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _resume_hint(args: argparse.Namespace) -> str:
    """What Ctrl-C prints after "interrupted": a run with --out keeps its private checkpoint."""
    if not args.out:
        return ""
    return (f"; its private checkpoint is kept: run the same command with --resume to continue from the last "
            f"checkpoint (--out {args.out})")


def _tuning_lines(tuning: dict[str, Any] | None) -> list[str]:
    """What --tune chose and what it cost."""
    if not tuning:
        return []
    chosen = ", ".join(f"{k}={v:g}" for k, v in tuning["chosen"].items()) or "the defaults"
    if tuning["mode"] == "private":
        lines = [f"tuned             privately: {chosen} (noisy validation accuracy "
                 f"{tuning['noisy_validation_accuracy']:.4f} ± {tuning['score_noise_std']:.3f}); random search, "
                 f"E[K] = {tuning['mean_trials']:g} {tuning['distribution']} trials, epsilon above is the whole "
                 "search's (the number of trials is secret)"]
        if tuning["score_noise_std"] > 0.02:
            lines.append(f"note              each trial's score carries noise of sd {tuning['score_noise_std']:.3f} "
                         f"(accuracy) on about {tuning['validation_records']:.0f} validation records: the choice is "
                         "largely noise on a table this small; --tune public (FDP) costs nothing and has no score "
                         "noise")
        return lines
    return [f"tuned             on the public view: {chosen} (public-view validation accuracy "
            f"{tuning['public_view_validation_accuracy']:.4f}, {tuning['candidates']} candidates, free under "
            "feature DP)"]


def _reference_lines(summary: dict[str, Any]) -> list[str]:
    """The majority-class and public-only references, the last training loss shown, and advice when the
    private model falls below the public-only one (Ψ(S) alone already gets that accuracy, at no privacy cost)."""
    refs = summary.get("baselines")
    if not refs:
        return []
    parts = []
    if refs.get("majority") is not None:
        parts.append(f"majority class {refs['majority']:.4f}")
    noise = _one_run_noise(summary.get("accuracy"), refs.get("public_only"), refs.get("test_rows"))
    if refs.get("public_only") is not None:
        spread = f", ±{noise:.4f} test noise" if noise is not None else ""
        if refs.get("public_only_record_backstop"):  # trained under the run's backstop, as the run's public steps
            rec = refs.get("public_only_record_epsilon")
            cost = "Ψ alone under the record-level backstop" + ("" if rec is None else f", record ε {rec:.4g}")
        else:
            cost = "Ψ alone: free"
        parts.append(f"public only {refs['public_only']:.4f} (one run{spread}; {cost})")
    elif refs.get("public_only_note"):
        parts.append(f"public only: not trained ({refs['public_only_note']})")
    lines = [f"references        {', '.join(parts)}"] if parts else []
    loss = summary.get("train_loss")
    if loss:
        what = "public loss ℓ_pub on public batches" if loss["kind"] == "public_loss" else "loss on training batches"
        lines.append(f"training loss     {loss['value']:.4g} ({what}, last log point)")
    acc, public = summary.get("accuracy"), refs.get("public_only")
    if acc is not None and public is not None and acc < public and noise is not None and public - acc <= noise:
        lines.append(f"note              the private model ({acc:.4f}) and the public-only reference ({public:.4f}) "
                     f"differ by less than one run's noise (±{noise:.4f}): no difference is shown")
    elif acc is not None and public is not None and acc < public:
        lines.append(f"note              the private model ({acc:.4f}) is below the public-only reference "
                     f"({public:.4f}): train longer (--epochs) or with a larger --lr, pre-train on the public "
                     "view (--pretrain-epochs), or raise --epsilon; --tune public (free under FDP) or --tune "
                     "private tries settings")
    return lines


def _one_run_noise(acc: float | None, public: float | None, test_rows: int | None) -> float | None:
    """How far two single runs' test accuracies may differ by the test set's sampling alone: twice the standard
    error of their difference on ``test_rows`` rows, at least one point. None without the numbers.

    >>> round(_one_run_noise(0.80, 0.81, 1000), 4), _one_run_noise(0.8, None, 1000)
    (0.0354, None)
    """
    if acc is None or public is None or not test_rows:
        return None
    se = math.sqrt((acc * (1 - acc) + public * (1 - public)) / test_rows)
    return max(0.01, 2 * se)


def _check_flags(args: argparse.Namespace) -> None:
    """Every value and --out/--resume/--overwrite, before any data is read (one line naming the flag)."""
    check_training_values(args)
    check_run_out(args)
    if args.bands is not None:
        from featuredp._validate import check_int

        check_int("--bands", args.bands, minimum=1)
        if not takes_bands(args.noise):
            raise ValueError(f"--bands is for --noise bandmf, got --bands {args.bands} with --noise {args.noise}")
    if not is_default_noise(args.noise):
        from featuredp.methods import PRIVATE_METHODS

        # fdp_auto is Algorithm 1 (private), tuned: its search and its final run take the noise like --tune's
        if args.method not in (*PRIVATE_METHODS, "fdp_auto"):
            raise ValueError(f"--noise {args.noise} is for the private methods {', '.join(PRIVATE_METHODS)}, got "
                             f"--method {args.method}")
    if args.record_epsilon is not None:
        if args.method == "nonprivate":
            raise ValueError("--record-epsilon is for the methods that read a record with noise or through Psi "
                             "(public, dpsgd, fdp_dpsgd, fdp), not --method nonprivate")
        if noise_kind(args.noise).correlated:
            raise ValueError(f"--record-epsilon is not supported with --noise {args.noise} yet (use independent noise)")
        if args.tune or args.method == "fdp_auto":
            raise ValueError("--record-epsilon is not supported with --tune or --method fdp_auto yet")
    if args.sharding != "none" and (args.tune or args.method == "fdp_auto"):
        raise ValueError(f"--sharding {args.sharding} is not supported with --tune or --method fdp_auto yet")
    if args.method == "fdp_auto" and args.public_weight is not None:
        raise ValueError("--method fdp_auto chooses --public-weight itself: leave it out (or use --method fdp)")
    if args.tune or args.method == "fdp_auto":
        from featuredp.experiments.tuning import TuningSettings, check_request

        settings = TuningSettings(args.tune or "public", mean_trials=args.tune_trials,
                                  distribution=args.tune_distribution)  # fmt: skip
        check_request(settings, args.method, epsilon=args.epsilon, noise_multiplier=args.noise_multiplier,
                      seed=args.seed)
        if args.resume:
            raise ValueError("--tune cannot --resume (a search is not checkpointed): run it again")
        if args.tune_trials >= 1e6:
            raise ValueError(f"--tune-trials must be a mean number of trials in [1, 1e6), got {args.tune_trials}")
