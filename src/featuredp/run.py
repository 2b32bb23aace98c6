"""The run: one private training run as a public object, which every training loop builds on.

A :class:`PrivateRun` owns what the guarantee depends on: the plan (σ, C, q, T, Ψ, the noise plan; calibrated and
checked here), the secret streams, the samplers, the noise source (in its :class:`featuredp.run_state.RunState`), the
step's arithmetic (:class:`featuredp.step.StepCore`: clipping with the run's strategy and its checks, noise, Algorithm
1's public term, the record-level backstop), the ledger reservation and the report (ε for both questions, the
guarantee sentence). Loops are thin users of it: :class:`featuredp.engine.Trainer` (featuredp's own loop) and
:class:`featuredp.privacy_engine.PrivacyEngine` (the user's loop, Opacus's surface) ask it for the same releases,
so what a step releases is computed in one place whichever loop samples the batch and applies the update.

It also serves a user who wants one step and no wrapping::

    run = PrivateRun(model, "dpsgd", noise_multiplier=1.0, max_grad_norm=1.0, batch_size=64, steps=100, delta=1e-5)
    run.open(data)                    # binds Ψ, makes the plan and the secret streams
    grads = run.noisy_gradient()      # a Poisson batch from data, clipped, noised, counted
    run.epsilon()                     # ε of the private steps released so far
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from featuredp._io import atomic_write_json
from featuredp._validate import check_choice
from featuredp.accounting import BudgetLedger
from featuredp.batches import as_batch, gather, resolve_device, to_device
from featuredp.clipping import (
    DEFAULT_STRATEGY,
    GhostGradients,
    GradientStrategy,
    VmapGradients,
    check_no_batch_mixing,
    get_strategy,
    trainable_parameters,
)
from featuredp.clipping.auto import STAND_IN_ROWS, AutoStrategy
from featuredp.clipping.base import check_precision
from featuredp.clipping.fsdp import check_meshes, is_sharded
from featuredp.config import PerformanceConfig, PrivacyConfig, ScheduleConfig, resolve_config, split_settings
from featuredp.distributed import (
    DistContext,
    broadcast_parameters,
    context,
    load_rank_checkpoint,
    model_device,
    on_main_rank,
    rank_checkpoint_path,
)
from featuredp.errors import (
    BudgetExceededError,
    DataValidationError,
    PrivacyLeakWarning,
    warn_record_level_statistics,
)
from featuredp.features import Batch, PublicFeatureMap
from featuredp.losses import LabelDPSplit, LossSplit, default_split
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS, Method, get_method
from featuredp.noise import Independent
from featuredp.plan import PrivacyPlan, TrainResult, inf_to_str
from featuredp.run_plan import PUBLIC_BATCH_FACTOR, run_plan
from featuredp.run_report import run_result
from featuredp.run_state import ModelRuns, RunState, data_fingerprint, open_ledger, reserve
from featuredp.sampling import warn_private_seed
from featuredp.sharded_checkpoint import load_shards, save_checkpoint_files
from featuredp.sharding import shard_model
from featuredp.step import StepCore, noised_coordinates
from featuredp.users import UserIndex

__all__ = ["PUBLIC_BATCH_FACTOR", "SPENT_SUFFIX", "Fetch", "PrivateRun"]

#: ``fetch(indices)``: the records at ``indices`` as a batch (a loop's way to read its data by index)
Fetch = Callable[[np.ndarray], Batch]

def _read_spent(record: Path) -> dict[str, int]:
    """The spent-steps record (run token → private steps run); empty when there is none."""
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"{record}: the spent-steps record cannot be read ({exc}); it is what keeps a resumed "
                         "run's epsilon from going back: restore it or start a new run") from exc  # fmt: skip
    return {str(k): int(v) for k, v in data.items()}


# Every private run applied to each model object in this process (rule 7).
MODEL_RUNS = ModelRuns()

#: the spent-steps record beside a checkpoint ``X`` is ``X`` + this suffix (:meth:`PrivateRun.note_spent`)
SPENT_SUFFIX = ".spent.json"


class PrivateRun:
    """One private run of one method on one model: the plan, the secret streams and samplers, the noise source,
    the step's arithmetic and checks, the ledger and the report (the module docstring has the picture).

    Settings as for :class:`featuredp.engine.Trainer` (three configs, or flat keywords sorted into them). A run
    is started once, on one dataset (:meth:`start`, or :meth:`open` for a dict of tensors or a TabularDataset);
    its private steps are counted in ``state.private_steps``, which never goes down.
    """

    def __init__(
        self,
        model: nn.Module,
        method: str = "fdp",
        *,
        feature_map: PublicFeatureMap | None = None,
        loss_split: LossSplit | None = None,
        privacy: PrivacyConfig | None = None,
        schedule: ScheduleConfig | None = None,
        performance: PerformanceConfig | None = None,
        ledger: BudgetLedger | str | Path | None = None,
        user_key: Any = None,
        **settings: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.method = check_choice("method", method, METHOD_NAMES)
        flat = split_settings(settings)
        self.privacy: PrivacyConfig = resolve_config(PrivacyConfig, "privacy", privacy, flat)
        self.schedule: ScheduleConfig = resolve_config(ScheduleConfig, "schedule", schedule, flat)
        self.performance: PerformanceConfig = resolve_config(PerformanceConfig, "performance", performance, flat)
        self._check_settings(feature_map, loss_split)
        #: the privacy unit's key (None: records); bound to the data by :meth:`bind_users`
        self.user_key = user_key
        self.users: UserIndex | None = None
        self._check_user_settings()
        self.device = model_device(model) if self.performance.device is None else resolve_device(
            self.performance.device)
        self.model = model.to(self.device)
        check_precision(self.performance.precision, self.device)
        # torchrun (or the user's own process group): a data-parallel run of the same mechanism.
        self.dist: DistContext | None = context(self.device, mode=self.performance.distributed)
        if self.dist is not None and self.privacy.record_epsilon is not None:
            raise ValueError("record_epsilon (the record-level backstop) is not supported in data-parallel runs "
                             "(torchrun) yet; run on one process")  # fmt: skip
        #: FSDP2: the model is (or is now) sharded with fully_shard (featuredp.sharding, docs/distributed.md)
        self.sharded = is_sharded(self.model) or self.performance.sharding == "fsdp"
        if self.dist is not None and not is_sharded(self.model):
            broadcast_parameters(self.model)  # before sharding: every shard comes from one initialisation
        if self.sharded:
            self._check_sharding(user_key)
            shard_model(self.model)
            check_meshes(trainable_parameters(self.model))
        self.feature_map = loss_split.feature_map if loss_split is not None else feature_map
        self.loss_split = loss_split
        chosen = self.performance.strategy
        if chosen is None and self.sharded:
            chosen = "ghost"  # the only strategy that runs through FSDP's hooks (clipping/fsdp.py)
        if chosen is None:  # a user's gradient is a sum of its records': the per-record (vmap) path forms it
            # auto times both strategies on its own process: a data-parallel run keeps the fixed default
            chosen = "vmap" if user_key is not None else DEFAULT_STRATEGY if self.dist is not None else "auto"
        self.strategy: GradientStrategy = get_strategy(chosen, physical_batch_size=self.performance.physical_batch_size)
        if self.dist is not None and user_key is not None:
            raise ValueError("user_key= (user-level privacy) is not supported in data-parallel runs yet; run on one "
                             "process")  # fmt: skip
        if self.dist is not None and isinstance(self.strategy, AutoStrategy):
            raise ValueError("strategy='auto' times ghost and vmap on each process, which could choose differently; "
                             "in a data-parallel run give strategy='ghost' or strategy='vmap'")  # fmt: skip
        if user_key is not None and not isinstance(self.strategy, VmapGradients):
            raise ValueError(f"strategy={self.strategy.name!r} clips each record's gradient; user-level clipping "
                             "(user_key=) sums a user's records first and needs strategy='vmap' "
                             "(grad_sample_mode='functorch'), the default with a user key")  # fmt: skip
        if self.sharded and not isinstance(self.strategy, GhostGradients):
            raise ValueError(f"strategy={self.strategy.name!r} on a sharded (FSDP) model: only strategy='ghost' runs "
                             "through FSDP's hooks (and vmap's per-example gradients are each the whole model's "
                             "size); give strategy='ghost', the same clipped sums")  # fmt: skip
        self.ledger = open_ledger(ledger)
        self.plan: PrivacyPlan | None = None
        self.last_result: TrainResult | None = None
        self.state: RunState | None = None
        self.split: LossSplit | None = None
        # The step's arithmetic (featuredp.step), the same for every loop built on the run.
        self.core = StepCore(self.model, self.strategy, precision=self.performance.precision, device=self.device,
                              dist=self.dist)  # fmt: skip

    def _check_settings(self, feature_map: PublicFeatureMap | None, loss_split: LossSplit | None) -> None:
        """One-line refusals of settings that cannot make a run, before any work."""
        record = get_method(self.method)
        if loss_split is not None and not isinstance(loss_split, LossSplit):
            raise TypeError(f"loss_split must be a LossSplit, got {type(loss_split).__name__}")
        if feature_map is not None and not isinstance(feature_map, PublicFeatureMap):
            raise TypeError(f"feature_map must be a PublicFeatureMap, got {type(feature_map).__name__}")
        if loss_split is not None and feature_map is not None and loss_split.feature_map is not feature_map:
            raise ValueError("give feature_map or loss_split (which carries its own feature map), not two different")
        if record.needs_feature_map and loss_split is None and feature_map is None:
            raise ValueError(f"method {self.method!r} needs a public feature map: pass feature_map= or loss_split=")
        if self.schedule.pretrain_epochs and not record.pretrains:
            able = [m for m in METHOD_NAMES if get_method(m).pretrains]
            raise ValueError(f"pretrain_epochs is for methods {able}, got method={self.method!r}")
        if record.private and self.privacy.noise_multiplier is None and self.privacy.target_epsilon is None:
            raise ValueError(f"method {self.method!r} needs noise_multiplier= or target_epsilon= (with delta=)")
        if record.private and self.privacy.delta is None:
            raise ValueError(f"method {self.method!r} needs delta=")
        if self.privacy.noise_plan != Independent() and not record.private:
            raise ValueError(f"noise={self.privacy.noise_plan.kind!r} is for the private methods "
                             f"{list(PRIVATE_METHODS)}, got "
                             f"method={self.method!r}")  # fmt: skip
        if self.privacy.record_epsilon is not None and not (record.private or record.public_steps):
            raise ValueError(f"record_epsilon (the record-level backstop) is for methods that read a record with "
                             f"noise or Ψ, not method={self.method!r} (no privacy at all)")  # fmt: skip
        if self.privacy.seed is not None and record.private:
            warn_private_seed("seed", self.privacy.seed)  # public_seed= fixes only the public randomness

    def _check_sharding(self, user_key: Any) -> None:
        """One-line refusals of what a sharded (FSDP) run does not do, before any work."""
        if user_key is not None:
            raise ValueError("user_key= (user-level privacy) is not supported with sharding='fsdp' (user-level "
                             "clipping needs strategy='vmap'); run unsharded")  # fmt: skip
        if self.privacy.record_epsilon is not None:
            raise ValueError("record_epsilon (the record-level backstop) is not supported with sharding='fsdp'")
        if self.privacy.noise_plan != Independent():
            raise ValueError(f"noise={self.privacy.noise_plan.kind!r} with sharding='fsdp': correlated noise keeps "
                             "buffers of the full model's size; use noise='independent'")  # fmt: skip
        if self.schedule.projection_radius is not None:
            raise ValueError("projection_radius with sharding='fsdp' is not supported yet (the projection's norm is "
                             "over every shard); leave it out")  # fmt: skip
        if self.schedule.averaging is not None:
            raise ValueError(f"averaging={self.schedule.averaging!r} with sharding='fsdp' is not supported yet (its "
                             "averages are not sharded in checkpoints); leave averaging out")  # fmt: skip
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise ValueError("sharding='fsdp' needs torch.distributed: launch with torchrun (or initialise a process "
                             "group)")  # fmt: skip

    def _check_user_settings(self) -> None:
        """One-line refusals of user-level settings, before any work."""
        if self.user_key is None:
            for name in ("records_per_user", "num_users"):
                cfg = self.privacy if name == "records_per_user" else self.schedule
                if getattr(cfg, name) is not None:
                    raise ValueError(f"{name}={getattr(cfg, name)!r} is for user-level privacy: give user_key= too")

    def bind_users(self, keys: Any, records: int) -> UserIndex:
        """The run's users: ``keys`` (one per record, ``records`` of them) as a :class:`featuredp.users.UserIndex`.
        The number of users is a count of the private keys: declared (``num_users=``), checked, or warned about."""
        index = UserIndex(keys, records_per_user=self.privacy.records_per_user)
        if index.num_records != records:
            raise DataValidationError(f"user_key gives {index.num_records} keys for {records} records; give one key "
                                      "per record")  # fmt: skip
        declared = self.schedule.num_users
        if declared is not None and declared != index.num_users:
            raise DataValidationError(f"num_users={declared} was declared but the user keys name {index.num_users} "
                                      "users")  # fmt: skip
        if declared is None:
            warnings.warn(f"the number of users ({index.num_users}) was counted from the private user keys; declare "
                          f"num_users={index.num_users} (--num-users) when that count is public",
                          PrivacyLeakWarning, stacklevel=4)  # fmt: skip
        self.users = index
        return index

    # -- configuration ---------------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The run's settings (JSON-able; no data, no RNG state, never the seed) for run.json."""
        p, s = self.privacy, self.schedule
        return {
            "method": self.method,
            "epochs": s.epochs,
            "steps": s.steps,
            "batch_size": s.batch_size,
            "sampling_rate": s.sampling_rate,
            "public_batch_size": s.public_batch_size,
            "pretrain_epochs": s.pretrain_epochs,
            "pretrain_batch_size": s.pretrain_batch_size,
            "noise_multiplier": p.noise_multiplier,
            "target_epsilon": p.target_epsilon,
            "delta": p.delta,
            "max_grad_norm": inf_to_str(p.max_grad_norm),
            "alpha": p.alpha,
            "public_weight": p.public_weight,
            "optimizer": s.optimizer,
            "lr": s.lr,
            "pretrain_lr": s.pretrain_lr,
            "momentum": s.momentum,
            "weight_decay": s.weight_decay,
            "projection_radius": s.projection_radius,
            "averaging": s.averaging,
            "average_fraction": s.average_fraction,
            "ema_decay": s.ema_decay,
            "strategy": self.strategy.name,
            "relation": p.relation,
            "accountant": p.accountant,
            # Never the seed itself: with it anyone could replay the noise.
            "seeded": p.seed is not None,
            "public_seed": p.public_seed,
            "secure_rng": p.secure_rng,
            "noise": p.noise_plan.kind,
            "record_epsilon": p.record_epsilon,
            # The unit, never the keys (often names): a column's name at most.
            "unit": "record" if self.user_key is None else "user",
            "user_key": self.user_key if isinstance(self.user_key, str) else (
                None if self.user_key is None else "<one key per record>"),
            "records_per_user": p.records_per_user,
            # BandMF's bands as run (the plan's: chosen there when not given), None for independent noise.
            "bands": (self.plan.noise if self.plan is not None else p.noise_plan).settings().get("bands"),
            "device": str(self.device),
            "world_size": 1 if self.dist is None else self.dist.world_size,
            "sharding": "fsdp" if self.sharded else "none",
            "precision": self.performance.precision,
        }

    def make_plan(self, n: int) -> PrivacyPlan:
        """The privacy plan for a dataset of ``n`` records (calibrates σ when only a target is given). With users
        bound (:meth:`bind_users`) the plan counts users: its size, batch and rate are the users'
        (:func:`featuredp.run_plan.run_plan`)."""
        return run_plan(self.method, self.privacy, self.schedule, n, users=self.users,
                        noised=noised_coordinates(self.model))  # fmt: skip

    # -- starting ------------------------------------------------------------------------------------------------
    def start(self, data: Any, data_print: str, n: int, *, shard: int | None = None, stacklevel: int = 4
              ) -> tuple[RunState, LossSplit | None]:  # fmt: skip
        """A new run on ``n`` records: Ψ bound to ``data`` (a TabularDataset, or a dict that binds nothing), the
        plan, the model's checks and a fresh :class:`RunState` (secret streams, samplers, noise source). The
        loops built on the run start here (``data_print``: :func:`featuredp.run_state.data_fingerprint` of the data,
        or a description of a loader's)."""
        split = self._resolve_split(data)
        if self.schedule.pretrain_epochs and isinstance(split, LabelDPSplit):
            warnings.warn(
                "public pre-training with LabelDPSplit minimises logsumexp(logits) alone, which has no minimiser "
                "and only pushes the logits down; use pretrain_epochs=0 for a private label",
                UserWarning,
                stacklevel=3,
            )
        if self.user_key is not None and self.users is None:
            raise ValueError("a user-level run binds its users before it starts (PrivateRun.bind_users)")
        if self.user_key is not None and shard is not None:
            raise ValueError("user_key= (user-level privacy) with sharded data is not supported yet: a user's records "
                             "must all be in one process")  # fmt: skip
        plan = self.make_plan(n)
        self.plan = plan
        if isinstance(self.strategy, AutoStrategy):  # its stand-in batch: the expected batch (public), not a draw's
            self.strategy.rows = max(1, min(STAND_IN_ROWS, round(plan.expected_batch_size)))
        if plan.is_private:
            check_no_batch_mixing(self.model)
        record = get_method(plan.method)
        if record.private and not record.needs_feature_map:  # record-level DP (dpsgd)
            warn_record_level_statistics(data, "dpsgd", stacklevel=stacklevel)
        elif plan.record_noise_multiplier is not None:  # the backstop's record-level guarantee excludes them too
            warn_record_level_statistics(data, "the record-level backstop (record_epsilon)", stacklevel=stacklevel)
        rank, world = (0, 1) if self.dist is None else (self.dist.rank, self.dist.world_size)
        state = RunState.start(
            plan, {"data": data_print, "psi": self._psi_fingerprint(split)},
            params=list(trainable_parameters(self.model).values()), privacy=self.privacy, schedule=self.schedule,
            device=self.device, rank=rank, world_size=world, shard_size=shard,
            prefetch_noise=self.performance.prefetch_noise, sharded=self.sharded,
        )  # fmt: skip
        self.state, self.split = state, split
        MODEL_RUNS.warn_if_trained_before(self.model, state)
        return state, split
    # -- data-parallel bookkeeping (featuredp.distributed) ----------------------------------------------------
    def rank_settings(self, state: RunState, split: LossSplit | None, shard: int | None, n: int) -> dict[str, Any]:
        """What every rank must hold alike (ARCHITECTURE rule 15): the plan, the settings that shape a step, the
        model's trainable shapes, and the data's size (a digest of the data's fingerprint for unsharded runs,
        where every rank holds the whole dataset). Public quantities only, apart from that digest of a digest."""
        plan = state.plan
        settings: dict[str, Any] = {f"plan.{k}": v for k, v in plan.to_dict().items()}
        settings.update({
            "psi_and_loss_split": state.fingerprint["psi"],
            "loss_split": None if split is None else json.dumps(split.describe(), sort_keys=True, default=str),
            "precision": self.performance.precision,
            "strategy": self.strategy.name,
            "secure_rng": self.privacy.secure_rng,
            "optimizer": json.dumps({k: getattr(self.schedule, k) for k in (
                "optimizer", "lr", "pretrain_lr", "momentum", "weight_decay", "projection_radius")}),
            "trainable_parameters": [(k, tuple(p.shape)) for k, p in trainable_parameters(self.model).items()],
            "dataset_size": n,
        })  # fmt: skip
        if shard is None:  # every rank holds the whole dataset: the same one
            settings["data"] = hashlib.sha256(state.fingerprint["data"].encode()).hexdigest()
        return settings

    def reserve(self, state: RunState) -> Any:
        """The ledger reservation, made by rank 0 alone; every rank learns whether it was refused."""
        return on_main_rank(self.dist, lambda: reserve(self.ledger, state))

    def save_checkpoint(self, path: str | Path, state: RunState) -> None:
        """Write the checkpoint, owner-readable only (0600): one process's state, or each rank its own file; and
        the spent-steps record beside it (:meth:`note_spent`)."""
        # The strategy auto chose (public: a name) rides along, so a resume runs it without timing again.
        sharded = is_sharded(self.model)  # then the weights and moments go to a DCP folder the rank files name
        payload = {**state.state_dict(None if sharded else self.model, optimizers=not sharded),
                   "strategy": self.strategy.name}  # fmt: skip
        save_checkpoint_files(self.dist, path, payload, self.model, state.optimizers())
        self.note_spent(path, state)

    def load_checkpoint_state(self, path: str | Path) -> dict[str, Any] | None:
        """This process's checkpoint state (None: none to resume from); another number of processes is refused."""
        return load_rank_checkpoint(self.dist, path)

    def _spent_path(self, path: str | Path) -> Path:
        mine = Path(path) if self.dist is None else Path(rank_checkpoint_path(path, self.dist.rank))
        return mine.with_name(mine.name + SPENT_SUFFIX)

    def note_spent(self, path: str | Path, state: RunState, *, record: str | Path | None = None) -> None:
        """Record, beside the checkpoint ``path`` (or in ``record``, one file for all of a run's checkpoints), the
        private steps this run has charged: the most any process of it has run. A later resume from an older copy
        of the checkpoint is charged up to it (:meth:`resume`)."""
        record = self._spent_path(path) if record is None else Path(record)
        spent = _read_spent(record)
        if spent.get(state.run_token, -1) < state.private_steps:
            spent[state.run_token] = state.private_steps
            atomic_write_json(record, spent)

    def resume(self, path: str | Path, saved: dict[str, Any], state: RunState, *, record: str | Path | None = None
               ) -> None:  # fmt: skip
        """Load the checkpoint state ``saved`` (read from ``path``) into ``state``, charging every private step the
        run already ran (the spent-steps record beside ``path``, or ``record``): the count never goes down, whichever
        copy of the checkpoint is resumed. A correlated-noise run, accounted for its planned participations once
        each, refuses a rewind."""
        state.load_state_dict(saved, self.model)
        if "shards" in saved:
            load_shards(path, saved.get("shards"), self.model, state.optimizers())
        if isinstance(self.strategy, AutoStrategy):
            self.strategy.resume_choice(saved.get("strategy"))
        spent = _read_spent(self._spent_path(path) if record is None else Path(record)).get(state.run_token, 0)
        if spent > state.private_steps:
            if state.plan.noise.correlated:
                raise ValueError(f"{path} holds private step {state.private_steps} of a correlated-noise run that has "
                                 f"run {spent}: its accounting covers each planned participation once, so it cannot "
                                 "rewind; resume from its latest checkpoint")  # fmt: skip
            warnings.warn(f"{path} is older than the run ({state.private_steps} of the {spent} private steps it has "
                          f"run): all {spent} stay charged (epsilon and the budget count them)", UserWarning,
                          stacklevel=4)  # fmt: skip
            state.private_steps = spent

    def report(self, state: RunState, split: LossSplit | None, finished: bool) -> TrainResult:
        """The run so far as a TrainResult (ε, δ with the sampler's tail, the guarantee, the privacy report)."""
        self.last_result = run_result(state, split, finished, method=self.method, feature_map=self.feature_map,
                                 privacy=self.privacy, model=self.model,
                                 composed=MODEL_RUNS.composed_epsilon(self.model, state))  # fmt: skip
        return self.last_result

    def _psi_fingerprint(self, split: LossSplit | None) -> str:
        """A digest of Ψ and the loss split as declared (public; a resume must use the same ones)."""
        desc = {
            "feature_map": None if self.feature_map is None else self.feature_map.describe().to_dict(),
            "loss_split": None if split is None else split.describe(),
        }
        return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()

    def _resolve_split(self, data: Any) -> LossSplit | None:
        """Bind Ψ and the split to the data (a dict of tensors has no column names: maps bind to nothing)."""
        if self.feature_map is None:
            return None
        tabular = not isinstance(data, dict)
        if self.loss_split is None:
            if tabular:
                self.feature_map.bind(data)  # the default split depends on whether the label is private
            self.loss_split = default_split(self.feature_map)
        if tabular:
            self.loss_split.bind(data)
        return self.loss_split

    # -- one step without a loop ---------------------------------------------------------------------------------
    def open(self, data: Any) -> PrivateRun:
        """Start the run on ``data`` (a TabularDataset or a dict of batch-first tensors): Ψ bound, the plan made,
        the secret streams drawn. Returns the run."""
        if self.state is not None:
            raise ValueError("this run is already open: one run is one dataset (build another PrivateRun)")
        batch = as_batch(data)
        n = int(next(iter(batch.values())).shape[0])
        self.start(data, data_fingerprint(batch), n, stacklevel=4)
        self._data = to_device(batch, self.device)
        return self

    def noisy_gradient(self) -> dict[str, torch.Tensor]:
        """One private step's released gradient, not applied: a Poisson batch drawn from the open data by the run's
        secret sampler, Σ clip_C ∇ℓ_x + N(0, σ²C²) over the expected batch size, Algorithm 1's public term; the step
        is counted (and refused past a calibrated run's budget) before the gradient is returned."""
        state = self.state
        if state is None or getattr(self, "_data", None) is None:
            raise ValueError("call open(data) before noisy_gradient()")
        record = get_method(self.method)
        if not record.private:
            raise ValueError(f"noisy_gradient is a private step; method={self.method!r} has none")
        self.check_budget(state)
        data = self._data

        def fetch(idx: np.ndarray) -> Batch:
            return gather(data, idx)

        private = self.private_gradient(state, self.split, fetch, record)
        grads = self.with_public_term(state, self.split, private, fetch, {})
        self.count_private_step(state)
        return grads

    def check_budget(self, state: RunState) -> None:
        """Refuse a private step past the run's calibrated budget (a target ε) or a correlated plan's steps."""
        plan = state.plan
        limit = plan.budget_steps if plan.budget_steps is not None else (plan.steps if plan.noise.correlated else None)
        if limit is not None and state.private_steps + 1 > limit:
            raise BudgetExceededError(
                f"the run's {limit} accounted private steps are spent (epsilon={self.epsilon():.4g}); a further step "
                "is outside the accounted run: plan more steps in a new run")

    def epsilon(self, delta: float | None = None) -> float:
        """ε(δ) (add/remove) of the private steps counted so far (δ: the plan's by default)."""
        state = self.state
        if state is None or state.private_steps == 0:
            return 0.0
        plan = state.plan if delta is None else replace(state.plan, delta=float(delta))
        return plan.epsilon(state.private_steps)

    # -- the step's parts: what is released, whichever loop samples the batch and applies the update ------------
    def public_term(self, state: RunState, split: LossSplit, fetch: Fetch, shown: dict[str, float]
                    ) -> Callable[[], dict[str, torch.Tensor]]:  # fmt: skip
        """Algorithm 1's independent public batch, as a closure: its own sampler stream and its own draws
        generator; ``fetch(indices)`` returns those records. It reads Ψ(S) only, so w scales a public quantity and no
        FDP event depends on it. With the record-level backstop it is a record-level DP step instead
        (:meth:`record_gradient`), whichever loop asks."""

        def gradient() -> dict[str, torch.Tensor]:
            if state.plan.record_noise_multiplier is not None:  # the backstop: a record-level DP public batch
                return self.record_gradient(state, split, fetch, pre=False)
            bp = fetch(state.public_sampler.sample())
            gp, shown["public_loss"] = self.core.public_gradient(state, split, bp, self.public_total(state.plan))
            return gp

        return gradient

    def private_gradient(self, state: RunState, split: LossSplit | None, fetch: Fetch, record: Method
                         ) -> dict[str, torch.Tensor]:  # fmt: skip
        """(Σ_{i∈B} clip_C ∇ℓ_x(θ; x_i) + N(0, σ²C²)) / m for a Poisson batch B drawn by the run's secret sampler
        (ℓ_x = the method's clipped loss). At user level B is a Poisson draw of users, each user's summed gradient
        clipped as one (:meth:`draw`)."""
        idx, groups = self.draw(state)
        return self.core.private_gradient(state, split, fetch(idx), record, groups=groups)

    def draw(self, state: RunState) -> tuple[np.ndarray, torch.Tensor | None]:
        """One secret Poisson draw: record indices, and (at user level) each record's group, 0 .. U_B − 1. Users
        are drawn by the private sampler; each gives its records (at most ``records_per_user``, a subset chosen from
        the same secret stream)."""
        drawn = state.private_sampler.sample()
        if self.users is None:
            return drawn, None
        idx, groups = self.users.expand(drawn, state.private_sampler.generator)
        return idx, torch.from_numpy(groups)

    def record_gradient(self, state: RunState, split: LossSplit, fetch: Fetch, *, pre: bool) -> dict[str, torch.Tensor]:
        """The backstop's public step: (Σ_{i∈B'} clip_C ∇ℓ_pub(θ; x_i) + N(0, σ_pub²C²)) / (q'·n) on a Poisson batch
        B' at rate q' (m'/n, or m_pre/n in pre-training) drawn from the secret ``record_sampling`` stream.

        It shows no public loss: the batch's members are secret now, and its mean loss is not noised."""
        sampler = state.record_pretrain_sampler if pre else state.record_sampler
        if sampler is None:
            raise ValueError("the record-level backstop needs its sampler in the run state")
        drawn = sampler.sample()
        if self.users is None:
            return self.core.record_gradient(state, split, fetch(drawn), sampler.expected_batch_size)
        # At user level the backstop covers whole users too: its batch is a Poisson draw of users (its own secret
        # coins), each user's ℓ_pub gradients summed and clipped as one.
        idx, groups = self.users.expand(drawn, sampler.generator)
        return self.core.record_gradient(state, split, fetch(idx), sampler.expected_batch_size,
                                         groups=torch.from_numpy(groups))  # fmt: skip

    def release(self, state: RunState, split: LossSplit | None, sums: dict[str, torch.Tensor], fetch: Fetch,
                shown: dict[str, float]) -> dict[str, torch.Tensor]:  # fmt: skip
        """What one private step releases from the clipped sum ``sums`` of its Poisson batch: (``sums`` +
        N(0, σ²C²)) / m, with Algorithm 1's public term (:meth:`with_public_term`). A loop that computes the
        clipped sum itself (the PrivacyEngine's) releases through here."""
        return self.with_public_term(state, split, self.core.noisy_mean(state.plan, state.noise, sums), fetch, shown)

    def with_public_term(self, state: RunState, split: LossSplit | None, private: dict[str, torch.Tensor],
                         fetch: Fetch, shown: dict[str, float]) -> dict[str, torch.Tensor]:  # fmt: skip
        """Algorithm 1's g = w·g_pub + α·g_priv for the noisy mean ``private`` (itself for methods without a public
        batch), g_pub from the public batch ``fetch`` returns: a record-level DP step with the backstop."""
        plan = state.plan
        if not get_method(plan.method).public_batch:
            return private
        if plan.public_weight == 0:
            return self.core.combine(plan, private, None)
        if split is None:
            raise ValueError(f"method {plan.method!r} needs a public feature map")
        return self.core.combine(plan, private, self.public_term(state, split, fetch, shown))

    def count_private_step(self, state: RunState) -> None:
        """Count one private step, before its update reaches the model: an interrupt from here on leaves at most
        one step counted and not applied (the safe side), never a noisy update the accountant and ledger miss."""
        state.private_steps += 1

    def public_total(self, plan: PrivacyPlan) -> int:
        """m': the public batch's divisor (its size; m when the plan has none)."""
        return plan.public_batch_size or max(1, round(plan.expected_batch_size))
