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
ledger) is a :class:`featuredp.engine.Trainer`'s, so both loops are one engine.

What is trusted: as for the Trainer, the model code is trusted not to be adversarial; the checks catch the
accidental ways to break the bound (batch statistics, hooks, writes to the model in the forward). The loss the
user's own code reads (``loss.item()``) is the private batch's: it is not covered by ε (a warning says so once).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from featuredp._io import atomic_save_torch, load_torch_safely
from featuredp._keys import Uncopyable
from featuredp._validate import check_choice
from featuredp.batches import Batch, as_batch, gather, to_device
from featuredp.clipping import trainable_parameters
from featuredp.clipping.safety import ForwardStateGuard
from featuredp.distributed import agree_across_ranks
from featuredp.dp_wrappers import (
    DPCriterion,
    DPLoss,
    DPModule,
    DPOptimizer,
    PerExampleLoss,
    private_loader,
    unwrap,
)
from featuredp.engine import Trainer
from featuredp.errors import BudgetExceededError
from featuredp.losses import LossSplit
from featuredp.methods import get_method
from featuredp.plan import PrivacyPlan, TrainResult
from featuredp.run_state import RunState, reserve, settle
from featuredp.step import clipped_loss
from featuredp.testing.replay import replay_engine_step

# The wrappers live in featuredp.dp_wrappers; they are re-exported here, where users meet them.
__all__ = ["DPCriterion", "DPLoss", "DPModule", "DPOptimizer", "PlanAccountant", "PrivacyEngine"]

GRAD_SAMPLE_MODES = ("ghost", "vmap")
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
        state = self._engine._state
        if state is None or state.private_steps == 0 or not state.plan.noise_multiplier:
            return []
        return [state.plan.dpsgd_terms(state.private_steps)]

    def __len__(self) -> int:
        state = self._engine._state
        return 0 if state is None else state.private_steps


class PrivacyEngine(Uncopyable):
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
        self._trainer: Any = None
        self._state: RunState | None = None
        self._split: LossSplit | None = None
        self._steps_allowed: int | None = None
        self._reservation: Any = None
        self._finalizer: Any = None
        self.public_loss: float | None = None
        self._pending: dict[str, torch.Tensor] | None = None
        self._inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._output: Any = None

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
        grad_sample_mode: str = "ghost",
        **options: Any,
    ) -> tuple[DPModule, DPOptimizer, DPCriterion, DataLoader]:
        """(model, optimizer, criterion, data_loader), private, for the user's own loop.

        As Opacus: ``noise_multiplier`` σ and ``max_grad_norm`` C; the loader's batches are Poisson samples at rate
        1/len(data_loader) (``poisson_sampling=False`` is refused: the ε would answer a question the run does not
        pose); ``grad_sample_mode`` ``"ghost"`` (default) or ``"vmap"`` (featuredp's strategies; the criterion is
        wrapped in both). ``criterion`` defaults to ``nn.CrossEntropyLoss()``.

        featuredp's options: ``noise`` (a registered name or a noise plan, ``featuredp.noise.BandMF(bands=4)``),
        ``bands``;
        ``feature_map`` (Ψ) or ``loss_split``, ``method`` (``"fdp"`` by default with a feature map, else
        ``"dpsgd"``; ``"fdp_dpsgd"``), ``alpha``, ``public_batch_size``, ``public_weight``; ``dataset`` (a featuredp
        TabularDataset that names the loader's columns) or ``feature_names``; ``epochs`` or ``steps`` (the planned
        run: needed for ``ledger=``, correlated noise and a target ε); ``target_delta`` (the δ the run is planned
        at, default 1e-5; :meth:`get_epsilon` takes its own); ``precision`` (``"bf16"``); ``physical_batch_size``;
        ``relation``.
        """
        return self._make(module=module, optimizer=optimizer, data_loader=data_loader, criterion=criterion,
                          poisson_sampling=poisson_sampling, grad_sample_mode=grad_sample_mode,
                          noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm, **options)  # fmt: skip

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
        grad_sample_mode: str = "ghost",
        **options: Any,
    ) -> tuple[DPModule, DPOptimizer, DPCriterion, DataLoader]:
        """As :meth:`make_private`, with σ calibrated so that ``epochs`` epochs are (``target_epsilon``,
        ``target_delta``)-DP (or FDP); a step past them is refused (the budget stop)."""
        if "noise_multiplier" in options:
            raise TypeError("make_private_with_epsilon calibrates noise_multiplier: give target_epsilon alone")
        return self._make(module=module, optimizer=optimizer, data_loader=data_loader, criterion=criterion,
                          poisson_sampling=poisson_sampling, grad_sample_mode=grad_sample_mode,
                          target_epsilon=target_epsilon, target_delta=target_delta, epochs=epochs,
                          max_grad_norm=max_grad_norm, **options)  # fmt: skip

    def get_epsilon(self, delta: float) -> float:
        """ε(δ) of the private steps taken so far (0 before the first)."""
        state = self._require_state()
        plan = state.plan
        if state.private_steps == 0:
            return 0.0
        return replace(plan, delta=float(delta)).epsilon(state.private_steps)

    def get_replacement_epsilon(self, delta: float) -> float:
        """ε(δ) for the replace-one question (two values of one record's private part) so far."""
        state = self._require_state()
        if state.private_steps == 0:
            return 0.0
        return replace(state.plan, delta=float(delta)).replacement_epsilon(state.private_steps)

    @property
    def plan(self) -> PrivacyPlan:
        """The run's privacy plan (public: everything the guarantee depends on)."""
        return self._require_state().plan

    @property
    def steps(self) -> int:
        """Private steps taken so far."""
        return 0 if self._state is None else self._state.private_steps

    def result(self) -> TrainResult:
        """The run so far as a :class:`featuredp.plan.TrainResult`: ε, δ (with the noise sampler's tail), the
        replace-one ε, the guarantee sentence and the privacy report, as ``Trainer.fit`` returns them."""
        state = self._require_state()
        return self._trainer._result(state, self._split, self._steps_allowed is None or (
            state.private_steps >= self._steps_allowed))  # fmt: skip

    def save_checkpoint(self, *, path: str | Path, module: nn.Module, optimizer: Any = None,
                        checkpoint_dict: dict[str, Any] | None = None, **_: Any) -> None:  # fmt: skip
        """Write the model, the optimizer and the run's state (streams, step counter) atomically, owner-readable
        only (0600): the file holds the run's secret sampler and noise state."""
        state = self._require_state()
        inner = optimizer.original_optimizer if isinstance(optimizer, DPOptimizer) else optimizer
        atomic_save_torch(path, {
            "featuredp_privacy_engine": 1,
            "state": state.state_dict(unwrap(module)),
            "optimizer": None if inner is None else inner.state_dict(),
            "extra": checkpoint_dict or {},
        }, private=True)  # fmt: skip

    def load_checkpoint(self, *, path: str | Path, module: nn.Module, optimizer: Any = None, **_: Any
                        ) -> dict[str, Any]:  # fmt: skip
        """Continue the run saved by :meth:`save_checkpoint` (same plan; the noise is re-keyed from OS entropy).
        Returns the ``checkpoint_dict`` saved with it."""
        state = self._require_state()
        ck = load_torch_safely(path, what="checkpoint")
        if not isinstance(ck, dict) or "featuredp_privacy_engine" not in ck:
            raise ValueError(f"{path} is not a checkpoint written by PrivacyEngine.save_checkpoint")
        state.load_state_dict(ck["state"], unwrap(module))
        inner = optimizer.original_optimizer if isinstance(optimizer, DPOptimizer) else optimizer
        if inner is not None and ck.get("optimizer") is not None:
            inner.load_state_dict(ck["optimizer"])
        return dict(ck.get("extra") or {})

    def close(self) -> None:
        """Settle the ledger's reservation at the private steps that ran (also done when the engine is collected)."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> PrivacyEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def check_model(self, data: Any, *, records: int = 3, batch_size: int = 32) -> list[Any]:
        """The replay self-test through this engine's own loop (wrapped model, criterion, ``loss.backward()``,
        ``optimizer.step()``): see :func:`featuredp.testing.replay_engine_step`. Call it before training."""
        state = self._require_state()
        if state.private_steps:
            raise ValueError("check_model replays a step of a run that has not started; call it before training")
        n = int(next(iter(as_batch(data).values())).shape[0])
        rng = np.random.default_rng()
        reports = []
        for _ in range(int(records)):
            rows = rng.choice(n, size=min(int(batch_size), n - 1) + 1, replace=False)
            reports.append(replay_engine_step(self, data, record=int(rows[0]), batch=[int(i) for i in rows[1:]]))
        return reports

    # -- building the run ------------------------------------------------------------------------------------
    def _make(self, *, module: nn.Module, optimizer: torch.optim.Optimizer, data_loader: DataLoader,
              criterion: nn.Module | None, poisson_sampling: bool, grad_sample_mode: str,
              **options: Any) -> tuple[DPModule, DPOptimizer, DPCriterion, DataLoader]:  # fmt: skip
        if self._state is not None:
            raise ValueError("this PrivacyEngine already made a run private: one engine is one run (build another)")
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if isinstance(module, DPModule):
            raise ValueError("module is already private (a DPModule): pass the original model")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(data_loader, DataLoader):
            raise TypeError(f"data_loader must be a torch DataLoader, got {type(data_loader).__name__}")
        if not poisson_sampling:
            raise ValueError("poisson_sampling=False: featuredp accounts Poisson (or its cyclic) sampling only; the "
                             "printed ε would not answer the run's question. Use poisson_sampling=True")  # fmt: skip
        grad_sample_mode = check_choice("grad_sample_mode", grad_sample_mode, GRAD_SAMPLE_MODES)
        criterion = nn.CrossEntropyLoss() if criterion is None else criterion
        if (options.get("feature_map") is not None and options.get("loss_split") is None
                and type(criterion) is not nn.CrossEntropyLoss):  # fmt: skip
            raise ValueError(f"criterion={type(criterion).__name__}: with feature_map= the losses ℓ and ℓ_pub are the "
                             "loss split's (cross-entropy); give loss_split= for another loss")  # fmt: skip
        _check_opacus_options(options)
        n, batches = len(data_loader.dataset), len(data_loader)  # type: ignore[arg-type]
        if n < 1 or batches < 1:
            raise ValueError(f"data_loader is empty ({n} records, {batches} batches)")
        feature_map, split = options.pop("feature_map", None), options.pop("loss_split", None)
        dataset, names = options.pop("dataset", None), options.pop("feature_names", None)
        method = options.pop("method", None) or ("fdp" if feature_map is not None or split is not None else "dpsgd")
        epochs, steps = options.pop("epochs", None), options.pop("steps", None)
        delta = options.pop("target_delta", None)
        planned = steps if steps is not None else (max(1, round(float(epochs) * batches)) if epochs else None)
        settings: dict[str, Any] = {
            "sampling_rate": 1.0 / batches, "steps": planned or batches, "delta": 1e-5 if delta is None else delta,
            "strategy": grad_sample_mode, "seed": self._seed, "secure_rng": self.secure_mode,
            "accountant": self._accountant, "progress": False, "lr": float(optimizer.param_groups[0].get("lr", 0.1)),
            # The correlated noise's workload: the user's SGD momentum, else the prefix sums (Adam is not linear).
            "momentum": float(optimizer.param_groups[0].get("momentum", 0.0) or 0.0)
            if isinstance(optimizer, torch.optim.SGD) else 0.0,
            **options,
        }  # fmt: skip
        trainer = Trainer(module, method, feature_map=feature_map, loss_split=split, ledger=self._ledger, **settings)
        correlated = trainer.privacy.noise_plan.correlated
        if planned is None and (self._ledger is not None or correlated or "target_epsilon" in settings):
            raise ValueError("epochs= (or steps=) is needed to plan the run: a ledger, correlated noise and a target "
                             "epsilon all charge a planned number of steps")  # fmt: skip
        bind = dataset if dataset is not None else (_named(names) if names is not None else {})
        state, split = trainer._start_run(bind, f"loader of {n} records ({type(data_loader.dataset).__name__})", n)
        self._trainer, self._state, self._split = trainer, state, split
        self._dataset, self._collate = data_loader.dataset, data_loader.collate_fn
        # Independent noise accounts any number of steps exactly; a calibrated or correlated plan only its own.
        self._steps_allowed = planned if (planned is not None and (correlated or state.plan.budget_steps)) else None
        if state.plan.budget_steps is not None:
            self._steps_allowed = min(self._steps_allowed or state.plan.budget_steps, state.plan.budget_steps)
        if trainer.dist is not None:  # every rank must hold the same plan, settings and model shapes
            agree_across_ranks(trainer._rank_settings(state, split, None, n))
        self._reservation = reserve(trainer.ledger, state)
        self._finalizer = weakref.finalize(self, _settle, self._reservation, state)
        self._model, self._optimizer = DPModule(module, self), DPOptimizer(optimizer, self)
        self._criterion = DPCriterion(criterion, self)
        return self._model, self._optimizer, self._criterion, private_loader(data_loader, state, batches)

    def _require_state(self) -> RunState:
        if self._state is None:
            raise ValueError("call make_private (or make_private_with_epsilon) first")
        return self._state

    # -- the step (called by the wrapped loss and optimizer) -------------------------------------------------
    def _forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The user-visible forward: no graph (no gradient can bypass the engine) and no write to the model."""
        self._inputs = (args, kwargs)
        with torch.no_grad(), ForwardStateGuard(module, first_call=False):
            out = module(*args, **kwargs)
        self._output = out
        return out

    def _backward(self, loss: DPLoss) -> None:
        """The clipped sum of the batch the model last saw (kept until ``optimizer.step()``)."""
        state = self._require_state()
        if self._pending is not None:
            raise RuntimeError("loss.backward() was called twice before optimizer.step(): featuredp accounts one "
                               "Poisson batch per step (no gradient accumulation across batches)")  # fmt: skip
        if loss.inputs is None:
            raise RuntimeError("the loss was not computed from the private model's output")
        plan, record = state.plan, get_method(state.plan.method)
        batch, loss_fn = self._batch_and_loss(loss)
        size = int(next(iter(batch.values())).shape[0])
        core = self._trainer._core
        if plan.max_grad_norm is None:
            raise ValueError("the plan has no clipping bound")
        if size == 0:  # an empty Poisson batch: no model call, the noise is still added at step()
            self._pending = {k: torch.zeros_like(p) for k, p in trainable_parameters(core.model).items()}
            return
        if self._split is not None:
            draws = self._split.draws(batch, state.private_draws)
            loss_fn = clipped_loss(self._split, record, plan.public_weight)
        else:
            draws = {}
        self._pending = core.clipped_sum(loss_fn, batch, draws, plan.max_grad_norm)

    def _batch_and_loss(self, loss: DPLoss) -> tuple[Batch, Callable[..., torch.Tensor]]:
        """The loss's batch as a dict of batch-first tensors, and the per-example loss the strategy differentiates."""
        args, kwargs = loss.inputs
        target = loss.target
        if self._split is not None:  # ℓ and ℓ_pub are the split's (cross-entropy on Ψ(x) for column maps)
            if len(args) != 1 or kwargs or not isinstance(args[0], torch.Tensor):
                raise TypeError("with a feature map the model must be called as model(x) on one tensor x")
            return {"x": args[0], "y": target}, self._split.loss
        size = next((int(v.shape[0]) for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
        tail = tuple(target.shape[1:])
        if size is not None and target.dim() >= 1 and int(target.shape[0]) != size:
            if target.numel() % max(size, 1) or size == 0:
                raise TypeError(f"the target's first dimension ({target.shape[0]}) is not the batch's ({size}) or a "
                                "multiple of it")  # fmt: skip
            target = target.reshape(size, -1)  # labels.view(-1) of an LM loop: batch-first again, row i = example i
        keys = [f"arg{i}" for i in range(len(args))]
        tensors = {k: v for k, v in zip(keys, args, strict=True) if isinstance(v, torch.Tensor)}
        tensors.update({f"kw:{k}": v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
        constants = ({k: v for k, v in zip(keys, args, strict=True) if not isinstance(v, torch.Tensor)},
                     {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)})  # fmt: skip
        return {**tensors, "y": target}, PerExampleLoss(loss.criterion, loss.transform, len(args), constants, tail)

    def _step(self, inner: torch.optim.Optimizer, closure: Any = None) -> Any:
        """Noise, Algorithm 1's public term, the count, then the user's optimizer step."""
        state = self._require_state()
        sums = self._pending
        if sums is None:
            raise RuntimeError("optimizer.step() without loss.backward() on the private criterion's loss")
        self._pending = None
        plan = state.plan
        if self._steps_allowed is not None and state.private_steps + 1 > self._steps_allowed:
            raise BudgetExceededError(
                f"the run's {self._steps_allowed} planned private steps are spent (epsilon={self.get_epsilon(plan.delta or 1e-5):.4g}); "  # noqa: E501
                "a further step is outside the accounted run: plan more epochs in a new run"
            )
        core = self._trainer._core
        grads = core.noisy_mean(plan, state.noise, sums)
        record = get_method(plan.method)
        if record.public_batch:
            grads = core.combine(plan, grads, self._public_term(state) if plan.public_weight != 0 else None)
        params = trainable_parameters(core.model)
        for k, p in params.items():
            p.grad = grads[k].detach().to(p.dtype)
        # Counted before it is applied (as the Trainer): an interrupt leaves at most one step counted, not applied.
        state.private_steps += 1
        out = inner.step(closure) if closure is not None else inner.step()
        inner.zero_grad(set_to_none=True)
        return out

    def _public_term(self, state: RunState) -> Callable[[], dict[str, torch.Tensor]]:
        """Algorithm 1's public batch, drawn by the engine from the loader's dataset with its own sampler."""
        assert self._split is not None
        split = self._split

        def gradient() -> dict[str, torch.Tensor]:
            idx = state.public_sampler.sample()
            batch = to_device(self._public_batch(idx), self._trainer.device)
            total = self._trainer._public_total(state.plan)  # m', as the Trainer's loop divides it
            grads, self.public_loss = self._trainer._core.public_gradient(state, split, batch, total)
            return grads

        return gradient

    def _replay_step(self, data: Batch) -> None:
        """One step of the user's loop on the batch the private sampler draws from ``data`` (the replay test's);
        Algorithm 1's public batch reads ``data`` too."""
        batch = gather(data, self._require_state().private_sampler.sample())
        own = self._public_batch
        self._public_batch = lambda idx: gather(data, idx)  # type: ignore[method-assign]
        try:
            self._optimizer.zero_grad()
            self._criterion(self._model(batch["x"]), batch["y"]).backward()
            self._optimizer.step()
        finally:
            del self._public_batch  # the method again
            assert self._public_batch == own

    def _public_batch(self, idx: np.ndarray) -> Batch:
        batch = self._collate([self._dataset[int(i)] for i in idx])
        if isinstance(batch, dict):
            return dict(batch)
        x, y = batch
        return {"x": x, "y": y}


def _check_opacus_options(options: dict[str, Any]) -> None:
    """Opacus options with one meaning here: accepted at their default, refused otherwise (one line each)."""
    if options.pop("clipping", "flat") != "flat":
        raise ValueError("clipping: featuredp clips each example's whole gradient (clipping='flat') only")
    if options.pop("noise_generator", None) is not None:
        raise ValueError("noise_generator: the noise's randomness is secret (OS entropy); for a reproducible "
                         "research run give PrivacyEngine(seed=...)")  # fmt: skip
    if not options.pop("batch_first", True):
        raise ValueError("batch_first=False: featuredp's strategies need batch-first inputs")
    options.pop("wrap_model", None)
    options.pop("loss_reduction", None)  # the criterion's own reduction is used per example


def _named(names: Any) -> Any:
    """A stand-in dataset that names the loader's columns (``feature_names=``) for binding a column map."""
    names = [str(c) for c in names]
    return SimpleNamespace(name="loader", feature_names=names, feature_sources=list(names), label_name="y",
                           statistics_from_data=None, statistics_warned=[], column_types=None,
                           default_private=[])  # fmt: skip


def _settle(reservation: Any, state: RunState) -> None:
    settle(reservation, state.plan, state.private_steps)
