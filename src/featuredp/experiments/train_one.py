"""One call from "dataset + private columns + method + ε" to a trained, evaluated model.

Shared by ``featuredp train``, ``featuredp demo`` and ``benchmarks/adult_methods.py``:
loads the data, builds Ψ (:class:`~featuredp.features.Columns`), the model and a
:class:`~featuredp.engine.Trainer` with the per-method defaults of
:mod:`featuredp.experiments.presets`, trains, evaluates on the test set and optionally saves
a run directory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from featuredp._validate import check_choice
from featuredp.engine import METHODS, PRIVATE_METHODS, Trainer, evaluate, init_seed
from featuredp.experiments.presets import DEFAULT_MODEL, LABEL_DP_DEFAULTS, method_defaults
from featuredp.features import Columns
from featuredp.losses import LabelDPSplit, default_split
from featuredp.models import build_model, spec_for

__all__ = ["train_tabular"]


def train_tabular(
    *,
    dataset: str = "adult",
    private: list[str] | None = None,
    method: str = "fdp",
    epsilon: float | None = None,
    delta: float = 1e-5,
    seed: int | None = None,
    public_seed: int | None = None,
    secure_rng: bool = False,
    ledger: Any = None,
    model: str | None = None,
    hidden: list[int] | None = None,
    loss_split: str | None = None,
    data: tuple[Any, Any] | None = None,
    dataset_options: dict[str, Any] | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    **overrides: Any,
) -> dict[str, Any]:
    """Train ``method`` on ``dataset`` with ``private`` columns; returns a JSON-able summary.

    ``overrides`` are Trainer keyword arguments (epochs, batch_size, noise_multiplier,
    max_grad_norm, alpha, lr, pretrain_epochs, public_batch_size, ...) replacing the
    presets; ``None`` values are ignored. ``data=(train, test)`` skips loading.
    ``seed`` (secret; reproducible research only), ``public_seed``, ``secure_rng`` and
    ``ledger`` are the Trainer's (see :class:`~featuredp.engine.Trainer`); the model is
    initialised from ``public_seed`` (or ``seed``, or OS entropy).
    """
    method = check_choice("method", method, METHODS)
    kind = model or DEFAULT_MODEL["kind"]
    options = dict(dataset_options or {})
    if kind == "sparse_logreg":
        options.setdefault("categorical", "codes")
    if data is None:
        from featuredp.data import load_dataset

        train, test = load_dataset(dataset, **options)
    else:
        train, test = data
    if private is None:
        private = list(getattr(train, "default_private", None) or [])
    fmap = Columns(private=list(private)).bind(train)
    split = default_split(fmap, loss_split)
    spec_opts: dict[str, Any] = {}
    if kind == "mlp":
        spec_opts["hidden"] = hidden if hidden is not None else DEFAULT_MODEL.get("hidden", [64])
    spec = spec_for(train, kind, **spec_opts)
    net = build_model(spec, seed=init_seed(public_seed if public_seed is not None else seed))

    kwargs = method_defaults(method)
    kwargs.setdefault("strategy", _fast_strategy())
    if isinstance(split, LabelDPSplit) and method in ("fdp", "fdp_dpsgd"):
        kwargs.update(LABEL_DP_DEFAULTS)  # defaults only: the user's overrides below still win
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    if method in PRIVATE_METHODS:
        if epsilon is None and kwargs.get("noise_multiplier") is None:
            raise ValueError(f"method {method!r} needs --epsilon (a target) or --noise-multiplier")
        kwargs["target_epsilon"] = epsilon
        kwargs["delta"] = delta
    else:
        for k in ("noise_multiplier", "max_grad_norm", "alpha", "public_batch_size"):
            kwargs.pop(k, None)
        kwargs.pop("pretrain_epochs", None)
        kwargs.pop("pretrain_lr", None)
    if method == "dpsgd":
        for k in ("alpha", "public_batch_size", "pretrain_epochs", "pretrain_lr"):
            kwargs.pop(k, None)
    if method == "fdp_dpsgd":
        kwargs.pop("alpha", None)
    trainer = Trainer(net, method, loss_split=split, seed=seed, public_seed=public_seed, secure_rng=secure_rng,
                      ledger=ledger, progress=progress, **kwargs)
    checkpoint = None if out is None else Path(out) / "checkpoint.pt"
    # Periodic checkpoints (between steps, so a resumed run equals an uninterrupted one).
    result = trainer.fit(train, checkpoint=checkpoint, checkpoint_every=200 if checkpoint else None, resume=resume)
    metrics = evaluate(trainer.model, test)
    plan = result.plan
    summary = {
        "method": method,
        "dataset": dataset if data is None else getattr(train, "name", dataset),
        "private_columns": list(fmap.private_columns or []),
        "label_private": fmap.label_private,
        "accuracy": metrics["accuracy"],
        "test_loss": metrics["loss"],
        "epsilon": None if math.isinf(result.epsilon) else result.epsilon,
        "delta": result.delta,
        "noise_multiplier": plan.noise_multiplier,
        "max_grad_norm": plan.max_grad_norm,
        "sampling_rate": plan.sampling_rate,
        "batch_size": plan.expected_batch_size,
        "public_batch_size": plan.public_batch_size,
        "alpha": plan.alpha if method == "fdp" else None,
        "steps": result.steps,
        "pretrain_steps": result.pretrain_steps,
        "stopped_early": result.stopped_early,
        "stop_reason": result.stop_reason,
        "model": spec,
        # Whether the run was seeded, never the seed: with it anyone could replay the noise.
        "seeded": seed is not None,
        "public_seed": public_seed,
        "secure_rng": secure_rng,
        "guarantee": result.guarantee,
    }
    if out is not None:
        from featuredp.experiments.runs import save_run

        save_run(out, trainer, result, model_spec=spec,
                 dataset={"name": dataset, "options": options, "private_columns": summary["private_columns"],
                          "label_private": fmap.label_private, "split": "the loader's fixed train/test split"},
                 metrics=metrics)  # fmt: skip
        summary["out"] = str(out)
    return summary


def _fast_strategy() -> str:
    """"ghost" (ghost norms; same result as "vmap", several times faster) when it imports, else "vmap"."""
    try:
        import featuredp.clipping.ghost  # noqa: F401
    except ImportError:  # pragma: no cover - the ghost module is part of the package
        return "vmap"
    return "ghost"
