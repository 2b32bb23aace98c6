"""Your own training loop, made private: an Opacus-compatible :class:`PrivacyEngine` for DP-SGD and feature DP.

The idiom of Opacus 1.6, with only the import changed::

    from featuredp import PrivacyEngine

    engine = PrivacyEngine()
    model, optimizer, criterion, train_loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=train_loader, criterion=nn.CrossEntropyLoss(),
        noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost")
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    engine.get_epsilon(1e-5)

and feature DP in the same loop: ``make_private(..., feature_map=Columns(private=["sex", "race"]),
dataset=train)`` (Algorithm 1: ``method="fdp"``, the default with a feature map).

How the loop maps onto the mechanism. The returned loader draws every batch from the run's secret sampler
(Poisson at rate q = 1/len(data_loader), as Opacus's; BandMF/BLT: their cyclic samplers). The returned model
records its inputs and answers without building a graph, so no gradient can reach the parameters except through
the engine. The returned criterion gives a loss whose ``backward()`` computes the clipped sum Σ_i clip_C ∇ℓ_i
with the run's gradient strategy (ghost or vmap: every per-step check of the Trainer, the forward guard and the
separability cross-check included); ``optimizer.step()`` adds N(0, σ²C²) from the run's noise source, divides by
the expected batch size m = q·n, adds Algorithm 1's public term on an independent public batch drawn by the
engine from the loader's dataset, counts the step and applies the user's optimizer. The arithmetic is
:class:`featuredp.step.StepCore`, the same the Trainer's loop runs; the run (plan, streams, samplers, noise source,
ledger, report) is a :class:`featuredp.run.PrivateRun`, the object the Trainer's loop builds on too.

What the user's loop may not do, refused in one line (docs/own-loop.md, "What your loop may not do"): train on a
batch the returned loader did not draw (the original loader, a validation batch, a batch changed in the loop),
train twice on one draw, reload an older checkpoint to rewind ε (it is charged instead), use a collate that makes a
record's loss or gradient depend on the batch (checked on a secret subset of steps against the record collated
alone), or a sampler / ``drop_last`` the private loader would replace. Every batch the loader draws is charged as a
step when it is drawn.

What is trusted: as for the Trainer, the model code is trusted not to be adversarial; the checks catch the
accidental ways to break the bound (batch statistics, hooks, writes to the model in the forward). The loss the
user's own code reads (``loss.item()``) is the private batch's: it is not covered by ε (a warning says so once).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from featuredp._keys import Uncopyable
from featuredp._validate import check_choice
from featuredp.batches import Batch, to_device
from featuredp.clipping import trainable_parameters
from featuredp.clipping.fsdp import is_sharded
from featuredp.clipping.safety import ForwardStateGuard
from featuredp.distributed import agree_across_ranks
from featuredp.dp_wrappers import (
    DPCriterion,
    DPLoss,
    DPModule,
    DPOptimizer,
    output_transform,
)
from featuredp.errors import BudgetExceededError, PrivacyLeakWarning
from featuredp.features import PublicFeatureMap
from featuredp.hf_losses import hf_criterion
from featuredp.loss_batch import loss_batch, with_draw_columns
from featuredp.losses import LossSplit
from featuredp.methods import get_method
from featuredp.models.hf import register_hf_rules, traceable_attention
from featuredp.own_loop_checkpoints import EngineCheckpoints
from featuredp.own_loop_checks import (
    OpacusOptions,
    check_make,
    check_optimizer_holds,
    named_columns,
    strategy_of,
)
from featuredp.own_loop_forward import OneForward, ghost_of
from featuredp.own_loop_records import LoaderRecords
from featuredp.plan import PrivacyPlan, TrainResult
from featuredp.private_loader import Draws, check_loader, private_loader
from featuredp.private_output import FunctionalLoss, plain, wrap_output
from featuredp.run import PrivateRun
from featuredp.run_state import RunState, reserve, settle
from featuredp.step import clipped_loss
from featuredp.users import UserIndex, draws_per_epoch, user_keys_for, whole_users

# The wrappers live in featuredp.dp_wrappers; they are re-exported here, where users meet them.
__all__ = ["DPCriterion", "DPLoss", "DPModule", "DPOptimizer", "PlanAccountant", "PrivacyEngine"]

#: What make_private returns: (model, optimizer, data_loader), or with a ghost mode (model, optimizer, criterion,
#: data_loader), as Opacus 1.6.
Private = tuple[DPModule, DPOptimizer, DataLoader] | tuple[DPModule, DPOptimizer, DPCriterion, DataLoader]
ACCOUNTANTS = ("pld", "rdp", "prv")


class PlanAccountant:
    """What Opacus's ``engine.accountant`` offers, read from the run's plan (one source for ε): ``get_epsilon``,
    ``history`` ([(σ, q, steps)], the accounted terms) and ``len()`` (private steps so far)."""

    def __init__(self, engine: PrivacyEngine) -> None:
        self._engine = engine

    def mechanism(self) -> str:
        """The accounting backend: ``"pld"`` (dp-accounting's privacy loss distributions) or ``"rdp"``."""
        return self._engine._accountant

    def get_epsilon(self, delta: float) -> float:
        """ε(δ) of the private steps taken so far."""
        return self._engine.get_epsilon(delta)

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """[(σ, q, T)] as accounted (for BandMF/BLT the terms of their event, not the raw σ and q)."""
        state = None if self._engine._run is None else self._engine._run.state
        if state is None or state.private_steps == 0 or not state.plan.noise_multiplier:
            return []
        return [state.plan.dpsgd_terms(state.private_steps)]

    def __len__(self) -> int:
        return self._engine.steps


class PrivacyEngine(EngineCheckpoints, LoaderRecords, Uncopyable):
    """Makes a user's model, optimizer, criterion and data loader private (Opacus 1.6's surface).

    ``accountant``: ``"pld"`` (default; dp-accounting's PLD), ``"rdp"``, or ``"prv"`` (Opacus's default name:
    accounted with PLD, which agrees with the PRV accountant within 1 %). ``secure_mode=True``: noise and sampling
    from a ChaCha20 CSPRNG keyed by the OS. ``seed``: a secret seed for a reproducible research run (warned; never
    written out); the default is OS entropy. ``ledger``: a :class:`featuredp.accounting.BudgetLedger` (or its path)
    charged with the planned spend at ``make_private`` and settled at what was spent by :meth:`close` (or when the
    engine is collected). The engine and the objects it returns refuse to be pickled or copied: a copy would replay
    the run's noise.
    """

    _not_copied = ("a PrivacyEngine holds the run's secret sampler and noise state: a copy would replay its noise; "
                   "save_checkpoint() writes what a resume needs, owner-readable")

    def __init__(self, *, accountant: str = "pld", secure_mode: bool = False, seed: int | None = None,
                 ledger: Any = None) -> None:  # fmt: skip
        accountant = check_choice("accountant", accountant, ACCOUNTANTS)
        if accountant == "prv":
            warnings.warn("accountant='prv': featuredp accounts with dp-accounting's PLD, which agrees with the PRV "
                          "accountant within 1 %", UserWarning, stacklevel=2)  # fmt: skip
            accountant = "pld"
        self._accountant = accountant
        self.secure_mode = bool(secure_mode)
        self._seed = seed
        self._ledger = ledger
        self.accountant = PlanAccountant(self)
        self._run: PrivateRun | None = None
        self._draws = Draws()
        self._check_coins = np.random.default_rng()  # OS entropy: which draws and rows the record-alone check reads
        self._output_warned = False
        self._skip_next = False  # Opacus's skip-step protocol (BatchMemoryManager): the next step() only accumulates
        # check_model on the loader's own records (collated): the record-alone check on every row of its batches
        self._every_row: Batch | None = None
        self._steps_allowed: int | None = None
        self._reservation: Any = None
        self._finalizer: Any = None
        self.public_loss: float | None = None
        self._pending: dict[str, torch.Tensor] | None = None
        self._inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._output: Any = None
        self._one_forward = OneForward()  # the user's model call, captured for the clipped sum (ghost)
        self._transformers = False  # a transformers model: its per-example passes run eager attention
        self._spent: tuple[Path, str | Path | None] | None = None  # the spent-steps record kept current (checkpoints)

    # -- the Opacus surface ----------------------------------------------------------------------------------
    def make_private(
        self,
        *,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        data_loader: DataLoader,
        noise_multiplier: float,
        max_grad_norm: float,
        criterion: nn.Module | None = None,
        poisson_sampling: bool = True,
        grad_sample_mode: str = "hooks",
        clipping: str = "flat",
        noise_generator: Any = None,
        batch_first: bool = True,
        loss_reduction: str = "mean",
        wrap_model: bool = True,
        feature_map: PublicFeatureMap | None = None,
        loss_split: LossSplit | None = None,
        method: str | None = None,
        dataset: Any = None,
        feature_names: Sequence[str] | None = None,
        epochs: float | None = None,
        steps: int | None = None,
        target_delta: float | None = None,
        noise: Any = None,
        bands: int | None = None,
        alpha: float | None = None,
        public_batch_size: int | None = None,
        public_weight: float | None = None,
        record_epsilon: float | None = None,
        precision: str | None = None,
        physical_batch_size: int | str | None = None,
        relation: str | None = None,
        user_key: Any = None,
        records_per_user: int | None = None,
        num_users: int | None = None,
    ) -> Private:
        """(model, optimizer, data_loader), private, for the user's own loop; with a ghost ``grad_sample_mode``
        (model, optimizer, criterion, data_loader): exactly the tuple Opacus 1.6 returns for the same arguments.

        As Opacus: ``noise_multiplier`` σ and ``max_grad_norm`` C; the loader's batches are Poisson samples at rate
        1/len(data_loader) (``poisson_sampling=False`` is refused: the ε would answer a question the run does not
        pose); ``grad_sample_mode``: Opacus's ``"hooks"`` (default) and ``"ew"`` run featuredp's ghost strategy,
        ``"functorch"`` and featuredp's ``"vmap"`` its vmap strategy, ``"ghost"`` ghost (and returns the wrapped
        criterion), ``"ghost_fsdp"`` ghost on a module wrapped with ``fully_shard`` (under torchrun; any ghost mode
        runs such a module sharded, docs/distributed.md); ``"ghost_tp"`` and ``"no_op"`` are refused, naming the
        mode to use. The loss may come from the returned criterion or from the loop's own
        (``nn.CrossEntropyLoss()(model(x), y)``, ``F.cross_entropy``, ...): the engine recomputes it per example.
        ``criterion`` defaults to ``nn.CrossEntropyLoss()``. ``clipping`` (``"flat"`` only),
        ``noise_generator`` (refused: the noise is secret), ``batch_first`` (True only), ``loss_reduction`` (the
        criterion's own reduction is used per example) and ``wrap_model`` are Opacus's, accepted where they mean
        what featuredp does.

        featuredp's options: ``noise`` (a registered name or a noise plan, ``featuredp.noise.BandMF(bands=4)``) and
        ``bands``; ``feature_map`` (Ψ) or ``loss_split``, ``method`` (``"fdp"`` by default with a feature map, else
        ``"dpsgd"``; ``"fdp_dpsgd"``), ``alpha``, ``public_batch_size``, ``public_weight``; ``record_epsilon`` (the
        record-level backstop: Algorithm 1's public batches become Poisson-sampled, clipped, noised steps, and the
        whole run is (E, δ)-DP for whole records); ``dataset`` (a featuredp TabularDataset that names the loader's
        columns) or ``feature_names``; ``epochs`` or ``steps`` (the planned run: needed for a ledger, correlated noise
        and a target ε); ``target_delta`` (the δ the run is planned at, default 1e-5; :meth:`get_epsilon` takes its
        own); ``precision`` (``"bf16"``); ``physical_batch_size``; ``relation``. ``None`` leaves the Trainer's
        default. ``user_key``: user-level privacy (docs/users.md): one key per record of the loader's dataset (or
        the name of a column of a dataset that has ``column_names``); the loader's ``batch_size`` then counts
        users: it draws users (Poisson, at 1/⌈users/batch_size⌉), each with at most ``records_per_user`` of its
        records, and each user's summed gradient is clipped at C; ``num_users`` declares how many users there are.
        """
        opacus = OpacusOptions(clipping, noise_generator, batch_first, loss_reduction, wrap_model)
        return self._make(module=module, optimizer=optimizer, data_loader=data_loader, criterion=criterion,
                          poisson_sampling=poisson_sampling, grad_sample_mode=grad_sample_mode, opacus=opacus,
                          feature_map=feature_map, loss_split=loss_split, method=method, dataset=dataset,
                          feature_names=feature_names, epochs=epochs, steps=steps, target_delta=target_delta,
                          settings={"noise_multiplier": noise_multiplier, "max_grad_norm": max_grad_norm,
                                    "noise": noise, "bands": bands, "alpha": alpha,
                                    "public_batch_size": public_batch_size, "public_weight": public_weight,
                                    "record_epsilon": record_epsilon, "precision": precision,
                                    "physical_batch_size": physical_batch_size, "relation": relation,
                                    "records_per_user": records_per_user, "num_users": num_users},
                          user_key=user_key)  # fmt: skip

    def make_private_with_epsilon(
        self,
        *,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        data_loader: DataLoader,
        target_epsilon: float,
        target_delta: float,
        epochs: float,
        max_grad_norm: float,
        criterion: nn.Module | None = None,
        poisson_sampling: bool = True,
        grad_sample_mode: str = "hooks",
        clipping: str = "flat",
        noise_generator: Any = None,
        batch_first: bool = True,
        loss_reduction: str = "mean",
        wrap_model: bool = True,
        feature_map: PublicFeatureMap | None = None,
        loss_split: LossSplit | None = None,
        method: str | None = None,
        dataset: Any = None,
        feature_names: Sequence[str] | None = None,
        noise: Any = None,
        bands: int | None = None,
        alpha: float | None = None,
        public_batch_size: int | None = None,
        public_weight: float | None = None,
        record_epsilon: float | None = None,
        precision: str | None = None,
        physical_batch_size: int | str | None = None,
        relation: str | None = None,
        user_key: Any = None,
        records_per_user: int | None = None,
        num_users: int | None = None,
    ) -> Private:
        """As :meth:`make_private`, with σ calibrated so that ``epochs`` epochs are (``target_epsilon``,
        ``target_delta``)-DP (or FDP); a draw past them is refused (the budget stop)."""
        opacus = OpacusOptions(clipping, noise_generator, batch_first, loss_reduction, wrap_model)
        return self._make(module=module, optimizer=optimizer, data_loader=data_loader, criterion=criterion,
                          poisson_sampling=poisson_sampling, grad_sample_mode=grad_sample_mode, opacus=opacus,
                          feature_map=feature_map, loss_split=loss_split, method=method, dataset=dataset,
                          feature_names=feature_names, epochs=epochs, steps=None, target_delta=target_delta,
                          settings={"target_epsilon": target_epsilon, "max_grad_norm": max_grad_norm,
                                    "noise": noise, "bands": bands, "alpha": alpha,
                                    "public_batch_size": public_batch_size, "public_weight": public_weight,
                                    "record_epsilon": record_epsilon, "precision": precision,
                                    "physical_batch_size": physical_batch_size, "relation": relation,
                                    "records_per_user": records_per_user, "num_users": num_users},
                          user_key=user_key)  # fmt: skip

    def get_epsilon(self, delta: float) -> float:
        """ε(δ) of the private steps charged so far (every batch the loader drew; 0 before the first)."""
        return self._require_run().epsilon(delta)

    def get_replacement_epsilon(self, delta: float) -> float:
        """ε(δ) for the replace-one question (two values of one record's private part) so far."""
        state = self._require_state()
        if state.private_steps == 0:
            return 0.0
        return replace(state.plan, delta=float(delta)).replacement_epsilon(state.private_steps)

    @property
    def run(self) -> PrivateRun:
        """The run the user's loop trains (:class:`featuredp.run.PrivateRun`)."""
        return self._require_run()

    @property
    def plan(self) -> PrivacyPlan:
        """The run's privacy plan (public: everything the guarantee depends on)."""
        return self._require_state().plan

    @property
    def steps(self) -> int:
        """Private steps charged so far (every batch the private loader drew)."""
        return 0 if self._run is None or self._run.state is None else self._run.state.private_steps

    def result(self) -> TrainResult:
        """The run so far as a :class:`featuredp.plan.TrainResult`: ε, δ (with the noise sampler's tail), the
        replace-one ε, the record-level ε, the guarantee sentence and the privacy report, as ``Trainer.fit``
        returns them."""
        state, run = self._require_state(), self._require_run()
        return run.report(state, run.split, self._steps_allowed is None or state.private_steps >= self._steps_allowed)

    def close(self) -> None:
        """Settle the ledger's reservation at the private steps charged (also done when the engine is collected)."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> PrivacyEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- building the run ------------------------------------------------------------------------------------
    def _make(self, *, module: nn.Module, optimizer: torch.optim.Optimizer, data_loader: DataLoader,
              criterion: nn.Module | None, poisson_sampling: bool, grad_sample_mode: str, opacus: OpacusOptions,
              feature_map: PublicFeatureMap | None, loss_split: LossSplit | None, method: str | None, dataset: Any,
              feature_names: Sequence[str] | None, epochs: float | None, steps: int | None,
              target_delta: float | None, settings: dict[str, Any], user_key: Any = None
              ) -> Private:  # fmt: skip
        """The run on the user's loader (``settings``: the Trainer's keywords given, None left to its default)."""
        if self._run is not None:
            raise ValueError("this PrivacyEngine already made a run private: one engine is one run (build another)")
        criterion = check_make(module, optimizer, data_loader, criterion, poisson_sampling, feature_map, loss_split)
        check_optimizer_holds(module, optimizer)
        self._transformers = any(type(m).__module__.startswith("transformers.") for m in module.modules())
        if self._transformers:
            register_hf_rules()  # ghost's rule for transformers' Conv1D (GPT-2's projections)
        strategy = strategy_of(grad_sample_mode, users=user_key is not None, sharded=is_sharded(module))
        opacus.check()
        check_loader(data_loader)
        n, batches = len(data_loader.dataset), len(data_loader)  # type: ignore[arg-type]
        if n < 1 or batches < 1:
            raise ValueError(f"data_loader is empty ({n} records, {batches} batches)")
        keys = None
        if user_key is not None:  # the loader's batch_size counts users: ⌈users / batch_size⌉ draws per epoch
            keys = user_keys_for(user_key, data_loader.dataset)
            batches = draws_per_epoch(UserIndex(keys).num_users, data_loader.batch_size or 1)
        method = method or ("fdp" if feature_map is not None or loss_split is not None else "dpsgd")
        planned = steps if steps is not None else (max(1, round(float(epochs) * batches)) if epochs else None)
        run_settings: dict[str, Any] = {
            "sampling_rate": 1.0 / batches, "steps": planned or batches,
            "delta": 1e-5 if target_delta is None else target_delta,
            "strategy": strategy, "seed": self._seed, "secure_rng": self.secure_mode,
            "accountant": self._accountant, "progress": False, "lr": float(optimizer.param_groups[0].get("lr", 0.1)),
            # The correlated noise's workload: the user's SGD momentum, else the prefix sums (Adam is not linear).
            "momentum": float(optimizer.param_groups[0].get("momentum", 0.0) or 0.0)
            if isinstance(optimizer, torch.optim.SGD) else 0.0,
            **{k: v for k, v in settings.items() if v is not None},
        }  # fmt: skip
        run = PrivateRun(module, method, feature_map=feature_map, loss_split=loss_split, ledger=self._ledger,
                         user_key=user_key, **run_settings)  # fmt: skip
        if keys is not None:
            run.bind_users(keys, n)
        correlated = run.privacy.noise_plan.correlated
        if planned is None and (self._ledger is not None or correlated or "target_epsilon" in run_settings):
            raise ValueError("epochs= (or steps=) is needed to plan the run: a ledger, correlated noise and a target "
                             "epsilon all charge a planned number of steps")  # fmt: skip
        bind = dataset if dataset is not None else (named_columns(feature_names) if feature_names is not None else {})
        state, _ = run.start(bind, f"loader of {n} records ({type(data_loader.dataset).__name__})", n)
        self._run = run
        self._dataset, self._collate = data_loader.dataset, data_loader.collate_fn
        # Independent noise accounts any number of steps exactly; a calibrated or correlated plan only its own.
        self._steps_allowed = planned if (planned is not None and (correlated or state.plan.budget_steps)) else None
        if state.plan.budget_steps is not None:
            self._steps_allowed = min(self._steps_allowed or state.plan.budget_steps, state.plan.budget_steps)
        if run.dist is not None:  # every rank must hold the same plan, settings and model shapes
            agree_across_ranks(run.rank_settings(state, run.split, None, n))
        self._reservation = reserve(run.ledger, state)
        self._finalizer = weakref.finalize(self, _settle, self._reservation, state)
        self._model, self._optimizer = DPModule(module, self), DPOptimizer(optimizer, self)
        self._criterion = DPCriterion(criterion, self)
        loader = private_loader(data_loader, lambda: self._draw_indices(run, state), batches, self._drawn)
        self._per_record_collate = loader.per_record_collate
        if "ghost" in grad_sample_mode:
            return self._model, self._optimizer, self._criterion, loader
        return self._model, self._optimizer, loader

    def _require_run(self) -> PrivateRun:
        if self._run is None:
            raise ValueError("call make_private (or make_private_with_epsilon) first")
        return self._run

    def _require_state(self) -> RunState:
        state = self._require_run().state
        assert state is not None  # started in make_private
        return state

    # -- the draws (called by the private loader) ------------------------------------------------------------
    @staticmethod
    def _draw_indices(run: PrivateRun, state: RunState) -> tuple[np.ndarray, np.ndarray | None]:
        """The run's next secret draw: record indices, and their users at user level."""
        idx, groups = run.draw(state)
        return idx, None if groups is None else groups.numpy()

    def _drawn(self, indices: np.ndarray, batch: Any, groups: np.ndarray | None = None) -> None:
        """A batch the private loader drew: charged as one private step now, whether or not the loop trains on it
        (skipping a batch can only over-count), and refused past the run's budget."""
        state = self._require_state()
        if self._steps_allowed is not None and state.private_steps + 1 > self._steps_allowed:
            raise BudgetExceededError(
                f"the run's {self._steps_allowed} planned private steps are spent "
                f"(epsilon={self.get_epsilon(state.plan.delta or 1e-5):.4g}); a further batch is outside the "
                "accounted run: plan more epochs in a new run")  # fmt: skip
        last = self._draws.current
        if last is not None and last.used.any() and not last.stepped:
            raise RuntimeError("a new batch was drawn while the last one's loss.backward() has no optimizer.step(): "
                               "featuredp steps once per drawn batch, so gradients are not accumulated across "
                               "batches; to split one batch into physical chunks use "
                               "featuredp.utils.batch_memory_manager.BatchMemoryManager")  # fmt: skip
        self._pending = None
        self._skip_next = False
        self._draws.drawn(indices, batch, groups)
        self._require_run().count_private_step(state)
        if self._spent is not None:  # after a checkpoint: the record always holds what ran (a crash included)
            self._require_run().note_spent(self._spent[0], state, record=self._spent[1])

    # -- the step (called by the wrapped model, loss and optimizer) ------------------------------------------
    def _forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The user-visible forward: an output without a graph (no gradient can bypass the engine) and no write to
        the model; with ghost clipping the call is captured as the step's forward (``own_loop_forward``)."""
        self._inputs = inputs = (args, kwargs)
        with ForwardStateGuard(module, first_call=False):
            out = wrap_output(self._one_forward.forward(module, inputs, self._capturing()), self)
        self._output = out
        labels = kwargs.get("labels")
        if isinstance(labels, torch.Tensor) and getattr(out, "loss", None) is not None:
            out.loss = self._model_loss(module, out, labels)
        if not self._output_warned and self._draws.current is not None and torch.is_grad_enabled():
            self._output_warned = True
            warnings.warn("the model's outputs on a private batch are not covered by epsilon: keep them (and "
                          "anything computed from them) out of what you publish", PrivacyLeakWarning,
                          stacklevel=3)  # fmt: skip
        return out

    def _capturing(self) -> Any:
        """The ghost strategy that may capture this forward (:mod:`featuredp.own_loop_forward`), or None."""
        run = self._run
        draw = self._draws.current
        if run is None or run.split is not None or run.core.precision != "fp32" or self._transformers:
            return None
        if draw is None or draw.stepped or draw.groups is not None:
            return None
        return ghost_of(run.strategy)

    def _model_loss(self, module: nn.Module, out: Any, labels: torch.Tensor) -> DPLoss:
        """``outputs.loss`` of a Hugging Face model called with ``labels=``: the engine's loss, the model's own loss
        recomputed per example (:mod:`featuredp.hf_losses`); refused in one line where it cannot tell which."""
        criterion = hf_criterion(out, labels, getattr(module, "config", None))
        if criterion is None:
            raise TypeError(f"{type(module).__name__}(labels=...).loss: featuredp cannot recompute this model's own "
                            "loss per example; call the model without labels and compute the loss from its logits "
                            "with a torch.nn.functional loss")  # fmt: skip
        logits = out.logits
        with torch.no_grad():
            value = criterion(plain(logits), labels)
        return DPLoss(value, self, criterion, output_transform(logits, out), self._inputs, labels)

    def _loss_of(self, output: Any, target: torch.Tensor, criterion: Any) -> DPLoss:
        """A loss function called on the private model's output (the user's own criterion): the engine's loss, whose
        ``backward()`` recomputes it per example (:mod:`featuredp.private_output`). With a feature map the losses are
        the loss split's (cross-entropy): another loss function is refused rather than silently replaced."""
        run = self._require_run()
        if run.split is not None and not (isinstance(criterion, FunctionalLoss) and criterion.is_cross_entropy):
            raise TypeError(f"{criterion!r} on the private model's output: with feature_map= the losses ℓ and ℓ_pub "
                            "are the loss split's (cross-entropy); give loss_split= for another loss")  # fmt: skip
        return DPCriterion(criterion, self)(output, target)

    def _backward(self, loss: DPLoss) -> None:
        """The clipped sum of the loss's rows of the current draw (all of it, or a physical chunk of it: chunks of one
        draw add up), kept until ``optimizer.step()``."""
        state = self._require_state()
        run = self._require_run()
        if loss.inputs is None:
            raise RuntimeError("the loss was not computed from the private model's output")
        plan, record = state.plan, get_method(state.plan.method)
        batch, loss_fn = loss_batch(loss, self._require_run().split)
        draw, rows, paths = self._provenance(batch)
        if run.split is not None:
            batch, paths = with_draw_columns(batch, draw, rows, paths)
        if plan.max_grad_norm is None:
            raise ValueError("the plan has no clipping bound")
        draw.used[rows] = True
        if self._pending is None:  # the draw's first chunk (or an empty Poisson batch: zero, noised at step())
            self._pending = {k: torch.zeros_like(p) for k, p in trainable_parameters(run.model).items()}
        if len(rows) == 0:
            return
        if run.split is not None:
            draws = run.split.draws(batch, state.private_draws)
            loss_fn = clipped_loss(run.split, record, plan.public_weight)
        else:
            draws = {}
        groups = None
        if draw.groups is not None:
            batch, draws, rows, groups = whole_users(draw.groups, rows, batch, draws)
        with self._per_example():
            self._record_alone_check(draw, rows, batch, paths, loss_fn, draws)
            captured = self._one_forward.take(loss.inputs) if run.split is None and groups is None else None
            sums = run.core.clipped_sum(loss_fn, batch, draws, plan.max_grad_norm, groups=groups, captured=captured)
        for k, v in sums.items():
            self._pending[k] = self._pending[k] + v

    def _per_example(self) -> Any:
        """The context of a per-example pass: a transformers model's attention in plain tensor operations
        (:func:`traceable_attention`)."""
        return traceable_attention(self._require_run().model) if self._transformers else contextlib.nullcontext()

    def _step(self, inner: torch.optim.Optimizer, closure: Any = None) -> Any:
        """Noise, Algorithm 1's public term (record-level noised with the backstop), then the user's optimizer step.
        The step was charged when its batch was drawn."""
        state = self._require_state()
        run = self._require_run()
        sums = self._pending
        draw = self._draws.current
        if draw is not None and draw.stepped:
            raise RuntimeError("optimizer.step() was already called for this batch: one step per drawn batch")
        if sums is None and draw is not None and draw.size == 0:
            # An empty Poisson batch has nothing to call backward() on (many models refuse zero rows): its step is
            # the noise alone.
            sums = {k: torch.zeros_like(p) for k, p in trainable_parameters(run.model).items()}
        if sums is None or draw is None:
            raise RuntimeError("optimizer.step() without loss.backward() on the private criterion's loss of the "
                               "private loader's last batch")  # fmt: skip
        if self._skip_next:  # BatchMemoryManager: a physical chunk, not the logical batch's last
            self._skip_next = False
            return None
        if not draw.used.all():
            # No counts in the message: the realised Poisson batch size is private.
            raise RuntimeError("optimizer.step() with records of the drawn batch in no loss.backward(): a chunk of the "
                               "batch is missing (each drawn batch is one step, all its records in it)")  # fmt: skip
        check_optimizer_holds(run.model, inner)
        self._pending = None
        self._one_forward.clear()
        draw.stepped = True
        shown: dict[str, float] = {}
        with self._per_example():  # the backstop's record-level steps clip per example too
            grads = run.release(state, run.split, sums, self._fetch_public, shown)
        if "public_loss" in shown:
            self.public_loss = shown["public_loss"]
        for k, p in trainable_parameters(run.model).items():
            p.grad = grads[k].detach().to(p.dtype)
        out = inner.step(closure) if closure is not None else inner.step()
        inner.zero_grad(set_to_none=True)
        return out

    def _fetch_public(self, idx: np.ndarray) -> Batch:
        """Algorithm 1's public batch (and the backstop's), read by the engine from the loader's dataset."""
        return to_device(self._public_batch(idx), self._require_run().device)

def _settle(reservation: Any, state: RunState) -> None:
    settle(reservation, state.plan, state.private_steps)
