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

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from featuredp._validate import check_int
from featuredp.accounting import BudgetLedger
from featuredp.batches import as_batch, evaluate, gather, to_device
from featuredp.clipping import GradientStrategy, trainable_parameters
from featuredp.config import PerformanceConfig, PrivacyConfig, ScheduleConfig
from featuredp.distributed import DistContext, agree_across_ranks, exact_float32, whole_size
from featuredp.errors import DataValidationError
from featuredp.features import Batch, PublicFeatureMap
from featuredp.losses import LossSplit
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS, get_method
from featuredp.plan import PrivacyPlan, TrainResult
from featuredp.run import MODEL_RUNS, PUBLIC_BATCH_FACTOR, Fetch, PrivateRun
from featuredp.run_state import RunState, data_fingerprint, settle
from featuredp.sampling import make_streams, random_seed_from
from featuredp.step import plain_cross_entropy, project
from featuredp.testing import replay_step
from featuredp.users import UserIndex

#: the fingerprint's name for the records' user codes (a user-level run's grouping is part of its data)
USERS_KEY = "\0users"

__all__ = [
    "METHODS",
    "PRIVATE_METHODS",
    "PUBLIC_BATCH_FACTOR",
    "PerformanceConfig",
    "PrivacyConfig",
    "PrivacyPlan",
    "PrivateRun",
    "ScheduleConfig",
    "TrainResult",
    "Trainer",
    "as_batch",
    "evaluate",
    "init_seed",
]

METHODS = METHOD_NAMES  # the names, as before featuredp.methods held the records

def init_seed(seed: int | None) -> int:
    """A model-initialisation seed from the public ``init`` stream of ``seed`` (OS entropy for ``None``).

    Model initialisation reads no data, so a published seed here is safe; it is the same
    stream a Trainer with ``public_seed=seed`` would use.

    >>> init_seed(0) == init_seed(0)
    True
    """
    return random_seed_from(make_streams(None, public_seed=seed).init)


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
    * performance: ``strategy`` (a registered name; default ``"auto"``: ghost or vmap, timed once; ``"ghost"``
      data-parallel, ``"vmap"`` at user level),
      ``physical_batch_size``,
      ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``auto``; default: the model's device),
      ``progress``, ``log_points``.
    * ``user_key``: the privacy unit is a user, not a record (docs/users.md): one key per record (a
      sequence, array or tensor), or the name of a tensor in a dict ``data`` that holds them (taken out of
      the batch). Users are Poisson-sampled (``batch_size``/``sampling_rate`` then count users), a sampled
      user gives at most ``records_per_user`` records, and its summed gradient is clipped at C;
      ``num_users`` declares the count. The default strategy is then ``"vmap"``.
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
        user_key: Any = None,
        **settings: Any,
    ) -> None:
        #: the run this loop trains (plan, streams, samplers, noise, step, ledger, report): featuredp.run.PrivateRun
        self.run = PrivateRun(model, method, feature_map=feature_map, loss_split=loss_split, privacy=privacy,
                              schedule=schedule, performance=performance, ledger=ledger, user_key=user_key,
                              **settings)  # fmt: skip

    def __getattr__(self, name: str) -> Any:
        """Read a setting by its flat name (``trainer.lr``, ``trainer.noise_multiplier``), as before the configs."""
        if name.startswith("_") or name in ("run", "privacy", "schedule", "performance"):
            raise AttributeError(name)
        for cfg in (self.privacy, self.schedule, self.performance):
            if name in cfg.__dataclass_fields__:
                return getattr(cfg, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- the run's parts, read through the run (one owner) -------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The model trained (on the run's device)."""
        return self.run.model

    @property
    def method(self) -> str:
        """The method's name."""
        return self.run.method

    @property
    def privacy(self) -> PrivacyConfig:
        """The privacy settings."""
        return self.run.privacy

    @property
    def schedule(self) -> ScheduleConfig:
        """The schedule settings."""
        return self.run.schedule

    @property
    def performance(self) -> PerformanceConfig:
        """The performance settings."""
        return self.run.performance

    @property
    def device(self) -> torch.device:
        """The device the model and the data are on."""
        return self.run.device

    @property
    def dist(self) -> DistContext | None:
        """The data-parallel context (None: one process)."""
        return self.run.dist

    @property
    def feature_map(self) -> PublicFeatureMap | None:
        """Ψ (None for DP-SGD and the non-private method)."""
        return self.run.feature_map

    @property
    def loss_split(self) -> LossSplit | None:
        """The loss split (bound to the data once the run starts)."""
        return self.run.loss_split

    @property
    def strategy(self) -> GradientStrategy:
        """The gradient strategy (ghost, vmap, ...)."""
        return self.run.strategy

    @property
    def ledger(self) -> BudgetLedger | None:
        """The budget ledger charged by the run (None: none)."""
        return self.run.ledger

    @property
    def plan(self) -> PrivacyPlan | None:
        """The run's plan (None before the run starts)."""
        return self.run.plan

    @property
    def result(self) -> TrainResult | None:
        """The last :class:`TrainResult` (None before the first ``fit``)."""
        return self.run.last_result

    # -- configuration -----------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The trainer's settings (JSON-able; no data, no RNG state, never the seed) for run.json."""
        return self.run.config()

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
        if self.run.user_key is not None:
            raise ValueError("check_model replays the step with and without one record; a user-level run's "
                             "replay (with and without one user's records) is not built yet: its sensitivity is "
                             "pinned by tests/test_users.py (docs/users.md)")  # fmt: skip
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
        return self.run.make_plan(n)

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
        data, keys = self._user_keys(data)
        batch_all = as_batch(data)
        n = int(next(iter(batch_all.values())).shape[0])
        checkpoint_every, max_steps = self._check_fit(batch_all, checkpoint, checkpoint_every, max_steps)
        users = None
        if keys is not None:  # the grouping is part of the data: a resume or a later fit() must see the same
            users = self.run.bind_users(keys, n) if self.run.state is None else UserIndex(keys)
            batch_all = {**batch_all, USERS_KEY: torch.from_numpy(users.user_of)}
        shard = None
        if sharded:
            shard, n = n, self._whole_size(n)
        state, split = self._run_state(data, batch_all, n, checkpoint if resume else None, shard=shard)
        plan = state.plan
        batch_all.pop(USERS_KEY, None)  # the loss never sees it: the step groups the records itself
        batch_all = to_device(batch_all, self.device)

        total = plan.pretrain_steps + plan.steps
        log_at = {plan.pretrain_steps + round(plan.steps * (i + 1) / self.performance.log_points)
                  for i in range(self.performance.log_points)}  # fmt: skip
        params = trainable_parameters(self.model)
        steps_this_call = 0
        private_before = state.private_steps
        display: dict[str, float] = {}  # what the bar shows: public quantities and the ε at the last log point
        if self.dist is not None:  # before the first private step (and on every later call): one plan everywhere
            agree_across_ranks(self.run.rank_settings(state, split, shard, n))
        reservation = self.run.reserve(state)  # before any private step: an overspend is refused up front
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
                    self.run.save_checkpoint(checkpoint, state)
        finally:
            pbar.close()
            MODEL_RUNS.record(self.model, state)
            settle(reservation, plan, state.private_steps - private_before)
            self.run.core.tell_nonfinite(None)
            if checkpoint is not None and state.private_steps > private_before:  # a crash between checkpoints too
                self.run.note_spent(checkpoint, state)
        finished = state.step >= total
        if checkpoint is not None:
            self.run.save_checkpoint(checkpoint, state)
        if finished or state.stop_reason == "budget":
            state.averager.finalize(params)
            state.complete = True
        return self.run.report(state, split, finished)

    def _user_keys(self, data: Any) -> tuple[Any, Any]:
        """``data`` without the user-key tensor ``user_key`` names (a dict's), and the keys (None: record level)."""
        key = self.run.user_key
        if key is None:
            return data, None
        if isinstance(key, str):
            if not isinstance(data, dict) or key not in data:
                raise ValueError(f"user_key={key!r} names no tensor of data; give the name of one in a dict of "
                                 "tensors, or one key per record")  # fmt: skip
            return {k: v for k, v in data.items() if k != key}, data[key]
        return data, key

    def _check_fit(self, batch_all: Batch, checkpoint: str | Path | None, checkpoint_every: int | None,
                   max_steps: int | None) -> tuple[int | None, int | None]:  # fmt: skip
        """fit's one-line refusals, before any work; the checked ``checkpoint_every`` and ``max_steps``."""
        if "y" not in batch_all and not get_method(self.method).public_steps:
            raise DataValidationError("data has no labels 'y'")
        if checkpoint_every is not None:
            checkpoint_every = check_int("checkpoint_every", checkpoint_every, minimum=1)
            if checkpoint is None:
                raise ValueError("checkpoint_every needs checkpoint=PATH")
        if max_steps is not None:
            max_steps = check_int("max_steps", max_steps, minimum=1)
        return checkpoint_every, max_steps

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
        if self.run.state is not None:  # a later call: the same run goes on
            state = self.run.state
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
        state, split = self.run.start(data, data_print, n, shard=shard, stacklevel=5)
        saved = None if resume_from is None else self.run.load_checkpoint_state(resume_from)
        if saved is not None:
            assert resume_from is not None
            self.run.resume(resume_from, saved, state)
        return state, split


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
        run = self.run

        def fetch(idx: np.ndarray) -> Batch:
            return gather(data, idx)

        if pre or record.public_steps:
            grads = self._public_step_gradient(state, split, fetch, pre, shown)
            opt = state.pretrain_optimizer if pre else state.optimizer
        elif not record.private:
            grads = self._nonprivate_gradient(state, split, fetch, shown)
            opt = state.optimizer
        else:
            private = run.private_gradient(state, split, fetch, record)
            grads = run.with_public_term(state, split, private, fetch, shown)
            opt = state.optimizer
        for k, p in params.items():
            p.grad = grads[k].detach().to(p.dtype)
        if count:
            run.count_private_step(state)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if self.schedule.projection_radius is not None:
            project(params, self.schedule.projection_radius)
        if not pre:
            state.averager.update(params, state.step - plan.pretrain_steps + 1)
        return shown

    def _public_step_gradient(self, state: RunState, split: LossSplit | None, fetch: Fetch, pre: bool,
                              shown: dict[str, float]) -> dict[str, torch.Tensor]:  # fmt: skip
        """A public pre-training step or a step of the public method: the mean ∇ℓ_pub of a shuffled batch, or with
        the backstop a record-level DP step."""
        plan = state.plan
        if split is None:
            raise ValueError(f"method {plan.method!r} needs a public feature map")
        if plan.record_noise_multiplier is not None:  # the backstop: a record-level DP step
            return self.run.record_gradient(state, split, fetch, pre=pre)
        b = fetch(state.public_shuffler.sample())
        total = plan.pretrain_batch if pre else self.run.public_total(plan)
        grads, shown["public_loss"] = self.run.core.public_gradient(state, split, b, total)
        return grads

    def _nonprivate_gradient(self, state: RunState, split: LossSplit | None, fetch: Fetch,
                             shown: dict[str, float]) -> dict[str, torch.Tensor]:  # fmt: skip
        """The non-private method's step: the mean ∇ℓ of a shuffled batch."""
        plan, core = state.plan, self.run.core
        b = fetch(state.shuffler.sample())
        if split is not None:
            losses = core.amp(split.loss)(self.model, b, split.draws(b, state.private_draws))
        else:
            losses = core.amp(plain_cross_entropy)(self.model, b, {})
        total = min(plan.dataset_size, max(1, round(plan.expected_batch_size)))
        grads, shown["loss"] = core.mean_gradient(losses, total)
        return grads
