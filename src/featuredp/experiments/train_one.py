"""One call from "data + private columns + method + ε" to a trained, evaluated model.

:func:`train_one` is the only place the application layer trains a tabular model: ``featuredp
train`` and ``featuredp demo``, every grid cell (:mod:`featuredp.experiments.grid`), the audit
models of ``featuredp audit`` (through :func:`retrain_like`) and the benchmarks call it. It loads
the data, builds Ψ (:class:`~featuredp.features.Columns`) and the loss split, the model and a
:class:`~featuredp.engine.Trainer` whose arguments are the method's preset
(:mod:`featuredp.experiments.presets`) updated by the caller's, minus those the method does not
read; trains, evaluates on the test set and optionally saves a run directory.

:func:`train_tabular` (``featuredp train``'s JSON summary) and :func:`train_cell` (a grid
cell's) are the same call with a summary dict as the result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from featuredp._validate import check_positive
from featuredp.batches import evaluate, resolve_device
from featuredp.data import load_dataset
from featuredp.engine import Trainer, init_seed
from featuredp.experiments.presets import (
    DEFAULT_MODEL,
    DEFAULT_PRESET,
    LABEL_DP_DEFAULTS,
    PRESETS,
    fitted_schedule,
    method_params,
    override,
    unit_settings,
    unused_params,
)
from featuredp.experiments.runs import (
    close_private_checkpoint,
    data_files_fingerprint,
    open_private_checkpoint,
    record_data_fingerprint,
    save_run,
)
from featuredp.features import Columns
from featuredp.losses import GaussianPadding, LabelDPSplit, LossSplit, default_split
from featuredp.methods import Method, get_method
from featuredp.models import build_model, spec_for
from featuredp.noise import DEFAULT_NOISE
from featuredp.plan import TrainResult

__all__ = ["TrainedModel", "ledger_summary", "references", "resolved_params", "retrain_like", "train_cell", "train_one",
           "train_tabular"]




#: loaders of a user's file, whose datasets are named after the file
_FILE_LOADERS = ("csv",)

@dataclass
class TrainedModel:
    """What :func:`train_one` returns.

    Attributes:
        summary: JSON-able facts of the run (the keys ``featuredp train --json`` prints).
        model: the trained model (in eval mode).
        result: the engine's :class:`~featuredp.plan.TrainResult`.
        trainer: the :class:`~featuredp.engine.Trainer` (its ``config()`` is what run.json records).
        metrics: accuracy and loss on the evaluation set, None without one.
    """

    summary: dict[str, Any]
    model: nn.Module
    result: TrainResult
    trainer: Trainer
    metrics: dict[str, float] | None


def _run_settings(kwargs: dict[str, Any], record: Method, *, epsilon: float | None, delta: float | None, noise: str,
                  bands: int | None, record_epsilon: float | None, params: Mapping[str, Any], device: str | None,
                  precision: str, sharding: str = "none") -> None:  # fmt: skip
    """Add to the Trainer's ``kwargs`` what :func:`train_one` sets outside the preset's parameters: the target, the
    noise, the backstop, the device and the precision."""
    if record.private:
        if epsilon is None and kwargs.get("noise_multiplier") is None:
            raise ValueError(f"method {record.name!r} needs --epsilon (a target) or --noise-multiplier")
        kwargs["target_epsilon"] = epsilon
        kwargs["delta"] = delta
    if noise != DEFAULT_NOISE or bands is not None:
        # Not through the preset's parameters: a non-private method given correlated noise is refused, never
        # dropped.
        kwargs.update(noise=noise, bands=bands)
    if record_epsilon is not None:  # not through the preset either: nonprivate is refused, never dropped
        kwargs["record_epsilon"] = record_epsilon
        # the public method's steps are clipped now: the clipping settings it otherwise ignores apply (C, strategy)
        for key in ("max_grad_norm", "strategy", "physical_batch_size"):
            if params.get(key) is not None:
                kwargs.setdefault(key, params[key])
        kwargs.setdefault("delta", delta)  # the public method's steps become record-level DP steps
    if device is not None:
        kwargs["device"] = device
    if precision != "fp32":
        kwargs["precision"] = precision
    if sharding != "none":
        kwargs["sharding"] = sharding


def train_one(
    *,
    method: str = "fdp",
    dataset: str = "adult",
    data: tuple[Any, Any] | None = None,
    private: Sequence[str] | None = None,
    label_private: bool | None = None,
    epsilon: float | None = None,
    delta: float | None = 1e-5,
    seed: int | None = None,
    public_seed: int | None = None,
    secure_rng: bool = False,
    ledger: Any = None,
    model: str | Mapping[str, Any] | None = None,
    hidden: Sequence[int] | None = None,
    loss_split: str | None = None,
    padding_scale: float | None = None,
    preset: str | None = DEFAULT_PRESET,
    dataset_options: Mapping[str, Any] | None = None,
    device: str | None = None,
    precision: str = "fp32",
    sharding: str = "none",
    out: str | Path | None = None,
    resume: bool = False,
    accept_legacy_checkpoint: bool = False,
    keep_checkpoint: bool = False,
    progress: bool = True,
    baselines: bool = False,
    noise: str = DEFAULT_NOISE,
    bands: int | None = None,
    record_epsilon: float | None = None,
    **params: Any,
) -> TrainedModel:
    """Train ``method`` on ``dataset`` (or ``data``) with ``private`` columns and evaluate it.

    Args:
        method: a name of :mod:`featuredp.methods`.
        dataset, dataset_options: what :func:`featuredp.data.load_dataset` loads when ``data`` is None
            (``model="sparse_logreg"`` asks for categorical codes); with ``out`` both are recorded in
            run.json, so ``featuredp audit`` reloads the same data (for ``csv``: the file's absolute
            path, the label, the column lists and the schema file).
        data: ``(train, test)``; ``test`` may be None (no evaluation: accuracy and loss are None).
        private: the private raw columns (default: the dataset's ``default_private``); naming the
            label makes it private. ``label_private`` sets that explicitly.
        epsilon, delta: the target (ε, δ) of a private method; a private method needs ``epsilon``
            or a ``noise_multiplier`` in ``params``. Non-private methods ignore both.
        seed, public_seed, secure_rng, ledger: the Trainer's (see :class:`~featuredp.engine.Trainer`):
            ``seed`` is secret (reproducible research only), ``public_seed`` seeds only the public
            streams. The model is initialised from ``public_seed`` (or ``seed``, or OS entropy).
        model: a model kind (``mlp``, ``logreg``, ``sparse_logreg``; default mlp) or a full model spec;
            ``hidden``: the MLP's widths (default ``[64]``).
        loss_split: ``padding`` (Gaussian padding, scale ``padding_scale``), ``zero``, ``mean``,
            ``labeldp``; default: the split for Ψ.
        preset: the preset whose method parameters are the defaults (:data:`~featuredp.experiments.
            presets.PRESETS`; the default preset for every dataset, as ``featuredp train`` does);
            None: no defaults, ``params`` only.
        device: ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``auto``; checked before any work.
        precision: ``fp32`` or ``bf16`` (bfloat16 autocast; norms, clipping and noise in float32).
        sharding: ``none`` or ``fsdp`` (under torchrun: the model sharded with FSDP2, docs/distributed.md).
        out, resume: a run directory to write (run.json, model.pt) and whether to continue the run in it
            from its checkpoint. The checkpoint (RNG states and keys) is written outside ``out``, in a
            private place (:func:`~featuredp.experiments.runs.private_checkpoint`: folders 0700, file
            0600) named by the summary's ``checkpoint``; a ``checkpoint.pt`` an older featuredp left in
            ``out`` is refused by a resume unless ``accept_legacy_checkpoint`` (then moved there first). Every
            resume re-keys the private randomness after the checkpoint (noise, private batches and draws) from OS
            entropy: the model and steps up to it are the uninterrupted run's, the rest the same mechanism.
        keep_checkpoint: keep the private checkpoint when the run finishes (default: it is deleted once
            run.json and model.pt are written; it stays when training fails, for ``resume``).
        baselines: also report, in ``summary["baselines"]``, the test accuracy of always predicting the test
            set's most common class (``majority``) and of the ``public`` method trained on Ψ(S) alone with the
            same model (``public_only``: free under FDP; None without a Ψ), and the last training loss shown
            (``summary["train_loss"]``: ℓ_pub on public batches for the FDP methods, ℓ for non-private ones;
            a private batch's loss is never shown).
        noise, bands: the Trainer's (``"bandmf"`` or ``"blt"``: correlated noise, for a private method only;
            ``bands`` for ``"bandmf"`` only).
        params: Trainer keyword arguments (epochs, batch_size, noise_multiplier, max_grad_norm,
            alpha, lr, pretrain_epochs, public_batch_size, ...) replacing the preset's; None values
            are ignored and keys the method does not read are dropped
            (:func:`~featuredp.experiments.presets.unused_params`).
    """
    record = get_method(method)
    if device is not None:
        resolve_device(device)  # an absent device is a one-line error before the data is loaded
    kind = str(model.get("kind")) if isinstance(model, Mapping) else model or DEFAULT_MODEL["kind"]
    (train, test), options, file_hashes = _load(dataset, data, dataset_options, kind, hashed=out is not None)
    if private is None:
        private = list(getattr(train, "default_private", None) or [])
    fmap, split = _psi_and_split(record, train, private, label_private, loss_split, padding_scale)
    spec = _model_spec(train, model, kind, hidden)
    net = build_model(spec, seed=init_seed(public_seed if public_seed is not None else seed))

    # The unit of a private run on a table with a user column: a user (docs/users.md), else a record.
    users = getattr(train, "users", None) if record.private else None
    params = unit_settings(params, users)
    units = int(train.n) if users is None else len(set(users.tolist()))
    kwargs = resolved_params(record.name, dataset, units, params, preset=preset,
                             label_dp=isinstance(split, LabelDPSplit))
    _run_settings(kwargs, record, epsilon=epsilon, delta=delta, noise=noise, bands=bands,
                  record_epsilon=record_epsilon, params=params, device=device, precision=precision,
                  sharding=sharding)  # fmt: skip
    trainer = Trainer(net, record.name, loss_split=split, seed=seed, public_seed=public_seed, secure_rng=secure_rng,
                      ledger=ledger, progress=progress, user_key=users, **kwargs)  # fmt: skip
    checkpoint = None if out is None else _open_checkpoint(trainer, out, resume, accept_legacy_checkpoint)
    # Periodic checkpoints (between steps: a resumed run is the uninterrupted one up to the checkpoint).
    result = trainer.fit(train, checkpoint=checkpoint, checkpoint_every=200 if checkpoint else None, resume=resume)
    trained = trainer.model
    metrics = None if test is None else evaluate(trained, test)
    trained.eval()
    # A user's file is named by its file name (the loader's name), not by the loader ("csv").
    name = getattr(train, "name", dataset) if data is not None or dataset in _FILE_LOADERS else dataset
    summary = _summary(record, result, trainer, fmap, metrics, spec, dataset=name, seeded=seed is not None,
                       public_seed=public_seed, secure_rng=secure_rng)  # fmt: skip
    if baselines:
        # The reference is trained as `train --method public` with the same flags would be: under the record-level
        # backstop too when the run has one (its public steps then read records only through noise).
        summary.update(references(result, train, test, fmap, record.name, dict(
            private=private, label_private=label_private, model=spec, preset=preset, public_seed=public_seed,
            device=device, precision=precision, dataset=dataset, record_epsilon=record_epsilon, delta=delta,
            **params)))  # fmt: skip
    if trainer.ledger is not None:
        summary["ledger"] = ledger_summary(trainer.ledger)
    if out is not None:
        _save(out, trainer, result, summary, spec=spec, dataset={"name": dataset, "options": options},
              metrics=metrics, checkpoint=checkpoint, keep_checkpoint=keep_checkpoint, file_hashes=file_hashes)
    return TrainedModel(summary=summary, model=trained, result=result, trainer=trainer, metrics=metrics)


def _load(dataset: str, data: tuple[Any, Any] | None, dataset_options: Mapping[str, Any] | None, kind: str, *,
          hashed: bool) -> tuple[tuple[Any, Any], dict[str, Any], dict[str, Any]]:  # fmt: skip
    """``(train, test)``, the loader options run.json records and, when ``hashed``, the data files' fingerprint."""
    options = dict(dataset_options or {})
    if kind == "sparse_logreg":
        # Codes for the sparse model: the CSV loader's categorical= lists columns, its encoding= picks codes.
        options.setdefault("encoding" if dataset == "csv" else "categorical", "codes")
    if data is not None:
        return data, options, {}
    # Hashed before the data is read, so that the fingerprint `featuredp audit` checks is of these bytes.
    file_hashes = data_files_fingerprint(options) if hashed else {}
    return load_dataset(dataset, **options), options, file_hashes


def _psi_and_split(record: Method, train: Any, private: Sequence[str], label_private: bool | None,
                   loss_split: str | None, padding_scale: float | None) -> tuple[Columns | None, LossSplit | None]:
    """Ψ and the loss split. A method that reads no Ψ gets them only when something is declared private (the
    guarantee then names it); e.g. retrained non-private audit models have none."""
    if not (private or label_private or record.needs_feature_map):
        return None, None
    fmap = Columns(private=list(private), label_private=bool(label_private)).bind(train)
    if loss_split == "padding" and padding_scale is not None:
        return fmap, GaussianPadding(fmap, scale=check_positive("padding_scale", padding_scale))
    return fmap, default_split(fmap, loss_split)


def _model_spec(train: Any, model: str | Mapping[str, Any] | None, kind: str, hidden: Sequence[int] | None
                ) -> dict[str, Any]:  # fmt: skip
    """The model's spec: the one given, or ``kind`` sized for ``train`` (an MLP with ``hidden``, default [64])."""
    if isinstance(model, Mapping):
        return dict(model)
    spec_opts: dict[str, Any] = {}
    if kind == "mlp":
        spec_opts["hidden"] = list(hidden) if hidden is not None else list(DEFAULT_MODEL["hidden"])
    return spec_for(train, kind, **spec_opts)


def _open_checkpoint(trainer: Trainer, out: str | Path, resume: bool, accept_legacy: bool) -> Path:
    """The run's private checkpoint. Keys and RNG states stay out of the run directory, which is meant to be shared
    (rule 13); one process creates the place and moves an old checkpoint.pt, then every rank uses it."""
    main = trainer.dist is None or trainer.dist.is_main
    checkpoint = open_private_checkpoint(out, resume=resume, accept_legacy=accept_legacy) if main else None
    if trainer.dist is not None:
        torch.distributed.barrier()
    return checkpoint if checkpoint is not None else open_private_checkpoint(out)


def _summary(record: Method, result: TrainResult, trainer: Trainer, fmap: Columns | None,
             metrics: dict[str, float] | None, spec: dict[str, Any], *, dataset: str, seeded: bool,
             public_seed: int | None, secure_rng: bool) -> dict[str, Any]:  # fmt: skip
    """The run's JSON-able facts (``featuredp train --json``); public quantities only."""
    plan = result.plan
    return {
        "method": record.name,
        "dataset": dataset,
        "private_columns": list(fmap.private_columns or []) if fmap is not None else [],
        "label_private": bool(fmap is not None and fmap.label_private),
        "accuracy": None if metrics is None else metrics["accuracy"],
        "test_loss": None if metrics is None else metrics["loss"],
        "epsilon": None if math.isinf(result.epsilon) else result.epsilon,
        # the replace-one question (two values of one record's private part), same steps (docs/accounting.md)
        "replacement_epsilon": _finite(result.replacement_epsilon),
        "relation": plan.relation,
        # the privacy unit: a record, or a user (--user-column; batch and rate then count users)
        "unit": plan.unit,
        "units": plan.dataset_size,
        "records_per_user": plan.records_per_user,
        "delta": result.delta,
        "noise_multiplier": plan.noise_multiplier,
        "noise": plan.noise.kind,
        "bands": plan.bands,
        # the privacy report's block of a correlated-noise run (BLT's buffers and epoch, BandMF's coefficients, the
        # sensitivity its ε is accounted at); None for independent noise
        "correlated_noise": result.privacy_report.get("correlated_noise"),
        "max_grad_norm": plan.max_grad_norm,
        **record_summary(result),
        "sampling_rate": plan.sampling_rate,
        "batch_size": plan.expected_batch_size,
        "public_batch_size": plan.public_batch_size,
        "alpha": plan.alpha if record.public_batch else None,
        "steps": result.steps,
        "pretrain_steps": result.pretrain_steps,
        "stopped_early": result.stopped_early,
        "stop_reason": result.stop_reason,
        "model": spec,
        # Whether the run was seeded, never the seed: with it anyone could replay the noise.
        "seeded": seeded,
        "public_seed": public_seed,
        "secure_rng": secure_rng,
        # How it ran: the same keys as run.json's config.
        "device": str(trainer.device),
        "precision": trainer.performance.precision,
        "world_size": 1 if trainer.dist is None else trainer.dist.world_size,
        "sharding": "fsdp" if trainer.run.sharded else "none",
        "guarantee": result.guarantee,
    }


def _save(out: str | Path, trainer: Trainer, result: TrainResult, summary: dict[str, Any], *, spec: dict[str, Any],
          dataset: dict[str, Any], metrics: dict[str, float] | None, checkpoint: Path | None, keep_checkpoint: bool,
          file_hashes: dict[str, Any]) -> None:  # fmt: skip
    """Write the run directory (run.json, model.pt), the private data fingerprint, and close the checkpoint."""
    save_run(out, trainer, result, model_spec=spec,
             dataset={**dataset, "private_columns": summary["private_columns"],
                      "label_private": summary["label_private"], "split": "the loader's fixed train/test split"},
             metrics=metrics)  # fmt: skip
    summary["out"] = str(out)
    summary["checkpoint"] = str(checkpoint)
    summary["checkpoint_kept"] = bool(keep_checkpoint)
    if trainer.dist is None or trainer.dist.is_main:
        record_data_fingerprint(out, file_hashes)  # private, next to the checkpoint: never in run.json
    if trainer.dist is not None:
        torch.distributed.barrier()  # every rank has written its last checkpoint
    close_private_checkpoint(out, keep=keep_checkpoint)


def resolved_params(method: str, dataset: str, n: int, params: Mapping[str, Any], *,
                    preset: str | None = DEFAULT_PRESET, label_dp: bool = False) -> dict[str, Any]:
    """The Trainer arguments of ``method`` on ``n`` training records of ``dataset``: the preset's, fitted to ``n``
    for a dataset without a preset of its own, updated by the caller's ``params`` (None values ignored).

    Keys the method does not read are dropped; the caller's ``steps`` (``sampling_rate``) replaces the
    preset's ``epochs`` (``batch_size``). With ``label_dp`` (a private label) the caller's ``pretrain_epochs`` > 0
    is refused for a method that reads Ψ.
    """
    record = get_method(method)
    if label_dp and record.needs_feature_map and (params.get("pretrain_epochs") or 0) > 0:
        # Ψ holds no label: pre-training on ℓ_pub alone learns nothing about y (it only pulls towards the uniform
        # prediction), and would read as a head start it is not.
        raise ValueError(f"pretrain_epochs={params['pretrain_epochs']:g} with a private label: public pre-training "
                         "has no label to learn from (the public view holds none); leave it out or set it to 0")
    kwargs = {} if preset is None else method_params(PRESETS[preset]["methods"], record)
    if preset is not None and dataset not in PRESETS:
        # A table without a preset of its own (a user's file): batches and epochs fitted to its size.
        kwargs = override(kwargs, fitted_schedule(int(n), record))
    if preset is not None and label_dp and record.needs_feature_map:
        kwargs.update(LABEL_DP_DEFAULTS)  # defaults only: the caller's params below still win
    kwargs = override(kwargs, {k: v for k, v in params.items() if v is not None})
    for key in unused_params(record):
        kwargs.pop(key, None)
    return kwargs


def ledger_summary(ledger: Any) -> dict[str, Any]:
    """The summary's ``ledger``: where the run's budget ledger stands after the run.

    ``spent_epsilon`` is null when unbounded; open reservations (other runs') count as spent.
    """
    spent = ledger.spent()
    return {"path": str(ledger.path), "total_epsilon": ledger.total_epsilon, "delta": ledger.delta,
            "spent_epsilon": None if math.isinf(spent) else spent,
            "left_epsilon": max(0.0, ledger.total_epsilon - spent)}


def references(result: TrainResult, train: Any, test: Any, fmap: Columns | None, method: str,
                public_kwargs: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """``baselines`` (majority, public_only) and ``train_loss`` for the summary (see :func:`train_one`)."""
    majority = None
    if test is not None and len(test.y):
        counts = np.bincount(np.asarray(test.y, dtype=np.int64))
        majority = float(counts.max() / counts.sum())
    public_only = None
    public_record: dict[str, Any] = record_summary(None)
    note = None
    if fmap is not None and fmap.label_private:
        # Ψ(S) holds no label: a model trained on it alone learns nothing about y, and a "public only" accuracy
        # (it fell to 47 % on Adult, below the majority class's 76 %) would mislead. Without labels the best a
        # public-only model can do is a fixed class: the majority-class reference above, at best.
        note = "the label is private: a public-only model sees no labels; the majority class is its best case"
    elif fmap is not None and method != "public":  # Ψ(S) is public: the reference costs no feature-level privacy
        reference = train_one(method="public", data=(train, test), progress=False, **public_kwargs).summary
        public_only, public_record = reference["accuracy"], {k: reference[k] for k in public_record}
    shown = [h for h in result.history if "loss" in h or "public_loss" in h]
    last = shown[-1] if shown else {}
    kind = "loss" if "loss" in last else "public_loss" if "public_loss" in last else None
    # One retraining: its accuracy has no spread over seeds, only the test set's binomial noise (train prints it).
    return {"baselines": {"majority": majority, "public_only": public_only,
                          "public_only_runs": 0 if public_only is None else 1, "public_only_note": note,
                          # the reference under the run's record-level backstop (null without one): σ_pub and its ε
                          **{f"public_only_{k}": v for k, v in public_record.items()},
                          "test_rows": None if test is None else len(test.y)},
            "train_loss": None if kind is None else {"kind": kind, "value": float(last[kind])}}


def record_summary(result: TrainResult | None) -> dict[str, Any]:
    """The summary's record-level keys: ``record_epsilon`` (ε for whole records; null where the public view was
    read without noise, and for nonprivate), ``record_backstop`` (whether a backstop noised the public steps) and
    ``record_noise_multiplier`` (σ_pub). ``result`` None: the keys of no run (null, False, null)."""
    if result is None:
        return {"record_epsilon": None, "record_backstop": False, "record_noise_multiplier": None}
    rec = result.record_epsilon
    return {"record_epsilon": None if rec is None or math.isinf(rec) else float(rec),
            "record_backstop": result.plan.record_noise_multiplier is not None,
            "record_noise_multiplier": result.plan.record_noise_multiplier}


def train_tabular(**kwargs: Any) -> dict[str, Any]:
    """:func:`train_one`'s summary dict (what ``featuredp train --json`` prints); same arguments."""
    return train_one(**kwargs).summary


def train_cell(
    *,
    data: tuple[Any, Any],
    method: str,
    epsilon: float | None,
    delta: float,
    seed: int,
    private: Sequence[str] | None = None,
    model: str | None = None,
    hidden: Sequence[int] | None = None,
    loss_split: str | None = None,
    padding_scale: float | None = None,
    **params: Any,
) -> dict[str, Any]:
    """One grid cell: :func:`train_one` on ``data = (train, eval)`` with exactly ``params``, a summary dict.

    ``seed`` is the cell's *public* seed (initialisation, public batches); the private randomness
    is OS entropy. ``params`` are the cell's complete Trainer arguments (no preset is added); the
    summary has :func:`train_one`'s keys plus ``loss`` (the evaluation loss).
    """
    run = train_one(data=data, method=method, epsilon=epsilon, delta=delta, public_seed=seed,
                    private=list(private) if private else None, model=model, hidden=hidden, loss_split=loss_split,
                    padding_scale=padding_scale, preset=None, progress=False, **params)  # fmt: skip
    return {**run.summary, "loss": run.summary["test_loss"]}


# The names of the loss splits in run.json (``describe()``) as ``loss_split=`` takes them.
_SPLIT_NAMES = {"gaussian_padding": "padding", "label_dp": "labeldp", "masking": "zero"}
# The Trainer settings of a run's config that an audit model keeps; its length (steps / epochs), batch
# size and, for private methods, σ and p are set from the run's plan below.
_KEEP = ("public_batch_size", "pretrain_epochs", "pretrain_batch_size", "delta", "max_grad_norm", "alpha",
         "public_weight", "optimizer", "lr", "pretrain_lr", "momentum", "weight_decay", "projection_radius",
         "averaging", "average_fraction", "ema_decay", "relation", "accountant")  # fmt: skip


def retrain_like(
    run: Any,
    data: Any,
    *,
    steps: int | None = None,
    epochs: float | None = None,
    seed: int = 0,
    progress: bool = False,
) -> tuple[nn.Module, TrainResult]:
    """Train a fresh model on ``data`` with ``run``'s method, model and hyperparameters: an audit model.

    ``run`` is a loaded run directory (:func:`featuredp.experiments.runs.load_run`). Private methods
    keep the run's noise multiplier and sampling rate (not its ε target), so that the audit models'
    claimed ε is the run's when the length is the same; ``steps`` or ``epochs`` shorten them.
    ``seed`` is public (initialisation, public batches). Returns ``(model, TrainResult)``; the audits
    of :mod:`featuredp.attacks.tabular` take it as their ``train_fn``.
    """
    info = run.info
    cfg = dict(info.get("config") or {})
    record = get_method(info["method"])
    kwargs: dict[str, Any] = {k: cfg[k] for k in _KEEP if k in cfg and cfg[k] is not None}
    if kwargs.get("max_grad_norm") == "inf":
        kwargs["max_grad_norm"] = math.inf
    for key in ("public_batch_size", "pretrain_batch_size"):  # a shrunken audit set (--train-size) may be smaller
        if kwargs.get(key):
            kwargs[key] = min(int(kwargs[key]), int(data.n))
    plan = run.plan
    if record.private:
        kwargs["noise_multiplier"] = plan.noise_multiplier
        kwargs["sampling_rate"] = plan.sampling_rate
        if epochs is not None:
            kwargs["epochs"] = epochs
        else:
            kwargs["steps"] = int(steps if steps is not None else (info.get("result") or {}).get("steps")
                                  or plan.steps)  # fmt: skip
    else:
        kwargs["batch_size"] = cfg.get("batch_size") or 256
        if steps is not None:
            kwargs["steps"] = steps
        else:
            kwargs["epochs"] = epochs if epochs is not None else (cfg.get("epochs") or 1.0)
    split_name = ((info.get("result") or {}).get("privacy_report") or {}).get("loss_split", {}).get("split")
    # The seed fixes only the public randomness (initialisation, public batches): the audit models'
    # private noise is fresh, as it would be in a real run, so audit outcomes vary from run to run.
    trained = train_one(
        data=(data, None), method=record.name, private=run.private_columns,
        label_private=bool(run.dataset.get("label_private")), model=info["model_spec"],
        loss_split=_SPLIT_NAMES.get(split_name), delta=kwargs.pop("delta", None), public_seed=seed, preset=None,
        progress=progress, **kwargs,
    )  # fmt: skip
    return trained.model, trained.result


def _finite(value: float | None) -> float | None:
    """``value`` as a float, None for ∞ (no guarantee) or None (JSON has no infinity)."""
    return None if value is None or math.isinf(value) else float(value)
