"""THE composer: Algorithm 1 (FDP-SGD) and its baselines, with accounting and a budget stop.

Methods (SPEC §3):

=============  ====================================================================  =====================
method         each step                                                             guarantee
=============  ====================================================================  =====================
nonprivate     shuffled batch of m, gradient of mean ℓ                               none
public         shuffled batch of m' read through Ψ, gradient of mean ℓ_pub           (0, 0)-FDP
dpsgd          Poisson batch (rate p = m/n), Σ clip_C ∇ℓ + N(0, σ²C²), divided by m  (ε, δ)-DP ⇒ FDP
fdp_dpsgd      public pre-training on ℓ_pub, then dpsgd                              (ε, δ)-FDP
fdp            [public pre-training], then Algorithm 1:                              (ε, δ)-FDP (Thm 5)
               g = g_pub + α·g_priv; g_priv = (Σ clip_C ∇ℓ_priv + N(0, σ²C²)) / m
               on a Poisson batch, g_pub = mean ∇ℓ_pub on an independent uniform
               batch of m'
=============  ====================================================================  =====================

Rules this module keeps (ARCHITECTURE "rules that keep it private"):

* the private batch (Poisson, ``private_sampling`` stream) and the public batch
  (uniform, ``public_sampling`` stream) never share coins; the public batch's
  loss draws come from their own torch generator, the noise from another;
* the private sum is divided by the *expected* batch size m = p·n, never by
  the realised size;
* clipping applies to ∇ℓ_priv as a whole (the strategy receives ℓ_priv);
* n, p, m and m' are explicit and checked against the data;
* layers that mix examples are refused for private methods;
* private runtime quantities (indices, realised batch sizes, RNG states,
  losses of private batches) are never put in the plan, the history or the
  progress bar. Only public quantities are shown: ε, and ℓ_pub on public
  batches (or ℓ for nonprivate).

Public batches and public pre-training read Ψ(S) only and add no privacy event
(Thm 5 / Remark 2); the accountant sees exactly (σ, p, T_private).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from featuredp._io import atomic_save_torch, load_torch_safely
from featuredp._validate import (
    check_choice,
    check_delta,
    check_int,
    check_nonnegative,
    check_positive,
    check_real,
    check_sampling_rate,
)
from featuredp.batches import as_batch, evaluate, forward, gather
from featuredp.clipping import GradientStrategy, check_no_batch_mixing, get_strategy, trainable_parameters
from featuredp.errors import BudgetExceededError, DataValidationError, PrivacyLeakWarning, PrivacyRiskWarning
from featuredp.features import Batch, PublicFeatureMap
from featuredp.losses import LabelDPSplit, LossSplit, default_split
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS, get_method
from featuredp.noise import ChaCha20Generator, SecureNoise, TorchNoise
from featuredp.plan import PrivacyPlan, TrainResult, inf_to_str
from featuredp.sampling import (
    STREAM_NAMES,
    EpochShuffler,
    PoissonSampler,
    UniformSampler,
    make_streams,
    random_seed_from,
    warn_private_seed,
)

__all__ = [
    "METHODS",
    "PRIVATE_METHODS",
    "PrivacyPlan",
    "TrainResult",
    "Trainer",
    "as_batch",
    "evaluate",
    "init_seed",
]

METHODS = METHOD_NAMES  # the names, as before featuredp.methods held the records
# 2: secret private streams split from public ones, noise-source state, data/Ψ fingerprint.
_CHECKPOINT_FORMAT = 2
_NEEDS_FEATURE_MAP = tuple(name for name in METHOD_NAMES if get_method(name).needs_feature_map)


# ----------------------------------------------------------------------------------------------------------
# Data helpers
# ----------------------------------------------------------------------------------------------------------
def init_seed(seed: int | None) -> int:
    """A model-initialisation seed from the public ``init`` stream of ``seed`` (OS entropy for ``None``).

    Model initialisation reads no data, so a published seed here is safe; it is the same
    stream a Trainer with ``public_seed=seed`` would use.
    """
    return random_seed_from(make_streams(None, public_seed=seed).init)


def _torch_generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g


# ----------------------------------------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------------------------------------
class Trainer:
    """Runs one method with a model, a Ψ / loss split and a privacy plan.

    Parameters (the important ones):

    * ``method``: one of ``nonprivate, public, dpsgd, fdp_dpsgd, fdp``.
    * ``feature_map`` (Ψ) or ``loss_split`` (which carries its Ψ): needed for
      ``public``, ``fdp_dpsgd`` and ``fdp``. Without a split, the default for Ψ
      is used (Gaussian padding for column maps, the label-DP split for a
      private label).
    * ``epochs`` or ``steps``: length of the main phase (epochs × n / m steps).
    * ``batch_size`` (expected private batch m; or give ``sampling_rate`` p = m/n),
      ``public_batch_size`` (m', default m), ``dataset_size`` (checked against
      the data when given).
    * ``noise_multiplier`` σ or ``target_epsilon`` (with ``delta``): with a
      target alone, σ is calibrated for the planned steps; with both, training
      stops before a step would exceed the target.
    * ``max_grad_norm`` C (``inf``: no clipping), ``alpha`` (weight of g_priv).
    * ``optimizer`` ``"sgd"`` (``momentum``) or ``"adam"``; ``lr``, ``weight_decay``.
    * ``projection_radius`` R: project θ onto the L2 ball after every step.
    * ``averaging``: None, ``"uniform"`` (mean of the iterates in the last
      ``average_fraction`` of training) or ``"ema"`` (decay ``ema_decay``).
    * ``strategy``: ``"vmap"``, ``"ghost"`` or a GradientStrategy object.
    * ``seed``: ``None`` (the default) draws every private stream (Poisson batches, noise,
      loss draws of the private batch) from OS entropy, so the noise cannot be replayed.
      An integer makes the whole run reproducible for research; it warns
      (``PrivacyRiskWarning``: the seed must stay as secret as the data) and is never
      written to run.json or results (only that the run was seeded).
    * ``public_seed``: seeds only the public streams (public batches and their loss draws);
      safe to publish.
    * ``secure_rng``: noise and private sampling from a ChaCha20 CSPRNG keyed from the OS,
      with Gaussian noise drawn and added in float64 (see :mod:`featuredp.noise`).
    * ``ledger``: a :class:`~featuredp.accounting.BudgetLedger` (or its path). Each ``fit``
      reserves the planned private spend before the first private step (refusing an
      overspend before any work) and settles it with what was actually spent, also on a crash.

    One Trainer is one run with one accountant: a second ``fit`` continues the same run
    (same streams, ε for all private steps so far) and refuses once the run is complete.
    """

    def __init__(
        self,
        model: nn.Module,
        method: str = "fdp",
        *,
        feature_map: PublicFeatureMap | None = None,
        loss_split: LossSplit | None = None,
        epochs: float | None = None,
        steps: int | None = None,
        batch_size: int | None = None,
        sampling_rate: float | None = None,
        public_batch_size: int | None = None,
        dataset_size: int | None = None,
        pretrain_epochs: float = 0.0,
        noise_multiplier: float | None = None,
        target_epsilon: float | None = None,
        delta: float | None = 1e-5,
        max_grad_norm: float = 1.0,
        alpha: float = 1.0,
        optimizer: str = "sgd",
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        pretrain_lr: float | None = None,
        projection_radius: float | None = None,
        averaging: str | None = None,
        average_fraction: float = 0.5,
        ema_decay: float = 0.99,
        strategy: str | GradientStrategy = "vmap",
        physical_batch_size: int | str | None = "auto",
        relation: str = "add-remove",
        accountant: str = "pld",
        seed: int | None = None,
        public_seed: int | None = None,
        secure_rng: bool = False,
        ledger: Any = None,
        progress: bool = True,
        log_points: int = 5,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.method = check_choice("method", method, METHODS)
        if loss_split is not None and not isinstance(loss_split, LossSplit):
            raise TypeError(f"loss_split must be a LossSplit, got {type(loss_split).__name__}")
        if feature_map is not None and not isinstance(feature_map, PublicFeatureMap):
            raise TypeError(f"feature_map must be a PublicFeatureMap, got {type(feature_map).__name__}")
        if loss_split is not None and feature_map is not None and loss_split.feature_map is not feature_map:
            raise ValueError("give feature_map or loss_split (which carries its own feature map), not two different")
        if self.method in _NEEDS_FEATURE_MAP and loss_split is None and feature_map is None:
            raise ValueError(f"method {self.method!r} needs a public feature map: pass feature_map= or loss_split=")
        self.feature_map = loss_split.feature_map if loss_split is not None else feature_map
        self.loss_split = loss_split
        if (epochs is None) == (steps is None):
            raise ValueError("give exactly one of epochs= or steps=")
        self.epochs = None if epochs is None else check_positive("epochs", epochs)
        self.steps = None if steps is None else check_int("steps", steps, minimum=1)
        if batch_size is not None and sampling_rate is not None:
            raise ValueError("give batch_size= or sampling_rate=, not both")
        if batch_size is None and sampling_rate is None:
            batch_size = 256
        self.sampling_rate = None if sampling_rate is None else check_sampling_rate("sampling_rate", sampling_rate)
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, minimum=1)
        self.public_batch_size = (
            None if public_batch_size is None else check_int("public_batch_size", public_batch_size, minimum=1)
        )
        self.dataset_size = None if dataset_size is None else check_int("dataset_size", dataset_size, minimum=1)
        self.pretrain_epochs = check_nonnegative("pretrain_epochs", pretrain_epochs)
        if self.pretrain_epochs and self.method not in ("fdp", "fdp_dpsgd"):
            raise ValueError(f"pretrain_epochs is for methods 'fdp' and 'fdp_dpsgd', got method={self.method!r}")
        self.noise_multiplier = (
            None if noise_multiplier is None else check_nonnegative("noise_multiplier", noise_multiplier)
        )
        self.target_epsilon = None if target_epsilon is None else check_positive("target_epsilon", target_epsilon)
        if self.method in PRIVATE_METHODS and self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError(f"method {self.method!r} needs noise_multiplier= or target_epsilon= (with delta=)")
        if self.method in PRIVATE_METHODS and delta is None:
            raise ValueError(f"method {self.method!r} needs delta=")
        self.delta = None if delta is None else check_delta(delta)
        self.max_grad_norm = check_positive("max_grad_norm", max_grad_norm, allow_inf=True)
        self.alpha = check_real("alpha", alpha)
        self.optimizer_name = check_choice("optimizer", optimizer, ("sgd", "adam"))
        self.lr = check_positive("lr", lr)
        self.pretrain_lr = self.lr if pretrain_lr is None else check_positive("pretrain_lr", pretrain_lr)
        self.momentum = check_nonnegative("momentum", momentum)
        self.weight_decay = check_nonnegative("weight_decay", weight_decay)
        self.projection_radius = (
            None if projection_radius is None else check_positive("projection_radius", projection_radius)
        )
        self.averaging = None if averaging is None else check_choice("averaging", averaging, ("uniform", "ema"))
        self.average_fraction = check_real("average_fraction", average_fraction)
        if not 0 < self.average_fraction <= 1:
            raise ValueError(f"average_fraction must be in (0, 1], got {average_fraction!r}")
        self.ema_decay = check_real("ema_decay", ema_decay)
        if not 0 < self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in (0, 1), got {ema_decay!r}")
        self.strategy = get_strategy(strategy, physical_batch_size=physical_batch_size)
        from featuredp.accounting.events import check_accountant, check_relation

        self.relation = check_relation(relation)
        self.accountant = check_accountant(accountant)
        self.seed = None if seed is None else check_int("seed", seed, minimum=0)
        if self.seed is not None and self.method in PRIVATE_METHODS:
            warn_private_seed("seed", self.seed)  # public_seed= fixes only the public randomness
        self.public_seed = None if public_seed is None else check_int("public_seed", public_seed, minimum=0)
        if not isinstance(secure_rng, bool):
            raise TypeError(f"secure_rng must be True or False, got {secure_rng!r}")
        self.secure_rng = secure_rng
        self.ledger = _open_ledger(ledger)
        self._state: _RunState | None = None
        self.progress = bool(progress)
        self.log_points = check_int("log_points", log_points, minimum=1)
        self.plan: PrivacyPlan | None = None
        self.result: TrainResult | None = None

    # -- configuration -----------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The trainer's settings (JSON-able; no data, no RNG state) for run.json."""
        return {
            "method": self.method,
            "epochs": self.epochs,
            "steps": self.steps,
            "batch_size": self.batch_size,
            "sampling_rate": self.sampling_rate,
            "public_batch_size": self.public_batch_size,
            "pretrain_epochs": self.pretrain_epochs,
            "noise_multiplier": self.noise_multiplier,
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "max_grad_norm": inf_to_str(self.max_grad_norm),
            "alpha": self.alpha,
            "optimizer": self.optimizer_name,
            "lr": self.lr,
            "pretrain_lr": self.pretrain_lr,
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
            "projection_radius": self.projection_radius,
            "averaging": self.averaging,
            "average_fraction": self.average_fraction,
            "ema_decay": self.ema_decay,
            "strategy": self.strategy.name,
            "relation": self.relation,
            "accountant": self.accountant,
            # Never the seed itself: with it anyone could replay the noise (rule 6).
            "seeded": self.seed is not None,
            "public_seed": self.public_seed,
            "secure_rng": self.secure_rng,
        }

    def make_plan(self, n: int) -> PrivacyPlan:
        """The privacy plan for a dataset of ``n`` records (calibrates σ when only a target is given)."""
        n = check_int("dataset_size", n, minimum=1)
        if self.dataset_size is not None and self.dataset_size != n:
            raise DataValidationError(f"dataset_size={self.dataset_size} was declared but the data holds {n} records")
        if self.sampling_rate is not None:
            p = self.sampling_rate
            m = p * n
        else:
            assert self.batch_size is not None
            if self.batch_size > n:
                raise DataValidationError(f"batch_size must be <= the number of records {n}, got {self.batch_size}")
            m = float(self.batch_size)
            p = m / n
        m_pub = self.public_batch_size or max(1, round(m))
        if m_pub > n:
            raise DataValidationError(f"public_batch_size must be <= the number of records {n}, got {m_pub}")
        steps = self.steps if self.steps is not None else max(1, round(self.epochs * n / m))  # type: ignore[operator]
        pretrain = round(self.pretrain_epochs * n / m_pub) if self.pretrain_epochs else 0
        delta = self.delta
        if delta is not None and self.method in PRIVATE_METHODS:
            delta = check_delta(delta, n)  # warns (PrivacyRiskWarning) when delta >= 1/n
        sigma, budget = self.noise_multiplier, None
        if self.method in PRIVATE_METHODS:
            from featuredp import accounting

            if sigma is None:
                sigma = accounting.calibrate_noise_multiplier(
                    self.target_epsilon, delta, p, steps, relation=self.relation, accountant=self.accountant
                )
                budget = steps
            elif self.target_epsilon is not None:
                if sigma == 0:
                    raise ValueError("noise_multiplier=0 cannot meet any target_epsilon; drop target_epsilon")
                budget = accounting.calibrate_steps(
                    self.target_epsilon, delta, p, sigma, relation=self.relation, accountant=self.accountant
                )
        private = self.method in PRIVATE_METHODS
        if private and sigma and math.isinf(self.max_grad_norm):
            raise ValueError("max_grad_norm=inf (no clipping) has unbounded sensitivity; it is only allowed with "
                             "noise_multiplier=0 (a non-private reference run)")
        uses_public = self.method in ("public", "fdp") or pretrain > 0
        return PrivacyPlan(
            method=self.method,
            dataset_size=n,
            expected_batch_size=m,
            sampling_rate=p,
            steps=steps,
            pretrain_steps=pretrain,
            public_batch_size=m_pub if uses_public else None,
            noise_multiplier=sigma if private else None,
            max_grad_norm=self.max_grad_norm if private else None,
            alpha=self.alpha if self.method == "fdp" else 1.0,
            delta=delta if private else None,
            target_epsilon=self.target_epsilon if private else None,
            budget_steps=budget,
            relation=self.relation,
            accountant=self.accountant,
        )

    # -- training ----------------------------------------------------------------------------------------
    def fit(
        self,
        data: Any,
        *,
        checkpoint: str | Path | None = None,
        checkpoint_every: int | None = None,
        resume: bool = False,
        max_steps: int | None = None,
        callback: Callable[[int, dict[str, float]], None] | None = None,
    ) -> TrainResult:
        """Train on ``data`` (a TabularDataset or a dict of batch-first tensors); returns a TrainResult.

        ``checkpoint``: file to write every ``checkpoint_every`` steps and at the
        end (model, optimizer, RNG states, step counter, accountant phases, and a
        fingerprint of the data and of Ψ). ``resume=True`` continues from that file
        when it exists (same run, same ε); a checkpoint of other data or another Ψ
        is refused.
        ``max_steps``: stop this call after that many total steps (pre-training
        included). Calling ``fit`` again on the same Trainer continues the same run:
        the streams advance (no noise is replayed) and ε counts every private step
        of the run. Once the run is complete, ``fit`` raises: a new run needs a new
        Trainer (and its spend adds to the earlier one's: use ``ledger=``).
        """
        batch_all = as_batch(data)
        n = int(next(iter(batch_all.values())).shape[0])
        if "y" not in batch_all and self.method != "public":
            raise DataValidationError("data has no labels 'y'")
        if checkpoint_every is not None:
            checkpoint_every = check_int("checkpoint_every", checkpoint_every, minimum=1)
            if checkpoint is None:
                raise ValueError("checkpoint_every needs checkpoint=PATH")
        if max_steps is not None:
            max_steps = check_int("max_steps", max_steps, minimum=1)
        data_print = _data_fingerprint(batch_all)

        if self._state is not None:  # a later call: the same run goes on
            state = self._state
            plan = state.plan
            split = self.loss_split
            if data_print != state.fingerprint["data"]:
                raise ValueError(
                    "fit() was called again on different data: one Trainer is one run on one dataset. Build a new "
                    "Trainer for a new run (its privacy spend adds to this one's; record both with ledger=)"
                )
            if state.complete:
                raise ValueError(
                    f"this Trainer's run is complete ({state.private_steps} private steps, epsilon="
                    f"{plan.epsilon(state.private_steps) if plan.is_private else plan.epsilon(0):.4g}); fit() again "
                    "would keep training the model outside the accounted run. To train longer, plan it in one run "
                    "(steps=/epochs=, then fit(max_steps=...) repeatedly); to start a new run, build a new Trainer and "
                    "count both runs' spends together (ledger=)"
                )
        else:
            split = self._resolve_split(data)
            if self.pretrain_epochs and isinstance(split, LabelDPSplit):
                warnings.warn(
                    "public pre-training with LabelDPSplit minimises logsumexp(logits) alone, which has no minimiser "
                    "and only pushes the logits down; use pretrain_epochs=0 for a private label",
                    UserWarning,
                    stacklevel=2,
                )
            plan = self.make_plan(n)
            self.plan = plan
            if plan.is_private:
                check_no_batch_mixing(self.model)
            if plan.method == "dpsgd":
                _warn_record_level_statistics(data)
            state = _RunState.start(self, plan, {"data": data_print, "psi": self._psi_fingerprint(split)})
            if resume and checkpoint is not None and Path(checkpoint).exists():
                state.load(load_torch_safely(checkpoint, what="checkpoint"))
            self._state = state
            _warn_if_trained_before(self.model, state)

        total = plan.pretrain_steps + plan.steps
        log_at = {plan.pretrain_steps + round(plan.steps * (i + 1) / self.log_points) for i in range(self.log_points)}
        params = trainable_parameters(self.model)
        steps_this_call = 0
        private_before = state.private_steps
        display: dict[str, float] = {}  # what the bar shows: public quantities and the ε at the last log point
        reservation = self._reserve(state)  # before any private step: an overspend is refused up front
        pbar = _progress(total, state.step, self.progress, self.method)
        try:
            while state.step < total:
                if max_steps is not None and steps_this_call >= max_steps:
                    break
                pre = state.step < plan.pretrain_steps
                budget = plan.budget_steps if plan.is_private and not pre else None
                if budget is not None and state.private_steps + 1 > budget:
                    state.stop_reason = "budget"  # stop before a step would exceed the budget
                    break
                shown = self._step(state, split, batch_all, plan, params, pre)
                state.step += 1
                steps_this_call += 1
                if not pre and plan.is_private:
                    state.private_steps += 1
                if state.step in log_at:
                    shown["epsilon"] = plan.epsilon(state.private_steps) if plan.is_private else plan.epsilon(0)
                    state.history.append({"step": state.step, **shown})
                    if callback is not None:
                        callback(state.step, shown)
                pbar.update(1)
                display.update(shown)
                if display:
                    pbar.set_postfix({k: f"{v:.4g}" for k, v in display.items()}, refresh=False)
                if checkpoint is not None and checkpoint_every and state.step % checkpoint_every == 0:
                    self._save_checkpoint(checkpoint, state)
        finally:
            pbar.close()
            _record_applied(self.model, state)
            self._settle(reservation, state.private_steps - private_before)
        finished = state.step >= total
        if checkpoint is not None:
            self._save_checkpoint(checkpoint, state)
        if finished or state.stop_reason == "budget":
            state.finalize_average(self.model)
            state.complete = True
        eps = plan.epsilon(state.private_steps) if plan.is_private else plan.epsilon(0)
        report = {
            "feature_map": None if self.feature_map is None else self.feature_map.describe(),
            "loss_split": None if split is None else split.describe(),
            "accounting": "public batches and public pre-training read Ψ(S) only and add no privacy event",
            "randomness": _randomness_report(self),
        }
        earlier = _model_epsilon(self.model, state, plan)
        if earlier is not None:
            report["model_epsilon_all_runs"] = earlier
        self.result = TrainResult(
            method=self.method,
            plan=plan,
            epsilon=eps,
            delta=plan.delta,
            steps=state.private_steps if plan.is_private else max(0, state.step - plan.pretrain_steps),
            pretrain_steps=min(state.step, plan.pretrain_steps),
            stopped_early=not finished,
            stop_reason=state.stop_reason if state.stop_reason else (None if finished else "max_steps"),
            guarantee=plan.guarantee(eps, report["feature_map"]).replace("{T}", str(state.private_steps)),
            privacy_report=report,
            history=list(state.history),
        )
        return self.result

    def _psi_fingerprint(self, split: LossSplit | None) -> str:
        """A digest of Ψ and the loss split as declared (public; a resume must use the same ones)."""
        desc = {
            "feature_map": None if self.feature_map is None else self.feature_map.describe(),
            "loss_split": None if split is None else split.describe(),
        }
        return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()

    def _reserve(self, state: _RunState) -> Any:
        """Reserve in the ledger what the rest of this run may spend (None without a ledger or a private plan)."""
        plan = state.plan
        if self.ledger is None or not plan.is_private:
            return None
        planned = plan.steps if plan.budget_steps is None else min(plan.steps, plan.budget_steps)
        remaining = planned - state.private_steps
        if remaining <= 0:
            return None
        from featuredp.accounting import dpsgd_event

        assert plan.noise_multiplier is not None
        event = dpsgd_event(plan.noise_multiplier, plan.sampling_rate, remaining)
        return self.ledger.reserve(f"featuredp Trainer {plan.method}: up to {remaining} private steps", event=event)

    def _settle(self, reservation: Any, private_steps: int) -> None:
        """Settle the reservation at the private steps this call actually ran (a crash included)."""
        if reservation is None:
            return
        plan = self.plan
        if private_steps <= 0:
            reservation.cancel()  # no private step ran: the data was never touched by the mechanism
            return
        from featuredp.accounting import dpsgd_event

        assert plan is not None and plan.noise_multiplier is not None
        try:
            reservation.settle(event=dpsgd_event(plan.noise_multiplier, plan.sampling_rate, private_steps))
        except BudgetExceededError:
            # Fewer steps never cost more, but if rounding ever said so, keep the (larger) reserved amount
            # rather than lose the record or mask the exception that may be unwinding this call.
            reservation.settle()

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

    def _save_checkpoint(self, path: str | Path, state: _RunState) -> None:
        atomic_save_torch(path, state.state_dict())

    def _step(
        self,
        state: _RunState,
        split: LossSplit | None,
        data: Batch,
        plan: PrivacyPlan,
        params: dict[str, torch.Tensor],
        pre: bool,
    ) -> dict[str, float]:
        """One optimisation step; returns the public quantities to show."""
        shown: dict[str, float] = {}
        method = plan.method
        if pre or method == "public":
            assert split is not None
            b = gather(data, state.public_shuffler.sample())
            d = split.draws(b, state.public_draws)
            loss = split.public_loss(self.model, b, d).mean()
            grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
            shown["public_loss"] = float(loss.detach())
            opt = state.pretrain_optimizer if pre else state.optimizer
        elif method == "nonprivate":
            b = gather(data, state.shuffler.sample())
            if split is not None:
                d = split.draws(b, state.private_draws)
                loss = split.loss(self.model, b, d).mean()
            else:
                loss = nn.functional.cross_entropy(forward(self.model, b), b["y"])
            grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
            shown["loss"] = float(loss.detach())
            opt = state.optimizer
        else:
            grads = self._private_gradient(state, split, data, plan)
            if method == "fdp":
                assert split is not None
                # Independent public batch: its own sampler stream and its own draws generator.
                bp = gather(data, state.public_sampler.sample())
                dp = split.draws(bp, state.public_draws)
                lp = split.public_loss(self.model, bp, dp).mean()
                gp = torch.autograd.grad(lp, list(params.values()))
                grads = {k: g_pub + plan.alpha * grads[k] for k, g_pub in zip(params, gp)}
                shown["public_loss"] = float(lp.detach())
            opt = state.optimizer
        for k, p in params.items():
            p.grad = grads[k].detach().to(p.dtype)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if self.projection_radius is not None:
            _project(params, self.projection_radius)
        if not pre:
            state.update_average(params, plan.steps)
        return shown

    def _private_gradient(
        self, state: _RunState, split: LossSplit | None, data: Batch, plan: PrivacyPlan
    ) -> dict[str, torch.Tensor]:
        """(Σ_{i∈B} clip_C ∇ℓ_x(θ; x_i) + N(0, σ²C²)) / m for a Poisson batch B (ℓ_x = ℓ_priv for fdp, ℓ for dpsgd)."""
        idx = state.private_sampler.sample()
        b = gather(data, idx)
        if split is not None:
            d = split.draws(b, state.private_draws)
            loss_fn = split.private_loss if plan.method == "fdp" else split.loss
        else:
            d = {}
            loss_fn = _plain_cross_entropy
        sums, _norms = self.strategy.clipped_sum(self.model, loss_fn, b, d, plan.max_grad_norm)
        assert plan.noise_multiplier is not None and plan.max_grad_norm is not None
        std = 0.0 if plan.noise_multiplier == 0 else plan.noise_multiplier * plan.max_grad_norm
        noisy = state.noise.add(sums, std)  # new tensors: safe to scale in place
        # Divide by the EXPECTED batch size m = p·n; the realised size len(idx) is private.
        return {k: v.div_(plan.expected_batch_size) for k, v in noisy.items()}


def _plain_cross_entropy(model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
    return nn.functional.cross_entropy(forward(model, batch), batch["y"], reduction="none")


def _data_fingerprint(batch: Batch) -> str:
    """SHA-256 of the training tensors (keys, dtypes, shapes, bytes).

    A function of private data: it goes into the private checkpoint only, never into
    run.json (anyone could test a guessed dataset against a published hash).
    """
    h = hashlib.sha256()
    for key in sorted(batch):
        t = batch[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(memoryview(t.view(torch.uint8).numpy()) if t.numel() else b"")
    return h.hexdigest()


def _warn_record_level_statistics(data: Any) -> None:
    """DP-SGD claims record-level DP, so *every* column's encoding statistic read from the data escapes it
    (for FDP only the private columns' do; ``Columns.bind`` checks those)."""
    from_data = getattr(data, "statistics_from_data", None) or {}
    if from_data:
        listed = ", ".join(f"{col} ({what})" for col, what in sorted(from_data.items()))
        warnings.warn(
            f"dpsgd protects whole records, but these encoding statistics were computed from the training data "
            f"and are outside its guarantee: {listed}; pass public bounds=/categories=/classes= to the loader",
            PrivacyLeakWarning,
            stacklevel=3,
        )


def _open_ledger(ledger: Any) -> Any:
    """A BudgetLedger from a ledger object or the path of an existing ledger file (None passes through)."""
    if ledger is None:
        return None
    from featuredp.accounting import BudgetLedger

    if isinstance(ledger, BudgetLedger):
        return ledger
    if isinstance(ledger, str | os.PathLike):
        if not Path(ledger).exists():
            raise FileNotFoundError(
                f"ledger={str(ledger)!r} does not exist: create it once with its total budget, e.g. "
                f"BudgetLedger({str(ledger)!r}, total_epsilon=8.0, delta=1e-5)"
            )
        return BudgetLedger(ledger)
    raise TypeError(f"ledger must be a BudgetLedger or the path of one, got {type(ledger).__name__}")


def _randomness_report(trainer: Trainer) -> dict[str, Any]:
    """Where the private randomness came from (never the seed itself)."""
    return {
        "private": "user seed (reproducible: keep it secret)" if trainer.seed is not None else "OS entropy (secret)",
        "secure_rng": trainer.secure_rng,
        "noise": "ChaCha20 CSPRNG, float64 Box-Muller, added in float64" if trainer.secure_rng else "torch.randn",
        "public_seed": trainer.public_seed,
    }


# Private phases applied to each model object, by run (ARCHITECTURE rule 7: every private
# step any call applies to a model is counted). Weak keys: the record dies with the model.
_APPLIED: weakref.WeakKeyDictionary[nn.Module, dict[int, dict[str, Any]]] = weakref.WeakKeyDictionary()


def _record_applied(model: nn.Module, state: _RunState) -> None:
    plan = state.plan
    if not plan.is_private or state.private_steps == 0:
        return
    _APPLIED.setdefault(model, {})[id(state)] = {
        "noise_multiplier": plan.noise_multiplier,
        "sampling_rate": plan.sampling_rate,
        "steps": state.private_steps,
    }


def _earlier_runs(model: nn.Module, state: _RunState) -> list[dict[str, Any]]:
    return [phase for key, phase in _APPLIED.get(model, {}).items() if key != id(state) and phase["steps"] > 0]


def _warn_if_trained_before(model: nn.Module, state: _RunState) -> None:
    earlier = _earlier_runs(model, state)
    if earlier and state.plan.is_private:
        steps = sum(p["steps"] for p in earlier)
        warnings.warn(
            f"this model was already trained privately by {len(earlier)} other run(s) ({steps} private steps); the "
            "released model's guarantee is the composition of all of them, not this run's epsilon alone. The result "
            "reports both (privacy_report['model_epsilon_all_runs']); record every run in one BudgetLedger (ledger=)",
            PrivacyRiskWarning,
            stacklevel=3,
        )


def _model_epsilon(model: nn.Module, state: _RunState, plan: PrivacyPlan) -> float | str | None:
    """ε(δ) of every private run applied to ``model`` composed, when other runs came before this one."""
    earlier = _earlier_runs(model, state)
    if not earlier or not plan.is_private or plan.delta is None:
        return None
    from featuredp import accounting

    phases = [*earlier]
    if state.private_steps:
        phases.append({"noise_multiplier": plan.noise_multiplier, "sampling_rate": plan.sampling_rate,
                       "steps": state.private_steps})
    if any(not p["noise_multiplier"] for p in phases):
        return "inf"
    events = [accounting.dpsgd_event(p["noise_multiplier"], p["sampling_rate"], p["steps"]) for p in phases]
    return accounting.compute_epsilon(accounting.compose_events(*events), plan.delta, relation=plan.relation,
                                      accountant=plan.accountant)


@torch.no_grad()
def _project(params: dict[str, torch.Tensor], radius: float) -> None:
    norm = torch.sqrt(sum(p.pow(2).sum() for p in params.values()))
    if norm > radius:
        for p in params.values():
            p.mul_(radius / norm)


def _progress(total: int, initial: int, enabled: bool, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, file=sys.stderr, desc=desc, leave=False,
                dynamic_ncols=True)


# ----------------------------------------------------------------------------------------------------------
# Run state: samplers, generators, optimizers, averaging — everything a checkpoint must restore
# ----------------------------------------------------------------------------------------------------------
class _RunState:
    """The mutable state of one run (private: RNG states reveal batch membership; never logged)."""

    def __init__(self) -> None:
        self.step = 0
        self.private_steps = 0
        self.stop_reason: str | None = None
        self.history: list[dict[str, float]] = []
        self.complete = False

    @classmethod
    def start(cls, trainer: Trainer, plan: PrivacyPlan, fingerprint: dict[str, str]) -> _RunState:
        s = cls()
        s.trainer = trainer
        s.plan = plan
        s.fingerprint = fingerprint
        streams = make_streams(trainer.seed, public_seed=trainer.public_seed)
        s.streams = streams
        n = plan.dataset_size
        m_int = max(1, round(plan.expected_batch_size))
        # Loss draws of the private batch and of the public batch come from two different
        # streams (the public ones may be seeded publicly; the private ones never).
        s.private_draws = _torch_generator(random_seed_from(streams.private_draws))
        s.public_draws = _torch_generator(random_seed_from(streams.public_draws))
        s.secure_sampling: ChaCha20Generator | None = None
        if trainer.secure_rng:
            # Keys from os.urandom, or from the user's seed for a reproducible (and secret) run.
            keys = [streams.noise.bytes(32), streams.private_sampling.bytes(32)] if streams.seeded else [None, None]
            s.noise = SecureNoise(ChaCha20Generator(keys[0]))
            s.secure_sampling = ChaCha20Generator(keys[1])
            s.private_sampler = PoissonSampler(n, plan.sampling_rate, s.secure_sampling)
        else:
            s.noise = TorchNoise(_torch_generator(random_seed_from(streams.noise)))
            s.private_sampler = PoissonSampler(n, plan.sampling_rate, streams.private_sampling)
        s.shuffler = EpochShuffler(n, min(m_int, n), streams.private_sampling)
        m_pub = plan.public_batch_size or m_int
        s.public_sampler = UniformSampler(n, m_pub, streams.public_sampling)
        s.public_shuffler = EpochShuffler(n, m_pub, streams.public_sampling)
        params = list(trainable_parameters(trainer.model).values())
        s.optimizer = _make_optimizer(trainer, params, trainer.lr)
        s.pretrain_optimizer = _make_optimizer(trainer, params, trainer.pretrain_lr)
        s.average: dict[str, torch.Tensor] | None = None
        s.average_count = 0
        return s

    # -- iterate averaging (post-processing of the iterates) ---------------------------------------------
    @torch.no_grad()
    def update_average(self, params: dict[str, torch.Tensor], main_steps: int) -> None:
        t = self.trainer
        if t.averaging is None:
            return
        main_done = self.step - self.plan.pretrain_steps + 1  # this step's index in the main phase, 1-based
        if t.averaging == "ema":
            if self.average is None:
                self.average = {k: p.detach().clone() for k, p in params.items()}
            else:
                for k, p in params.items():
                    self.average[k].mul_(t.ema_decay).add_(p.detach(), alpha=1 - t.ema_decay)
            return
        start = main_steps - max(1, math.ceil(t.average_fraction * main_steps))
        if main_done <= start:
            return
        self.average_count += 1
        if self.average is None:
            self.average = {k: p.detach().clone() for k, p in params.items()}
        else:
            for k, p in params.items():
                self.average[k].add_(p.detach() - self.average[k], alpha=1.0 / self.average_count)

    @torch.no_grad()
    def finalize_average(self, model: nn.Module) -> None:
        if self.average is None:
            return
        for k, p in trainable_parameters(model).items():
            p.copy_(self.average[k])

    # -- checkpoint state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain containers only (safe for ``torch.load(weights_only=True)``)."""
        return {
            "format": _CHECKPOINT_FORMAT,
            "plan": self.plan.to_dict(),
            "fingerprint": dict(self.fingerprint),
            "step": self.step,
            "private_steps": self.private_steps,
            "stop_reason": self.stop_reason,
            "history": self.history,
            "accountant_phases": [
                {"noise_multiplier": self.plan.noise_multiplier, "sampling_rate": self.plan.sampling_rate,
                 "steps": self.private_steps}
            ] if self.plan.is_private else [],
            "model": {k: v.detach().clone() for k, v in self.trainer.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "pretrain_optimizer": self.pretrain_optimizer.state_dict(),
            "numpy_rng": {name: _np_state(getattr(self.streams, name)) for name in STREAM_NAMES},
            "torch_rng": {"private_draws": self.private_draws.get_state(),
                          "public_draws": self.public_draws.get_state()},
            "noise": self.noise.state_dict(),
            "secure_sampling": None if self.secure_sampling is None else self.secure_sampling.state_dict(),
            "shufflers": {"private": _shuffler_state(self.shuffler), "public": _shuffler_state(self.public_shuffler)},
            "average": self.average,
            "average_count": self.average_count,
        }

    def load(self, ck: dict[str, Any]) -> None:
        if ck.get("format") != _CHECKPOINT_FORMAT:
            raise ValueError(
                f"the checkpoint has format {ck.get('format')!r}, this featuredp writes {_CHECKPOINT_FORMAT}; it was "
                "written by another version and cannot be resumed: start a new run"
            )
        if ck.get("plan") != self.plan.to_dict():
            raise ValueError(
                "the checkpoint belongs to a different plan (dataset size, batch sizes, noise or steps differ); "
                "resume with the same settings or start a new run"
            )
        saved = ck.get("fingerprint") or {}
        if saved.get("data") != self.fingerprint["data"]:
            raise ValueError(
                "the checkpoint was written for different training data (its fingerprint differs): a resumed run "
                "must continue on exactly the same records, or its accountant would not cover the change; resume "
                "on the original data or start a new run"
            )
        if saved.get("psi") != self.fingerprint["psi"]:
            raise ValueError(
                "the checkpoint was written with a different public feature map or loss split (Ψ differs); resume "
                "with the same Ψ or start a new run"
            )
        if (ck.get("secure_sampling") is not None) != (self.secure_sampling is not None):
            raise ValueError("the checkpoint's secure_rng setting differs from this Trainer's; resume with the same")
        self.step = int(ck["step"])
        self.private_steps = int(ck["private_steps"])
        self.stop_reason = ck.get("stop_reason")
        self.history = list(ck.get("history", []))
        self.trainer.model.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.pretrain_optimizer.load_state_dict(ck["pretrain_optimizer"])
        for name, st in ck["numpy_rng"].items():
            getattr(self.streams, name).bit_generator.state = _np_state_from(st)
        self.private_draws.set_state(ck["torch_rng"]["private_draws"])
        self.public_draws.set_state(ck["torch_rng"]["public_draws"])
        self.noise.load_state_dict(ck["noise"])
        if self.secure_sampling is not None:
            self.secure_sampling.load_state_dict(ck["secure_sampling"])
        _load_shuffler(self.shuffler, ck["shufflers"]["private"])
        _load_shuffler(self.public_shuffler, ck["shufflers"]["public"])
        self.average = ck.get("average")
        self.average_count = int(ck.get("average_count", 0))


def _make_optimizer(trainer: Trainer, params: list[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    if trainer.optimizer_name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=trainer.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=trainer.momentum, weight_decay=trainer.weight_decay)


def _np_state(gen: np.random.Generator) -> dict[str, Any]:
    # PCG64 state holds 128-bit integers; store them as strings so the checkpoint stays plain JSON-able data.
    return _stringify(gen.bit_generator.state)


def _stringify(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _stringify(v) for k, v in obj.items()}
    if isinstance(obj, int) and not isinstance(obj, bool):
        return {"int": str(obj)}
    return obj


def _np_state_from(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"int"}:
            return int(obj["int"])
        return {k: _np_state_from(v) for k, v in obj.items()}
    return obj


def _shuffler_state(s: EpochShuffler) -> dict[str, Any]:
    return {"perm": torch.from_numpy(np.asarray(s._perm, dtype=np.int64).copy()), "pos": int(s._pos)}


def _load_shuffler(s: EpochShuffler, st: dict[str, Any]) -> None:
    s._perm = st["perm"].numpy().astype(np.int64)
    s._pos = int(st["pos"])
