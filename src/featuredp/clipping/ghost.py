"""Ghost (book-keeping) clipping: exact per-example clipped gradient sums without per-example gradients.

:class:`GhostGradients` implements the :class:`featuredp.clipping.GradientStrategy`
protocol. One forward pass records, for every supported layer and for *every
call* of it, the layer's input and output; one backward pass gives the
gradient of Σ_i loss_i with respect to each recorded output (no parameter
gradients are formed). Because the loss is per example, row i of those output
gradients belongs to example i alone, so each layer's per-example gradient is
a sum of outer products Σ_t g_t a_tᵀ whose squared norm is
Σ_{t,s} (a_t·a_s)(g_t·g_s) — computed without building the gradient. A loss that
sends an example through the same layer twice, like FDP's ℓ(x) − ℓ(x_padded),
simply has more tokens t, which produces the cross terms 2(a₁·a₂)(g₁·g₂).
Then c_i = min(1, C/‖∇ℓ_i‖) and each layer's clipped sum is one weighted
matmul Σ_i c_i Σ_t g_it a_itᵀ. The result is exact (tests compare it with
torch.func per-example gradients).

Supported layers (exact module types): Linear (any number of leading dims),
Embedding (padding_idx), EmbeddingBag (sum/mean, ragged bags, per-sample
weights, padding_idx), Conv1d/Conv2d (any stride, dilation, groups, padding
mode), LayerNorm, GroupNorm, RMSNorm. A parameter shared by supported layers
(a token embedding tied to the output head) combines their contributions with
the cross terms (:class:`featuredp.clipping.mixed.Mixed`). Parameters of any
other layer, shared with one, or used outside a layer's call (a weight reused
functionally, ``F.linear(h, emb.weight)``), fall back to torch.func per-example
gradients for just those parameters; :attr:`GhostGradients.fallback_layers`
lists them and a warning says so. Norms of both paths add up.

Requirements: supported layers must see batch-first inputs (first dimension =
the examples of the batch). A layer called otherwise makes the whole step fall
back to torch.func (with a warning). With fallback parameters the model must be
deterministic given (batch, draws) (no dropout), because the fallback
re-evaluates the loss.

Safety. Ghost norms are only right if row i of every recorded tensor belongs to
example i alone. Layers known to mix the batch are refused statically
(:func:`featuredp.clipping.check_no_batch_mixing`); mixing by parameter-free
code (``x - x.mean(0)``, attention over the wrong axis) is caught by the
*separability cross-check*: on the first batch of at least two examples the
gradients of the first four examples are recomputed on their own (a forward and
backward of each example alone) and compared with the ghost ones; a mismatch
raises :class:`featuredp.clipping.BatchMixingError`. Every call runs under
:class:`featuredp.clipping.ForwardStateGuard`, because the private forward
runs on the real model and must not write into its parameters or buffers, and
every private forward under :class:`featuredp.clipping.safety.AutogradHookGuard`,
which refuses backward hooks and saved-tensor hooks (they could edit the
gradients read after the clip factors are known). The clipped sum is formed
from the same recorded activations and output gradients as the norms (one
backward pass; there is no second, unchecked one).
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from featuredp._validate import check_choice, check_int, check_positive
from featuredp.clipping.base import (
    AutocastLoss,
    LossFn,
    add_up,
    batch_size_of,
    clip_factors,
    empty_result,
    full_precision,
    per_example_grads,
    slice_batch,
    trainable_parameters,
)
from featuredp.clipping.contributions import Contribution, Dense, NormCache
from featuredp.clipping.mixed import combine
from featuredp.clipping.rules import NotPerExampleError, Rule, rule_for
from featuredp.clipping.safety import AutogradHookGuard, ForwardStateGuard, check_no_batch_mixing
from featuredp.errors import BatchMixingError
from featuredp.features.base import Batch

__all__ = ["GhostGradients", "GhostPlan"]


@dataclass
class _Layer:
    """A supported layer of the model and the trainable parameters its rule covers."""

    name: str
    module: nn.Module
    rule: Rule
    params: dict[str, str]  # attribute on the module -> name in model.named_parameters()


@dataclass
class GhostPlan:
    """How one model's trainable parameters are handled (built once per model and cached)."""

    layers: list[_Layer]
    fallback: list[str]  # parameter names differentiated per example with torch.func
    fallback_layers: list[str]  # "layer (Type): reason", for the user
    signature: tuple[tuple[str, int, bool], ...]
    clone_outputs: set[int] = field(default_factory=set)  # id(module): outputs later modified in place
    validated: bool = False
    whole_model_fallback: bool = False
    deterministic: bool = False  # two batch-of-one computations of the same example agreed (checked once)


@dataclass
class _Call:
    """One call of a supported layer during the forward: what its rule needs, and how to see it was modified."""

    layer: _Layer
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: torch.Tensor
    versions: list[tuple[torch.Tensor, int]]  # tensors whose in-place modification would invalidate the call


def _signature(model: nn.Module) -> tuple[tuple[str, int, bool], ...]:
    return tuple((n, id(p), p.requires_grad) for n, p in model.named_parameters(remove_duplicate=False))


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
# float64, alone): two float32 evaluations differ by at most about twice it.
_SEPARABILITY_NOISE_FACTOR = 8.0
_SEPARABILITY_EXAMPLES = 2
# The chunk check: on a secret share of the steps (OS entropy, never a seed), a secret random chunk of the checked
# physical chunk (up to this many rows) is recomputed per example with torch.func, and its clipped sum compared
# with ghost's. One row that mixes only itself with the batch (a marker row) is in the chunk with probability
# chunk/B, so a run of T steps catches it with probability at least 1 − (1 − rate·chunk/B)^T (docs/engine.md).
_CHUNK_CHECK_RATE = 0.125
_CHUNK_CHECK_EXAMPLES = 32
# Tolerance of the chunk's clipped sums: relative to Σ_i ‖c_i g_i‖ (rounding scales with the terms, not the sum),
# plus a floor of 1e-6·C per row. A mismatch is confirmed example by example (batch-of-one autograd, with the
# every-step check's tolerances and rounding retry) before the step is refused.
_CHUNK_RTOL = 1e-3


def _owner(model: nn.Module) -> str:
    return f"GhostGradients ({type(model).__name__})"


def _example_gradient(
    model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, params: dict[str, torch.Tensor], i: int
) -> list[torch.Tensor]:
    """The gradient of example ``i`` alone (a batch of one with its own batch and draws rows), per parameter of
    ``params`` in order; zeros where no gradient reaches a parameter."""
    one, one_d = slice_batch(batch, slice(i, i + 1)), slice_batch(draws, slice(i, i + 1))
    tensors = list(params.values())
    with AutogradHookGuard(_owner(model)):
        losses = loss_fn(model, one, one_d)
    gs = torch.autograd.grad(losses.sum(), tensors, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g.detach() for g, t in zip(gs, tensors)]


class GhostGradients:
    """Exact per-example clipped gradient sums by ghost norms (see the module docstring).

    Models that mix the examples of a batch are refused (statically, and by a once-per-model separability
    cross-check) and every call refuses forwards that change the model's parameters or buffers; see "Safety"
    in the module docstring.

    Parameters
    ----------
    physical_batch_size:
        Examples processed at once (memory bound); ``None`` processes the whole batch (the memory
        of a non-private step). It does not change the result beyond float summation order.
    reweight:
        How the clipped sum is formed once the clip factors are known: ``"matmul"``, one weighted matmul
        per layer from the recorded activations and output gradients, the same ones the norms came from
        (the only choice: ``"backward"``, a second backward pass of Σ_i c_i loss_i, was removed because
        nothing checked that pass, and it was slower).
    fallback_batch_size:
        Chunk size of the torch.func fallback (its memory grows with the fallback parameters).

    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    >>> loss = lambda m, batch, draws: m(batch["x"]).squeeze(1) ** 2
    >>> strategy = GhostGradients()
    >>> sums, norms = strategy.clipped_sum(model, loss, {"x": torch.randn(8, 3)}, {}, max_grad_norm=0.1)
    >>> sorted(sums), tuple(norms.shape), strategy.fallback_layers
    (['0.bias', '0.weight', '2.bias', '2.weight'], (8,), [])
    """

    name = "ghost"
    #: Run the separability cross-check (tests switch it off to show what it prevents; never do so otherwise).
    _check_separability: bool = True
    #: Run every call under :class:`ForwardStateGuard` (switched off only to measure its cost; never otherwise).
    _guard_forward: bool = True
    #: Share of the steps whose chunk check runs (tests set 0 to show what it catches; never lower it otherwise).
    _chunk_check_rate: float = _CHUNK_CHECK_RATE

    def __init__(
        self,
        physical_batch_size: int | None = None,
        *,
        reweight: Literal["matmul"] = "matmul",
        fallback_batch_size: int = 256,
    ) -> None:
        self.physical_batch_size = (
            None if physical_batch_size is None else check_int("physical_batch_size", physical_batch_size, minimum=1)
        )
        self.reweight = check_choice("reweight", reweight, ("matmul",))
        self.fallback_batch_size = check_int("fallback_batch_size", fallback_batch_size, minimum=1)
        self._plans: weakref.WeakKeyDictionary[nn.Module, GhostPlan] = weakref.WeakKeyDictionary()
        self.fallback_layers: list[str] = []
        # Which examples the separability check compares: OS entropy, never a user's or a published seed, so
        # that neither the model nor anyone who knows the run's seeds can predict which rows are looked at.
        self._secret = np.random.default_rng()

    def __repr__(self) -> str:
        return f"GhostGradients(physical_batch_size={self.physical_batch_size}, reweight={self.reweight!r})"

    # -- planning ------------------------------------------------------------------------------------------

    def plan(self, model: nn.Module) -> GhostPlan:
        """The (cached) plan for ``model``: which layers use ghost norms and which parameters fall back."""
        sig = _signature(model)
        cached = self._plans.get(model)
        if cached is not None and cached.signature == sig:
            self.fallback_layers = cached.fallback_layers
            return cached
        check_no_batch_mixing(model)
        trainable = trainable_parameters(model)
        canonical = {id(p): n for n, p in trainable.items()}
        owners: dict[int, set[int]] = {}
        for _, m in model.named_modules(remove_duplicate=False):
            for _, p in m.named_parameters(recurse=False, remove_duplicate=False):
                owners.setdefault(id(p), set()).add(id(m))
        # A parameter held by several layers (a tied embedding and output head) is ghost-clipped only if every
        # one of them has a rule: their contributions are then combined (rules.Mixed, with the cross terms).
        ruled = {id(m) for m in model.modules() if rule_for(m)[0] is not None}
        layers: list[_Layer] = []
        covered: set[str] = set()
        reasons: dict[str, str] = {}
        for mname, m in model.named_modules():
            direct = [(a, p) for a, p in m.named_parameters(recurse=False) if p.requires_grad]
            if not direct:
                continue
            label = f"{mname or '<root>'} ({type(m).__name__})"
            rule, why = rule_for(m)
            if rule is None:
                reasons[label] = why
                continue
            params = {}
            for attr, p in direct:
                if not owners[id(p)] <= ruled:
                    reasons[label] = f"parameter {attr!r} is shared with a layer without a ghost rule"
                else:
                    params[attr] = canonical[id(p)]
            if params:
                layers.append(_Layer(mname, m, rule, params))
                covered.update(params.values())
        fallback = [n for n in trainable if n not in covered]
        plan = GhostPlan(layers, fallback, [f"{k}: {v}" for k, v in reasons.items()], sig)
        self._plans[model] = plan
        self.fallback_layers = plan.fallback_layers
        if fallback:
            self._warn_fallback(plan)
        return plan

    @staticmethod
    def _warn_fallback(plan: GhostPlan) -> None:
        warnings.warn(
            "GhostGradients: these parameters use (slower) torch.func per-example gradients: "
            f"{', '.join(plan.fallback)} — layers: {'; '.join(plan.fallback_layers) or 'parameters outside layers'}",
            UserWarning,
            stacklevel=3,
        )

    def _demote(self, plan: GhostPlan, names: list[str], reason: str) -> None:
        for layer in plan.layers:
            for attr, pname in list(layer.params.items()):
                if pname in names:
                    del layer.params[attr]
                    if pname not in plan.fallback:  # a parameter of several layers falls back once
                        plan.fallback.append(pname)
                    plan.fallback_layers.append(f"{layer.name} ({type(layer.module).__name__}): {reason}")
        plan.layers = [layer for layer in plan.layers if layer.params]
        self.fallback_layers = plan.fallback_layers
        self._warn_fallback(plan)

    # -- the protocol ----------------------------------------------------------------------------------------

    def clipped_sum(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Σ_i clip_C(∇_θ loss_fn(model, batch_i, draws_i)) per trainable parameter, and the norms (B,).

        An example whose gradient is not finite contributes zero (its norm, returned as it is, says so)."""
        C = check_positive("max_grad_norm", max_grad_norm, allow_inf=True)
        n = batch_size_of(batch, draws)
        params = trainable_parameters(model)
        if n == 0:  # an empty Poisson batch: the sum is zero (the caller still adds noise)
            return empty_result(params, batch, draws)
        plan = self.plan(model)
        if plan.fallback and _has_randomness(model):
            raise ValueError(
                f"GhostGradients needs a deterministic model when some parameters fall back to torch.func "
                f"({', '.join(plan.fallback)}), but dropout is active in {_has_randomness(model)}; "
                "remove dropout or use supported layers only"
            )
        # The forward runs on the real model with private data: it must leave parameters and buffers alone.
        guard = ForwardStateGuard(model) if self._guard_forward else None
        with guard if guard is not None else contextlib.nullcontext():
            out = self._clipped_sum(plan, model, loss_fn, batch, draws, C, params, n)
        return out

    def _clipped_sum(
        self,
        plan: GhostPlan,
        model: nn.Module,
        loss_fn: LossFn,
        batch: Batch,
        draws: Batch,
        C: float,
        params: dict[str, torch.Tensor],
        n: int,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        chunk = self.physical_batch_size or n
        checked, inspect = self._separability_check(plan, model, loss_fn, batch, draws, params, n, chunk, C)
        if chunk >= n:
            return self._chunk(plan, model, loss_fn, batch, draws, C, params, inspect)
        sums = {k: torch.zeros_like(p, memory_format=torch.contiguous_format) for k, p in params.items()}
        norms = []
        for index, start in enumerate(range(0, n, chunk)):
            sl = slice(start, min(start + chunk, n))
            part_b, part_d = slice_batch(batch, sl), slice_batch(draws, sl)
            part_sums, part_norms = self._chunk(plan, model, loss_fn, part_b, part_d, C, params,
                                                inspect if index == checked else None)  # fmt: skip
            for k, v in part_sums.items():
                sums[k] += v
            norms.append(part_norms)
        return sums, torch.cat(norms)

    # -- separability cross-check ----------------------------------------------------------------------------

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
    ) -> tuple[int, Inspect | None]:
        """Arrange this step's check that ghost gradients are per-example: the physical chunk to check and the
        callback that checks it (``(-1, None)`` when nothing can mix or checking is off).

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
        sizes = [min(chunk, n - start) for start in range(0, n, chunk)]
        weights = np.array([size if size >= 2 else 0 for size in sizes], dtype=np.float64)
        if weights.sum() == 0:
            return -1, None
        index = int(self._secret.choice(len(sizes), p=weights / weights.sum()))
        start = index * chunk
        part_b = slice_batch(batch, slice(start, start + sizes[index]))
        part_d = slice_batch(draws, slice(start, start + sizes[index]))
        exact = loss_fn.loss_fn if isinstance(loss_fn, AutocastLoss) else loss_fn

        # Decided before the forward, from OS entropy: the model cannot tell which steps are checked.
        chunk_check = bool(self._secret.random() < self._chunk_check_rate)

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
        ``picked``) differ from theirs computed alone."""
        # Rows with a non-finite gradient contribute zero and would make every comparison false: choose among
        # the others (if none is left there is nothing this step could leak through mixing that is summed).
        if picked is None:
            picked = self._pick(norms)
        if picked is None:
            return
        k = len(picked)
        rows = torch.as_tensor(picked, dtype=torch.int64, device=norms.device)
        alone = self._alone(model, loss_fn, batch, draws, params, picked, twice=not plan.deterministic)
        plan.deterministic = True
        with torch.no_grad():
            # One comparison per example over all parameters at once: the sensitivity is about a whole example's
            # gradient, and one (k, P) difference keeps this every-step check to a few operations (per-parameter
            # differences are computed only to name the layers once a check has failed). The differences are in
            # the gradients' own dtype (float32 rounding is ~1e-7 of the terms, far inside the tolerances).
            diffs, refs, bounds = [], [], []
            for pname in params:
                ref = alone[pname].reshape(k, -1)
                refs.append(ref)
                if pname in combined:
                    diffs.append(combined[pname].examples(rows).reshape(k, -1).to(ref.dtype) - ref)
                    # Bound the terms over the separate calls (passes), whose sum is where cancellation happens.
                    bounds.append(add_up([c.term_bounds(rows) for c in parts.get(pname) or [combined[pname]]]))
                else:  # no gradient reached it through the ghost path
                    diffs.append(-ref)
            err = torch.linalg.vector_norm(torch.cat(diffs, dim=1), dim=1).to(torch.float64)
            ref_norms = torch.linalg.vector_norm(torch.cat(refs, dim=1), dim=1).to(torch.float64)
            bound = ref_norms if not bounds else torch.maximum(torch.stack(bounds).pow(2).sum(0).sqrt(), ref_norms)
            # The absolute floor follows the chunk's largest gradient, not only the two checked rows': a saturated
            # model has rows whose gradients are ~1e-21, where float32 Gram norms lose whole digits (their squares
            # are denormal) and a comparison relative to those rows alone would refuse an ordinary model.
            finite = norms[torch.isfinite(norms)]
            scale = torch.maximum(bound.max(), finite.max().to(torch.float64)) if finite.numel() else bound.max()
            tol = _SEPARABILITY_RTOL * ref_norms + _SEPARABILITY_TERM_TOL * bound + _SEPARABILITY_SCALE_TOL * scale
            if math.isfinite(C):
                # Differences below 1e-6·C move a clipped contribution by at most that: far inside the
                # sensitivity, and the level of float32 noise in a model whose whole batch is saturated (every
                # gradient ~1e-22, where Gram norms lose whole digits).
                tol = tol + _SEPARABILITY_CLIP_TOL * C
            norm_off = (norms[rows].to(torch.float64) - ref_norms).abs()

            def fails(limit: torch.Tensor) -> bool:
                # The gradients, and the norms that set the clip factors (float64 Gram forms, fallback included),
                # against the same computed alone; a NaN computed alone makes every comparison false: a failure.
                return bool(((err > limit) | (norm_off > limit) | ~torch.isfinite(ref_norms)).any())

            failed = fails(tol)
        if failed:
            # Before calling it mixing: an ill-conditioned forward (a diverged model's logits in the thousands)
            # moves an example's float32 gradient by ~0.1% between any two summation orders. Measure how far
            # rounding moves each checked example's own gradient (float32 alone against float64 alone, which no
            # other example enters) and allow a few times that; mixing moves gradients far more.
            noise = self._rounding_noise(model, loss_fn, batch, draws, params, picked, alone)
            if noise is not None:
                failed = fails(tol + _SEPARABILITY_NOISE_FACTOR * noise)
        if failed:
            bad = [pname for pname, d, r in zip(params, diffs, refs)
                   if bool((torch.linalg.vector_norm(d, dim=1) > _SEPARABILITY_RTOL * torch.linalg.vector_norm(r, dim=1)
                            + _SEPARABILITY_TERM_TOL * bound.to(d.dtype)).any())]  # fmt: skip
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
        """Raise BatchMixingError if ghost's clipped sum over a secret random chunk of rows differs from the same
        rows' clipped sum from torch.func per-example gradients (each example alone)."""
        finite = torch.isfinite(norms).nonzero().flatten().cpu().numpy()
        if len(finite) == 0:
            return
        picked = np.sort(self._secret.choice(finite, size=min(_CHUNK_CHECK_EXAMPLES, len(finite)), replace=False))
        rows = torch.as_tensor(picked, dtype=torch.int64, device=norms.device)
        sub_b = {k: v[rows.to(v.device)] for k, v in batch.items()}
        sub_d = {k: v[rows.to(v.device)] for k, v in draws.items()}
        names = list(params)
        try:
            ref = per_example_grads(model, loss_fn, sub_b, sub_d, names)
        except Exception:  # a model torch.func cannot vmap (dynamic shapes): one example at a time
            ref = self._alone(model, loss_fn, sub_b, sub_d, params, np.arange(len(picked)), twice=False)
        k = len(picked)
        with torch.no_grad():
            # The (k, P) gradients stay in their dtype (float32 norms of k rows: ~1e-6 relative, far inside the
            # tolerance); only the P-vectors' difference is taken in float64. Few passes: this runs on a share of
            # all steps.
            ref2d = {n: ref[n].reshape(k, -1) for n in names}
            ref_sq = add_up([torch.linalg.vector_norm(r, dim=1).to(torch.float64).square() for r in ref2d.values()])
            ref_factors = clip_factors(ref_sq.sqrt(), C)
            factors = clip_factors(norms[rows].to(torch.float64), C)
            diff_sq = torch.zeros((), dtype=torch.float64, device=norms.device)
            mine2d: dict[str, torch.Tensor] = {}
            for n in names:
                theirs = (ref_factors.to(ref2d[n].dtype) @ ref2d[n]).to(torch.float64)
                if n in combined:
                    mine2d[n] = combined[n].examples(rows).reshape(k, -1)
                    mine = (factors.to(mine2d[n].dtype) @ mine2d[n]).to(torch.float64)
                    diff_sq += (mine - theirs).square().sum()
                else:
                    diff_sq += theirs.square().sum()
            scale = float((ref_factors * ref_sq.sqrt()).nan_to_num(posinf=0.0).sum())
            tol = _CHUNK_RTOL * scale + _SEPARABILITY_CLIP_TOL * (C if math.isfinite(C) else scale) * k
            failed = not (float(diff_sq.sqrt()) <= tol)
        if failed:
            # Confirm on the rows that differ most, with the every-step comparison (its tolerances, its rounding
            # retry): it raises, naming the layers, unless float rounding explains the difference.
            with torch.no_grad():
                row_sq = add_up([torch.linalg.vector_norm((mine2d[n].to(r.dtype) - r) if n in mine2d else r, dim=1)
                                 .to(torch.float64).square() for n, r in ref2d.items()])  # fmt: skip
            worst = picked[np.sort(torch.argsort(row_sq, descending=True)[:_SEPARABILITY_EXAMPLES].cpu().numpy())]
            self._compare_with_alone(plan, model, loss_fn, batch, draws, params, combined, parts, norms, C, worst)

    @staticmethod
    def _rounding_noise(
        model: nn.Module,
        loss_fn: LossFn,
        batch: Batch,
        draws: Batch,
        params: dict[str, torch.Tensor],
        picked: np.ndarray,
        alone: dict[str, torch.Tensor],
    ) -> torch.Tensor | None:
        """Per checked example, ‖its float32 gradient alone − its float64 gradient alone‖ (float64, shape (k,)):
        how far float32 rounding alone moves it. None when the model or the loss cannot run in float64 (the
        comparison then stands as it is)."""
        names = list(params)
        try:
            wide = copy.deepcopy(model).double()
            wide_params = trainable_parameters(wide)
            if list(wide_params) != names:
                return None
            b64 = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
            d64 = {k: v.double() if v.is_floating_point() else v for k, v in draws.items()}
            out = []
            for j, i in enumerate(picked.tolist()):
                exact = _example_gradient(wide, loss_fn, b64, d64, wide_params, i)
                out.append(torch.cat([(alone[n][j].to(torch.float64) - g).flatten() for n, g in zip(names, exact)])
                           .norm())  # fmt: skip
            return torch.stack(out)
        except (RuntimeError, TypeError, ValueError):
            return None

    def _pick(self, norms: torch.Tensor) -> np.ndarray | None:
        """Up to ``_SEPARABILITY_EXAMPLES`` distinct rows with finite norms, uniformly at random (secret)."""
        n, k = len(norms), min(_SEPARABILITY_EXAMPLES, len(norms))
        for _ in range(8):  # the common case, every row finite: a few draws, no pass over the batch
            picked = np.unique(self._secret.integers(0, n, size=k))
            if len(picked) == k and bool(torch.isfinite(norms[torch.as_tensor(picked, device=norms.device)]).all()):
                return picked
        finite = torch.isfinite(norms).nonzero().flatten().cpu().numpy()
        if len(finite) == 0:
            return None
        return np.sort(self._secret.choice(finite, size=min(k, len(finite)), replace=False))

    @staticmethod
    def _alone(
        model: nn.Module,
        loss_fn: LossFn,
        batch: Batch,
        draws: Batch,
        params: dict[str, torch.Tensor],
        picked: np.ndarray,
        *,
        twice: bool,
    ) -> dict[str, torch.Tensor]:
        """Gradients of the examples ``picked``, each from a forward and backward of that example alone.

        A plain loop of batch-of-one autograd calls rather than torch.func: it works for every model ghost
        clipping accepts (ragged bags with boolean masks and other dynamic shapes cannot be vmapped), and k is
        small. With ``twice`` (a model's first check) each example is computed twice: a forward that draws
        random numbers outside nn.Dropout modules would make the comparison meaningless, and is refused with
        its own message (one that starts doing so later fails the comparison instead: refused all the same).
        """
        names = list(params)
        rows: dict[str, list[torch.Tensor]] = {n: [] for n in names}

        def grads(i: int) -> list[torch.Tensor]:
            return _example_gradient(model, loss_fn, batch, draws, params, i)

        for i in picked.tolist():
            for n, g in zip(names, grads(i)):
                rows[n].append(g)
        for j, i in enumerate(picked.tolist() if twice else []):
            for n, g in zip(names, grads(i)):
                first = rows[n][j]
                if g.numel() and float((g - first).abs().max()) > 1e-5 * float(first.abs().max()) + 1e-12:
                    raise ValueError(
                        "GhostGradients checks on every step that the model treats examples separately, by "
                        "recomputing a few examples' gradients on their own; that needs a forward that is "
                        "deterministic given (batch, draws) apart from nn.Dropout modules, but two identical calls "
                        "gave different "
                        f"gradients for {n!r}; take random numbers from the loss split's draws, or use "
                        "strategy='vmap'"
                    )
        return {n: torch.stack(r) for n, r in rows.items()}

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

    # -- one physical chunk ----------------------------------------------------------------------------------

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
        B = batch_size_of(batch, draws)
        for _ in range(2):  # re-run only if an output was modified in place (it is cloned the next time)
            if plan.whole_model_fallback:
                return self._fallback_only(model, loss_fn, batch, draws, C, list(params))
            calls, losses = self._forward(plan, model, loss_fn, batch, draws)
            if losses.shape != (B,):
                raise ValueError(f"loss_fn must return per-example losses of shape ({B},), got {tuple(losses.shape)}")
            if not self._versions_ok(plan, calls):
                continue
            try:
                return self._finish(plan, model, loss_fn, batch, draws, C, params, calls, losses, inspect)
            except NotPerExampleError as exc:
                plan.whole_model_fallback = True
                warnings.warn(
                    f"GhostGradients: {exc}; using torch.func per-example gradients for the whole model",
                    UserWarning,
                    stacklevel=4,
                )
        raise RuntimeError("GhostGradients: layer outputs keep being modified in place")

    def _forward(
        self, plan: GhostPlan, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch
    ) -> tuple[list[_Call], torch.Tensor]:
        calls: list[_Call] = []
        handles: list[torch.utils.hooks.RemovableHandle] = []

        def make_hooks(layer: _Layer) -> None:
            clone_out = id(layer.module) in plan.clone_outputs

            def post(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
                if not isinstance(output, torch.Tensor) or not output.requires_grad:
                    return None
                tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
                versions = [(t, t._version) for t in tensors]
                if not clone_out:
                    versions.append((output, output._version))
                calls.append(_Call(layer, args, kwargs, output, versions))
                # The caller gets a copy, so in-place ops downstream leave the recorded output intact.
                return output.clone() if clone_out else None

            handles.append(layer.module.register_forward_hook(post, with_kwargs=True))

        for layer in plan.layers:
            make_hooks(layer)
        try:
            # Every call, not only the first: a hook can be added on any step.
            with AutogradHookGuard(_owner(model)):
                losses = loss_fn(model, batch, draws)
        finally:
            for h in handles:
                h.remove()
        if not isinstance(losses, torch.Tensor):
            raise TypeError(f"loss_fn must return a Tensor, got {type(losses).__name__}")
        return calls, losses

    @staticmethod
    def _versions_ok(plan: GhostPlan, calls: list[_Call]) -> bool:
        """False (and the layer's output cloned from now on) if a recorded output was modified in place."""
        ok = True
        for call in calls:
            for t, v in call.versions:
                if t._version == v:
                    continue
                if t is call.output:
                    ok = False
                    plan.clone_outputs.add(id(call.layer.module))
                else:
                    # Ordinary autograd refuses this too (the layer saved its input for the weight gradient).
                    raise ValueError(
                        f"the input of layer {call.layer.name!r} was modified in place after the layer used it; "
                        "use an out-of-place operation"
                    )
        return ok

    def _finish(
        self,
        plan: GhostPlan,
        model: nn.Module,
        loss_fn: LossFn,
        batch: Batch,
        draws: Batch,
        C: float,
        params: dict[str, torch.Tensor],
        calls: list[_Call],
        losses: torch.Tensor,
        inspect: Inspect | None = None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        B = losses.shape[0]
        validate = not plan.validated
        keep_graph = validate
        if calls:
            out_grads = torch.autograd.grad(
                losses.sum(), [c.output for c in calls], allow_unused=True, retain_graph=keep_graph
            )
        else:
            out_grads = ()
        parts: dict[str, list[Contribution]] = {}
        with torch.no_grad():  # book-keeping only: nothing here may join the model's graph
            for call, g in zip(calls, out_grads):
                if g is None:  # this call's output did not reach the loss
                    continue
                # Under bfloat16 autocast the norms and the weighted sums are computed from float32 copies,
                # so the clip factors bound exactly the gradient that is summed (float32 rounding only).
                contrib = call.layer.rule(call.layer.module, full_precision(call.args), full_precision(call.kwargs),
                                          full_precision(g), B, call.layer.name)  # fmt: skip
                for attr, pname in call.layer.params.items():
                    if attr in contrib:
                        parts.setdefault(pname, []).append(contrib[attr])
            del calls
            combined = {pname: combine(ps) for pname, ps in parts.items()}

        if validate:
            bad = self._validate(plan, params, combined, parts, losses)
            plan.validated = True
            if bad:  # parameters used outside their layer's call: redo this chunk with them in the fallback
                self._demote(plan, bad, "parameter also used outside the layer's call (e.g. reused functionally)")
                return self._chunk(plan, model, loss_fn, batch, draws, C, params, inspect)

        for pname, dense in self._fallback_grads(model, loss_fn, batch, draws, plan.fallback).items():
            combined[pname] = Dense(dense)

        with torch.no_grad():
            sq = torch.zeros(B, dtype=torch.float64, device=losses.device)
            cache: NormCache = {}
            for c in combined.values():
                sq += c.squared_norms(cache)
            norms = sq.sqrt()
        if inspect is not None:
            inspect(combined, parts, norms)
        with torch.no_grad():
            # Factors in the parameters' dtype once (not per layer); min(1, C/‖g‖) ≤ 1 is safe to round.
            factors = clip_factors(norms, C).to(losses.dtype)
            # A non-finite gradient gets factor 0, and its rows are zeroed too (0 · NaN is NaN): it adds nothing.
            dropped = ~torch.isfinite(norms)
            any_dropped = bool(dropped.any())
            if any_dropped:
                combined = {pname: c.without(dropped) for pname, c in combined.items()}

        sums: dict[str, torch.Tensor] = {}
        # The sums are formed from the very activations and output gradients the norms (and the every-step
        # check) were computed from: no second pass whose result nothing compares.
        with torch.no_grad():
            for pname, c in combined.items():
                sums[pname] = c.weighted_sum(factors).to(params[pname].dtype)
        for pname, p in params.items():  # parameters that got no gradient in this chunk
            if pname not in sums:
                sums[pname] = torch.zeros_like(p)
        return sums, norms.to(next(iter(params.values())).dtype if params else torch.float32)

    @staticmethod
    def _validate(
        plan: GhostPlan,
        params: dict[str, torch.Tensor],
        combined: dict[str, Contribution],
        parts: dict[str, list[Contribution]],
        losses: torch.Tensor,
    ) -> list[str]:
        """Parameter names whose ghost sum of gradients differs from autograd's (checked once per model).

        A parameter of a supported layer that is also used outside the layer's call (a tied or functionally
        reused weight) would otherwise silently miss that part of its gradient.
        """
        names = list(dict.fromkeys(n for layer in plan.layers for n in layer.params.values()))  # tied: once
        if not names:
            return []
        truth = torch.autograd.grad(losses.sum(), [params[n] for n in names], allow_unused=True, retain_graph=True)
        ones = torch.ones(losses.shape[0], dtype=torch.float64, device=losses.device)
        bad = []
        with torch.no_grad():
            for n, t in zip(names, truth):
                t = torch.zeros_like(params[n]) if t is None else t
                if n not in combined:
                    if float(t.abs().max()) > 0:
                        bad.append(n)
                    continue
                mine = combined[n].weighted_sum(ones)
                # Rounding scales with the size of the terms, not of their (possibly cancelling) sum.
                scale = float(add_up([p.abs_sum() for p in parts[n]]).max()) + float(t.abs().max())
                if float((mine - t).abs().max()) > 1e-4 * scale:
                    bad.append(n)
        return bad

    # -- torch.func fallback ---------------------------------------------------------------------------------

    def _fallback_grads(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, names: list[str]
    ) -> dict[str, torch.Tensor]:
        """Per-example gradients of just ``names`` (B, *shape) with torch.func; other parameters are constants."""
        if not names:
            return {}
        B = batch_size_of(batch, draws)
        step = self.fallback_batch_size
        pieces = []
        for s in range(0, B, step):
            sl = slice(s, min(s + step, B))
            pieces.append(per_example_grads(model, loss_fn, slice_batch(batch, sl), slice_batch(draws, sl), names))
        return {k: torch.cat([p[k] for p in pieces]) for k in names}

    def _fallback_only(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, C: float, names: list[str]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        random_layers = _has_randomness(model)
        if random_layers:
            raise ValueError(f"torch.func per-example gradients need a model without active dropout: {random_layers}")
        B = batch_size_of(batch, draws)
        per = self._fallback_grads(model, loss_fn, batch, draws, names)
        # The gradients' device (the model's); without parameters, the batch's (B > 0: there is a tensor).
        device = next(iter((*per.values(), *batch.values(), *draws.values()))).device
        sq = torch.zeros(B, dtype=torch.float64, device=device)
        for g in per.values():
            sq += Dense(g).squared_norms()
        norms = sq.sqrt()
        factors = clip_factors(norms, C)
        dropped = ~torch.isfinite(norms)
        dtype = next(iter(per.values())).dtype if per else torch.float32
        return {k: Dense(g).without(dropped).weighted_sum(factors).to(g.dtype) for k, g in per.items()}, norms.to(dtype)
