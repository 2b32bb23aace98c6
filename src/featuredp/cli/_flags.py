"""Flag helpers shared by the subcommands.

Whole numbers in any notation, range limits, ``--out`` checks, and errors that name the flag the
user typed instead of the Python parameter behind it.

Limits (docs/engine.md, "Command line"): ``--epsilon`` <= :data:`MAX_EPSILON` (a larger ε bounds nothing),
``--epochs`` <= :data:`MAX_EPOCHS`; the PLD accountant accounts at most 10⁷ Poisson-subsampled steps
(:data:`featuredp.accounting.accountant.MAX_PLD_STEPS`; ``--accountant rdp`` has no limit).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

#: the largest target ε a command accepts: e^1000 bounds no attack, so a larger value is a typo (1e6 for 1e-6?)
MAX_EPSILON = 1000.0
#: the most training epochs ``train``/``demo`` accept (Adult's presets use 3-5; 10⁴ epochs is days of CPU)
MAX_EPOCHS = 10_000.0
#: PLD accounting of at least this many steps prints how long it will take (:func:`pld_seconds`)
SLOW_PLD_STEPS = 1_000_000


class _NoiseKinds:
    """The registered noise kinds (:data:`featuredp.noise.NOISE_PLANS`), read on first use so that building the
    parser imports no accountant: ``"bandmf" in NOISES``, ``list(NOISES)``."""

    def _kinds(self) -> list[str]:
        from featuredp.noise import NOISE_PLANS

        return list(NOISE_PLANS)

    def __contains__(self, name: object) -> bool:
        return name in self._kinds()

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds())

    def __len__(self) -> int:
        return len(self._kinds())

    def __repr__(self) -> str:
        return repr(tuple(self._kinds()))


#: ``--noise`` of train, compare and benchmark: the registry's kinds
NOISES = _NoiseKinds()


def noise_kind(name: str) -> Any:
    """The noise plan class registered as ``name`` (its ``correlated``, ``label``...)."""
    from featuredp.noise import NOISE_PLANS

    return NOISE_PLANS[name]


def takes_bands(name: str) -> bool:
    """Whether ``--bands`` applies to the noise ``name``: its plan class has a ``bands`` setting
    (:func:`featuredp.noise.plan_settings`; BandMF's), so the CLI's flag is decided here, not by the plan."""
    from featuredp.noise import plan_settings

    return "bands" in plan_settings(noise_kind(name))


def default_noise() -> str:
    """The default noise's kind (:class:`featuredp.noise.Independent`)."""
    from featuredp.noise import Independent

    return Independent.kind


def is_default_noise(name: str) -> bool:
    """Whether ``name`` is the default noise (independent Gaussian noise: nothing to pass on to the Trainer)."""
    from featuredp.noise import Independent

    return noise_kind(name) is Independent


def whole_number(text: str) -> int:
    """An argparse ``type``: an integer written as ``1000``, ``1_000`` or ``1e3`` (no fractions).

    >>> whole_number("1e3"), whole_number("2_000")
    (1000, 2000)
    """
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not math.isfinite(value) or not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(value)


def number_list(text: str) -> list[float]:
    """An argparse ``type``: comma-separated numbers (``inf`` allowed), at least one.

    >>> number_list("1,2, 8"), number_list("0.5,inf")
    ([1.0, 2.0, 8.0], [0.5, inf])
    """
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    return values


def check_epsilon(flag: str, value: float) -> float:
    """``value`` in (0, :data:`MAX_EPSILON`]; the message names ``flag``.

    >>> check_epsilon("--epsilon", 2)
    2.0
    >>> check_epsilon("--epsilon", 1e6)
    Traceback (most recent call last):
    ...
    ValueError: --epsilon must be <= 1000 (a larger epsilon bounds nothing: e^1000 > 10^434), got 1000000.0
    """
    from featuredp._validate import check_positive

    eps = check_positive(flag, value)
    if eps > MAX_EPSILON:
        raise ValueError(f"{flag} must be <= {MAX_EPSILON:g} (a larger epsilon bounds nothing: e^1000 > 10^434), "
                         f"got {value!r}")
    return eps


def check_epochs(flag: str, value: float | None) -> float | None:
    """``value`` in (0, :data:`MAX_EPOCHS`] (None passes); the message names ``flag``."""
    from featuredp._validate import check_positive

    if value is None:
        return None
    epochs = check_positive(flag, value)
    if epochs > MAX_EPOCHS:
        raise ValueError(f"{flag} must be <= {MAX_EPOCHS:g} (days of training on a CPU), got {value!r}")
    return epochs


def check_out_dir(flag: str, path: str | Path | None) -> Path | None:
    """Refuse an ``--out`` that names an existing file (or sits below one) before any work."""
    if path is None:
        return None
    p = Path(path)
    for part in (p, *p.parents):
        if part.exists() and not part.is_dir():
            where = "" if part == p else f" ({str(part)!r} is a file)"
            raise ValueError(f"{flag} must be a folder, got {str(path)!r}, which is an existing file{where}")
    return p


def note(command: str, message: str) -> None:
    """One line on stderr, e.g. ``featuredp account: note: ...`` (a time estimate, a clamped default)."""
    print(f"featuredp {command}: note: {message}", file=sys.stderr, flush=True)


def pld_time_note(command: str, steps: int, *, evaluations: int = 1) -> None:
    """Say how long PLD accounting of ``steps`` Poisson-subsampled steps will take, when it is noticeable."""
    if steps < SLOW_PLD_STEPS:
        return
    seconds = pld_seconds(steps) * evaluations
    when = f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.0f} min"
    note(command, f"PLD accounting of {steps:,} steps takes {when} on one core"
                  + (f" ({evaluations} evaluations)" if evaluations > 1 else "") + "; --accountant rdp answers "
                  "at once (a looser upper bound)")  # fmt: skip


def pld_seconds(steps: int) -> float:
    """Measured cost of one PLD evaluation of ``steps`` subsampled steps: ≈ 4 s × (T / 10⁶)^1.5 (2-core CPU).

    >>> round(pld_seconds(10**7))
    126
    """
    return 4.0 * (steps / 1e6) ** 1.5


def translate(message: str, flags: Mapping[str, str]) -> str:
    """Rewrite Python parameter names in ``message`` as the command's flags.

    ``name='value'`` becomes ``--flag value``; names with an underscore (``target_epsilon``) are
    replaced wherever they stand; plain words (``steps``) only as ``steps=...`` or ``steps must ...``.

    >>> translate("target_epsilon=5 is not reachable; use accountant='rdp'",
    ...           {"target_epsilon": "--epsilon", "accountant": "--accountant"})
    '--epsilon=5 is not reachable; use --accountant rdp'
    """
    for name, flag in flags.items():
        message = re.sub(rf"(?<![\w-]){re.escape(name)}=['\"]([^'\"]*)['\"]", rf"{flag} \1", message)
        follows = r"(?![\w-])" if "_" in name else r"(?=\s*(?:=|must\b|>|<))"
        message = re.sub(rf"(?<![\w-]){re.escape(name)}{follows}", flag, message)
    return message


@contextlib.contextmanager
def flag_names(flags: Mapping[str, str]) -> Iterator[None]:
    """Errors (ValueError, TypeError) raised inside the block name ``flags`` instead of parameters."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        if len(exc.args) == 1 and isinstance(exc.args[0], str):
            exc.args = (translate(exc.args[0], flags),)
        raise


#: parameter → flag of the accounting commands (and of ``train``'s accounting settings)
ACCOUNTING_FLAGS = {
    "target_epsilon": "--epsilon",
    "noise_multiplier": "--noise-multiplier",
    "sampling_rate": "--sampling-rate",
    "steps": "--steps",
    "delta": "--delta",
    "accountant": "--accountant",
    "relation": "--relation",
}


#: parameter → flag of ``train``/``demo`` (the Trainer's and train_one's names in library messages)
TRAIN_FLAGS = {
    **ACCOUNTING_FLAGS,
    "max_grad_norm": "--max-grad-norm",
    "batch_size": "--batch-size",
    "public_batch_size": "--public-batch-size",
    "pretrain_batch_size": "--pretrain-batch-size",
    "pretrain_epochs": "--pretrain-epochs",
    "loss_split": "--loss-split",
    "public_seed": "--public-seed",
    "epochs": "--epochs",
    "lr": "--lr",
    "momentum": "--momentum",
    "alpha": "--alpha",
    "public_weight": "--public-weight",
    "noise": "--noise",
    "bands": "--bands",
    "record_epsilon": "--record-epsilon",
    "num_users": "--num-users",
    "records_per_user": "--records-per-user",
}
del TRAIN_FLAGS["steps"]  # train has no --steps: a step count in a message is the computed one


def check_training_values(args: argparse.Namespace) -> None:
    """The training flags present on ``args`` (``train``, ``demo``), each checked with its flag's name."""
    # the order of the checks is the order of the errors a user with several bad flags sees first
    _check_budget_and_schedule(args)
    _check_sizes_and_rates(args)


def _check_budget_and_schedule(args: argparse.Namespace) -> None:
    from featuredp._validate import check_nonnegative, check_open_unit, check_positive

    if getattr(args, "epsilon", None) is not None:
        check_epsilon("--epsilon", args.epsilon)
    if getattr(args, "delta", None) is not None:
        check_open_unit("--delta", args.delta)
    if getattr(args, "epochs", None) is not None:
        check_epochs("--epochs", args.epochs)
    if getattr(args, "pretrain_epochs", None) is not None:
        check_nonnegative("--pretrain-epochs", args.pretrain_epochs)
        check_epochs("--pretrain-epochs", args.pretrain_epochs or None)
    if getattr(args, "noise_multiplier", None) is not None:
        check_nonnegative("--noise-multiplier", args.noise_multiplier)
    if getattr(args, "max_grad_norm", None) is not None:
        check_positive("--max-grad-norm", args.max_grad_norm, allow_inf=True)


def _check_sizes_and_rates(args: argparse.Namespace) -> None:
    from featuredp._validate import check_int, check_nonnegative, check_positive

    def given(name: str) -> object:
        return getattr(args, name, None)

    for name in ("batch_size", "public_batch_size", "pretrain_batch_size"):
        if given(name) is not None:
            check_int("--" + name.replace("_", "-"), given(name), minimum=1)
    for name in ("lr", "alpha"):
        if given(name) is not None:
            check_positive("--" + name, given(name))
    if given("public_weight") is not None:
        check_nonnegative("--public-weight", args.public_weight)
    if given("record_epsilon") is not None:
        check_positive("--record-epsilon", args.record_epsilon)
    if given("momentum") is not None and not 0 <= args.momentum < 1:
        raise ValueError(f"--momentum must be in [0, 1), got {args.momentum!r}")
    for width in getattr(args, "hidden", None) or []:
        check_int("--hidden", width, minimum=1)


def check_run_out(args: argparse.Namespace) -> None:
    """``--out`` / ``--resume`` / ``--overwrite`` / ``--keep-checkpoint`` of ``train``: refuse what would lose or mix
    up a run.

    * ``--out`` naming a file: refused.
    * ``--resume``: ``--out``'s private checkpoint (:func:`~featuredp.experiments.runs.private_checkpoint`), or a
      checkpoint.pt an older featuredp left in ``--out`` (only with ``--accept-legacy-checkpoint``), must exist and
      be readable.
    * ``--out`` already holding a run (run.json, model.pt, checkpoint.pt, audit/, or a private checkpoint of an
      interrupted run): refused unless ``--resume`` (continue it) or ``--overwrite`` (replace it) is given.
    """
    from featuredp.experiments.runs import (
        CHECKPOINT_FILE,
        check_legacy_checkpoint,
        load_checkpoint,
        private_checkpoint,
        run_files,
    )

    out = check_out_dir("--out", args.out)
    if args.resume and args.overwrite:
        raise ValueError("give --resume (continue the run in --out) or --overwrite (replace it), not both")
    if getattr(args, "accept_legacy_checkpoint", False) and not args.resume:
        raise ValueError("--accept-legacy-checkpoint is for --resume (a checkpoint.pt left in --out), got no --resume")
    if out is None:
        for flag, given in (("--resume", args.resume), ("--overwrite", args.overwrite),
                            ("--keep-checkpoint", getattr(args, "keep_checkpoint", False))):  # fmt: skip
            if given:
                what = {"--resume": "the run to continue", "--overwrite": "the run to replace"}.get(
                    flag, "the run whose checkpoint to keep")
                raise ValueError(f"{flag} needs --out DIR ({what})")
        return
    private = private_checkpoint(out)
    if args.resume:
        legacy = out / CHECKPOINT_FILE
        checkpoint = private if private.is_file() else legacy
        if not checkpoint.is_file():
            where = "does not exist" if not out.exists() else "has no checkpoint"
            raise ValueError(f"--resume: --out {str(out)!r} {where}: no checkpoint at {private} (its private place, "
                             "keyed by --out's absolute path: a moved or renamed run directory cannot be resumed), "
                             "so there is no run to continue; drop --resume to start a new run there")
        check_legacy_checkpoint(out, accept=bool(getattr(args, "accept_legacy_checkpoint", False)))
        import pickle

        try:
            load_checkpoint(checkpoint)
        except pickle.UnpicklingError as exc:
            raise ValueError(f"--resume: checkpoint {checkpoint} is refused by the safe loader ({exc})") from None
        except (KeyError, AttributeError, ImportError, IndexError) as exc:
            raise ValueError(f"--resume: checkpoint {checkpoint} is not a featuredp file ({exc!r})") from None
        return
    existing = run_files(out) + ([f"a private checkpoint at {private}"] if private.exists() else [])
    if existing and not args.overwrite:
        raise ValueError(
            f"--out {str(out)!r} already holds a run ({', '.join(existing)}); pass --resume to continue it (same "
            "settings), --overwrite to replace it (its files are removed once the new run has finished), or "
            "choose another --out"
        )
