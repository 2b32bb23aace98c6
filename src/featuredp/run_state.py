"""The mutable state of one training run, everything a checkpoint must restore, and its bookkeeping.

A :class:`RunState` is a dataclass of parts — the streams, the samplers and shufflers,
the loss-draw generators, the noise source, the optimisers, the iterate averager — and
each part owns its ``state_dict()`` / ``load_state_dict()``. The state is **private**:
RNG states reveal which records were sampled and, with the noise source's key, the noise.
It goes into ``checkpoint.pt`` only (written by the caller with
:func:`featuredp._io.atomic_save_torch`), never into run.json or logs.

The run's bookkeeping lives here too: the data fingerprint a resume must match, the
ledger reservation made before the first private step and settled with what ran, and
:class:`ModelRuns`, which counts every private run applied to a model object.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import os
import warnings
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from featuredp.accounting import BudgetLedger, Reservation, compose_events, compute_epsilon
from featuredp.clipping.fsdp import is_sharded, local_tensor
from featuredp.config import PrivacyConfig, ScheduleConfig
from featuredp.distributed import shard_bounds
from featuredp.errors import BudgetExceededError, PrivacyRiskWarning
from featuredp.noise import Independent, NoisePlan
from featuredp.noise.sharded import ShardedNoise
from featuredp.noise.sources import ChaCha20Generator, NoiseSource, SecureNoise, TorchNoise
from featuredp.plan import PrivacyPlan
from featuredp.sampling import (
    BMinSepSampler,
    EpochShuffler,
    PoissonSampler,
    Streams,
    UniformSampler,
    make_streams,
    random_seed_from,
)
from featuredp.sharding import load_local_state, local_state, rewrap_optimizer_state

__all__ = [
    "CHECKPOINT_FORMAT",
    "Averager",
    "ModelRuns",
    "RunState",
    "data_fingerprint",
    "open_ledger",
    "reserve",
    "settle",
    "torch_generator",
]

# 3: each part owns its state (streams, samplers, draws, noise, averager); data and Ψ fingerprints.
CHECKPOINT_FORMAT = 3


def torch_generator(seed: int, device: torch.device) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (draws then need no copy between devices)."""
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def _generator_state(g: torch.Generator) -> torch.Tensor:
    return g.get_state()


@dataclass
class Averager:
    """Iterate averaging, a post-processing of the iterates: ``"uniform"`` over the last
    ``fraction`` of the main phase, ``"ema"`` with ``decay``, or None (off)."""

    mode: str | None
    fraction: float
    decay: float
    main_steps: int
    average: dict[str, torch.Tensor] | None = None
    count: int = 0

    @torch.no_grad()
    def update(self, params: dict[str, torch.Tensor], main_done: int) -> None:
        """Fold in the iterate after main-phase step ``main_done`` (1-based)."""
        if self.mode is None:
            return
        if self.mode == "ema":
            if self.average is None:
                self.average = {k: p.detach().clone() for k, p in params.items()}
            else:
                for k, p in params.items():
                    self.average[k].mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)
            return
        start = self.main_steps - max(1, math.ceil(self.fraction * self.main_steps))
        if main_done <= start:
            return
        self.count += 1
        if self.average is None:
            self.average = {k: p.detach().clone() for k, p in params.items()}
        else:
            for k, p in params.items():
                self.average[k].add_(p.detach() - self.average[k], alpha=1.0 / self.count)

    @torch.no_grad()
    def finalize(self, params: dict[str, torch.Tensor]) -> None:
        """Write the average into the parameters (nothing without averaging)."""
        if self.average is None:
            return
        for k, p in params.items():
            p.copy_(self.average[k])

    def state_dict(self) -> dict[str, Any]:
        """The running average and its count."""
        return {"average": self.average, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.average = state["average"]
        self.count = int(state["count"])


_RUN_IDS = itertools.count(1)


@dataclass
class RunState:
    """One run's parts and counters (see the module docstring)."""

    plan: PrivacyPlan
    fingerprint: dict[str, str]
    streams: Streams
    private_sampler: PoissonSampler | BMinSepSampler
    shuffler: EpochShuffler
    public_sampler: UniformSampler
    public_shuffler: EpochShuffler
    private_draws: torch.Generator
    public_draws: torch.Generator
    noise: NoiseSource
    optimizer: torch.optim.Optimizer
    pretrain_optimizer: torch.optim.Optimizer
    averager: Averager
    # The record-level backstop's Poisson samplers of the public steps and of pre-training (None: no backstop).
    record_sampler: PoissonSampler | None = None
    record_pretrain_sampler: PoissonSampler | None = None
    step: int = 0
    private_steps: int = 0
    stop_reason: str | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    complete: bool = False
    # Which run this is, for ModelRuns: never id(self), which a later run can get once this one is freed.
    run_id: int = field(default_factory=lambda: next(_RUN_IDS))
    # Which run a checkpoint belongs to, across processes: the key of its spent-steps record (featuredp.run).
    run_token: str = field(default_factory=lambda: os.urandom(8).hex())

    @classmethod
    def start(
        cls,
        plan: PrivacyPlan,
        fingerprint: dict[str, str],
        *,
        params: list[torch.Tensor],
        privacy: PrivacyConfig,
        schedule: ScheduleConfig,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
        shard_size: int | None = None,
        prefetch_noise: bool = False,
        sharded: bool = False,
    ) -> RunState:
        """A fresh state: streams from OS entropy (or the user's seeds), samplers, generators, optimisers.

        In a data-parallel run (``world_size`` > 1) rank ``rank`` Poisson-samples only its shard of
        the indices, at the global rate, from streams of its own, and draws its share of the public
        and shuffled batches (:mod:`featuredp.distributed`). ``shard_size``: this rank holds only its
        shard, of that many records (indices 0 .. shard_size − 1 of its data), and samples all of them.

        The private sampler and the noise come from the plan's noise plan
        (:meth:`featuredp.noise.NoisePlan.sampler_and_noise`), over the secret private-sampling stream (or key) and
        the noise source: a Poisson sampler and fresh noise, or a correlated plan's cyclic :class:`BMinSepSampler`
        and its correlated noise; the public batch keeps its own independent sampler either way. ``prefetch_noise``:
        the source draws the next step's noise on a worker thread while a step computes (the same noise).
        ``sharded`` (FSDP2): the noise is :class:`~featuredp.noise.sharded.ShardedNoise` under one key for all ranks
        (rank 0's), each rank noising its own shards.
        """
        backstop = plan.record_noise_multiplier is not None
        # Without a backstop, exactly today's call (no extra stream; the same streams as before it existed).
        extra = {"record": True} if backstop else {}
        streams = make_streams(privacy.seed, public_seed=privacy.public_seed,
                               rank=rank if world_size > 1 else None, **extra)  # fmt: skip
        n = plan.dataset_size
        start, stop = shard_bounds(n, rank, world_size) if shard_size is None else (0, shard_size)
        # The public batches, pre-training and the shufflers read records; at user level the private sampler draws
        # users (plan.dataset_size counts them) and the public ones still draw records.
        local = plan.record_count if shard_size is None else shard_size
        m_int = share(max(1, round(plan.expected_batch_size)), rank, world_size)
        noise: NoiseSource
        private_sampler: PoissonSampler | BMinSepSampler
        sampling_generator: Any
        if privacy.secure_rng:
            # Keys from os.urandom, or from the user's seed for a reproducible (and secret) run.
            keys = [streams.noise.bytes(32), streams.private_sampling.bytes(32)] if streams.seeded else [None, None]
            noise = _sharded_noise(keys[0]) if sharded else SecureNoise(ChaCha20Generator(keys[0]),
                                                                        prefetch=prefetch_noise)  # fmt: skip
            sampling_generator = ChaCha20Generator(keys[1])
        elif sharded:  # ChaCha20 keyed per coordinate whatever the mode: each rank draws its own shards
            noise = _sharded_noise(streams.noise.bytes(32) if streams.seeded else None)
            sampling_generator = streams.private_sampling
        else:
            noise = TorchNoise(torch_generator(random_seed_from(streams.noise), device), prefetch=prefetch_noise)
            sampling_generator = streams.private_sampling
        private_sampler, noise = plan.noise.sampler_and_noise(plan, start, stop, sampling_generator, noise,
                                                              sum(int(p.numel()) for p in params))  # fmt: skip
        m_pub = share(plan.public_batch_size or max(1, round(plan.expected_batch_size)), rank, world_size)
        # The shuffler serves public pre-training (batches of m_pre) or the public method's steps (m_pre = m').
        m_pre = share(plan.pretrain_batch, rank, world_size)
        record_sampler = record_pretrain_sampler = None
        if backstop:
            # Secret coins of their own (Streams.record_sampling), never the private batch's: FDP needs the public
            # batch independent of the private one, record-level DP needs it secret. One generator serves both
            # samplers: pre-training's steps all come before the main phase's.
            assert streams.record_sampling is not None
            record_gen: Any = streams.record_sampling
            if privacy.secure_rng:
                record_gen = ChaCha20Generator(streams.record_sampling.bytes(32) if streams.seeded else None)
            record_sampler = PoissonSampler(stop - start, plan.public_sampling_rate, record_gen, offset=start)
            record_pretrain_sampler = PoissonSampler(stop - start, plan.pretrain_sampling_rate, record_gen,
                                                     offset=start)  # fmt: skip
        return cls(
            plan=plan,
            fingerprint=fingerprint,
            streams=streams,
            private_sampler=private_sampler,
            shuffler=EpochShuffler(local, min(m_int, local), streams.private_sampling),
            public_sampler=UniformSampler(local, min(m_pub, local), streams.public_sampling),
            public_shuffler=EpochShuffler(local, min(m_pre, local), streams.public_sampling),
            # Loss draws of the private and of the public batch come from two different streams
            # (the public one may be seeded publicly; the private one never).
            private_draws=torch_generator(random_seed_from(streams.private_draws), device),
            public_draws=torch_generator(random_seed_from(streams.public_draws), device),
            noise=noise,
            optimizer=_make_optimizer(schedule, params, schedule.lr),
            pretrain_optimizer=_make_optimizer(schedule, params, schedule.pretrain_lr or schedule.lr),
            averager=Averager(schedule.averaging, schedule.average_fraction, schedule.ema_decay, plan.steps),
            record_sampler=record_sampler,
            record_pretrain_sampler=record_pretrain_sampler,
        )

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The run's optimizers by their checkpoint keys (a sharded checkpoint saves their states with DCP)."""
        return {"optimizer": self.optimizer, "pretrain_optimizer": self.pretrain_optimizer}

    def state_dict(self, model: nn.Module | None, *, optimizers: bool = True) -> dict[str, Any]:
        """Tensors and plain containers only (safe for ``torch.load(weights_only=True)``); private. ``model=None``:
        the run's state without the weights (a caller that saves them itself, as Hugging Face's Trainer does).
        ``optimizers=False``: without the optimizers' states too (a sharded model's go to a DCP folder,
        :mod:`featuredp.sharded_checkpoint`)."""
        return {
            "format": CHECKPOINT_FORMAT,
            "plan": self.plan.to_dict(),
            "fingerprint": dict(self.fingerprint),
            "step": self.step,
            "private_steps": self.private_steps,
            "run_token": self.run_token,
            "stop_reason": self.stop_reason,
            "history": self.history,
            "accountant_phases": [
                {"noise_multiplier": self.plan.noise_multiplier, "sampling_rate": self.plan.sampling_rate,
                 "steps": self.private_steps}
            ] if self.plan.is_private else [],
            # A sharded model's (FSDP2) as this rank's shards: its checkpoint file is its own.
            **({} if model is None else {"model": {k: local_tensor(v).detach().cpu().clone()
                                                   for k, v in model.state_dict().items()}}),
            **({"optimizer": local_state(self.optimizer.state_dict()),
                "pretrain_optimizer": local_state(self.pretrain_optimizer.state_dict())} if optimizers else {}),
            "streams": self.streams.state_dict(),
            "private_sampler": self.private_sampler.state_dict(),
            "shufflers": {"private": self.shuffler.state_dict(), "public": self.public_shuffler.state_dict()},
            "draws": {"private": _generator_state(self.private_draws),
                      "public": _generator_state(self.public_draws)},
            "noise": self.noise.state_dict(),
            "averager": self.averager.state_dict(),
            **({"record_sampler": self.record_sampler.state_dict()} if self.record_sampler is not None else {}),
        }  # fmt: skip

    def load_state_dict(self, ck: dict[str, Any], model: nn.Module, *, rekey: bool = True) -> None:
        """Restore a checkpoint of the *same* run: format, plan, data and Ψ fingerprints must match.

        ``rekey`` (the default, every resume): the private streams then draw from fresh OS entropy
        (:meth:`rekey_private`). Only the replay self-test passes ``False``, to restore a snapshot it took itself
        in memory and replay one step with identical randomness; a checkpoint file is never loaded that way."""
        if ck.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"the checkpoint has format {ck.get('format')!r}, this featuredp writes {CHECKPOINT_FORMAT}; it was "
                "written by another version and cannot be resumed: start a new run"
            )
        saved_noise, noise = _noise_of(ck.get("plan")), _noise_of(self.plan.to_dict())
        if saved_noise != noise:
            raise ValueError(
                f"the checkpoint's run used noise={saved_noise[0]!r} with bands={saved_noise[1]!r}, this run "
                f"noise={noise[0]!r} with bands={noise[1]!r}: resume with the same noise and bands"
            )
        if not _same_plan(ck.get("plan"), self.plan):
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
        self.private_sampler.load_state_dict(ck["private_sampler"])
        if self.record_sampler is not None:  # a ChaCha20 generator shared by both backstop samplers
            self.record_sampler.load_state_dict(ck["record_sampler"])
        self.step = int(ck["step"])
        self.private_steps = int(ck["private_steps"])
        self.run_token = str(ck.get("run_token", self.run_token))
        self.stop_reason = ck.get("stop_reason")
        self.history = list(ck.get("history", []))
        sharded = is_sharded(model)
        if "model" in ck:  # saved without the weights (state_dict(None)): the caller restores them
            if sharded:
                load_local_state(model, ck["model"])
            else:
                model.load_state_dict(ck["model"])
        if "optimizer" in ck:  # saved without them (state_dict(optimizers=False)): the caller restores them
            self.optimizer.load_state_dict(ck["optimizer"])
            self.pretrain_optimizer.load_state_dict(ck["pretrain_optimizer"])
        if sharded and "optimizer" in ck:
            rewrap_optimizer_state(self.optimizer)
            rewrap_optimizer_state(self.pretrain_optimizer)
        self.streams.load_state_dict(ck["streams"])
        self.shuffler.load_state_dict(ck["shufflers"]["private"])
        self.public_shuffler.load_state_dict(ck["shufflers"]["public"])
        self.private_draws.set_state(ck["draws"]["private"])
        self.public_draws.set_state(ck["draws"]["public"])
        self.noise.load_state_dict(ck["noise"])
        self.averager.load_state_dict(ck["averager"])
        if rekey:
            self.rekey_private()

    def rekey_private(self) -> None:
        """Draw every private random choice after a resume from fresh OS entropy, never from the saved state.

        Whoever read the checkpoint (a copy, a backup, an older featuredp's ``checkpoint.pt`` left in the shared run
        folder) must not predict the noise, the private batches or the private loss draws to come. A fresh
        independent stream has the distribution the accounting assumes: each step's Poisson coins and Gaussian
        draws are independent of the earlier steps', so the resumed run is the uninterrupted run up to the
        checkpoint, bit for bit, and the same mechanism after it (the same σ, rate and accounting), with another
        realisation. What stays is state the mechanism's structure needs: BandMF/BLT's noise buffers, the b-min-sep
        partition, the current epoch's permutation. Data-parallel ranks re-key each on their own (only rank 0
        draws noise). The public streams (possibly publicly seeded) are not secret and stay.
        """
        self.noise.rekey()
        self.streams.rekey_private()  # the numpy private sampler and the private shuffler follow in place
        self.private_sampler.rekey()  # a secure (ChaCha20) sampler's key
        if self.record_sampler is not None:  # the backstop's coins (one generator serves both of its samplers)
            self.record_sampler.rekey()
        self.private_draws.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


def _sharded_noise(key: bytes | None) -> ShardedNoise:
    """The noise of a sharded run: rank 0's key on every rank (a seeded run's from rank 0's noise stream; otherwise
    drawn from OS entropy by rank 0), sent over the ranks' group like the unnoised sums are."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return ShardedNoise(key)
    box = [key]
    torch.distributed.broadcast_object_list(box, src=0)
    return ShardedNoise(box[0], group=torch.distributed.group.WORLD)


def _noise_of(plan: Any) -> tuple[str, Any]:
    """(noise kind, bands) of a plan dict, this version's or an earlier one's (:meth:`PrivacyPlan.from_dict`); a
    plan written before correlated noise existed, or unreadable, used independent noise."""
    noise: NoisePlan = Independent()
    if isinstance(plan, dict):
        with contextlib.suppress(TypeError, ValueError):
            noise = PrivacyPlan.from_dict(plan).noise
    return (noise.kind, noise.settings().get("bands"))


def _same_plan(saved: Any, plan: PrivacyPlan) -> bool:
    """Whether a checkpoint's plan dict is ``plan``. A dict written before a plan field existed holds that
    field's default, which meant what the old run did: w = 1, and pre-training on batches of m'."""
    if not isinstance(saved, dict):
        return False
    try:
        old = PrivacyPlan.from_dict(saved)
    except (TypeError, ValueError):
        return False
    if "pretrain_batch_size" not in saved and old.pretrain_steps:
        old = replace(old, pretrain_batch_size=old.pretrain_batch)
    return old == plan


def share(total: int, rank: int, world_size: int) -> int:
    """Rank ``rank``'s part of ``total`` records when ``world_size`` ranks split it (at least one)."""
    lo, hi = shard_bounds(total, rank, world_size)
    return max(1, hi - lo)


def _make_optimizer(schedule: ScheduleConfig, params: list[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    if schedule.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=schedule.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=schedule.momentum, weight_decay=schedule.weight_decay)


def data_fingerprint(batch: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the training tensors (keys, dtypes, shapes, bytes).

    A function of private data: it goes into the private checkpoint only, never into
    run.json (anyone could test a guessed dataset against a published hash).
    """
    h = hashlib.sha256()
    for key in sorted(batch):
        t = batch[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")  # a view: no copy of the data
    return h.hexdigest()


def open_ledger(ledger: Any) -> BudgetLedger | None:
    """A BudgetLedger from a ledger object or the path of an existing ledger file (None passes through)."""
    if ledger is None or isinstance(ledger, BudgetLedger):
        return ledger
    if isinstance(ledger, str | os.PathLike):
        if not Path(ledger).exists():
            raise FileNotFoundError(
                f"ledger={str(ledger)!r} does not exist: create it once with its total budget, e.g. "
                f"BudgetLedger({str(ledger)!r}, total_epsilon=8.0, delta=1e-5)"
            )
        return BudgetLedger(ledger)
    raise TypeError(f"ledger must be a BudgetLedger or the path of one, got {type(ledger).__name__}")


def reserve(ledger: BudgetLedger | None, state: RunState) -> Reservation | None:
    """Reserve what the rest of the run may spend, before its first private step (None: nothing to reserve)."""
    plan = state.plan
    if ledger is None or not plan.is_private or plan.noise_multiplier is None:
        return None
    planned = plan.steps if plan.budget_steps is None else min(plan.steps, plan.budget_steps)
    # What the loop may still run from its position (a rewound run's charged count can be ahead of it).
    remaining = planned - min(state.private_steps, max(0, state.step - plan.pretrain_steps))
    if remaining <= 0:
        return None
    # A segment's event (BandMF: every band's column norm), so that a resumed run's parts never add up to less.
    event = plan.event(remaining, segment=True)
    return ledger.reserve(f"featuredp Trainer {plan.method}: up to {remaining} private steps", event=event)


def settle(reservation: Reservation | None, plan: PrivacyPlan, private_steps: int) -> None:
    """Settle a reservation at the private steps that actually ran (a crash included)."""
    if reservation is None:
        return
    if private_steps <= 0 or plan.noise_multiplier is None:
        reservation.cancel()  # no private step ran: the data was never touched by the mechanism
        return
    try:
        reservation.settle(event=plan.event(private_steps, segment=True))
    except BudgetExceededError:
        # Fewer steps never cost more, but if rounding ever said so, keep the (larger) reserved amount
        # rather than lose the record or mask the exception that may be unwinding the caller.
        reservation.settle()


class ModelRuns:
    """Which private runs were applied to which model object: every private step any call applies to a
    model is counted (docs/engine.md, "One Trainer is one run"). Weak keys: the record dies with the model."""

    def __init__(self) -> None:
        # Keyed by RunState.run_id: an id() of a freed state can come back for a new one and hide the old run.
        self._runs: weakref.WeakKeyDictionary[nn.Module, dict[int, dict[str, Any]]] = weakref.WeakKeyDictionary()

    def record(self, model: nn.Module, state: RunState) -> None:
        """Note the private steps ``state`` has applied to ``model`` so far."""
        plan = state.plan
        if plan.is_private and state.private_steps:
            self._runs.setdefault(model, {})[state.run_id] = _phase(plan, state.private_steps)

    def earlier(self, model: nn.Module, state: RunState) -> list[dict[str, Any]]:
        """The other runs' private phases on ``model``."""
        return [p for key, p in self._runs.get(model, {}).items() if key != state.run_id and p["steps"] > 0]

    def warn_if_trained_before(self, model: nn.Module, state: RunState) -> None:
        """PrivacyRiskWarning when another run already trained ``model`` privately."""
        earlier = self.earlier(model, state)
        if earlier and state.plan.is_private:
            steps = sum(p["steps"] for p in earlier)
            warnings.warn(
                f"this model was already trained privately by {len(earlier)} other run(s) ({steps} private steps); "
                "the released model's guarantee is the composition of all of them, not this run's epsilon alone. "
                "The result reports both (privacy_report['model_epsilon_all_runs']); record every run in one "
                "BudgetLedger (ledger=)",
                PrivacyRiskWarning,
                stacklevel=4,
            )

    def composed_epsilon(self, model: nn.Module, state: RunState) -> float | str | None:
        """ε(δ) of every private run on ``model`` composed, when other runs came before this one."""
        plan = state.plan
        earlier = self.earlier(model, state)
        if not earlier or not plan.is_private or plan.delta is None:
            return None
        phases = [*earlier]
        if state.private_steps:
            phases.append(_phase(plan, state.private_steps))
        if any(not p["noise_multiplier"] for p in phases):
            return "inf"
        events = [_phase_event(p) for p in phases]
        return compute_epsilon(compose_events(*events), plan.delta, relation=plan.relation, accountant=plan.accountant)


def _phase(plan: PrivacyPlan, steps: int) -> dict[str, Any]:
    """One run's private phase on a model (with its plan: its event is the plan's, the one source of its terms)."""
    return {"noise_multiplier": plan.noise_multiplier, "sampling_rate": plan.sampling_rate, "steps": steps,
            "plan": plan}  # fmt: skip


def _phase_event(phase: dict[str, Any]) -> Any:
    """A phase's event: DP-SGD's, or a correlated-noise segment's (a resumed run records each part; they never add
    to less)."""
    return phase["plan"].event(phase["steps"], segment=True)
