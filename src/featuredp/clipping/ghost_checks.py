"""The checks that ghost clipping's gradients are per-example: the separability cross-check and the chunk check.

Ghost norms are only right if row i of every recorded tensor belongs to example i alone. Layers known
to mix the batch are refused statically (:func:`featuredp.clipping.check_no_batch_mixing`); mixing by
parameter-free code (``x - x.mean(0)``, attention over the wrong axis) is caught here, on every call
of :class:`~featuredp.clipping.ghost.GhostGradients`:

* the *separability cross-check* recomputes two secretly chosen examples' gradients each on its own (a forward
  and backward of the example alone) and compares them, and their norms, with the ghost ones, by the float64
  distance ‖ghost − alone‖ (:mod:`featuredp.clipping.distances`);
* the *chunk check*, on a secret share of the steps, recomputes a secret random chunk of rows each alone (vmap
  over batches of one; a loop where vmap cannot run) and compares one weighted sum of their gradients, weights
  ±(1 + U)·c_i secret, with ghost's weighted sum over the same rows: one backward, no per-example gradient on
  either side.

A mismatch that float rounding does not explain raises :class:`featuredp.errors.BatchMixingError`.
The checks are a mixin of :class:`~featuredp.clipping.ghost.GhostGradients` (its private methods,
unchanged), kept apart so that the strategy's own module is the forward, the rules and the sums.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import torch
from torch import nn

from featuredp.clipping import distances
from featuredp.clipping.alone import (
    NOT_DETERMINISTIC,
    AloneGradients,
    alone_gradients,
    batch_rounding_noise,
    owner,
    rounding_noise,
)
from featuredp.clipping.base import (
    AutocastLoss,
    LossFn,
    add_up,
    batch_size_of,
    clip_factors,
    per_example_grads,
    slice_batch,
)
from featuredp.clipping.contributions import Contribution
from featuredp.clipping.fsdp import Lockstep
from featuredp.clipping.ghost_plan import GhostPlan
from featuredp.clipping.safety import AutogradHookGuard
from featuredp.errors import BatchMixingError, ForwardSideEffectError
from featuredp.features.base import Batch

__all__ = ["GhostChecks", "Inspect"]

_owner = owner  # ghost.py's name for it


def _has_randomness(model: nn.Module) -> list[str]:
    return [
        n or type(model).__name__
        for n, m in model.named_modules()
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0
    ]


@contextlib.contextmanager
def _dropout_off(model: nn.Module) -> Iterator[None]:
    """Dropout modules in eval mode (identity) for the duration: the cross-check compares two computations of
    the same gradients, which only agree if both see the same (no) dropout masks."""
    active = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training]
    for m in active:
        m.training = False
    try:
        yield
    finally:
        for m in active:
            m.training = True


# Parameter-free modules that act on each example alone (elementwise or per-row); any other parameter-free leaf
# module is named as a suspect when the separability cross-check fails.
_PER_EXAMPLE = (
    nn.Identity,
    nn.Flatten,
    nn.Unflatten,
    nn.modules.dropout._DropoutNd,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.PReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Tanh,
    nn.Sigmoid,
    nn.Hardtanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Softplus,
    nn.Softsign,
    nn.Tanhshrink,
    nn.Upsample,
    nn.PixelShuffle,
    nn.PixelUnshuffle,
    nn.modules.pooling._MaxPoolNd,
    nn.modules.pooling._AvgPoolNd,
    nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd,
    nn.modules.padding._ConstantPadNd,
    nn.modules.padding._ReflectionPadNd,
    nn.modules.padding._ReplicationPadNd,
)


def _acts_per_example(m: nn.Module) -> bool:
    if isinstance(m, (nn.Softmax, nn.LogSoftmax, nn.Softmin)):
        return m.dim not in (None, 0)  # over dim 0 (or an implicit dim on 2-d input) it normalises across examples
    return isinstance(m, _PER_EXAMPLE)

# The separability cross-check's look at one chunk: (combined contributions, the per-call parts, norms).
Inspect = Callable[[dict[str, Contribution], dict[str, list[Contribution]], torch.Tensor], None]

# Separability cross-check tolerance. Per example and parameter, the ghost gradient g and the batch-of-one
# gradient r must satisfy ‖g − r‖ ≤ RTOL·‖r‖ + TERM_TOL·b + SCALE_TOL·max b, where b bounds the norm without
# cancellation (Σ_t ‖a_t‖‖g_t‖, see term_bounds). Both are float32 computations of the same quantity on
# different batch shapes; they differ by rounding of ~1e-7 of the terms (a few ulps after depth and
# reductions). The ghost norm's float64 recomputation under cancellation shows up relative to ‖r‖. Mixing
# examples changes gradients by a sizeable fraction of their terms (x − mean(x) at B = 4: by ~1/4 or more).
_SEPARABILITY_RTOL = 1e-3
_SEPARABILITY_TERM_TOL = 1e-4
_SEPARABILITY_SCALE_TOL = 1e-6
_SEPARABILITY_CLIP_TOL = 1e-6
# A failed comparison is retried allowing this many times each example's own float32 rounding (float32 against
# float64, alone): two float32 evaluations differ by at most about twice it. A comparison that still fails is
# retried once more adding, once, its row's rounding in the batch's own forward (a kink's branch; see there).
_SEPARABILITY_NOISE_FACTOR = 8.0
_SEPARABILITY_EXAMPLES = 2
# The chunk check: on a secret share of the steps (OS entropy, never a seed), a secret random chunk of the
# checked physical chunk (up to this many rows) is recomputed example by example (vmap over batches of one) and
# its secretly weighted clipped sum compared with ghost's. One row that mixes only itself with the batch (a marker
# row) is in the chunk with probability chunk/B, so a run of T steps catches it with probability at least
# 1 − (1 − rate·chunk/B)^T (docs/engine.md).
_CHUNK_CHECK_RATE = 0.125
_CHUNK_CHECK_EXAMPLES = 64
# Tolerance of the chunk's weighted sums: relative to Σ_i |w_i|‖g_i‖ (rounding scales with the terms, not the
# sum), plus a floor of 1e-6·C per row and unit of weight. A mismatch is confirmed example by example
# (batch-of-one autograd, with the every-step check's tolerances and rounding retry) before the step is refused.
_CHUNK_RTOL = 1e-3
# A failed chunk check is confirmed on this many of its rows that differ most.
_CONFIRM_EXAMPLES = 2


class GhostChecks:
    """The every-call checks of :class:`~featuredp.clipping.ghost.GhostGradients` (a mixin; see the module docstring).

    The host class provides the secret generator, the switches and the physical chunk computation.
    """

    physical_batch_size: int | None
    _secret: np.random.Generator
    _check_separability: bool
    _chunk_check_rate: float
    #: Set for the duration of a call on a sharded model (clipping/fsdp.py): every rank makes the same passes.
    _lock: Lockstep | None = None
    # The references the checks compare with (clipping/alone.py), as methods so that tests can watch them.
    _alone = staticmethod(alone_gradients)
    _rounding_noise = staticmethod(rounding_noise)
    _batch_rounding_noise = staticmethod(batch_rounding_noise)

    def _chunk(
        self,
        plan: GhostPlan,
        model: nn.Module,
        loss_fn: LossFn,
        batch: Batch,
        draws: Batch,
        C: float,
        params: dict[str, torch.Tensor],
        inspect: Inspect | None = None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One physical chunk's clipped sums and norms (the host's)."""
        raise NotImplementedError

    def _alone_contributions(self, plan: GhostPlan, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch,
                             slices: list[slice]) -> list[dict[str, Contribution]]:  # fmt: skip
        """Each of ``slices`` run alone through the hooked forward: its contributions (the host's)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def _agreed(self, what: str) -> Iterator[None]:
        """On a sharded model, a refusal (BatchMixingError, ValueError) of the body on any rank raised on every rank
        after it, so that no rank waits in a collective for one that left; elsewhere the body as it is."""
        if self._lock is None:
            yield
            return
        error: BaseException | None = None
        try:
            yield
        except (BatchMixingError, ValueError) as exc:
            error = exc
        self._lock.raise_if_any(error, lambda: BatchMixingError(
            f"GhostGradients: another rank's {what} refused this step (its error is on its stderr)"))

    def _sharded_alone(self, plan: GhostPlan, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch,
                       params: dict[str, torch.Tensor], picked: list[int], *, twice: bool,
                       weights: torch.Tensor | None = None) -> AloneGradients:  # fmt: skip
        """A sharded model's :meth:`_alone` (or, with ``weights``, :meth:`_weighted_alone`): each row of ``picked``
        through the hooked forward alone, as many passes as the rank with the most rows (the others over no rows),
        its gradients read one parameter at a time (:class:`AloneGradients`). ``twice``: run again and compare, as
        :meth:`_alone` does on a model's first check."""
        assert self._lock is not None
        slices = [slice(i, i + 1) for i in picked]
        slices += [slice(0, 0)] * (self._lock.max(len(picked)) - len(picked))
        def run() -> AloneGradients:
            contribs = self._alone_contributions(plan, model, loss_fn, batch, draws, slices)
            return AloneGradients(contribs[: len(picked)], params, weights)

        first = run()
        if twice:
            again = run()
            for n in params:
                a, b = first[n], again[n]
                if a.numel() and float((a - b).abs().max()) > 1e-5 * float(a.abs().max()) + 1e-12:
                    raise ValueError(NOT_DETERMINISTIC.format(name=n))
        return first

    def _separability_check(
        self,
        plan: GhostPlan,
        model: nn.Module,
        loss_fn: LossFn,
        batch: Batch,
        draws: Batch,
        params: dict[str, torch.Tensor],
        n: int,
        chunk: int,
        C: float = math.inf,
        count: int = 1,
    ) -> tuple[int, Inspect | None]:
        """Arrange this step's check that ghost gradients are per-example: the physical chunk to check and the
        callback that checks it (``(-1, None)`` when nothing can mix or checking is off). ``count``: the step's
        number of physical chunks (on a sharded model the ranks' agreed one, which may exceed this rank's own).

        A forward computed over B examples at once is only a set of B per-example computations if no operation
        mixes rows; parameter-free code that does (centring over the batch, trimming padding to the batch's
        longest sequence, attention over the batch axis) is invisible to the layer hooks, and may do so only
        on some batches. So on **every** call, one physical chunk (the chunk of a uniformly random example)
        and a few of its examples are chosen with secret randomness (OS entropy: the model cannot know which
        rows are compared), and those examples' gradients are recomputed alone (batch of one, through the
        same ``loss_fn`` with their own batch and draws rows) and compared with what ghost clipping derived
        for them from the whole chunk, before any of the step's result leaves the strategy. Physical chunks
        of one are separate forwards: nothing can mix, and nothing needs checking.
        """
        if plan.whole_model_fallback or not self._check_separability or self.physical_batch_size == 1:
            return -1, None
        lock = self._lock
        sizes = [max(0, min(chunk, n - start)) for start in range(0, count * chunk, chunk)]
        weights = np.array([size if size >= 2 else 0 for size in sizes], dtype=np.float64)
        if weights.sum() == 0 and lock is None:
            return -1, None
        if len(sizes) == 1:
            index = 0
        else:
            p = weights / weights.sum() if weights.sum() else None
            index = int(self._secret.choice(len(sizes), p=p))
            if lock is not None:  # one chunk for every rank, rank 0's secret choice: the passes line up
                index = lock.first(index)
        start = index * chunk
        part_b = slice_batch(batch, slice(start, start + sizes[index]))
        part_d = slice_batch(draws, slice(start, start + sizes[index]))
        exact = loss_fn.loss_fn if isinstance(loss_fn, AutocastLoss) else loss_fn

        # Decided before the forward, from OS entropy: the model cannot tell which steps are checked.
        chunk_check = bool(self._secret.random() < self._chunk_check_rate)
        if lock is not None:
            chunk_check = bool(lock.first(int(chunk_check)))

        def inspect(
            combined: dict[str, Contribution], parts: dict[str, list[Contribution]], norms: torch.Tensor
        ) -> None:
            self._compare_with_alone(plan, model, exact, part_b, part_d, params, combined, parts, norms, C)
            if chunk_check:
                self._compare_chunk(plan, model, exact, part_b, part_d, params, combined, parts, norms, C)

        if not _has_randomness(model) and exact is loss_fn:
            return index, inspect  # checked on the step's own chunk: no extra forward
        # Dropout draws different masks in every forward; the comparison needs one deterministic forward of the
        # chunk (an extra one) with dropout off, for the ghost side as for the reference. Under bfloat16 a
        # batch and a batch of one round differently, so that extra forward runs in float32 and the check keeps
        # float32's tolerance (a mixing layer moves a gradient by multiples of C, not 2⁻⁸).
        with _dropout_off(model):
            self._chunk(plan, model, exact, part_b, part_d, math.inf, params, inspect)
        return -1, None

    def _compare_with_alone(
        self,
        plan: GhostPlan,
        model: nn.Module,
        loss_fn: LossFn,
        batch: Batch,
        draws: Batch,
        params: dict[str, torch.Tensor],
        combined: dict[str, Contribution],
        parts: dict[str, list[Contribution]],
        norms: torch.Tensor,
        C: float = math.inf,
        picked: np.ndarray | None = None,
    ) -> None:
        """Raise BatchMixingError if the ghost gradients or norms of a few secretly chosen examples (or those
        ``picked``) differ from theirs computed alone. On a sharded model every rank raises if any rank's did."""
        with self._agreed("every-step check"):
            # Rows with a non-finite gradient contribute zero and would make every comparison false: choose among
            # the others (if none is left there is nothing this step could leak through mixing that is summed).
            if picked is None:
                picked = self._pick(norms)
            if picked is None or len(picked) == 0:
                if self._lock is not None:  # nothing to check here: this rank joins the others' passes
                    self._sharded_alone(plan, model, loss_fn, batch, draws, params, [], twice=not plan.deterministic)
                    plan.deterministic = True
                return
            rows = torch.as_tensor(picked, dtype=torch.int64, device=norms.device)
            alone: Mapping[str, torch.Tensor]
            if self._lock is not None:
                alone = self._sharded_alone(plan, model, loss_fn, batch, draws, params, picked.tolist(),
                                            twice=not plan.deterministic)  # fmt: skip
            else:
                alone = self._alone(model, loss_fn, batch, draws, params, picked, twice=not plan.deterministic)
            plan.deterministic = True
            with torch.no_grad():
                # Materialised where the rows are small and the model unsharded; the compact forms otherwise (a
                # sharded model's alone gradients are read one parameter at a time, never all at once).
                size = len(rows) * sum(p.numel() for p in params.values())
                flat = self._lock is None and size <= distances.FLAT_ELEMENTS
                if flat:
                    err_sq, ref_sq = distances.flat(combined, rows, alone)
                else:
                    err_sq, ref_sq, terms = distances.compact(combined, rows, alone)
                err = err_sq.clamp(min=0).sqrt()
                ref_norms = ref_sq.sqrt()
                norm_off = (norms[rows].to(torch.float64) - ref_norms).abs()

                def fails(limit: torch.Tensor) -> bool:
                    # The gradients, and the norms that set the clip factors (float64 Gram forms, fallback included),
                    # against the same computed alone; a NaN computed alone makes every comparison false: a failure.
                    return bool(((err > limit) | (norm_off > limit) | ~torch.isfinite(ref_norms)).any())

                clip_floor = _SEPARABILITY_CLIP_TOL * C if math.isfinite(C) else 0.0
                # The tolerance below is at least this: an ordinary step (distance ~1e-7 of the norm) passes here,
                # without the bounds that only matter when a distance comes near it.
                if not fails(_SEPARABILITY_RTOL * ref_norms + clip_floor):
                    return
                # Bound the terms over the separate calls (passes), whose sum is where cancellation happens.
                bounds = [add_up([c.term_bounds(rows) for c in parts.get(pname) or [combined[pname]]])
                          for pname in params if pname in combined]  # fmt: skip
                bound = ref_norms if not bounds else torch.maximum(torch.stack(bounds).pow(2).sum(0).sqrt(), ref_norms)
                # The absolute floor follows the chunk's largest gradient, not only the checked rows': a saturated
                # model has rows whose gradients are ~1e-21, where float32 Gram norms lose whole digits (their squares
                # are denormal) and a comparison relative to those rows alone would refuse an ordinary model.
                finite = norms[torch.isfinite(norms)]
                scale = torch.maximum(bound.max(), finite.max().to(torch.float64)) if finite.numel() else bound.max()
                # Differences below 1e-6·C (clip_floor) move a clipped contribution by at most that: far inside the
                # sensitivity, and the level of float32 noise in a model whose whole batch is saturated (every
                # gradient ~1e-22, where Gram norms lose whole digits).
                tol = (_SEPARABILITY_RTOL * ref_norms + _SEPARABILITY_TERM_TOL * bound + _SEPARABILITY_SCALE_TOL * scale
                       + clip_floor)  # fmt: skip
                failed = fails(tol)
            if failed:
                # Before calling it mixing: an ill-conditioned forward (a diverged model's logits in the thousands)
                # moves an example's float32 gradient by ~0.1% between any two summation orders. Measure how far
                # rounding moves each checked example's own gradient (float32 alone against float64 alone, which no
                # other example enters) and allow a few times that; mixing moves gradients far more.
                # Not on a sharded model: the float64 copy's forward would be collectives this rank alone makes.
                noise = None
                if self._lock is None:
                    assert isinstance(alone, dict)
                    noise = self._rounding_noise(model, loss_fn, batch, draws, params, picked, alone)
                if noise is not None:
                    failed = fails(tol + _SEPARABILITY_NOISE_FACTOR * noise)
                if noise is not None and failed:
                    # A kink (ReLU gate, max-pool argmax) turns one rounding into a different derivative: where the
                    # batch's kernel rounds a unit to the other side of it than a row alone does (NNPACK's Winograd on
                    # 16 rows, a direct kernel on one: ~1e-5 apart), the row's gradient moves by that unit's share
                    # (0.2-5% in a small CNN), while float64 alone takes float32 alone's branch, so the retry above sees
                    # nothing. Float64 takes the exact branch on both sides, so the flip is in one of the two measured
                    # roundings: for a separable model ‖ghost − alone‖ ≤ tol + noise + batch_noise (the triangle
                    # inequality through the row's gradient in the batch's float32 forward, ghost's own branches, and
                    # in its float64 one, equal to float64 alone). Mixing is in both precisions alike, so batch_noise
                    # holds only rounding: 1e-7 to 1e-6 of the gradient on a row with no unit that close to a kink.
                    batch_noise = self._batch_rounding_noise(model, loss_fn, batch, draws, params, picked)
                    if batch_noise is not None:
                        failed = fails(tol + _SEPARABILITY_NOISE_FACTOR * noise + batch_noise)
            if failed:
                if flat:  # the per-parameter terms, for the message only
                    terms = distances.compact(combined, rows, alone)[2]
                bad = [pname for pname, (d, r) in ((n, distances.of_parameter(t)) for n, t in terms.items())
                       if bool((d > _SEPARABILITY_RTOL * r + _SEPARABILITY_TERM_TOL * bound).any())]  # fmt: skip
                raise BatchMixingError(self._mixing_message(plan, model, bad))

    def _compare_chunk(
        self,
        plan: GhostPlan,
        model: nn.Module,
        loss_fn: LossFn,
        batch: Batch,
        draws: Batch,
        params: dict[str, torch.Tensor],
        combined: dict[str, Contribution],
        parts: dict[str, list[Contribution]],
        norms: torch.Tensor,
        C: float,
    ) -> None:
        """Raise BatchMixingError if ghost's clipped sum over a secret random chunk of rows, each row weighted by
        a secret random sign and size, differs from the same weighted sum of the rows' gradients computed alone.

        The reference is one forward of the chunk's rows, each alone (vmap over batches of one, or a loop where
        the model cannot be vmapped), and one backward of their weighted losses: no per-example gradient is
        formed on either side. The weights are w_i = s_i·c_i with c_i ghost's clip factor and s_i = ±(1 + U),
        U uniform on [0, 1): a row whose gradient differs moves the weighted sums apart by |w_i| times its
        difference, and no set of differing rows can cancel except on a set of weights of probability zero
        (centring over the batch makes the rows' differences sum to zero, which equal weights would not see).
        """
        lock = self._lock
        finite = torch.isfinite(norms).nonzero().flatten().cpu().numpy()
        if len(finite) == 0 and lock is None:
            return
        picked = np.sort(self._secret.choice(finite, size=min(_CHUNK_CHECK_EXAMPLES, len(finite)), replace=False))
        k = len(picked)
        rows = torch.as_tensor(picked, dtype=torch.int64, device=norms.device)
        sizes = self._secret.choice([-1.0, 1.0], size=k) * (1.0 + self._secret.random(k))
        weights = torch.as_tensor(sizes, device=norms.device) * clip_factors(norms[rows].to(torch.float64), C)
        sub_b = {key: v[rows.to(v.device)] for key, v in batch.items()}
        sub_d = {key: v[rows.to(v.device)] for key, v in draws.items()}
        theirs = self._weighted_alone(plan, model, loss_fn, sub_b, sub_d, params, weights)
        with torch.no_grad():
            diff_sq = torch.zeros((), dtype=torch.float64, device=norms.device)
            for n, t in theirs.items():
                # The difference in the gradients' dtype: its rounding is ~1e-7 of the terms, far inside the
                # tolerance (1e-3 of them).
                diff = combined[n].select(rows).weighted_sum(weights).to(t.dtype).sub_(t) if n in combined else t
                diff_sq += torch.linalg.vector_norm(diff, dtype=torch.float64).square()
            # Rounding scales with Σ_i |w_i|·‖g_i‖ (the terms), not with their possibly cancelling sum.
            scale = float((weights.abs() * norms[rows].to(torch.float64)).sum())
            tol = _CHUNK_RTOL * scale + _SEPARABILITY_CLIP_TOL * (C if math.isfinite(C) else scale) * float(
                np.abs(sizes).sum()
            )
            failed = not (float(diff_sq.sqrt()) <= tol)
        if lock is not None:  # no confirmation one by one (torch.func or more passes than the other ranks make)
            with self._agreed("chunk check"):
                if failed:
                    raise BatchMixingError(self._mixing_message(plan, model, list(theirs)))
            return
        if failed:
            rows_alone = (picked, sub_b, sub_d)
            self._confirm_chunk(plan, model, loss_fn, batch, draws, params, combined, parts, norms, C, rows_alone)

    def _weighted_alone(
        self,
        plan: GhostPlan,
        model: nn.Module,
        loss_fn: LossFn,
        batch: Batch,
        draws: Batch,
        params: dict[str, torch.Tensor],
        weights: torch.Tensor,
    ) -> Mapping[str, torch.Tensor]:
        """∇_θ Σ_i weights[i]·loss(example i alone), per parameter: one forward of every example as a batch of one
        (vmap; a loop of batch-of-one calls for models vmap cannot run, remembered in the plan) and one backward."""
        if self._lock is not None:  # a sharded model: the rows' contributions, one parameter's gradient at a time
            picked = list(range(batch_size_of(batch, draws)))
            return self._sharded_alone(plan, model, loss_fn, batch, draws, params, picked, twice=False,
                                       weights=weights)  # fmt: skip
        tensors = list(params.values())
        losses = None
        if plan.alone_vmap:

            def one(b: Batch, d: Batch) -> torch.Tensor:
                return loss_fn(model, {k: v.unsqueeze(0) for k, v in b.items()},
                               {k: v.unsqueeze(0) for k, v in d.items()}).reshape(())  # fmt: skip

            try:
                with AutogradHookGuard(owner(model)):
                    losses = torch.func.vmap(one, randomness="error")(batch, draws)
            except (BatchMixingError, ForwardSideEffectError):
                raise
            except Exception:  # data-dependent shapes, .item(), random draws: a loop of batches of one instead
                plan.alone_vmap = False
        if losses is None:
            one_at_a_time = [slice(i, i + 1) for i in range(len(weights))]
            with AutogradHookGuard(owner(model)):
                losses = torch.cat([loss_fn(model, slice_batch(batch, sl), slice_batch(draws, sl)).reshape(1)
                                    for sl in one_at_a_time])  # fmt: skip
        gs = torch.autograd.grad((losses * weights.to(losses.dtype)).sum(), tensors, allow_unused=True)
        return {n: torch.zeros_like(t) if g is None else g.detach() for n, g, t in zip(params, gs, tensors)}

    def _confirm_chunk(
        self,
        plan: GhostPlan,
        model: nn.Module,
        loss_fn: LossFn,
        batch: Batch,
        draws: Batch,
        params: dict[str, torch.Tensor],
        combined: dict[str, Contribution],
        parts: dict[str, list[Contribution]],
        norms: torch.Tensor,
        C: float,
        rows_alone: tuple[np.ndarray, Batch, Batch],
    ) -> None:
        """After a failed chunk check: the rows that differ most, compared one by one (the every-step comparison,
        its tolerances and its rounding retry), which raises naming the layers unless rounding explains it.
        Only here are the chunk's per-example gradients formed. ``rows_alone``: the chunk's rows (indices into
        ``batch``) and their batch and draws rows."""
        picked, sub_b, sub_d = rows_alone
        rows = torch.as_tensor(picked, dtype=torch.int64, device=norms.device)
        names = list(params)
        try:
            ref = per_example_grads(model, loss_fn, sub_b, sub_d, names)
        except Exception:  # a model torch.func cannot vmap (dynamic shapes): one example at a time
            ref = self._alone(model, loss_fn, sub_b, sub_d, params, np.arange(len(picked)), twice=False)
        with torch.no_grad():
            row_sq = distances.compact(combined, rows, ref)[0]
        worst = picked[np.sort(torch.argsort(row_sq, descending=True)[:_CONFIRM_EXAMPLES].cpu().numpy())]
        self._compare_with_alone(plan, model, loss_fn, batch, draws, params, combined, parts, norms, C, worst)

    def _pick(self, norms: torch.Tensor) -> np.ndarray | None:
        """Up to ``_SEPARABILITY_EXAMPLES`` distinct rows with finite norms, uniformly at random (secret)."""
        if bool(torch.isfinite(norms).all()):  # the common case: every row can be checked
            return self._distinct(np.arange(len(norms)))
        finite = torch.isfinite(norms).nonzero().flatten().cpu().numpy()
        return None if len(finite) == 0 else self._distinct(finite)

    def _distinct(self, rows: np.ndarray) -> np.ndarray:
        """Up to ``_SEPARABILITY_EXAMPLES`` of ``rows``, a uniformly random subset (Floyd's algorithm: one scalar draw
        per row picked, where ``choice`` without replacement shuffles all of them), sorted."""
        n = len(rows)
        chosen: set[int] = set()
        for top in range(n - min(_SEPARABILITY_EXAMPLES, n), n):
            t = int(self._secret.integers(top + 1))
            chosen.add(top if t in chosen else t)
        return np.sort(rows[sorted(chosen)])

    @staticmethod
    def _mixing_message(plan: GhostPlan, model: nn.Module, bad: list[str]) -> str:
        layers = []
        for layer in plan.layers:
            if any(p in bad for p in layer.params.values()):
                layers.append(f"{layer.name or '<root>'!r} ({type(layer.module).__name__})")
        suspects = [
            f"{n!r} ({type(m).__name__})"
            for n, m in model.named_modules()
            if n
            and not any(True for _ in m.children())
            and not any(True for _ in m.parameters(recurse=False))
            and not _acts_per_example(m)
        ]
        if len(suspects) > 6:
            suspects = [*suspects[:6], f"and {len(suspects) - 6} more"]
        where = f"the gradients of {', '.join(layers)} differ" if layers else "the per-example norms differ"
        culprit = (
            f"likely culprits: the parameter-free modules {', '.join(suspects)}"
            if suspects
            else "likely culprit: parameter-free code in a forward (a reduction or attention over the first "
            "dimension, e.g. x - x.mean(0))"
        )
        return (
            f"GhostGradients: the model ({type(model).__name__}) mixes examples across the batch — computed from "
            "the whole batch, "
            f"{where} from each example's gradient computed on its own ({culprit}), so per-example clipping "
            "would not bound one record's influence and the reported ε would be false; make every layer "
            "per-example (batch_first=True for attention, GroupNorm/LayerNorm instead of batch statistics, no "
            "reductions over the batch dimension) or use strategy='vmap'"
        )
