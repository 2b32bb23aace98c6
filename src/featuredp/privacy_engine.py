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

import copy
import math
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler

from featuredp._io import atomic_save_torch, load_torch_safely
from featuredp._validate import check_choice
from featuredp.batches import Batch, to_device
from featuredp.clipping import trainable_parameters
from featuredp.clipping.safety import ForwardStateGuard
from featuredp.errors import BudgetExceededError, PrivacyLeakWarning
from featuredp.losses import LossSplit
from featuredp.methods import get_method
from featuredp.plan import PrivacyPlan, TrainResult
from featuredp.run_state import RunState, reserve, settle
from featuredp.step import clipped_loss

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


class PrivacyEngine:
    """Makes a user's model, optimizer, criterion and data loader private (Opacus 1.6's surface).

    ``accountant``: ``"pld"`` (default; dp-accounting's PLD), ``"rdp"``, or ``"prv"`` (Opacus's default name:
    accounted with PLD, which agrees with the PRV accountant within 1 %). ``secure_mode=True``: noise and sampling
    from a ChaCha20 CSPRNG keyed by the OS. ``seed``: a secret seed for a reproducible research run (warned; never
    written out); the default is OS entropy. ``ledger``: a :class:`featuredp.accounting.BudgetLedger` (or its path)
    charged with the planned spend at ``make_private`` and settled at what was spent by :meth:`close` (or when the
    engine is collected).
    """

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

        featuredp's options: ``noise`` (``"independent"``, ``"bandmf"``, ``"blt"`` or a noise plan), ``bands``;
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
            "state": state.state_dict(_unwrap(module)),
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
        state.load_state_dict(ck["state"], _unwrap(module))
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
        from featuredp.testing.replay import replay_engine_step

        state = self._require_state()
        if state.private_steps:
            raise ValueError("check_model replays a step of a run that has not started; call it before training")
        n = int(next(iter(_as_dict(data).values())).shape[0])
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
        from featuredp.engine import Trainer

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
        correlated = settings.get("noise", "independent") not in ("independent", None)
        if planned is None and (self._ledger is not None or correlated or "target_epsilon" in settings):
            raise ValueError("epochs= (or steps=) is needed to plan the run: a ledger, correlated noise and a target "
                             "epsilon all charge a planned number of steps")  # fmt: skip
        trainer = Trainer(module, method, feature_map=feature_map, loss_split=split, ledger=self._ledger, **settings)
        bind = dataset if dataset is not None else (_named(names) if names is not None else {})
        state, split = trainer._start_run(bind, f"loader of {n} records ({type(data_loader.dataset).__name__})", n)
        self._trainer, self._state, self._split = trainer, state, split
        self._dataset, self._collate = data_loader.dataset, data_loader.collate_fn
        # Independent noise accounts any number of steps exactly; a calibrated or correlated plan only its own.
        self._steps_allowed = planned if (planned is not None and (correlated or state.plan.budget_steps)) else None
        if state.plan.budget_steps is not None:
            self._steps_allowed = min(self._steps_allowed or state.plan.budget_steps, state.plan.budget_steps)
        if trainer.dist is not None:  # every rank must hold the same plan, settings and model shapes
            from featuredp.distributed import agree_across_ranks

            agree_across_ranks(trainer._rank_settings(state, split, None, n))
        self._reservation = reserve(trainer.ledger, state)
        self._finalizer = weakref.finalize(self, _settle, self._reservation, state)
        self._model, self._optimizer = DPModule(module, self), DPOptimizer(optimizer, self)
        self._criterion = DPCriterion(criterion, self)
        return self._model, self._optimizer, self._criterion, _private_loader(data_loader, state, batches)

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
        return {**tensors, "y": target}, _PerExampleLoss(loss.criterion, loss.transform, len(args), constants, tail)

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
            total = state.plan.public_batch_size or max(1, round(state.plan.expected_batch_size))
            grads, self.public_loss = self._trainer._core.public_gradient(state, split, batch, total)
            return grads

        return gradient

    def _replay_step(self, data: Batch) -> None:
        """One step of the user's loop on the batch the private sampler draws from ``data`` (the replay test's);
        Algorithm 1's public batch reads ``data`` too."""
        from featuredp.batches import gather

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


class DPModule(nn.Module):
    """The user's model, private: a call records its inputs for the engine and returns the output without a graph.

    ``_module`` is the original model; its parameters are the ones trained.
    """

    _engine: PrivacyEngine

    def __init__(self, module: nn.Module, engine: PrivacyEngine) -> None:
        super().__init__()
        self._module = module
        object.__setattr__(self, "_engine", engine)  # not a submodule: never in state_dict()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's output on the batch (no graph: the gradient is the engine's, at ``loss.backward()``)."""
        module: nn.Module = self._module
        return self._engine._forward(module, args, kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The original model's state dict (keys without a wrapper prefix)."""
        return self._module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """Load into the original model."""
        return self._module.load_state_dict(*args, **kwargs)


class DPCriterion:
    """The user's criterion, private: returns a :class:`DPLoss` whose ``backward()`` is the engine's clipped sum."""

    def __init__(self, criterion: Any, engine: PrivacyEngine) -> None:
        if not hasattr(criterion, "reduction"):
            raise TypeError(f"criterion must be a torch.nn loss module with a reduction (e.g. nn.CrossEntropyLoss()), "
                            f"got {type(criterion).__name__}")  # fmt: skip
        self.criterion = criterion
        self._engine = engine

    def __call__(self, output: Any, target: torch.Tensor) -> DPLoss:
        """The loss of ``output`` (the private model's output, or a reshape of it) against ``target``."""
        engine = self._engine
        seen = engine._output
        transform = _transform(output, seen)
        with torch.no_grad():
            value = self.criterion(output, target)
        loss = DPLoss(value, engine, self.criterion, transform, engine._inputs, target)
        engine._inputs, engine._output = None, None  # one loss per forward
        return loss


class DPLoss:
    """A private batch's loss: ``backward()`` computes the clipped per-example gradient sum (not ``.grad`` of
    this value). Reading the value (``item()``) reads the private batch: not covered by ε (warned once)."""

    _warned = False

    def __init__(self, value: torch.Tensor, engine: PrivacyEngine, criterion: Any, transform: Callable[[Any], Any],
                 inputs: Any, target: torch.Tensor) -> None:  # fmt: skip
        self.value = value
        self._engine = engine
        self.criterion = criterion
        self.transform = transform
        self.inputs = inputs
        self.target = target

    def backward(self, *args: Any, **kwargs: Any) -> None:
        """Σ_i clip_C ∇ℓ_i over the batch, kept by the engine for ``optimizer.step()``."""
        self._engine._backward(self)

    def item(self) -> float:
        """The batch's mean loss (the private batch's: not covered by ε)."""
        if not DPLoss._warned:
            DPLoss._warned = True
            warnings.warn("loss.item() reads the loss of a private batch, which the guarantee does not cover: keep "
                          "it out of anything you publish (the engine's public_loss is covered)",
                          PrivacyLeakWarning, stacklevel=2)  # fmt: skip
        return float(self.value)

    def __float__(self) -> float:
        return self.item()

    def detach(self) -> torch.Tensor:
        """The value, as a tensor without a graph."""
        return self.value.detach()


class DPOptimizer(torch.optim.Optimizer):
    """The user's optimizer, private: ``step()`` adds the noise, divides by the expected batch size, adds the
    public term, counts the step and applies the original optimizer. Exposes Opacus's ``noise_multiplier``,
    ``max_grad_norm``, ``expected_batch_size`` and ``original_optimizer``."""

    def __init__(self, optimizer: torch.optim.Optimizer, engine: PrivacyEngine) -> None:
        # Not Optimizer.__init__: this object shares the original's param_groups and state.
        self.original_optimizer = optimizer
        self._engine = engine
        plan = engine.plan
        self.noise_multiplier = float(plan.noise_multiplier or 0.0)
        self.max_grad_norm = float(plan.max_grad_norm or math.inf)
        self.expected_batch_size = plan.expected_batch_size
        self.defaults = optimizer.defaults

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The original optimizer's parameter groups (a learning-rate scheduler may edit them)."""
        return self.original_optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        """The original optimizer's state."""
        return self.original_optimizer.state

    def step(self, closure: Any = None) -> Any:
        """One private step on the batch of the last ``loss.backward()``."""
        return self._engine._step(self.original_optimizer, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients (the engine's pending sum is kept until ``step``)."""
        self.original_optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The original optimizer's state dict."""
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the original optimizer."""
        self.original_optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: the run's noise covers the parameters it was planned with."""
        raise ValueError("add_param_group after make_private: the noise is planned for the original parameters")

    def __repr__(self) -> str:
        return f"DPOptimizer({self.original_optimizer!r}, σ={self.noise_multiplier:g}, C={self.max_grad_norm:g})"


class _PerExampleLoss:
    """ℓ_i of the user's criterion for each example: the model called as the user called it, the output reshaped
    as the user reshaped it, the criterion at reduction ``"none"`` and each example's elements reduced alone."""

    def __init__(self, criterion: Any, transform: Callable[[Any], Any], nargs: int,
                 constants: tuple[dict[str, Any], dict[str, Any]], tail: tuple[int, ...]) -> None:  # fmt: skip
        self.criterion = copy.copy(criterion)
        self.tail = tail  # the target's shape after the first dimension, as the user passed it
        self.mean = criterion.reduction == "mean"
        self.criterion.reduction = "none"
        self.transform = transform
        self.nargs = nargs
        self.constants = constants
        self.ignore = getattr(criterion, "ignore_index", None)

    def __call__(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        args = [batch[f"arg{i}"] if f"arg{i}" in batch else self.constants[0][f"arg{i}"] for i in range(self.nargs)]
        kwargs = {k[3:]: v for k, v in batch.items() if k.startswith("kw:")} | self.constants[1]
        y = batch["y"]
        size = int(y.shape[0])
        per = self.criterion(self.transform(model(*args, **kwargs)), y.reshape(-1, *self.tail)).reshape(size, -1)
        if not self.mean:
            return per.sum(1)
        if self.ignore is not None:  # a mean over each example's own counted elements
            counted = (y.reshape(size, -1) != self.ignore).sum(1).clamp(min=1)
            return per.sum(1) / counted
        return per.mean(1)


def _identity(out: Any) -> Any:
    return out


def _transform(output: Any, seen: Any) -> Callable[[Any], Any]:
    """How the user turned the model's output into the criterion's input: itself, its ``logits``, or a reshape
    (``logits.view(-1, V)``). Anything else is refused: the engine must be able to recompute it per example."""
    if seen is None:
        raise RuntimeError("the criterion was called without a fresh output of the private model: call "
                           "criterion(model(x), y) with the model make_private returned")  # fmt: skip
    if output is seen:
        return _identity
    base = getattr(seen, "logits", None)
    source: Callable[[Any], Any] = _identity
    if base is not None and isinstance(base, torch.Tensor):
        source = _logits
    else:
        base = seen
    if output is base:
        return source
    if isinstance(output, torch.Tensor) and isinstance(base, torch.Tensor) and output.numel() == base.numel() and (
            output.data_ptr() == base.data_ptr()):  # fmt: skip
        tail = tuple(output.shape[1:])
        return _Reshape(source, tail)
    raise TypeError("the criterion must get the private model's output, its .logits, or a reshape of either "
                    "(e.g. logits.view(-1, V)); compute anything else (a shift, a slice) inside the criterion")


def _logits(out: Any) -> Any:
    return out.logits


class _Reshape:
    def __init__(self, source: Callable[[Any], Any], tail: tuple[int, ...]) -> None:
        self.source, self.tail = source, tail

    def __call__(self, out: Any) -> Any:
        return self.source(out).reshape(-1, *self.tail)


class _PlanSampler(Sampler[list[int]]):
    """Batches from the run's secret sampler (Poisson at rate q, or BandMF/BLT's cyclic one), ``batches`` per
    epoch as the original loader had."""

    def __init__(self, state: RunState, batches: int) -> None:
        self.state, self.batches = state, batches

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.batches):
            yield [int(i) for i in self.state.private_sampler.sample()]


def _private_loader(loader: DataLoader, state: RunState, batches: int) -> DataLoader:
    """The user's loader with its batches drawn by the run's sampler; an empty batch keeps the records' shape."""
    dataset = loader.dataset
    collate = loader.collate_fn

    def collate_or_empty(items: list[Any]) -> Any:
        if items:
            return collate(items)
        # The shape of one record is public (the schema); its values are not used.
        one = collate([dataset[0]])
        return _empty_like(one)

    return DataLoader(dataset, batch_sampler=_PlanSampler(state, batches), collate_fn=collate_or_empty,
                      num_workers=loader.num_workers, pin_memory=loader.pin_memory)  # fmt: skip


def _empty_like(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, dict):
        return {k: _empty_like(v) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_empty_like(v) for v in batch)
    return batch


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


def _as_dict(data: Any) -> Batch:
    from featuredp.batches import as_batch

    return as_batch(data)


def _unwrap(module: nn.Module) -> nn.Module:
    if isinstance(module, DPModule):
        inner: nn.Module = module._module
        return inner
    return module


def _settle(reservation: Any, state: RunState) -> None:
    settle(reservation, state.plan, state.private_steps)
