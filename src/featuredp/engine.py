"""THE composer: Algorithm 1 (FDP-SGD) and its baselines, with accounting and a budget stop.

Methods (paper §3; their records are in :mod:`featuredp.methods`):

=============  ====================================================================  =====================
method         each step                                                             guarantee
=============  ====================================================================  =====================
nonprivate     shuffled batch of m, gradient of mean ℓ                               none
public         shuffled batch of m' read through Ψ, gradient of mean ℓ_pub           (0, 0)-FDP
dpsgd          Poisson batch (rate p = m/n), Σ clip_C ∇ℓ + N(0, σ²C²), divided by m  (ε, δ)-DP ⇒ FDP
fdp_dpsgd      public pre-training on ℓ_pub, then dpsgd                              (ε, δ)-FDP
fdp            [public pre-training], then Algorithm 1:                              (ε, δ)-FDP (Thm 5)
               g = w·g_pub + α·g_priv; g_priv = (Σ clip_C ∇(ℓ − w·ℓ_pub) + N(0, σ²C²))
               / m on a Poisson batch, g_pub = mean ∇ℓ_pub on an independent
               uniform batch of m'. w = 1 (default): ℓ_priv = ℓ − ℓ_pub; w = 0: no
               public batch, ∇ℓ clipped (α = 1: exactly fdp_dpsgd)
=============  ====================================================================  =====================

Rules this module keeps (docs/engine.md, "privacy rules the engine keeps"):

* the private batch (Poisson, ``private_sampling`` stream) and the public batch
  (uniform, ``public_sampling`` stream) never share coins; the public batch's
  loss draws come from their own generator, the noise from another;
* the private randomness is secret (OS entropy unless the user seeds the run);
* the private sum is divided by the *expected* batch size m = p·n, never by
  the realised size;
* clipping applies to ∇(ℓ − w·ℓ_pub) as a whole (the strategy receives that loss);
* n, p, m and m' are explicit and checked against the data;
* layers that mix examples are refused for private methods;
* one Trainer is one run with one accountant: a second ``fit`` continues it;
* private runtime quantities (indices, realised batch sizes, RNG states,
  losses of private batches) are never put in the plan, the history or the
  progress bar. Only public quantities are shown: ε, and ℓ_pub on public
  batches (or ℓ for nonprivate).

Public batches and public pre-training read Ψ(S) only and add no privacy event
(Thm 5 / Remark 2); the accountant sees exactly (σ, p, T_private). With the record-level
backstop (``record_epsilon=E``) they become record-level DP steps too — Poisson batches from
a secret stream of their own, clipped at C, noise σ_pub·C, divided by the expected size —
and the plan's ``record_epsilon`` composes every step (docs/engine.md, "The record-level backstop").

The building blocks it composes: :mod:`featuredp.config` (settings),
:mod:`featuredp.plan` (the plan and the guarantee), :mod:`featuredp.run_state`
(samplers, generators, noise, optimisers, ledger), :mod:`featuredp.clipping`,
:mod:`featuredp.losses`, :mod:`featuredp.batches`.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from featuredp._validate import check_choice, check_delta, check_int
from featuredp.accounting import (
    BudgetLedger,
    calibrate_record_noise,
    check_sampler_tail,
)
from featuredp.batches import as_batch, evaluate, gather, resolve_device, to_device
from featuredp.clipping import GradientStrategy, check_no_batch_mixing, get_strategy, trainable_parameters
from featuredp.clipping.base import check_precision
from featuredp.config import PerformanceConfig, PrivacyConfig, ScheduleConfig, resolve_config, split_settings
from featuredp.distributed import (
    DistContext,
    agree_across_ranks,
    broadcast_parameters,
    context,
    exact_float32,
    load_rank_checkpoint,
    model_device,
    on_main_rank,
    save_rank_checkpoint,
    whole_size,
)
from featuredp.errors import DataValidationError, UnreachableTargetError, warn_record_level_statistics
from featuredp.features import Batch, PublicFeatureMap
from featuredp.losses import LabelDPSplit, LossSplit, default_split
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS, Method, get_method
from featuredp.noise import Independent
from featuredp.noise.sources import SecureNoise, TorchNoise
from featuredp.plan import PrivacyPlan, TrainResult, inf_to_str
from featuredp.run_report import run_result
from featuredp.run_state import ModelRuns, RunState, data_fingerprint, open_ledger, reserve, settle
from featuredp.sampling import make_streams, random_seed_from, warn_private_seed
from featuredp.step import StepCore, noised_coordinates, plain_cross_entropy, project
from featuredp.testing import replay_step

__all__ = [
    "METHODS",
    "PRIVATE_METHODS",
    "PerformanceConfig",
    "PrivacyConfig",
    "PrivacyPlan",
    "ScheduleConfig",
    "TrainResult",
    "Trainer",
    "as_batch",
    "evaluate",
    "init_seed",
]

METHODS = METHOD_NAMES  # the names, as before featuredp.methods held the records

# Every private run applied to each model object in this process (rule 7).
_MODEL_RUNS = ModelRuns()


def init_seed(seed: int | None) -> int:
    """A model-initialisation seed from the public ``init`` stream of ``seed`` (OS entropy for ``None``).

    Model initialisation reads no data, so a published seed here is safe; it is the same
    stream a Trainer with ``public_seed=seed`` would use.

    >>> init_seed(0) == init_seed(0)
    True
    """
    return random_seed_from(make_streams(None, public_seed=seed).init)


#: Algorithm 1's default public batch m' as a multiple of the expected private batch m (at most n)
PUBLIC_BATCH_FACTOR = 4


class Trainer:
    """Runs one method with a model, a Ψ / loss split and a privacy plan.

    Settings come as three frozen configs (:class:`~featuredp.config.PrivacyConfig`,
    :class:`~featuredp.config.ScheduleConfig`, :class:`~featuredp.config.PerformanceConfig`)
    or as flat keywords sorted into them (``Trainer(model, "fdp", lr=0.05, target_epsilon=1)``).
    The important ones:

    * ``method``: one of ``nonprivate, public, dpsgd, fdp_dpsgd, fdp`` (:mod:`featuredp.methods`).
    * ``feature_map`` (Ψ) or ``loss_split`` (which carries its Ψ): needed for methods that
      read Ψ. Without a split, the default for Ψ is used (Gaussian padding for column maps,
      the label-DP split for a private label).
    * schedule: ``epochs`` or ``steps``; ``batch_size`` (expected private batch m) or
      ``sampling_rate``; ``public_batch_size`` (m'; for ``fdp`` default 4·m, at most n; else m);
      ``dataset_size`` (checked); ``pretrain_epochs``, ``pretrain_batch_size`` (default: a given m', else m);
      ``optimizer`` (sgd/adam), ``lr``,
      ``momentum``, ``weight_decay``, ``pretrain_lr``; ``projection_radius``; ``averaging`` (uniform/ema).
    * privacy: ``noise_multiplier`` σ or ``target_epsilon`` (with ``delta``; with both, training
      stops before a step would exceed the target); ``max_grad_norm`` C; ``alpha``; ``public_weight``
      w (``fdp``: g = w·g_pub + α·g_priv with ℓ − w·ℓ_pub clipped; 0 = no public batch);
      ``relation``, ``accountant``; ``seed`` (secret: reproducible research only, warned, never
      written out), ``public_seed`` (public streams only), ``secure_rng`` (ChaCha20 noise).
    * performance: ``strategy`` (a registered name, default ``"ghost"``), ``physical_batch_size``,
      ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``auto``; default: the model's device),
      ``progress``, ``log_points``.
    * ``ledger``: a :class:`~featuredp.accounting.BudgetLedger` (or its path). Each ``fit``
      reserves the planned private spend before the first private step and settles it with
      what was actually spent, also on a crash.

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
        privacy: PrivacyConfig | None = None,
        schedule: ScheduleConfig | None = None,
        performance: PerformanceConfig | None = None,
        ledger: BudgetLedger | str | Path | None = None,
        **settings: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.method = check_choice("method", method, METHOD_NAMES)
        record = get_method(self.method)
        flat = split_settings(settings)
        self.privacy: PrivacyConfig = resolve_config(PrivacyConfig, "privacy", privacy, flat)
        self.schedule: ScheduleConfig = resolve_config(ScheduleConfig, "schedule", schedule, flat)
        self.performance: PerformanceConfig = resolve_config(PerformanceConfig, "performance", performance, flat)
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
        self.device = model_device(model) if self.performance.device is None else resolve_device(
            self.performance.device)
        self.model = model.to(self.device)
        check_precision(self.performance.precision, self.device)
        # torchrun (or the user's own process group): a data-parallel run of the same mechanism.
        self.dist: DistContext | None = context(self.device, mode=self.performance.distributed)
        if self.dist is not None and self.privacy.record_epsilon is not None:
            raise ValueError("record_epsilon (the record-level backstop) is not supported in data-parallel runs "
                             "(torchrun) yet; run on one process")  # fmt: skip
        if self.dist is not None:
            broadcast_parameters(self.model)
        self.feature_map = loss_split.feature_map if loss_split is not None else feature_map
        self.loss_split = loss_split
        self.strategy: GradientStrategy = get_strategy(
            self.performance.strategy, physical_batch_size=self.performance.physical_batch_size)
        self.ledger = open_ledger(ledger)
        self.plan: PrivacyPlan | None = None
        self.result: TrainResult | None = None
        self._state: RunState | None = None
        # The step's arithmetic, shared with PrivacyEngine's optimizer (featuredp.step): one engine, two loops.
        self._core = StepCore(self.model, self.strategy, precision=self.performance.precision, device=self.device,
                              dist=self.dist)  # fmt: skip

    def __getattr__(self, name: str) -> Any:
        """Read a setting by its flat name (``trainer.lr``, ``trainer.noise_multiplier``), as before the configs."""
        if name.startswith("_") or name in ("privacy", "schedule", "performance"):
            raise AttributeError(name)
        for cfg in (self.privacy, self.schedule, self.performance):
            if name in cfg.__dataclass_fields__:
                return getattr(cfg, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- configuration -----------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The trainer's settings (JSON-able; no data, no RNG state, never the seed) for run.json."""
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
            # BandMF's bands as run (the plan's: chosen there when not given), None for independent noise.
            "bands": (self.plan.noise if self.plan is not None else p.noise_plan).settings().get("bands"),
            "device": str(self.device),
            "world_size": 1 if self.dist is None else self.dist.world_size,
            "precision": self.performance.precision,
        }

    def check_model(self, data: Any, *, records: int = 3, batch_size: int = 32) -> list[Any]:
        """Run the replay self-test (:func:`featuredp.testing.replay_step`) on this Trainer's model, method,
        strategy and settings: for each of ``records`` records of ``data``, one private step on a batch of
        ``batch_size`` other records and on that batch plus the record, with identical randomness. Returns the
        :class:`featuredp.testing.ReplayReport` of each; :func:`featuredp.testing.verdict` sums them up
        (for ghost clipping: whether it is safe for this model, or was refused and ``strategy="vmap"`` is needed).

        Call it before :meth:`fit`; the model and the Trainer are left as they were. The rows are chosen with
        OS entropy. The verdict is computed from ``data`` and is not covered by ε: use public or synthetic
        records of the same shape where you can.
        """
        records = check_int("records", records, minimum=1)
        batch_size = check_int("batch_size", batch_size, minimum=1)
        n = int(next(iter(as_batch(data).values())).shape[0])
        if n < 2:
            raise DataValidationError(f"check_model needs at least 2 records, got {n}")
        rng = np.random.default_rng()
        reports = []
        for _ in range(records):
            rows = rng.choice(n, size=min(batch_size, n - 1) + 1, replace=False)
            with exact_float32(self.device):
                reports.append(replay_step(self, data, record=int(rows[0]), batch=[int(i) for i in rows[1:]]))
        return reports

    def make_plan(self, n: int) -> PrivacyPlan:
        """The privacy plan for a dataset of ``n`` records (calibrates σ when only a target is given)."""
        n = check_int("dataset_size", n, minimum=1)
        p_cfg, s_cfg = self.privacy, self.schedule
        record = get_method(self.method)
        if s_cfg.dataset_size is not None and s_cfg.dataset_size != n:
            raise DataValidationError(f"dataset_size={s_cfg.dataset_size} was declared but the data holds {n} records")
        if s_cfg.sampling_rate is not None:
            p = s_cfg.sampling_rate
            m = p * n
        else:
            batch = int(s_cfg.batch_size or 256)
            if batch > n:
                raise DataValidationError(f"batch_size must be <= the number of records {n}, got {batch}")
            m = float(batch)
            p = m / n
        if s_cfg.public_batch_size is not None:
            m_pub = s_cfg.public_batch_size
        elif record.public_batch:
            # Algorithm 1's public batch costs compute, not privacy: by default 4·m (at most n), so that its own
            # sampling noise stays below the DP noise (docs/engine.md, "The public batch").
            m_pub = min(n, max(1, round(PUBLIC_BATCH_FACTOR * m)))
        else:
            m_pub = max(1, round(m))
        if m_pub > n:
            raise DataValidationError(f"public_batch_size must be <= the number of records {n}, got {m_pub}")
        # Pre-training keeps its own batch (default: a given m', else m), so a larger m' costs no pre-training steps.
        m_pre = s_cfg.pretrain_batch_size or s_cfg.public_batch_size or max(1, round(m))
        if m_pre > n:
            raise DataValidationError(f"pretrain_batch_size must be <= the number of records {n}, got {m_pre}")
        steps = s_cfg.steps if s_cfg.steps is not None else max(1, round(float(s_cfg.epochs or 0.0) * n / m))
        pretrain = round(s_cfg.pretrain_epochs * n / m_pre) if s_cfg.pretrain_epochs else 0
        delta = p_cfg.delta
        if delta is not None and record.private:
            delta = check_delta(delta, n)  # warns (PrivacyRiskWarning) when delta >= 1/n
        sigma, budget = p_cfg.noise_multiplier, None
        noise = p_cfg.noise_plan if record.private else Independent()
        if record.private:
            assert delta is not None  # checked in __init__
            s_cfg = self.schedule  # the workload: SGD momentum's, else the prefix sums (Adam is not linear)
            noise = noise.planned(n, m, steps, target_epsilon=p_cfg.target_epsilon, delta=delta,
                                  momentum=s_cfg.momentum if s_cfg.optimizer == "sgd" else 0.0,
                                  relation=p_cfg.relation, accountant=p_cfg.accountant)  # fmt: skip
            # σ and the step budget are calibrated on the plan's own accounted terms (the noise plan's, through
            # PrivacyPlan.dpsgd_terms), the ones its ε, the ledger and the audits read; never overshooting.
            accounted = PrivacyPlan(self.method, n, m, p, steps, noise_multiplier=1.0 if sigma is None else sigma,
                                    delta=delta, relation=p_cfg.relation, accountant=p_cfg.accountant,
                                    noise=noise)  # fmt: skip
            if sigma is None:
                assert p_cfg.target_epsilon is not None  # checked in __init__
                sigma = accounted.calibrated_noise_multiplier(p_cfg.target_epsilon)
                budget = steps
            elif p_cfg.target_epsilon is not None:
                if sigma == 0:
                    raise ValueError("noise_multiplier=0 cannot meet any target_epsilon; drop target_epsilon")
                budget = accounted.affordable_steps(p_cfg.target_epsilon)
            if sigma and math.isinf(p_cfg.max_grad_norm):
                raise ValueError("max_grad_norm=inf (no clipping) has unbounded sensitivity; it is only allowed "
                                 "with noise_multiplier=0 (a non-private reference run)")
        weight = p_cfg.public_weight if record.public_batch else 1.0
        uses_public = record.public_steps or (record.public_batch and weight > 0) or pretrain > 0
        backstop = p_cfg.record_epsilon is not None
        if backstop and not record.private:  # the public method's steps become DP steps: they need C and δ
            if delta is None:
                raise ValueError("record_epsilon (the record-level backstop) needs delta=")
            delta = check_delta(delta, n)
            if math.isinf(p_cfg.max_grad_norm):
                raise ValueError("record_epsilon (the record-level backstop) needs a finite max_grad_norm")
        if backstop and record.private and not sigma:
            raise ValueError("record_epsilon (the record-level backstop) needs noise on the private steps, got "
                             f"noise_multiplier={sigma!r}")  # fmt: skip
        plan = PrivacyPlan(
            method=self.method,
            dataset_size=n,
            expected_batch_size=m,
            sampling_rate=p,
            steps=steps,
            pretrain_steps=pretrain,
            public_batch_size=m_pub if uses_public else None,
            pretrain_batch_size=m_pre if pretrain else None,
            noise_multiplier=sigma if record.private else None,
            max_grad_norm=p_cfg.max_grad_norm if record.private or backstop else None,
            alpha=p_cfg.alpha if record.public_batch else 1.0,
            public_weight=weight,
            delta=delta if record.private or backstop else None,
            target_epsilon=p_cfg.target_epsilon if record.private else None,
            budget_steps=budget,
            relation=p_cfg.relation,
            accountant=p_cfg.accountant,
            noise=noise,
            record_target_epsilon=p_cfg.record_epsilon,
        )
        if backstop:
            plan = self._backstop_plan(plan)
        if record.private and sigma:
            # What the noise sampler cannot produce is added to the reported δ (ARCHITECTURE rule 12); refuse up
            # front a run whose ε is so large that this tail would be more than a sliver of δ.
            assert delta is not None  # checked in __init__
            most = steps if budget is None else min(steps, budget)
            eps = p_cfg.target_epsilon if p_cfg.target_epsilon is not None else plan.epsilon(most)
            check_sampler_tail(eps, delta, most, noised_coordinates(self.model), noise_multiplier=sigma,
                               tail_mass_per_pair=(SecureNoise if p_cfg.secure_rng else TorchNoise).tail_mass_per_pair)
        return plan

    def _backstop_plan(self, plan: PrivacyPlan) -> PrivacyPlan:
        """``plan`` with σ_pub calibrated so that the whole run is (E, δ)-DP for whole records (E =
        ``record_epsilon``): the private steps' and the noised public steps' Poisson Gaussians composed, never
        above E (:func:`featuredp.accounting.calibrate_record_noise`). ``dpsgd`` is already record-level DP: E is
        only checked against its ε. The FDP ε is unchanged: public steps read Ψ(S) only."""
        target = plan.record_target_epsilon
        assert target is not None and plan.delta is not None
        terms = plan.record_terms()
        if not get_method(plan.method).needs_feature_map or (terms["pretrain"][1] <= 0 and terms["public"][1] <= 0):
            eps = plan.record_epsilon()
            if eps is not None and eps > target:
                raise UnreachableTargetError(
                    f"--record-epsilon {target:g} cannot be met: the private steps alone are ({eps:.4g}, "
                    f"{plan.delta:g})-DP at record level; give a larger --record-epsilon"
                )
            return plan
        sigma = calibrate_record_noise(target, plan.delta, **terms, relation=plan.relation,
                                       accountant=plan.accountant)  # fmt: skip
        return replace(plan, record_noise_multiplier=sigma)

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
        sharded: bool = False,
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
        ``sharded=True``: in a data-parallel run, ``data`` is only this rank's shard of the
        dataset (the ranks' shards are disjoint and together the whole dataset, e.g. row ranges
        from :func:`featuredp.data.files.read_table`); the whole dataset's size must be declared
        with ``dataset_size=`` and is checked against the sum of the shards. Each rank then
        Poisson-samples all its records at the global rate and draws its public share from them
        (docs/distributed.md).
        """
        batch_all = as_batch(data)
        n = int(next(iter(batch_all.values())).shape[0])
        if "y" not in batch_all and not get_method(self.method).public_steps:
            raise DataValidationError("data has no labels 'y'")
        if checkpoint_every is not None:
            checkpoint_every = check_int("checkpoint_every", checkpoint_every, minimum=1)
            if checkpoint is None:
                raise ValueError("checkpoint_every needs checkpoint=PATH")
        if max_steps is not None:
            max_steps = check_int("max_steps", max_steps, minimum=1)
        shard = None
        if sharded:
            shard, n = n, self._whole_size(n)
        state, split = self._run_state(data, batch_all, n, checkpoint if resume else None, shard=shard)
        plan = state.plan
        batch_all = to_device(batch_all, self.device)

        total = plan.pretrain_steps + plan.steps
        log_at = {plan.pretrain_steps + round(plan.steps * (i + 1) / self.performance.log_points)
                  for i in range(self.performance.log_points)}  # fmt: skip
        params = trainable_parameters(self.model)
        steps_this_call = 0
        private_before = state.private_steps
        display: dict[str, float] = {}  # what the bar shows: public quantities and the ε at the last log point
        if self.dist is not None:  # before the first private step (and on every later call): one plan everywhere
            agree_across_ranks(self._rank_settings(state, split, shard, n))
        reservation = self._reserve(state)  # before any private step: an overspend is refused up front
        main = self.dist is None or self.dist.is_main
        desc = plan.noise.progress_label(self.method)
        pbar = tqdm(total=total, initial=state.step, disable=not (self.performance.progress and main),
                    file=sys.stderr, desc=desc, leave=False, dynamic_ncols=True)  # fmt: skip
        try:
            while state.step < total:
                if max_steps is not None and steps_this_call >= max_steps:
                    break
                pre = state.step < plan.pretrain_steps
                budget = plan.budget_steps if plan.is_private and not pre else None
                if budget is not None and state.private_steps + 1 > budget:
                    state.stop_reason = "budget"  # stop before a step would exceed the budget
                    break
                # A private step is counted inside _step, before its noisy update is applied (see there).
                with exact_float32(self.device):
                    shown = self._step(state, split, batch_all, params, pre, count=not pre and plan.is_private)
                state.step += 1
                steps_this_call += 1
                if state.step in log_at:
                    shown["epsilon"] = plan.epsilon(state.private_steps) if plan.is_private else plan.epsilon(0)
                    state.history.append({"step": state.step, **shown})
                    if callback is not None and main:
                        callback(state.step, shown)
                pbar.update(1)
                display.update(shown)
                if display:
                    pbar.set_postfix({k: f"{v:.4g}" for k, v in display.items()}, refresh=False)
                if checkpoint is not None and checkpoint_every and state.step % checkpoint_every == 0:
                    self._save_checkpoint(checkpoint, state)
        finally:
            pbar.close()
            _MODEL_RUNS.record(self.model, state)
            settle(reservation, plan, state.private_steps - private_before)
            self._tell_nonfinite(None)
        finished = state.step >= total
        if checkpoint is not None:
            self._save_checkpoint(checkpoint, state)
        if finished or state.stop_reason == "budget":
            state.averager.finalize(params)
            state.complete = True
        return self._result(state, split, finished)

    def _whole_size(self, local: int) -> int:
        """The declared size of the whole dataset, checked against the sum of the ranks' shards."""
        declared = self.schedule.dataset_size
        if declared is None:
            raise ValueError("fit(sharded=True) needs dataset_size= (the number of records of the whole dataset)")
        return whole_size(self.dist, declared, local, self.device)

    def _run_state(
        self, data: Any, batch_all: Batch, n: int, resume_from: str | Path | None, *, shard: int | None = None
    ) -> tuple[RunState, LossSplit | None]:
        """This Trainer's run: the one in progress, or a new one (resumed from a checkpoint if asked)."""
        data_print = data_fingerprint(batch_all)
        if self._state is not None:  # a later call: the same run goes on
            state = self._state
            if data_print != state.fingerprint["data"]:
                raise ValueError(
                    "fit() was called again on different data: one Trainer is one run on one dataset. Build a new "
                    "Trainer for a new run (its privacy spend adds to this one's; record both with ledger=)"
                )
            if state.complete:
                plan = state.plan
                eps = plan.epsilon(state.private_steps) if plan.is_private else plan.epsilon(0)
                raise ValueError(
                    f"this Trainer's run is complete ({state.private_steps} private steps, epsilon={eps:.4g}); "
                    "fit() again would keep training the model outside the accounted run. To train longer, plan it "
                    "in one run (steps=/epochs=, then fit(max_steps=...) repeatedly); to start a new run, build a "
                    "new Trainer and count both runs' spends together (ledger=)"
                )
            return state, self.loss_split
        state, split = self._start_run(data, data_print, n, shard=shard, stacklevel=5)
        saved = None if resume_from is None else self._load_rank_checkpoint(resume_from)
        if saved is not None:
            state.load_state_dict(saved, self.model)
        return state, split

    def _start_run(self, data: Any, data_print: str, n: int, *, shard: int | None = None, stacklevel: int = 4
                   ) -> tuple[RunState, LossSplit | None]:  # fmt: skip
        """A new run on ``n`` records: Ψ bound to ``data`` (a TabularDataset, or a dict that binds nothing), the
        plan, the model's checks and a fresh :class:`RunState` (secret streams, samplers, noise source). The
        Trainer's loop and :class:`featuredp.privacy_engine.PrivacyEngine` both start here."""
        split = self._resolve_split(data)
        if self.schedule.pretrain_epochs and isinstance(split, LabelDPSplit):
            warnings.warn(
                "public pre-training with LabelDPSplit minimises logsumexp(logits) alone, which has no minimiser "
                "and only pushes the logits down; use pretrain_epochs=0 for a private label",
                UserWarning,
                stacklevel=3,
            )
        plan = self.make_plan(n)
        self.plan = plan
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
        )  # fmt: skip
        self._state = state
        _MODEL_RUNS.warn_if_trained_before(self.model, state)
        return state, split

    # -- data-parallel bookkeeping (featuredp.distributed) ----------------------------------------------------
    def _rank_settings(self, state: RunState, split: LossSplit | None, shard: int | None, n: int) -> dict[str, Any]:
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

    def _reserve(self, state: RunState) -> Any:
        """The ledger reservation, made by rank 0 alone; every rank learns whether it was refused."""
        return on_main_rank(self.dist, lambda: reserve(self.ledger, state))

    def _save_checkpoint(self, path: str | Path, state: RunState) -> None:
        """Write the checkpoint, owner-readable only (0600): one process's state, or each rank its own file."""
        save_rank_checkpoint(self.dist, path, state.state_dict(self.model))

    def _load_rank_checkpoint(self, path: str | Path) -> dict[str, Any] | None:
        """This process's checkpoint state (None: none to resume from); another number of processes is refused."""
        return load_rank_checkpoint(self.dist, path)

    def _result(self, state: RunState, split: LossSplit | None, finished: bool) -> TrainResult:
        """The run so far as a TrainResult (ε, δ with the sampler's tail, the guarantee, the privacy report)."""
        self.result = run_result(state, split, finished, method=self.method, feature_map=self.feature_map,
                                 privacy=self.privacy, model=self.model,
                                 composed=_MODEL_RUNS.composed_epsilon(self.model, state))  # fmt: skip
        return self.result

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

    def _timing_step(self, data: Any) -> Callable[[], None]:
        """One main-phase step of this method as a closure, for throughput timing only.

        It skips the accountant, the budget stop and the ledger: a model trained through it has
        no guarantee. ``featuredp benchmark`` uses it; never use it to train a model you release.
        """
        batch_all = as_batch(data)
        n = int(next(iter(batch_all.values())).shape[0])
        state, split = self._run_state(data, batch_all, n, None)
        batch_all = to_device(batch_all, self.device)
        params = trainable_parameters(self.model)

        def step() -> None:
            self._step(state, split, batch_all, params, False)

        return step

    # -- one step ----------------------------------------------------------------------------------------
    def _step(
        self,
        state: RunState,
        split: LossSplit | None,
        data: Batch,
        params: dict[str, torch.Tensor],
        pre: bool,
        *,
        count: bool = False,
    ) -> dict[str, float]:
        """One optimisation step; returns the public quantities to show. ``count``: a private step of the run,
        counted in ``state.private_steps`` before its update reaches the model."""
        shown: dict[str, float] = {}
        plan = state.plan
        record = get_method(plan.method)
        core = self._core
        if pre or record.public_steps:
            if split is None:
                raise ValueError(f"method {plan.method!r} needs a public feature map")
            if plan.record_noise_multiplier is not None:  # the backstop: a record-level DP step
                grads = self._record_gradient(state, split, data, pre=pre)
            else:
                b = gather(data, state.public_shuffler.sample())
                total = plan.pretrain_batch if pre else self._public_total(plan)
                grads, shown["public_loss"] = core.public_gradient(state, split, b, total)
            opt = state.pretrain_optimizer if pre else state.optimizer
        elif not record.private:
            b = gather(data, state.shuffler.sample())
            if split is not None:
                losses = core.amp(split.loss)(self.model, b, split.draws(b, state.private_draws))
            else:
                losses = core.amp(plain_cross_entropy)(self.model, b, {})
            total = min(plan.dataset_size, max(1, round(plan.expected_batch_size)))
            grads, shown["loss"] = core.mean_gradient(losses, total)
            opt = state.optimizer
        else:
            grads = self._private_gradient(state, split, data, record)
            public = None
            if record.public_batch and plan.public_weight != 0:
                if split is None:
                    raise ValueError(f"method {plan.method!r} needs a public feature map")
                public = self._public_batch_gradient(state, split, data, shown)
            grads = core.combine(plan, grads, public) if record.public_batch else grads
            opt = state.optimizer
        for k, p in params.items():
            p.grad = grads[k].detach().to(p.dtype)
        if count:
            # Counted before it is applied: an interrupt from here on leaves at most one step counted and not
            # applied (the safe side), never a noisy update in the model that the accountant and ledger miss.
            state.private_steps += 1
        opt.step()
        opt.zero_grad(set_to_none=True)
        if self.schedule.projection_radius is not None:
            project(params, self.schedule.projection_radius)
        if not pre:
            state.averager.update(params, state.step - plan.pretrain_steps + 1)
        return shown

    def _public_batch_gradient(self, state: RunState, split: LossSplit, data: Batch, shown: dict[str, float]
                               ) -> Callable[[], dict[str, torch.Tensor]]:  # fmt: skip
        """Algorithm 1's independent public batch, as a closure: its own sampler stream and its own draws
        generator. It reads Ψ(S) only, so w scales a public quantity and no privacy event depends on it."""

        def gradient() -> dict[str, torch.Tensor]:
            if state.plan.record_noise_multiplier is not None:  # the backstop: a record-level DP public batch
                return self._record_gradient(state, split, data, pre=False)
            bp = gather(data, state.public_sampler.sample())
            gp, shown["public_loss"] = self._core.public_gradient(state, split, bp, self._public_total(state.plan))
            return gp

        return gradient

    def _private_gradient(
        self, state: RunState, split: LossSplit | None, data: Batch, record: Method
    ) -> dict[str, torch.Tensor]:
        """(Σ_{i∈B} clip_C ∇ℓ_x(θ; x_i) + N(0, σ²C²)) / m for a Poisson batch B (ℓ_x = the method's clipped loss)."""
        return self._core.private_gradient(state, split, gather(data, state.private_sampler.sample()), record)

    def _record_gradient(self, state: RunState, split: LossSplit, data: Batch, *, pre: bool) -> dict[str, torch.Tensor]:
        """The backstop's public step: (Σ_{i∈B'} clip_C ∇ℓ_pub(θ; x_i) + N(0, σ_pub²C²)) / (q'·n) on a Poisson batch
        B' at rate q' (m'/n, or m_pre/n in pre-training) drawn from the secret ``record_sampling`` stream.

        It shows no public loss: the batch's members are secret now, and its mean loss is not noised."""
        sampler = state.record_pretrain_sampler if pre else state.record_sampler
        if sampler is None:
            raise ValueError("the record-level backstop needs its sampler in the run state")
        return self._core.record_gradient(state, split, gather(data, sampler.sample()), sampler.expected_batch_size)

    def _tell_nonfinite(self, records: int | None) -> None:
        self._core.tell_nonfinite(records)

    def _public_total(self, plan: PrivacyPlan) -> int:
        return plan.public_batch_size or max(1, round(plan.expected_batch_size))
