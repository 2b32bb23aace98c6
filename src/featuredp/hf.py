"""``featuredp.hf.DPTrainer``: Hugging Face's ``transformers.Trainer`` with featuredp's private run inside.

A drop-in ``Trainer`` for private fine-tuning (``pip install 'featuredp[llm]'``)::

    from featuredp.hf import DPTrainer

    trainer = DPTrainer(model=model, args=TrainingArguments(output_dir="out", per_device_train_batch_size=16,
                                                            gradient_accumulation_steps=4, num_train_epochs=3),
                        train_dataset=train, eval_dataset=valid, data_collator=collator,
                        target_epsilon=3.0, target_delta=1e-5, max_grad_norm=1.0)
    trainer.train()                  # ends with the guarantee sentence; trainer.privacy holds ε, δ and the plan

What it changes in the Trainer, and why:

* **Sampling.** Every logical batch is a Poisson sample of the training set at rate
  q = 1/⌈N / (per_device_train_batch_size × gradient_accumulation_steps)⌉, drawn by featuredp's secret sampler
  (:class:`featuredp.PrivacyEngine`'s loader), never by Hugging Face's sampler: the accountant's ε is for Poisson
  sampling, and a shuffled sampler would make it answer another question. ``gradient_accumulation_steps`` splits each
  sampled batch into that many physical chunks; their clipped sums add up and the noise is added once, at the step.
* **The step.** ``outputs.loss`` of the model (``labels`` in the batch) is recomputed per example by the engine
  (:mod:`featuredp.hf_losses`): each example's gradient is clipped at ``max_grad_norm``, the sum is noised, and the
  optimizer Hugging Face built (AdamW by default, with its scheduler) steps on it. ``TrainingArguments.max_grad_norm``
  (the global-norm clip) is replaced by the per-example clip.
* **Logs.** The training loss and the gradient norm on private batches are statistics of private data with no
  noise: they are not logged (nor written to ``trainer_state.json``). Logged instead: ``epsilon`` (add/remove one
  record, at the plan's δ), ``replacement_epsilon`` (replace one record's private part), ``private_steps``, and
  ``public_loss`` where the method has one. Evaluation (``eval_dataset``) is logged as usual: held-out data is the
  user's to publish.
* **Checkpoints.** Each ``checkpoint-N`` also holds ``featuredp_privacy.pt`` (the run's state without the weights,
  owner-readable only; its secret streams are re-keyed from OS entropy on resume, never replayed), and
  ``output_dir`` holds ``featuredp.spent.json``, the
  private steps the run has charged, brought up to date at every draw. ``train(resume_from_checkpoint=...)``
  continues the accounting: resuming an older checkpoint keeps every step that ran charged (ε never goes back), and
  a correlated-noise run refuses to rewind.

Refused in one line, before any work: DeepSpeed, FSDP (sharding lands with featuredp's FSDP work), more than one
process or GPU, ``train_sampling_strategy`` other than the default (``group_by_length``, ``sequential``,
``batch_rebalance``), a custom sampler or train data loader (a subclass overriding ``_get_train_sampler`` or
``get_train_dataloader``), an iterable dataset, ``fp16`` (loss scaling would scale the clipped gradients; ``bf16``
works), NEFTune, label smoothing, ``auto_find_batch_size`` (it changes q mid-run),
``include_num_input_tokens_seen`` (a count of private tokens), ``torch_compile`` and activation checkpointing.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.nn import functional
from torch.utils.data import DataLoader, Dataset, IterableDataset
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from featuredp._io import atomic_write_json
from featuredp.data.text import TextDataset
from featuredp.errors import PrivacyLeakWarning
from featuredp.features import PublicFeatureMap
from featuredp.features.text import TextSpans
from featuredp.features.tokens import TokenView
from featuredp.lm import token_nll
from featuredp.losses import CausalLMSplit, LossSplit
from featuredp.models.hf import HFCausalLM
from featuredp.plan import TrainResult
from featuredp.privacy_engine import PrivacyEngine
from featuredp.users import UserIndex, draws_per_epoch, user_keys_for
from featuredp.utils.batch_memory_manager import chunk_rows, rows_of_batch

__all__ = ["PRIVACY_FILE", "SPENT_FILE", "DPTrainer", "TokenRows"]

#: the run's state in each ``checkpoint-N`` folder (no weights, no secret coins)
PRIVACY_FILE = "featuredp_privacy.pt"
#: the private steps the run has charged, in ``output_dir`` (kept current at every draw)
SPENT_FILE = "featuredp.spent.json"
#: the run's public summary (ε, δ, the guarantee, the plan), written to ``output_dir`` when training ends
SUMMARY_FILE = "privacy.json"
# Statistics of private batches with no noise: never logged.
_PRIVATE_LOGS = frozenset({"loss", "grad_norm", "train_loss"})


class DPTrainer(transformers.Trainer):
    """``transformers.Trainer`` training with differential privacy (DP-SGD) or feature DP (module docstring).

    Privacy keywords (the rest are ``transformers.Trainer``'s):

    * ``max_grad_norm`` C: the per-example clipping bound (required);
    * ``noise_multiplier`` σ, or ``target_epsilon`` (σ calibrated so that the planned steps are
      (``target_epsilon``, ``target_delta``)-DP); ``target_delta`` δ (default 1e-5);
    * ``feature_map`` Ψ, a :class:`featuredp.features.text.TextSpans` (or ``loss_split``, a
      :class:`featuredp.losses.CausalLMSplit`), with ``method`` (``"fdp"``, Algorithm 1, by default; ``"fdp_dpsgd"``;
      ``"dpsgd"`` without): feature DP of the text's private spans. ``train_dataset`` (and ``eval_dataset``) are
      then :class:`featuredp.data.text.TextDataset` objects built with the same Ψ, and the model is called as
      ``model(input_ids=x)`` on their token batches (:class:`featuredp.models.hf.HFCausalLM`); the evaluation loss
      is each text's mean token NLL;
    * ``grad_sample_mode``: ``"ghost"`` (the default; ``"vmap"`` with a user key) or ``"vmap"`` (featuredp's
      strategies; Opacus's names map as in :meth:`featuredp.PrivacyEngine.make_private`);
    * ``noise`` and ``bands`` (correlated noise), ``record_epsilon`` (the record-level backstop), ``alpha``,
      ``public_batch_size``, ``public_weight``: as in :meth:`featuredp.PrivacyEngine.make_private`;
    * ``accountant``, ``secure_mode``, ``ledger``: as in :class:`featuredp.PrivacyEngine`; ``privacy_seed`` fixes the
      secret key (tests only: it makes the noise predictable, and is warned about);
    * ``user_key`` (a column of ``train_dataset``, or one key per record), ``records_per_user``, ``num_users``:
      user-level privacy (docs/users.md): each optimizer step is a Poisson draw of users, ``per_device_train_batch_size
      × gradient_accumulation_steps`` of them expected, each user's records summed and clipped as one (the
      accumulation's chunks cut at users' boundaries); the strategy is vmap.

    After :meth:`train`, :attr:`privacy` is the run's :class:`featuredp.plan.TrainResult` and :attr:`engine` the
    :class:`featuredp.PrivacyEngine` that ran it.
    """

    def __init__(self, model: Any = None, args: Any = None, *, max_grad_norm: float,
                 noise_multiplier: float | None = None, target_epsilon: float | None = None,
                 target_delta: float | None = None, feature_map: PublicFeatureMap | None = None,
                 loss_split: LossSplit | None = None, method: str | None = None, grad_sample_mode: str | None = None,
                 noise: Any = None, bands: int | None = None, record_epsilon: float | None = None,
                 alpha: float | None = None, public_batch_size: int | None = None,
                 public_weight: float | None = None, accountant: str = "pld", secure_mode: bool = False,
                 ledger: Any = None, privacy_seed: int | None = None, user_key: Any = None,
                 records_per_user: int | None = None, num_users: int | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        if (noise_multiplier is None) == (target_epsilon is None):
            raise ValueError(f"give noise_multiplier or target_epsilon, exactly one (got noise_multiplier="
                             f"{noise_multiplier!r}, target_epsilon={target_epsilon!r})")  # fmt: skip
        if kwargs.get("eval_dataset") is not None and kwargs.get("eval_dataset") is kwargs.get("train_dataset"):
            warnings.warn("eval_dataset is train_dataset: its evaluation metrics are logged without noise and are not "
                          "covered by epsilon; evaluate on held-out data", PrivacyLeakWarning,
                          stacklevel=2)  # fmt: skip
        loss_split = _text_split(feature_map, loss_split, kwargs)
        _refuse_overrides(type(self))
        if args is not None:  # before Hugging Face sets anything up
            _refuse_settings(args, kwargs.get("train_dataset"))
        super().__init__(model=model, args=args, **kwargs)
        _refuse_settings(self.args, self.train_dataset)
        # Hugging Face's global-norm clip would rescale the clipped, noised sum; the data skip on resume would replay
        # draws (each one charged) instead of drawing fresh ones.
        self.args.max_grad_norm = 0.0
        self.args.ignore_data_skip = True
        self._text = loss_split is not None  # feature DP: token batches of TextDatasets, model(input_ids=x)
        if self._text:
            self.args.remove_unused_columns = False  # x, y, x_pub, y_pub are not the model's argument names
            self.args.label_names = self.label_names = ["y"]
        self.engine = PrivacyEngine(accountant=accountant, secure_mode=secure_mode, seed=privacy_seed, ledger=ledger)
        self._privacy_settings: dict[str, Any] = {
            "max_grad_norm": max_grad_norm, "grad_sample_mode": grad_sample_mode,
            "loss_split": loss_split, "method": method, "target_delta": target_delta, "noise": noise,
            "bands": bands, "record_epsilon": record_epsilon, "alpha": alpha,
            "public_batch_size": public_batch_size, "public_weight": public_weight,
            "records_per_user": records_per_user, "num_users": num_users,
        }  # fmt: skip
        # A column name is read before Hugging Face drops the columns the model does not take.
        self._user_keys = None if user_key is None else user_keys_for(user_key, self.train_dataset)
        if grad_sample_mode is None:  # a user's records are summed before the clip: the per-record strategy
            self._privacy_settings["grad_sample_mode"] = "ghost" if user_key is None else "vmap"
        self._noise_multiplier, self._target_epsilon = noise_multiplier, target_epsilon
        self._private: tuple[Any, Any] | None = None  # the engine's (model, loader) once the run is made
        self._resume_from: str | None = None
        self._trained = False
        self.privacy: TrainResult | None = None

    # -- the run ---------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any) -> Any:  # fmt: skip
        """``transformers.Trainer.train``, privately; ends with the guarantee sentence (:attr:`privacy`)."""
        if self._trained:
            raise ValueError("this DPTrainer has trained: one DPTrainer is one private run (the accountant counts "
                             "it once); continue it with a new DPTrainer and resume_from_checkpoint=")  # fmt: skip
        if trial is not None:
            raise ValueError("DPTrainer does not run hyperparameter searches: each trial is a release of the "
                             "private data, and their ε's add up")  # fmt: skip
        output_dir = str(self.args.output_dir)
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"resume_from_checkpoint=True: no checkpoint in output_dir={output_dir!r}")
        if resume_from_checkpoint and self._private is not None:
            raise ValueError("resume_from_checkpoint: this DPTrainer's run was already started (its train loader "
                             "drew batches); resume in a new DPTrainer")  # fmt: skip
        self._resume_from = str(resume_from_checkpoint) if resume_from_checkpoint else None
        # The record of this trainer's own run (written when its loader was first asked for) is not another run's.
        if self._resume_from is None and self._private is None and (Path(output_dir) / SPENT_FILE).exists():
            raise ValueError(f"output_dir={self.args.output_dir!r} holds another private run ({SPENT_FILE}): "
                             "resume it (resume_from_checkpoint=True) or give a new output_dir")  # fmt: skip
        self._trained = True
        try:
            out = super().train(resume_from_checkpoint=self._resume_from, ignore_keys_for_eval=ignore_keys_for_eval,
                                **kwargs)  # fmt: skip
        finally:
            if self._private is not None:
                self.engine.close()
        # The training loss Hugging Face reports is of private batches: not measured here, rather than a false 0.
        out.metrics.pop("train_loss", None)
        out = out._replace(training_loss=float("nan"))
        self.privacy = self.engine.result()
        if self.is_world_process_zero():
            atomic_write_json(Path(output_dir) / SUMMARY_FILE, self.privacy.to_dict())
            print(self.privacy.guarantee)
        return out

    def get_train_dataloader(self) -> Any:
        """The engine's loader: secret Poisson draws, each split into ``gradient_accumulation_steps`` chunks."""
        if self._private is None:
            self._make_private()
        assert self._private is not None
        return _Chunks(self._private[1], self.args.gradient_accumulation_steps)

    def _make_private(self) -> None:
        """The private run on the training set: the engine wraps the model, Hugging Face's optimizer and a loader of
        logical batches (its length sets q); a resume loads the run's state and charges what the run spent."""
        dataset = self.train_dataset
        if dataset is None:
            raise ValueError("DPTrainer needs train_dataset")
        collate = self.data_collator
        if transformers.utils.is_datasets_available():
            import datasets

            if isinstance(dataset, datasets.Dataset):
                dataset = self._remove_unused_columns(dataset, description="training")
            else:
                collate = self._get_collator_with_removed_columns(collate, description="training")
        logical = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
        loader = DataLoader(dataset, batch_size=logical, collate_fn=collate)
        draws = len(loader)
        if self._user_keys is not None:  # the batch counts users: ⌈users / batch⌉ draws per epoch
            draws = draws_per_epoch(UserIndex(self._user_keys).num_users, logical)
        steps = self.args.max_steps if self.args.max_steps > 0 else math.ceil(self.args.num_train_epochs * draws)
        self.create_optimizer()
        module = HFCausalLM(self._model()) if self._text else self.model
        common = {"module": module, "optimizer": self.optimizer, "data_loader": loader, "user_key": self._user_keys,
                  **{k: v for k, v in self._privacy_settings.items() if v is not None}}  # fmt: skip
        if self._target_epsilon is not None:
            out = self.engine.make_private_with_epsilon(target_epsilon=self._target_epsilon, epochs=steps / draws,
                                                        **common)  # fmt: skip
        else:
            out = self.engine.make_private(noise_multiplier=float(self._noise_multiplier or 0.0), steps=steps,
                                           **common)  # fmt: skip
        model, optimizer, private = out[0], out[1], out[-1]
        self.optimizer = optimizer
        self._private = (model, private)
        if self._resume_from is not None:
            saved = Path(self._resume_from) / PRIVACY_FILE
            if not saved.exists():
                raise ValueError(f"{self._resume_from} has no {PRIVACY_FILE}: it was not written by DPTrainer, so "
                                 "the run's accounting cannot continue from it")  # fmt: skip
            self.engine.load_checkpoint(path=saved, module=self._model(),
                                        spent_record=Path(self._resume_from).parent / SPENT_FILE)  # fmt: skip
        else:
            Path(str(self.args.output_dir)).mkdir(parents=True, exist_ok=True)
        self._note_spent()

    def _model(self) -> torch.nn.Module:
        if not isinstance(self.model, torch.nn.Module):
            raise ValueError("DPTrainer needs model=")
        return self.model

    def _note_spent(self) -> None:
        """Keep ``output_dir/featuredp.spent.json`` current from now on (the engine updates it at every draw)."""
        if self.is_world_process_zero():
            self.engine.note_spent(Path(str(self.args.output_dir)) / SPENT_FILE)

    # -- the step --------------------------------------------------------------------------------------------
    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        """One physical chunk of the current draw through the engine's wrapped model: ``outputs.loss.backward()``
        adds the chunk's clipped per-example gradients. Returns 0: the private loss is not logged.

        ``num_items_in_batch`` (Hugging Face's token count over the accumulated chunks, a statistic of the private
        batch) is not used: each example's loss is its own mean over its own counted tokens."""
        assert self._private is not None
        zero = torch.zeros((), device=self.args.device)
        if rows_of_batch(inputs) == 0:
            return zero  # an empty chunk (or an empty Poisson draw: its step is the noise alone)
        wrapped = self._private[0]
        wrapped.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            if self._text:  # the engine's loss is the split's (ℓ and ℓ_pub on each text and its Ψ)
                loss = functional.cross_entropy(wrapped(inputs["x"]).flatten(0, 1), inputs["y"].flatten())
            else:
                loss = self.compute_loss(wrapped, inputs)
        loss.backward()
        return zero

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:  # fmt: skip
        """Hugging Face's ``outputs.loss`` (without ``num_items_in_batch``, a count over the private batch); on a
        text dataset's token batch, the mean over texts of each text's mean token NLL."""
        if not self._text:
            return super().compute_loss(model, inputs, return_outputs=return_outputs)
        logits = HFCausalLM(model)(inputs["x"])
        loss = token_nll(logits, inputs["y"]).mean()
        return (loss, {"logits": logits}) if return_outputs else loss

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """0: Hugging Face counts the tokens of each private batch here (``total_flos``), a private statistic."""
        return 0

    # -- logs and checkpoints --------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Hugging Face's log without the private batches' loss and gradient norm, with ε (both questions)."""
        logs = {k: v for k, v in logs.items() if k not in _PRIVATE_LOGS}
        if self._private is not None and not any(k.startswith("eval_") for k in logs):
            delta = self.engine.plan.delta or 1e-5
            logs["epsilon"] = self.engine.get_epsilon(delta)
            logs["replacement_epsilon"] = self.engine.get_replacement_epsilon(delta)
            logs["private_steps"] = self.engine.steps
            if self.engine.public_loss is not None:
                logs["public_loss"] = self.engine.public_loss
        super().log(logs, start_time)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        run_dir = Path(self._get_output_dir(trial=trial))
        folder = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self._private is not None and self.is_world_process_zero() and folder.is_dir():
            self.engine.save_checkpoint(path=folder / PRIVACY_FILE, module=self._model(), weights=False,
                                        spent_record=run_dir / SPENT_FILE)  # fmt: skip


class _Chunks:
    """The private loader's draws, each split into exactly ``k`` near-equal chunks of rows (some empty when the draw
    has fewer than ``k`` rows), so that Hugging Face's accumulation groups one draw per optimizer step."""

    def __init__(self, loader: Any, k: int) -> None:
        self.loader, self.k = loader, int(k)

    def __len__(self) -> int:
        return len(self.loader) * self.k

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield from chunk_rows(batch, self.k, self.loader.last_groups)


def _text_split(feature_map: Any, loss_split: Any, kwargs: dict[str, Any]) -> CausalLMSplit | None:
    """Feature DP of text spans: the loss split of Ψ, with the datasets as token rows (refused in one line where the
    data is not a TextDataset of the same Ψ); None for DP-SGD."""
    if feature_map is None and loss_split is None:
        return None
    if loss_split is None:
        if not isinstance(feature_map, TextSpans):
            raise TypeError(f"feature_map must be a TextSpans (featuredp.features.text) for DPTrainer, got "
                            f"{type(feature_map).__name__}: tables and images train with featuredp.Trainer")
        loss_split = CausalLMSplit(TokenView(feature_map))
    elif not isinstance(loss_split, CausalLMSplit):
        raise TypeError(f"loss_split must be a CausalLMSplit for DPTrainer, got {type(loss_split).__name__}")
    for name in ("train_dataset", "eval_dataset"):
        data = kwargs.get(name)
        if data is None and name == "eval_dataset":
            continue
        if not isinstance(data, TextDataset):
            raise TypeError(f"{name} must be a featuredp.data.text.TextDataset with feature DP (its texts' Ψ is "
                            f"what stays public), got {type(data).__name__}")  # fmt: skip
        if feature_map is not None and data.psi != feature_map:
            raise ValueError(f"{name} was built with Ψ = {data.psi!r}, feature_map= is {feature_map!r}: one Ψ")
        kwargs[name] = TokenRows(data)
    return loss_split


class TokenRows(Dataset):
    """A :class:`featuredp.data.text.TextDataset` as a map-style dataset: row i is the dict of its ``x``, ``y``,
    ``x_pub`` and ``y_pub`` (fixed length, so any batch of rows collates the same way)."""

    def __init__(self, data: TextDataset) -> None:
        self.data = data
        self.columns = data.batch()

    def __len__(self) -> int:
        return int(self.columns["x"].shape[0])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.columns.items()}


def _refuse_overrides(cls: type) -> None:
    """A subclass that brings its own sampler or train loader would replace the secret Poisson draws."""
    for klass in cls.__mro__:
        if klass is DPTrainer:
            return
        for name in ("_get_train_sampler", "get_train_dataloader"):
            if name in vars(klass):
                raise TypeError(f"{klass.__name__}.{name} is overridden: DPTrainer draws every batch itself (Poisson "
                                "sampling from secret coins, the sampling its ε is for); weight records in the loss "
                                "instead of a custom sampler")  # fmt: skip


_REFUSED_ARGS = (
    ("deepspeed", lambda v: bool(v), "DeepSpeed is not supported: train in one process"),
    ("fsdp", lambda v: bool(v), "FSDP is not supported yet (featuredp's own FSDP work): train in one process"),
    ("fp16", lambda v: bool(v), "fp16 scales the loss, and so the clipped gradients: use bf16=True"),
    ("neftune_noise_alpha", lambda v: v is not None, "NEFTune perturbs the forward from a public random stream: "
                                                        "per-example clipping needs a deterministic forward"),
    ("label_smoothing_factor", lambda v: bool(v), "label smoothing replaces outputs.loss with Hugging Face's own "
                                                   "smoothed loss, which the engine does not recompute per example"),
    ("auto_find_batch_size", lambda v: bool(v), "auto_find_batch_size changes the sampling rate mid-run"),
    ("include_num_input_tokens_seen", lambda v: v not in (False, None, "no"),
     "it logs the number of private tokens trained on"),
    ("group_by_length", lambda v: bool(v), "featuredp samples batches itself (Poisson), not by length"),
    ("train_sampling_strategy", lambda v: v not in (None, "random"),
     "featuredp samples batches itself (Poisson at rate q, from secret coins), the sampling its ε is for"),
    ("torch_compile", lambda v: bool(v), "torch.compile of the model is not supported by the per-example passes"),
    ("activation_checkpointing", lambda v: bool(v), "its saved-tensor hooks could rescale the gradients the "
                                                     "per-example clip reads: train without it"),
    ("gradient_checkpointing", lambda v: bool(v), "its saved-tensor hooks could rescale the gradients the "
                                                   "per-example clip reads: train without it"),
)


def _refuse_settings(args: Any, train_dataset: Any) -> None:
    """Refuse, in one line, a TrainingArguments setting DPTrainer cannot honour."""
    for name, bad, why in _REFUSED_ARGS:
        value = getattr(args, name, None)
        if bad(value):
            raise ValueError(f"TrainingArguments({name}={value!r}): {why}")
    strategy = str(getattr(getattr(args, "hub_strategy", None), "value", getattr(args, "hub_strategy", "")))
    if getattr(args, "push_to_hub", False) and strategy in ("checkpoint", "all_checkpoints"):
        raise ValueError(f"TrainingArguments(hub_strategy={strategy!r}) with push_to_hub: it would upload the "
                         f"checkpoints' {PRIVACY_FILE}, which holds the run's secret sampler and noise state; push "
                         "the model only (hub_strategy='end' or 'every_save')")  # fmt: skip
    processes = int(getattr(args, "world_size", 1) or 1)
    gpus = int(getattr(args, "n_gpu", 0) or 0)
    if processes > 1 or gpus > 1:
        raise ValueError(f"DPTrainer runs in one process on one device (world_size={processes}, n_gpu={gpus}); "
                         "for several, use `featuredp train` under torchrun")  # fmt: skip
    if isinstance(train_dataset, IterableDataset):
        raise ValueError("train_dataset is an IterableDataset: Poisson sampling needs an indexable dataset of known "
                         "size (a map-style Dataset)")  # fmt: skip
