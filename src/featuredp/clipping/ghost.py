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
*separability cross-check* and the chunk check (:mod:`featuredp.clipping.ghost_checks`):
on every call the gradients of a few secretly chosen examples are recomputed on their
own (a forward and backward of each example alone) and compared with the ghost ones; a mismatch
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
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from featuredp._validate import check_choice, check_int, check_positive
from featuredp.clipping.base import (
    LossFn,
    batch_size_of,
    clip_factors,
    empty_result,
    full_precision,
    per_example_grads,
    slice_batch,
    trainable_parameters,
)
from featuredp.clipping.contributions import Contribution, Dense, NormCache
from featuredp.clipping.fsdp import Lockstep, forward_parameters, is_sharded, sharded_sums
from featuredp.clipping.ghost_checks import _CHUNK_CHECK_RATE, GhostChecks, Inspect, _has_randomness, _owner
from featuredp.clipping.ghost_plan import GhostPlan, _Layer, validate_rules
from featuredp.clipping.mixed import combine
from featuredp.clipping.rules import NotPerExampleError, rule_for
from featuredp.clipping.safety import AutogradHookGuard, ForwardStateGuard, check_no_batch_mixing
from featuredp.features.base import Batch

__all__ = ["Captured", "GhostGradients", "GhostPlan"]


@dataclass
class _Call:
    """One call of a supported layer during the forward: what its rule needs, and how to see it was modified."""

    layer: _Layer
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: torch.Tensor
    versions: list[tuple[torch.Tensor, int]]  # tensors whose in-place modification would invalidate the call


@dataclass
class Captured:
    """A forward of a whole batch already run under ghost's hooks: the user's own forward in the own loop
    (:meth:`GhostGradients.capture`), whose output the user saw without a graph. :meth:`GhostGradients.clipped_sum`
    with ``captured=`` computes the losses from this output instead of calling the model again: one forward a step.
    Used once, and only while nothing it depends on changed (:meth:`usable`)."""

    model: nn.Module
    calls: list[_Call]
    output: Any
    #: the model's parameters and the call's input tensors at the forward: a write to one makes the capture stale
    versions: list[tuple[torch.Tensor, int]]
    signature: tuple[tuple[str, int, bool], ...]
    used: bool = False

    def usable(self, model: nn.Module) -> bool:
        """Whether the capture is still this model's forward on unchanged inputs and parameters (and unused)."""
        return (not self.used and model is self.model and _signature(model) == self.signature
                and all(t._version == v for t, v in self.versions))  # fmt: skip

    def replay(self, *args: Any, **kwargs: Any) -> Any:
        """The captured output, in place of the model's call in the loss (which then runs on it once)."""
        return self.output


def _signature(model: nn.Module) -> tuple[tuple[str, int, bool], ...]:
    return tuple((n, id(p), p.requires_grad) for n, p in model.named_parameters(remove_duplicate=False))


class GhostGradients(GhostChecks):
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
    #: During a call on a sharded model: each trainable parameter's DTensor (the sums are returned as these).
    _shards: dict[str, torch.Tensor] | None = None

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

    def capture(self, model: nn.Module, call: Callable[[], Any], inputs: list[torch.Tensor]) -> tuple[Any, Captured]:
        """Run ``call()`` (the model's forward on a whole batch) under the hooks a :meth:`clipped_sum` forward
        would run it under, with a graph; returns its output and the :class:`Captured` forward to pass to
        :meth:`clipped_sum`. The caller guards the forward (:class:`~featuredp.clipping.ForwardStateGuard`)."""
        plan = self.plan(model)
        calls, output = self._hooked(plan, model, call)
        versions = [(p, p._version) for p in trainable_parameters(model).values()]
        versions += [(t, t._version) for t in inputs]
        return output, Captured(model, calls, output, versions, _signature(model))

    def clipped_sum(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float,
        captured: Captured | None = None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Σ_i clip_C(∇_θ loss_fn(model, batch_i, draws_i)) per trainable parameter, and the norms (B,).

        An example whose gradient is not finite contributes zero (its norm, returned as it is, says so).
        ``captured``: the batch's forward already run (:meth:`capture`); ``loss_fn`` then computes the losses from
        its output, where it is still usable and the batch is one physical chunk (otherwise the model runs
        again, as without it)."""
        C = check_positive("max_grad_norm", max_grad_norm, allow_inf=True)
        n = batch_size_of(batch, draws)
        params = trainable_parameters(model)
        lock, shards = None, None
        if is_sharded(model):  # the full-shape tensors the forward differentiates, not the DTensor shards
            shards, params = params, forward_parameters(model, params)
            lock = Lockstep()
        elif n == 0:  # an empty Poisson batch: the sum is zero (the caller still adds noise)
            return empty_result(params, batch, draws)
        plan = self.plan(model)
        if lock is not None and plan.fallback:
            raise ValueError(
                f"GhostGradients on a sharded (FSDP) model needs a ghost rule for every trainable parameter; these "
                f"have none: {', '.join(plan.fallback)} ({'; '.join(plan.fallback_layers)})"
            )
        if plan.fallback and _has_randomness(model):
            raise ValueError(
                f"GhostGradients needs a deterministic model when some parameters fall back to torch.func "
                f"({', '.join(plan.fallback)}), but dropout is active in {_has_randomness(model)}; "
                "remove dropout or use supported layers only"
            )
        # The forward runs on the real model with private data: it must leave parameters and buffers alone.
        if captured is not None and not (captured.usable(model) and (self.physical_batch_size or n) >= n):
            captured = None
        if lock is not None and lock.any(captured is None):  # the forward runs again on every rank, or on none
            captured = None
        # Guarded even with a capture (whose forward the caller guarded): the checks below run the model again.
        guard = ForwardStateGuard(model) if self._guard_forward else None
        self._lock, self._shards = lock, shards
        try:
            with guard if guard is not None else contextlib.nullcontext():
                out = self._clipped_sum(plan, model, loss_fn, batch, draws, C, params, n, captured)
        finally:
            self._lock = self._shards = None
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
        captured: Captured | None = None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        chunk = self.physical_batch_size or max(n, 1)
        # A sharded model: as many chunks as the rank with the most (each forward is a collective).
        count = max(1, -(-n // chunk))
        if self._lock is not None:
            count = self._lock.max(count)
        checked, inspect = self._separability_check(plan, model, loss_fn, batch, draws, params, n, chunk, C, count)
        if count <= 1:
            return self._chunk(plan, model, loss_fn, batch, draws, C, params, inspect, captured)
        if self._shards is not None:
            sums = {k: torch.zeros_like(p) for k, p in self._shards.items()}
        else:
            sums = {k: torch.zeros_like(p, memory_format=torch.contiguous_format) for k, p in params.items()}
        norms = []
        for index, start in enumerate(range(0, count * chunk, chunk)):
            sl = slice(min(start, n), min(start + chunk, n))
            part_b, part_d = slice_batch(batch, sl), slice_batch(draws, sl)
            part_sums, part_norms = self._chunk(plan, model, loss_fn, part_b, part_d, C, params,
                                                inspect if index == checked else None)  # fmt: skip
            for k, v in part_sums.items():
                sums[k] += v
            norms.append(part_norms)
        return sums, torch.cat(norms)

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
        captured: Captured | None = None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        B = batch_size_of(batch, draws)
        for _ in range(2):  # re-run only if an output was modified in place (it is cloned the next time)
            if plan.whole_model_fallback:
                return self._fallback_only(model, loss_fn, batch, draws, C, list(params))
            if captured is not None:  # the forward already run: the loss on its output, the model not called again
                captured.used = True
                with AutogradHookGuard(_owner(model)):  # the loss's part of the forward, guarded as a whole one is
                    losses = loss_fn(captured.replay, batch, draws)
                calls, captured = captured.calls, None
                if not isinstance(losses, torch.Tensor):
                    raise TypeError(f"loss_fn must return a Tensor, got {type(losses).__name__}")
            else:
                calls, losses = self._forward(plan, model, loss_fn, batch, draws)
            if losses.shape != (B,):
                raise ValueError(f"loss_fn must return per-example losses of shape ({B},), got {tuple(losses.shape)}")
            ok = self._versions_ok(plan, calls)
            if not (ok if self._lock is None else not self._lock.any(not ok)):
                continue
            try:
                return self._finish(plan, model, loss_fn, batch, draws, C, params, calls, losses, inspect)
            except NotPerExampleError as exc:
                if self._lock is not None:  # no torch.func fallback through FSDP's hooks
                    raise ValueError(f"GhostGradients on a sharded (FSDP) model: {exc}") from exc
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
        calls, losses = self._hooked(plan, model, lambda: loss_fn(model, batch, draws))
        if not isinstance(losses, torch.Tensor):
            raise TypeError(f"loss_fn must return a Tensor, got {type(losses).__name__}")
        return calls, losses

    def _hooked(self, plan: GhostPlan, model: nn.Module, run: Callable[[], Any]) -> tuple[list[_Call], Any]:
        """``run()`` with every ruled layer's calls recorded, under the autograd-hook guard."""
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
                result = run()
        finally:
            for h in handles:
                h.remove()
        return calls, result

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
        combined, parts = self._contributions(calls, losses, keep_graph=validate)
        del calls

        if validate:
            bad = self._validate_here(plan, params, combined, parts, losses)
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

        # The sums are formed from the very activations and output gradients the norms (and the every-step
        # check) were computed from: no second pass whose result nothing compares.
        return self._sums(params, combined, factors), norms.to(
            next(iter(params.values())).dtype if params else torch.float32)

    @torch.no_grad()
    def _sums(
        self, params: dict[str, torch.Tensor], combined: dict[str, Contribution], factors: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Σ_i factors_i·g_i per parameter (zeros for one no gradient reached in this chunk)."""
        if self._shards is not None:
            return sharded_sums(params, combined, factors, self._shards)
        sums = {pname: c.weighted_sum(factors).to(params[pname].dtype) for pname, c in combined.items()}
        for pname, p in params.items():
            if pname not in sums:
                sums[pname] = torch.zeros_like(p)
        return sums

    def _contributions(self, calls: list[_Call], losses: torch.Tensor, *, keep_graph: bool = False
                       ) -> tuple[dict[str, Contribution], dict[str, list[Contribution]]]:  # fmt: skip
        """Each ruled parameter's per-example contribution (combined over its calls) and its per-call parts, from
        one backward of ``losses.sum()`` to the recorded layers' outputs."""
        B = losses.shape[0]
        if calls:
            out_grads = torch.autograd.grad(
                losses.sum(), [c.output for c in calls], allow_unused=True, retain_graph=keep_graph
            )
        else:
            out_grads = ()
        parts: dict[str, list[Contribution]] = {}
        with torch.no_grad():  # book-keeping only: nothing here may join the model's graph
            for call, g in zip(calls, out_grads):
                if g is None or B == 0:  # this call's output did not reach the loss; a chunk of no rows (sharded)
                    continue
                # Under bfloat16 autocast the norms and the weighted sums are computed from float32 copies,
                # so the clip factors bound exactly the gradient that is summed (float32 rounding only).
                contrib = call.layer.rule(call.layer.module, full_precision(call.args), full_precision(call.kwargs),
                                          full_precision(g), B, call.layer.name)  # fmt: skip
                for attr, pname in call.layer.params.items():
                    if attr in contrib:
                        parts.setdefault(pname, []).append(contrib[attr])
            combined = {pname: combine(ps) for pname, ps in parts.items()}
        return combined, parts

    def _alone_contributions(self, plan: GhostPlan, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch,
                             slices: list[slice]) -> list[dict[str, Contribution]]:  # fmt: skip
        """Each of ``slices`` (one row, or none) run alone through the hooked forward: its contributions, the factors
        ghost forms the gradient from (no parameter's gradient is formed here: a sharded model's checks)."""
        out = []
        for sl in slices:
            part_b, part_d = slice_batch(batch, sl), slice_batch(draws, sl)
            calls, losses = self._forward(plan, model, loss_fn, part_b, part_d)
            out.append(self._contributions(calls, losses)[0])
        return out

    def _validate_here(
        self,
        plan: GhostPlan,
        params: dict[str, torch.Tensor],
        combined: dict[str, Contribution],
        parts: dict[str, list[Contribution]],
        losses: torch.Tensor,
    ) -> list[str]:
        """:func:`~featuredp.clipping.ghost_plan.validate_rules`, once per model; on a sharded model a failure on any
        rank is refused on every rank."""
        bad = validate_rules(plan, params, combined, parts, losses, piecewise=self._lock is not None)
        plan.validated = True
        if self._lock is not None and self._lock.any(bool(bad)):
            raise ValueError(
                "GhostGradients on a sharded (FSDP) model: a parameter is also used outside its layer's call "
                f"({', '.join(bad) or 'on another rank'}), and there is no torch.func fallback under FSDP"
            )
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
