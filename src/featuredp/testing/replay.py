"""The replay self-test: one private step on D and on D plus one record, with identical secret randomness.

Following Cebere et al. (2026), who found 13 violations in 12 DP libraries this way: if every random draw of a
step is held fixed, the only difference between the step on D (the record's private term left out) and on
D ∪ {x} is the record's own clipped contribution, so every released quantity may move by at most the stated
sensitivity:

* the clipped sum by at most C (whatever the model does with the rest of the batch);
* the gradient handed to the optimizer by exactly α·(that difference)/m, with m the *expected* batch size (a
  divisor taken from the realised batch would add a term that depends on the batch);
* nothing else: buffers, frozen parameters and the noise draw itself must be identical.

With the record-level backstop (``record_epsilon``) an FDP step has a second noisy sum, over the record batch its
secret sampler draws: x is forced into that batch in the run with x and left out without it (the other rows and
draws fixed), and that sum is checked against its own bounds (C; noise σ_pub·C; its term w·Δ/(q'·n) in the update).

A third run swaps x's private part (Ψ(x) kept; the entries its feature map's ``private_entries()`` masks and the keys
Ψ drops, taken from the record whose private part differs most; for DP-SGD the whole record): the clipped sum may
then move by up to 2C, the sensitivity the replace-one ε is accounted at (check ``swap sensitivity``). That is twice
the add/remove bound, and a crafted pair reaches it (tests/testing/test_replay_swap.py): why telling two values of
one record's private part apart is charged f∘f / sensitivity 2C and not the add/remove ε. A map that hides nothing
by position or key (an image blur, a token view) has no such swap to build here: the check is left out.

The noise is checked too: the std the engine asks for (summed over ranks) must be σ·C, the draw's empirical
std must match it, and the source must state a cut tail of at most 2⁻¹⁰⁰ per pair
(:mod:`featuredp.accounting.sampler`).

The harness drives the engine's own step (:meth:`featuredp.engine.Trainer._step`), with the private sampler
replaced by the given batch and every stream restored between the two runs from the run's own checkpoint state;
it observes the step through the strategy, the noise source and an optimizer pre-step hook. A model that the
strategy refuses (mixing examples, side effects in the forward, shapes vmap cannot batch) is reported as
``refused``: nothing would be released, which is safe. The trainer and its model are left as they were found.

This is a test of the implementation on given inputs, not a proof: it checks the records and batches it is
given. Its verdict is computed from the data it is given and is not covered by ε: run it on public or synthetic
records of the same shape where the data is sensitive.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from featuredp.accounting.accountant import _SENSITIVITY
from featuredp.batches import as_batch, to_device
from featuredp.clipping import trainable_parameters
from featuredp.clipping.fsdp import whole
from featuredp.distributed import all_reduce_sum
from featuredp.methods import get_method

__all__ = ["ReplayCheck", "ReplayReport", "replay_engine_step", "replay_step", "replay_votes", "verdict"]

# Float32 sums of |B| terms of norm <= C, computed on batches of different sizes, differ by rounding of about
# |B|·2⁻²⁴·C; the rest of the tolerance is far below a bfloat16 rounding of a clip factor (2⁻⁹ = 2e-3 relative).
_RTOL = 2e-4
_ROUNDING = 2.0**-22
# A noise source must state a cut tail at least this small per pair of coordinates.
_TAIL_LIMIT = 2.0**-100
# Below this many noised coordinates the empirical std says too little: only the requested std is checked.
_MIN_COORDINATES = 200


@dataclass(frozen=True)
class ReplayCheck:
    """One comparison of the replay: ``value`` against ``bound`` (``ok`` when within)."""

    name: str
    value: float
    bound: float
    ok: bool
    what: str


@dataclass
class ReplayReport:
    """The outcome of one replay: ``"passed"``, ``"refused"`` (the strategy refused the model: nothing would be
    released) or ``"failed"`` (a released quantity moved by more than the stated sensitivity)."""

    method: str
    strategy: str
    precision: str
    secure_rng: bool
    world_size: int
    outcome: str
    checks: list[ReplayCheck] = field(default_factory=list)
    refusal: str | None = None

    @property
    def ok(self) -> bool:
        """Not failed: every check held, or the model was refused."""
        return self.outcome != "failed"

    def failures(self) -> list[ReplayCheck]:
        """The checks that did not hold."""
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (public quantities of the replay only)."""
        return {
            "method": self.method, "strategy": self.strategy, "precision": self.precision,
            "secure_rng": self.secure_rng, "world_size": self.world_size, "outcome": self.outcome,
            "refusal": self.refusal,
            "checks": [{"name": c.name, "value": c.value, "bound": c.bound, "ok": c.ok, "what": c.what}
                       for c in self.checks],
        }  # fmt: skip

    def __str__(self) -> str:
        head = (f"{self.method} / {self.strategy} / {self.precision}{' / secure' if self.secure_rng else ''}"
                f"{f' / {self.world_size} processes' if self.world_size > 1 else ''}: {self.outcome}")  # fmt: skip
        if self.refusal:
            return f"{head} ({self.refusal})"
        lines = [head] + [f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.value:.4g} (bound {c.bound:.4g}) {c.what}"
                          for c in self.checks]  # fmt: skip
        return "\n".join(lines)


class _RefusedError(Exception):
    """The strategy refused the private step (raised from inside clipped_sum)."""


@dataclass
class _Draws:
    """The private batch's per-record draws of the run with x, and whether x was among this rank's rows; with the
    record-level backstop, its record batch in the run with x (x last) and that batch's per-record draws."""

    values: dict[str, torch.Tensor] = field(default_factory=dict)
    has_x: bool = False
    record_rows: np.ndarray | None = None
    record_values: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class _Run:
    clipped: dict[str, torch.Tensor] = field(default_factory=dict)  # the clipped sum (total over ranks)
    noisy: dict[str, torch.Tensor] = field(default_factory=dict)  # the noisy sum as released (total over ranks)
    noise_state: Any = None
    stds: list[float] = field(default_factory=list)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    after: dict[str, torch.Tensor] = field(default_factory=dict)
    # The record-level backstop's second noisy sum (its record batch): the sums after that batch is drawn.
    in_record: bool = False
    record_clipped: dict[str, torch.Tensor] | None = None
    record_noisy: dict[str, torch.Tensor] | None = None
    record_noise_state: Any = None
    record_stds: list[float] = field(default_factory=list)

    def saw_clipped(self, sums: dict[str, torch.Tensor]) -> None:
        """A clipped sum of the step: the private batch's, or the record batch's once that batch is drawn."""
        if self.in_record:
            self.record_clipped = sums
        else:
            self.clipped = sums

    def saw_noise(self, state: Any, noisy: dict[str, torch.Tensor], std: float) -> None:
        """A noise draw (the source's state before it, the noisy sum, the std asked for), routed as above."""
        if self.in_record:
            self.record_noise_state, self.record_noisy = state, noisy
            self.record_stds.append(std)
        else:
            self.noise_state, self.noisy = state, noisy
            self.stds.append(std)


def replay_step(trainer: Any, data: Any, *, record: int, batch: Sequence[int],
                swap_with: int | None = None) -> ReplayReport:  # fmt: skip
    """Replay one private step of ``trainer`` on ``batch`` and on ``batch`` plus ``record``, with every random
    draw held fixed, and check that the released quantities move by at most the stated sensitivity.

    Args:
        trainer: a :class:`featuredp.engine.Trainer` with a private method that has not started its run.
        data: the records (a TabularDataset or a dict of batch-first tensors), ``record`` among them. For the
            FDP methods the public batch draws from all of them in both runs (x's public part is public).
        record: the index of the added record x.
        batch: the indices of the private batch without x (in a data-parallel run, global indices: each rank
            takes those of its shard).
        swap_with: the record whose private part replaces x's in the swap run (check ``swap sensitivity``);
            default: the record whose private part differs most from x's.

    Returns a :class:`ReplayReport`. The trainer's model, strategy and run are restored afterwards.
    """
    method = get_method(trainer.method)
    if not method.private:
        raise ValueError(f"replay_step needs a private method, got method={trainer.method!r}")
    if trainer.run.state is not None:
        raise ValueError("replay_step needs a Trainer whose run has not started (build a fresh one)")
    batch_all = as_batch(data)
    base, record = _rows(batch_all, record, batch, swap_with)
    model = trainer.model
    saved_model = copy.deepcopy(model.state_dict())
    state, split = trainer._run_state(data, batch_all, int(next(iter(batch_all.values())).shape[0]), None)
    batch_all = to_device(batch_all, trainer.device)

    def restore() -> None:
        trainer.run.state = None
        model.load_state_dict(saved_model)

    return _replay(trainer, state, split, batch_all, base, record, swap_with, restore=restore)


def replay_engine_step(engine: Any, data: Any, *, record: int, batch: Sequence[int],
                       swap_with: int | None = None) -> ReplayReport:  # fmt: skip
    """:func:`replay_step` through a :class:`featuredp.privacy_engine.PrivacyEngine`'s own loop: the wrapped
    model called on the batch, the wrapped criterion, ``loss.backward()`` and ``optimizer.step()``, with the
    private sampler replaced by the given batch and every stream restored between the runs. ``data``: a dict of
    batch-first tensors with ``"x"`` (the model's input) and ``"y"`` (the target), or a TabularDataset; for the
    FDP methods the engine's public batch draws from it. Call it on an engine whose run has not stepped yet."""
    trainer = engine.run  # the run has what the replay reads of a trainer: model, strategy, settings, method
    state, split = trainer.state, trainer.split
    if state is None or state.private_steps:
        raise ValueError("replay_engine_step needs an engine after make_private and before its first step")
    batch_all = to_device(as_batch(data), trainer.device)
    base, record = _rows(batch_all, record, batch, swap_with)
    model = trainer.model
    saved_model = copy.deepcopy(model.state_dict())
    inner = engine._optimizer.original_optimizer
    saved_optimizer = copy.deepcopy(inner.state_dict())
    snapshot = copy.deepcopy(state.state_dict(model))

    def restore() -> None:
        state.load_state_dict(copy.deepcopy(snapshot), model, rekey=True)  # the run goes on with fresh noise keys
        model.load_state_dict(saved_model)
        inner.load_state_dict(saved_optimizer)

    return _replay(trainer, state, split, batch_all, base, record, swap_with, restore=restore, optimizer=inner,
                   step=lambda data_now: (lambda: engine._replay_step(data_now)))  # fmt: skip


def _rows(batch_all: Any, record: int, batch: Sequence[int], swap_with: int | None) -> tuple[list[int], int]:
    """The batch without x (sorted, distinct) and x, checked against the data's size (one-line errors)."""
    n = int(next(iter(batch_all.values())).shape[0])
    base = sorted({int(i) for i in batch})
    record = int(record)
    if not 0 <= record < n or record in base or any(not 0 <= i < n for i in base):
        raise ValueError(f"record={record} must be an index of data (0..{n - 1}) outside batch")
    if swap_with is not None and not (0 <= int(swap_with) < n and int(swap_with) != record):
        raise ValueError(f"swap_with={swap_with} must be an index of data (0..{n - 1}) other than record={record}")
    return base, record


def _replay(trainer: Any, state: Any, split: Any, batch_all: Any, base: list[int], record: int,
            swap_with: int | None, *, restore: Callable[[], None],
            step: Callable[[Any], Callable[[], Any]] | None = None, optimizer: Any = None) -> ReplayReport:  # fmt: skip
    """The runs with and without x (and the swap), each from the run's snapshot, observed and compared.
    ``step(data)``: the loop's step on ``data`` (None: the Trainer's own); ``optimizer``: the one whose step
    pre-hook sees the gradient (None: the run's); ``restore``: leaves the trainer or engine as it was found."""
    method = get_method(trainer.method)
    dist = trainer.dist
    report = ReplayReport(method.name, trainer.strategy.name, trainer.performance.precision,
                          bool(trainer.privacy.secure_rng), 1 if dist is None else dist.world_size, "passed")
    model = trainer.model
    params = trainable_parameters(model)
    snapshot = copy.deepcopy(state.state_dict(model))
    saved_optimizer = None if optimizer is None else copy.deepcopy(optimizer.state_dict())
    swapped: _Run | None = None

    # The model's own randomness (nn.Dropout draws from torch's global generator): the same in every run, as the
    # run's streams are; the caller's generator is put back afterwards.
    global_rng = _global_rng()

    def fresh() -> None:  # every run starts from the same streams (and the same optimizer state)
        state.load_state_dict(copy.deepcopy(snapshot), model, rekey=False)
        _set_global_rng(global_rng)
        if optimizer is not None:
            optimizer.load_state_dict(copy.deepcopy(saved_optimizer))

    try:
        swap = _swapped(trainer.feature_map, batch_all, record, swap_with)
        runs: list[_Run] = []
        draws = _Draws()
        for with_x in (True, False):  # with x first: its run's per-record draws are reused without x
            fresh()
            rows = [*base, record] if with_x else base
            runs.insert(0, _observed_step(trainer, state, split, batch_all, params, rows, draws, with_x,
                                          step=None if step is None else step(batch_all), optimizer=optimizer))
        if swap is not None:  # x with another record's private part, the same draws as the run with x
            fresh()
            swapped = _observed_step(trainer, state, split, swap[0], params, [*base, record], draws, True,
                                     reuse=True, step=None if step is None else step(swap[0]), optimizer=optimizer)
    except _RefusedError as exc:
        cause = exc.__cause__
        report.outcome = "refused"
        report.refusal = f"{type(cause).__name__}: {str(cause).splitlines()[0][:300]}"
        return report
    finally:
        _set_global_rng(global_rng)
        restore()
    # The backstop's record batch is in the step when Algorithm 1's public term is (w ≠ 0): its expected size.
    record_sampler = getattr(state, "record_sampler", None)
    record_size = (float(record_sampler.expected_batch_size) if record_sampler is not None and method.public_batch
                   and state.plan.public_weight != 0 else None)  # fmt: skip
    report.checks = _compare(state.plan, method.public_batch, state.noise, runs[0], runs[1], record_size)
    if swap is not None and swapped is not None:
        report.checks.append(_swap_check(state.plan, runs[1], swapped, swap[1]))
    report.outcome = "passed" if all(c.ok for c in report.checks) else "failed"
    return report


def _global_rng() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """torch's global generators (the CPU's, and each CUDA device's where CUDA is up): what nn.Dropout draws from."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return torch.get_rng_state(), cuda


def _set_global_rng(states: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    torch.set_rng_state(states[0])
    if states[1]:
        torch.cuda.set_rng_state_all(states[1])


def _observed_step(trainer: Any, state: Any, split: Any, batch_all: Any, params: dict[str, torch.Tensor],
                   rows: list[int], draws: _Draws, with_x: bool, *, reuse: bool = False,
                   step: Callable[[], Any] | None = None, optimizer: Any = None) -> _Run:  # fmt: skip
    """One step of the engine with the private batch ``rows`` (this rank's share of them, x last), observed.

    The loss split's per-record draws of the private batch are coupled by record, not by position: a
    generator's stream does not give a prefix of a longer draw the same values (torch fills normals in blocks),
    and the records of the batch must see the same draws with and without x. The run with x records them in
    ``draws``; the run without x gets them back without x's row; ``reuse`` (the swap run) gets them all back.

    With the record-level backstop the step's public batch is a second private batch (the record sampler's): x is
    forced into it in the run with x (last) and left out in the run without, the other rows being the sampler's own
    draw in the run with x; its per-record draws are coupled the same way. Its clipped and noisy sums (those after
    the record sampler is called) are observed apart from the private batch's."""
    run = _Run()
    sampler = state.private_sampler
    lo, hi = sampler.offset, sampler.offset + sampler.dataset_size
    mine = np.asarray([i for i in rows if lo <= i < hi], dtype=np.int64)
    draw = None if split is None else split.draws
    record_sampler = getattr(state, "record_sampler", None)

    def coupled(batch: Any, generator: torch.Generator) -> Any:
        assert draw is not None
        if generator is state.private_draws:
            return _coupled_draws(draw, batch, generator, draws, "values", reuse=reuse, with_x=with_x,
                                  has_x=len(mine) > 0 and int(mine[-1]) == rows[-1])  # fmt: skip
        if run.in_record and generator is state.public_draws:  # the backstop's record batch: x last, or left out
            return _coupled_draws(draw, batch, generator, draws, "record_values", reuse=reuse, with_x=with_x,
                                  has_x=True)  # fmt: skip
        return draw(batch, generator)  # Algorithm 1's public batch: the same rows and stream in both runs

    strategy, noise = trainer.strategy, state.noise
    clipped_sum, add = strategy.clipped_sum, noise.add

    def clipped(*args: Any, **kwargs: Any) -> Any:
        try:
            sums, norms = clipped_sum(*args, **kwargs)
        except Exception as exc:
            raise _RefusedError() from exc
        run.saw_clipped({k: v.detach().clone() for k, v in sums.items()})
        return sums, norms

    def noisy(sums: dict[str, torch.Tensor], std: float, **kwargs: Any) -> dict[str, torch.Tensor]:
        before = copy.deepcopy(noise.state_dict())
        out = add(sums, std, **kwargs)
        run.saw_noise(before, {k: v.detach().clone() for k, v in out.items()}, float(std))
        return out

    def grads(optimizer: Any, args: Any, kwargs: Any) -> None:
        run.grads = {k: p.grad.detach().clone() for k, p in params.items() if p.grad is not None}

    sampler.sample = lambda: mine
    if record_sampler is not None:
        record_sampler.sample = _record_rows(record_sampler.sample, run, draws, rows[-1] if rows else -1,
                                             with_x=with_x, reuse=reuse)  # fmt: skip
    strategy.clipped_sum, noise.add = clipped, noisy
    if split is not None:
        split.draws = coupled
    hook = (state.optimizer if optimizer is None else optimizer).register_step_pre_hook(grads)
    try:
        if step is None:
            trainer._step(state, split, batch_all, params, False)
        else:  # the PrivacyEngine's loop: model(x), criterion, loss.backward(), optimizer.step()
            step()
    finally:
        hook.remove()
        del sampler.sample, strategy.clipped_sum, noise.add  # the instances' own methods again
        if record_sampler is not None:
            del record_sampler.sample
        if split is not None:
            del split.draws
    # A tied weight appears in state_dict under each of its names; only the trained one is in params, and its
    # aliases must not count as frozen tensors that changed.
    trained = {id(p) for p in params.values()}
    run.after = {k: v.detach().clone() for k, v in trainer.model.state_dict(keep_vars=True).items()
                 if k not in params and id(v) not in trained}  # fmt: skip
    run_of = getattr(trainer, "run", trainer)  # a Trainer's run, or the engine's PrivateRun itself
    if run_of.core.sharded:  # FSDP: the sums are the totals already, as shards; each coordinate noised once
        run.clipped, run.noisy, run.grads = (_whole(run.clipped), _whole(run.noisy) if run.noisy else run.noisy,
                                             _whole(run.grads))  # fmt: skip
    elif trainer.dist is not None:  # the released quantities are the totals over the ranks
        # Each rank's share of the all-reduced noisy sum: its noisy sum if it drew noise, else its clipped sum.
        share = run.noisy if run.noisy else run.clipped
        run.noisy = all_reduce_sum(share)
        run.clipped = all_reduce_sum(run.clipped)
        gathered: list[Any] = [None] * trainer.dist.world_size
        torch.distributed.all_gather_object(gathered, run.stds)
        run.stds = [s for stds in gathered for s in stds]
    return run


def _coupled_draws(draw: Callable[[Any, torch.Generator], Any], batch: Any, generator: torch.Generator,
                   draws: _Draws, slot: str, *, reuse: bool, with_x: bool, has_x: bool) -> Any:  # fmt: skip
    """A batch's per-record draws coupled by record (``slot``: the private batch's or the record batch's in
    ``draws``): drawn and kept in the run with x (``has_x``: x is its last row), given back without x's row in the
    run without x, and all given back in the swap run (``reuse``)."""
    if reuse:
        return {k: v.clone() for k, v in getattr(draws, slot).items()}
    if with_x:
        out = draw(batch, generator)
        setattr(draws, slot, {k: v.detach().clone() for k, v in out.items()})
        if slot == "values":
            draws.has_x = has_x
        return out
    keep = draws.has_x if slot == "values" else has_x
    return {k: (v[:-1] if keep else v).clone() for k, v in getattr(draws, slot).items()}


def _record_rows(sample: Callable[[], Any], run: _Run, draws: _Draws, x: int, *, with_x: bool,
                 reuse: bool) -> Callable[[], np.ndarray]:  # fmt: skip
    """The backstop's record sampler for one run: the sampler's own draw in the run with x, with x forced in (last);
    the same rows without x in the run without x; the run with x's rows in the swap run. Calling it marks the sums
    that follow as the record batch's."""

    def rows() -> np.ndarray:
        run.in_record = True
        if with_x and not reuse:
            drawn = np.asarray(sample(), dtype=np.int64)
            draws.record_rows = np.append(drawn[drawn != x], np.int64(x))
        if draws.record_rows is None:  # the run with x drew no record batch: nothing to couple
            return np.asarray(sample(), dtype=np.int64)
        return draws.record_rows.copy() if with_x else draws.record_rows[:-1].copy()

    return rows


def _flat(tensors: dict[str, torch.Tensor], keys: Sequence[str]) -> torch.Tensor:
    return torch.cat([tensors[k].detach().reshape(-1).to(torch.float64).cpu() for k in keys])


def _whole(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sharded (DTensor) values gathered whole on every rank (a collective), others as they are."""
    return {k: whole(v) for k, v in tensors.items()}


def _compare(plan: Any, public_batch: bool, noise: Any, a: _Run, b: _Run,
             record_size: float | None = None) -> list[ReplayCheck]:  # fmt: skip
    """The checks of the runs without x (``a``) and with x (``b``). ``record_size``: the expected size q'·n of the
    record-level backstop's record batch when the step has one (its sum is then checked too, and its term w·Δ/(q'·n)
    is part of the update), else None."""
    C, sigma, m = float(plan.max_grad_norm), float(plan.noise_multiplier), float(plan.expected_batch_size)
    alpha = float(plan.alpha) if public_batch else 1.0
    keys = sorted(a.clipped)
    out = []
    size = len(keys) and int(sum(a.clipped[k].numel() for k in keys))
    rounding = _ROUNDING * max(1.0, m) * 4
    # The noisy sum and the gradient are rounded to the parameters' dtype once, near the noise's own size.
    noise_rounding = _ROUNDING * sigma * math.sqrt(size) * 2
    # The backstop's record sum enters the update as w·(noisy record sum)/(q'·n); a sum it did not noise, as is.
    w_rec = 0.0 if record_size is None else float(plan.public_weight) / record_size
    if record_size is not None:
        noise_rounding = _ROUNDING * max(sigma, float(plan.record_noise_multiplier or 0.0)) * math.sqrt(size) * 2
    # 1. the randomness really was held fixed (else the replay proves nothing)
    same_noise = _same_state(a.noise_state, b.noise_state) and len(a.stds) == len(b.stds)
    if record_size is not None:
        same_noise = (same_noise and _same_state(a.record_noise_state, b.record_noise_state)
                      and len(a.record_stds) == len(b.record_stds))  # fmt: skip
    out.append(ReplayCheck("identical randomness", 0.0 if same_noise else 1.0, 0.0, same_noise,
                           "the noise source's state before the draw, in both runs"))  # fmt: skip
    # 2. the clipped sum moves by at most C
    d_clip = _flat(b.clipped, keys) - _flat(a.clipped, keys)
    moved = float(d_clip.norm())
    bound = C * (1 + _RTOL + rounding)
    out.append(ReplayCheck("clipped sum sensitivity", moved, bound, moved <= bound,
                           "‖Σ clip(g) with x − without x‖ <= C"))  # fmt: skip
    # 3. the gradient the optimizer gets moves by exactly α·Δ(noisy sum)/m (the expected batch size)
    d_noisy = _flat(b.noisy, keys) - _flat(a.noisy, keys)
    gkeys = sorted(set(a.grads) & set(b.grads))
    if gkeys == keys:
        d_grad = _flat(b.grads, keys) - _flat(a.grads, keys)
        expected = alpha * d_noisy / m
        if record_size is not None:
            expected = expected + w_rec * (_flat(_released(b), keys) - _flat(_released(a), keys))
        off = float((d_grad - expected).norm())
        scale = alpha * C / m + w_rec * C
        tol = scale * (_RTOL + rounding + noise_rounding)
        out.append(ReplayCheck("update divisor", off, tol, off <= tol,
                               f"Δgrad = α·Δ(noisy sum)/m with m = {m:g} (the expected batch size)"
                               + ("" if record_size is None else
                                  f" + w·Δ(noisy record sum)/(q'·n) with q'·n = {record_size:g}")))  # fmt: skip
        g_moved = float(d_grad.norm())
        g_bound = scale * (1 + 2 * (_RTOL + rounding + noise_rounding))
        out.append(ReplayCheck("update sensitivity", g_moved, g_bound, g_moved <= g_bound,
                               "‖Δ gradient handed to the optimizer‖ <= α·C/m"
                               + ("" if record_size is None else " + w·C/(q'·n)")))  # fmt: skip
    else:
        out.append(ReplayCheck("update sensitivity", math.inf, 0.0, False,
                               "the optimizer did not receive a gradient for every trainable parameter"))
    # 4. nothing else moved: buffers and frozen parameters after the step
    others = sorted(set(a.after) | set(b.after))
    differ = [k for k in others if k not in a.after or k not in b.after or not _equal(a.after[k], b.after[k])]
    out.append(ReplayCheck("nothing else changed", float(len(differ)), 0.0, not differ,
                           f"buffers and frozen parameters identical{': ' + ', '.join(differ[:5]) if differ else ''}"))
    # 5. the noise: the std asked for (over all ranks), the draw's std, the sampler's stated tail
    target = sigma * C
    asked = math.sqrt(sum(s * s for s in a.stds))
    out.append(ReplayCheck("noise std requested", asked, target, abs(asked - target) <= 1e-9 * max(target, 1e-300),
                           "sqrt(Σ over ranks of the std added) = σ·C"))  # fmt: skip
    if size >= _MIN_COORDINATES and target > 0:
        drawn = _flat(a.noisy, keys) - _flat(a.clipped, keys)
        realised = float(drawn.std())
        tol = 6.0 / math.sqrt(2.0 * size) + 1e-3  # six standard errors of an estimated std
        out.append(ReplayCheck("noise std drawn", realised / target, 1 + tol, abs(realised / target - 1) <= tol,
                               f"empirical std of the {size} noise coordinates / σ·C"))  # fmt: skip
    tail = float(getattr(noise, "tail_mass_per_pair", 1.0))
    out.append(ReplayCheck("noise tail", tail, _TAIL_LIMIT, tail <= _TAIL_LIMIT,
                           "the source's stated cut tail per pair of coordinates"
                           + ("" if record_size is None else " (it draws both noisy sums)")))  # fmt: skip
    if record_size is not None:
        out.extend(_record_checks(plan, keys, a, b, rounding))
    return out


def _released(run: _Run) -> dict[str, torch.Tensor]:
    """The backstop's record sum as the step released it: noisy, or as clipped where no noise was added."""
    return run.record_noisy if run.record_noisy is not None else (run.record_clipped or {})


def _record_checks(plan: Any, keys: list[str], a: _Run, b: _Run, rounding: float) -> list[ReplayCheck]:
    """The record-level backstop's record batch (x forced in with x, left out without): its clipped sum moves by at
    most C, and it is noised at σ_pub·C (asked for, and drawn)."""
    C, sigma_pub = float(plan.max_grad_norm), float(plan.record_noise_multiplier or 0.0)
    if a.record_clipped is None or b.record_clipped is None or sorted(a.record_clipped) != keys:
        return [ReplayCheck("record clipped sum sensitivity", math.inf, C, False,
                            "the backstop's record batch was not drawn from its sampler and clipped per record")]
    out = []
    moved = float((_flat(b.record_clipped, keys) - _flat(a.record_clipped, keys)).norm())
    bound = C * (1 + _RTOL + rounding)
    out.append(ReplayCheck("record clipped sum sensitivity", moved, bound, moved <= bound,
                           "‖Σ clip(∇ℓ_pub) over the record batch with x − without x‖ <= C"))  # fmt: skip
    target = sigma_pub * C
    asked = math.sqrt(sum(s * s for s in a.record_stds))
    exact = abs(asked - target) <= 1e-9 * max(target, 1e-300)
    out.append(ReplayCheck("record noise std requested", asked, target, exact,
                           "the std added to the record sum = σ_pub·C"))
    size = int(sum(a.record_clipped[k].numel() for k in keys))
    if size >= _MIN_COORDINATES and target > 0:
        drawn = _flat(_released(a), keys) - _flat(a.record_clipped, keys)
        realised = float(drawn.std())
        tol = 6.0 / math.sqrt(2.0 * size) + 1e-3  # six standard errors of an estimated std
        out.append(ReplayCheck("record noise std drawn", realised / target, 1 + tol,
                               abs(realised / target - 1) <= tol,
                               f"empirical std of the record sum's {size} noise coordinates / σ_pub·C"))  # fmt: skip
    return out


def _swapped(fmap: Any, batch: dict[str, torch.Tensor], record: int,
             donor: int | None = None) -> tuple[dict[str, torch.Tensor], int] | None:  # fmt: skip
    """``batch`` with record ``record``'s private part replaced by that of ``donor`` (default: the record whose
    private part differs most from it), Ψ of the record unchanged, and the donor; None when Ψ hides nothing by
    position or key, or the donor's private part equals x's.

    The private part: the entries the map's ``private_entries()`` masks and the keys Ψ drops; with no map (DP-SGD,
    whole records) every entry."""
    row = {k: v[record : record + 1] for k, v in batch.items()}
    if fmap is None:
        masks = {k: torch.ones_like(v[0], dtype=torch.bool) for k, v in batch.items()}
        view = None
    else:
        view = fmap(row)
        masks = {k: m.to(batch[k].device).bool() for k, m in fmap.private_entries().items()
                 if k in batch and m.shape == batch[k].shape[1:]}  # fmt: skip
        masks.update({k: torch.ones_like(v[0], dtype=torch.bool) for k, v in batch.items() if k not in view})
    masks = {k: m for k, m in masks.items() if bool(m.any())}
    if not masks:
        return None
    n = int(next(iter(batch.values())).shape[0])
    dist = torch.zeros(n, dtype=torch.float64, device=next(iter(batch.values())).device)
    for k, m in masks.items():
        diff = (batch[k].to(torch.float64) - batch[k][record].to(torch.float64)) * m
        dist += diff.reshape(n, -1).pow(2).sum(1)
    dist[record] = -1.0
    donor = int(dist.argmax()) if donor is None else int(donor)
    if float(dist[donor]) <= 0.0:
        return None
    out = dict(batch)
    for k, m in masks.items():
        out[k] = batch[k].clone()
        out[k][record] = torch.where(m, batch[k][donor], batch[k][record])
    if view is not None:  # the swap must keep Ψ(x): else it is not a replace-one neighbour under FDP
        new = fmap({k: v[record : record + 1] for k, v in out.items()})
        if new.keys() != view.keys() or not all(_equal(new[k], view[k]) for k in view):
            return None
    return out, donor


def _swap_check(plan: Any, a: _Run, b: _Run, donor: int) -> ReplayCheck:
    """The clipped sum with x against with x's private part swapped: at most the replace-one sensitivity (2C)."""
    C, m = float(plan.max_grad_norm), float(plan.expected_batch_size)
    keys = sorted(a.clipped)
    moved = float((_flat(b.clipped, keys) - _flat(a.clipped, keys)).norm())
    sensitivity = _SENSITIVITY["replace-one"]  # what the replace-one ε is accounted at, in units of C
    bound = sensitivity * C * (1 + _RTOL + _ROUNDING * max(1.0, m) * 4)
    return ReplayCheck("swap sensitivity", moved, bound, moved <= bound,
                       f"‖Σ clip(g) with x − with x's private part from record {donor}‖ <= {sensitivity:g}C "
                       "(replace-one; add/remove is C)")  # fmt: skip


def _equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and bool(torch.equal(x, y) or torch.allclose(x, y, rtol=0, atol=0, equal_nan=True))


def _same_state(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return _equal(x, y)
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same_state(x[k], y[k]) for k in x)
    if isinstance(x, list | tuple) and isinstance(y, list | tuple):
        return len(x) == len(y) and all(_same_state(u, v) for u, v in zip(x, y))
    return bool(x == y)


def replay_votes(make: Callable[[], Any], votes: Any, *, member: int) -> ReplayReport:
    """Replay a vote aggregator's noisy histogram with and without one member's votes, with identical noise.

    Args:
        make: builds the :class:`featuredp.aggregation.VoteAggregator` under test (called twice).
        votes: the members' votes, shape (queries, members), class indices or −1 (abstain).
        member: the column of the member (teacher, prompt) that is added.

    The noisy histogram may move by at most the mechanism's sensitivity per query (1 in L2 for GNMax, 1 in L1
    for LNMax: one member adds one vote), and the noise must have the stated scale.
    """
    votes = np.asarray(votes)
    if votes.ndim != 2 or not 0 <= member < votes.shape[1]:
        raise ValueError(f"member={member} must be a column of votes of shape (queries, members), got {votes.shape}")
    a, b = make(), make()
    _copy_generator(a._rng, b._rng)
    seen = [_observe_counts(a), _observe_counts(b)]
    a.answer_all(np.delete(votes, member, axis=1))  # the aggregator's own path: histogram, threshold, noise
    b.answer_all(votes)
    del a._noisy_counts, b._noisy_counts
    (without, noisy_a), (_, noisy_b) = seen[0][-1], seen[1][-1]
    report = ReplayReport(a.mechanism, "votes", "fp64", bool(a.secure_rng), 1, "passed")
    order = 2 if a.mechanism == "gnmax" else 1
    moved = float(np.linalg.norm(noisy_b - noisy_a, ord=order, axis=1).max())
    report.checks.append(ReplayCheck("histogram sensitivity", moved, 1 + 1e-9, moved <= 1 + 1e-9,
                                     f"max over queries of ‖Δ noisy histogram‖_{order} <= 1"))  # fmt: skip
    noise = (noisy_a - without).ravel()
    target = float(a.sigma) if a.mechanism == "gnmax" else math.sqrt(2.0) * float(a.scale)
    if noise.size >= _MIN_COORDINATES:
        tol = 6.0 / math.sqrt(2.0 * noise.size) * (1.0 if a.mechanism == "gnmax" else 2.0) + 1e-3
        ratio = float(noise.std()) / target
        report.checks.append(ReplayCheck("noise std drawn", ratio, 1 + tol, abs(ratio - 1) <= tol,
                                         f"empirical std of {noise.size} noise draws / the stated std"))  # fmt: skip
    report.outcome = "passed" if all(c.ok for c in report.checks) else "failed"
    return report


def _observe_counts(aggregator: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """Record every (histogram, noisy histogram) the aggregator computes."""
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    real = aggregator._noisy_counts

    def observed(hist: np.ndarray) -> np.ndarray:
        out = real(hist)
        seen.append((np.array(hist, dtype=np.float64), np.array(out, dtype=np.float64)))
        return out

    aggregator._noisy_counts = observed
    return seen


def _copy_generator(source: Any, target: Any) -> None:
    """Give ``target`` the state of ``source`` (numpy Generator or ChaCha20Generator): identical noise."""
    if isinstance(source, np.random.Generator):
        target.bit_generator.state = source.bit_generator.state
    else:
        target.load_state_dict(source.state_dict())


def verdict(reports: Sequence[ReplayReport]) -> str:
    """One line summing up replays of one configuration: safe, refused (and what to do), or UNSAFE."""
    if not reports:
        raise ValueError("verdict needs at least one ReplayReport")
    failed = [r for r in reports if r.outcome == "failed"]
    refused = [r for r in reports if r.outcome == "refused"]
    first = reports[0]
    where = f"{first.method} with strategy={first.strategy!r}"
    if failed:
        names = sorted({c.name for r in failed for c in r.failures()})
        return (f"UNSAFE: {where} let one record move a released quantity by more than its sensitivity in "
                f"{len(failed)} of {len(reports)} replays ({', '.join(names)}); do not train with it")
    if refused:
        hint = "; use strategy='vmap'" if first.strategy == "ghost" else ""
        return f"refused: {where} refuses this model ({refused[0].refusal}){hint}"
    return (f"safe: {where} kept every released quantity within its sensitivity in {len(reports)} replays "
            "(on these records; not a proof for all inputs)")
