"""Ghost (book-keeping) clipping: exact per-example clipped gradient sums without per-example gradients.

:class:`GhostGradients` implements the :class:`featuredp.privatize.GradientStrategy`
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
mode), LayerNorm, GroupNorm, RMSNorm. Parameters of any other layer, or used
outside their layer's call (tied weights), fall back to torch.func per-example
gradients for just those parameters; :attr:`GhostGradients.fallback_layers`
lists them and a warning says so. Norms of both paths add up.

Requirements: supported layers must see batch-first inputs (first dimension =
the examples of the batch). A layer called otherwise makes the whole step fall
back to torch.func (with a warning). With fallback parameters the model must be
deterministic given (batch, draws) (no dropout), because the fallback
re-evaluates the loss.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from featuredp._ghost_rules import (
    Dense,
    NotPerExampleError,
    Rule,
    abs_sum,
    combine,
    rule_for,
    squared_norms,
    weighted_sum,
)
from featuredp._validate import check_choice, check_int, check_positive
from featuredp.features import Batch
from featuredp.privatize import LossFn, _LossModule, check_no_batch_mixing, clip_factors, trainable_parameters

__all__ = ["GhostGradients", "GhostPlan"]


@dataclass
class _Layer:
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
    signature: tuple
    clone_outputs: set[int] = field(default_factory=set)  # id(module): outputs later modified in place
    validated: bool = False
    whole_model_fallback: bool = False


@dataclass
class _Call:
    layer: _Layer
    args: tuple
    kwargs: dict
    output: torch.Tensor
    versions: list[tuple[torch.Tensor, int]]  # tensors whose in-place modification would invalidate the call


def _signature(model: nn.Module) -> tuple:
    return tuple((n, id(p), p.requires_grad) for n, p in model.named_parameters(remove_duplicate=False))


def _batch_size(batch: Batch, draws: Batch) -> int:
    sizes = {int(v.shape[0]) for v in (*batch.values(), *draws.values())}
    if len(sizes) != 1:
        raise ValueError(f"batch and draws tensors must share the first (batch) dimension, got sizes {sorted(sizes)}")
    return sizes.pop()


def _has_randomness(model: nn.Module) -> list[str]:
    return [
        n or type(model).__name__
        for n, m in model.named_modules()
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0
    ]


class GhostGradients:
    """Exact per-example clipped gradient sums by ghost norms (see the module docstring).

    Parameters
    ----------
    physical_batch_size:
        Examples processed at once (memory bound); ``None`` processes the whole batch (the memory
        of a non-private step). It does not change the result beyond float summation order.
    reweight:
        How the clipped sum is formed once the clip factors are known: ``"matmul"`` (one weighted
        matmul per layer from the recorded activations; default, faster) or ``"backward"`` (a second
        backward pass of Σ_i c_i loss_i).
    fallback_batch_size:
        Chunk size of the torch.func fallback (its memory grows with the fallback parameters).
    """

    name = "ghost"

    def __init__(
        self,
        physical_batch_size: int | None = None,
        *,
        reweight: Literal["matmul", "backward"] = "matmul",
        fallback_batch_size: int = 256,
    ) -> None:
        self.physical_batch_size = (
            None if physical_batch_size is None else check_int("physical_batch_size", physical_batch_size, minimum=1)
        )
        self.reweight = check_choice("reweight", reweight, ("matmul", "backward"))
        self.fallback_batch_size = check_int("fallback_batch_size", fallback_batch_size, minimum=1)
        self._plans: weakref.WeakKeyDictionary[nn.Module, GhostPlan] = weakref.WeakKeyDictionary()
        self.fallback_layers: list[str] = []

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
                if len(owners[id(p)]) > 1:
                    reasons[label] = f"parameter {attr!r} is shared with another layer"
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
                    plan.fallback.append(pname)
                    plan.fallback_layers.append(f"{layer.name} ({type(layer.module).__name__}): {reason}")
        plan.layers = [layer for layer in plan.layers if layer.params]
        self.fallback_layers = plan.fallback_layers
        self._warn_fallback(plan)

    # -- the protocol ----------------------------------------------------------------------------------------

    def clipped_sum(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Σ_i clip_C(∇_θ loss_fn(model, batch_i, draws_i)) per trainable parameter, and the norms (B,)."""
        C = check_positive("max_grad_norm", max_grad_norm, allow_inf=True)
        n = _batch_size(batch, draws)
        params = trainable_parameters(model)
        if n == 0:  # an empty Poisson batch: the sum is zero (the caller still adds noise)
            return {k: torch.zeros_like(p, memory_format=torch.contiguous_format) for k, p in params.items()}, (
                torch.zeros(0)
            )
        plan = self.plan(model)
        if plan.fallback and _has_randomness(model):
            raise ValueError(
                f"GhostGradients needs a deterministic model when some parameters fall back to torch.func "
                f"({', '.join(plan.fallback)}), but dropout is active in {_has_randomness(model)}; "
                "remove dropout or use supported layers only"
            )
        chunk = self.physical_batch_size or n
        if chunk >= n:
            return self._chunk(plan, model, loss_fn, batch, draws, C, params)
        sums = {k: torch.zeros_like(p, memory_format=torch.contiguous_format) for k, p in params.items()}
        norms = []
        for start in range(0, n, chunk):
            sl = slice(start, min(start + chunk, n))
            part_b = {k: v[sl] for k, v in batch.items()}
            part_d = {k: v[sl] for k, v in draws.items()}
            part_sums, part_norms = self._chunk(plan, model, loss_fn, part_b, part_d, C, params)
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
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        B = _batch_size(batch, draws)
        for _ in range(2):  # re-run only if an output was modified in place (it is cloned the next time)
            if plan.whole_model_fallback:
                return self._fallback_only(model, loss_fn, batch, draws, C, list(params))
            calls, losses = self._forward(plan, model, loss_fn, batch, draws)
            if losses.shape != (B,):
                raise ValueError(f"loss_fn must return per-example losses of shape ({B},), got {tuple(losses.shape)}")
            if not self._versions_ok(plan, calls):
                continue
            try:
                return self._finish(plan, model, loss_fn, batch, draws, C, params, calls, losses)
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
        handles = []

        def make_hooks(layer: _Layer) -> None:
            clone_out = id(layer.module) in plan.clone_outputs

            def post(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
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
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        B = losses.shape[0]
        validate = not plan.validated
        keep_graph = validate or self.reweight == "backward"
        if calls:
            out_grads = torch.autograd.grad(
                losses.sum(), [c.output for c in calls], allow_unused=True, retain_graph=keep_graph
            )
        else:
            out_grads = ()
        parts: dict[str, list] = {}
        with torch.no_grad():  # book-keeping only: nothing here may join the model's graph
            for call, g in zip(calls, out_grads):
                if g is None:  # this call's output did not reach the loss
                    continue
                contrib = call.layer.rule(call.layer.module, call.args, call.kwargs, g, B, call.layer.name)
                for attr, pname in call.layer.params.items():
                    if attr in contrib:
                        parts.setdefault(pname, []).append(contrib[attr])
            del calls
            combined = {pname: combine(ps) for pname, ps in parts.items()}

        if validate:
            bad = self._validate(plan, params, combined, parts, losses)
            plan.validated = True
            if bad:  # parameters used outside their layer's call: redo this chunk with them in the fallback
                self._demote(plan, bad, "parameter also used outside the layer's call (e.g. tied weights)")
                return self._chunk(plan, model, loss_fn, batch, draws, C, params)

        for pname, dense in self._fallback_grads(model, loss_fn, batch, draws, plan.fallback).items():
            combined[pname] = Dense(dense)

        with torch.no_grad():
            sq = torch.zeros(B, dtype=torch.float64, device=losses.device)
            cache: dict = {}
            for c in combined.values():
                sq += squared_norms(c, cache)
            norms = sq.sqrt()
            # Factors in the parameters' dtype once (not per layer); min(1, C/‖g‖) ≤ 1 is safe to round.
            factors = clip_factors(norms, C).to(losses.dtype)

        sums: dict[str, torch.Tensor] = {}
        if self.reweight == "backward":
            ghost_names = [p for p in combined if p not in plan.fallback]
            if ghost_names:
                w = factors.to(losses.dtype)
                gs = torch.autograd.grad(losses, [params[p] for p in ghost_names], grad_outputs=w, allow_unused=True)
                for pname, g in zip(ghost_names, gs):
                    sums[pname] = g if g is not None else torch.zeros_like(params[pname])
        with torch.no_grad():
            for pname, c in combined.items():
                if pname not in sums:
                    sums[pname] = weighted_sum(c, factors).to(params[pname].dtype)
        for pname, p in params.items():  # parameters that got no gradient in this chunk
            if pname not in sums:
                sums[pname] = torch.zeros_like(p)
        return sums, norms.to(next(iter(params.values())).dtype if params else torch.float32)

    @staticmethod
    def _validate(
        plan: GhostPlan,
        params: dict[str, torch.Tensor],
        combined: dict[str, Any],
        parts: dict[str, list],
        losses: torch.Tensor,
    ) -> list[str]:
        """Parameter names whose ghost sum of gradients differs from autograd's (checked once per model).

        A parameter of a supported layer that is also used outside the layer's call (a tied or functionally
        reused weight) would otherwise silently miss that part of its gradient.
        """
        names = [n for layer in plan.layers for n in layer.params.values()]
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
                mine = weighted_sum(combined[n], ones)
                # Rounding scales with the size of the terms, not of their (possibly cancelling) sum.
                scale = float(sum(abs_sum(p) for p in parts[n]).max()) + float(t.abs().max())
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
        wrapper = _LossModule(model, loss_fn)
        wanted = set(names)
        diff = {f"model.{n}": p.detach() for n, p in model.named_parameters() if n in wanted}
        const = {f"model.{n}": p.detach() for n, p in model.named_parameters() if n not in wanted}
        buffers = {f"model.{n}": b for n, b in model.named_buffers()}

        def one(p: dict[str, torch.Tensor], example: Batch, draw: Batch) -> torch.Tensor:
            ex = {k: v.unsqueeze(0) for k, v in example.items()}
            dr = {k: v.unsqueeze(0) for k, v in draw.items()}
            return functional_call(wrapper, {**p, **const, **buffers}, (ex, dr)).sum()

        per_example = vmap(grad(one), in_dims=(None, 0, 0))
        B = _batch_size(batch, draws)
        step = self.fallback_batch_size
        pieces = []
        for s in range(0, B, step):
            sl = slice(s, min(s + step, B))
            pieces.append(per_example(diff, {k: v[sl] for k, v in batch.items()}, {k: v[sl] for k, v in draws.items()}))
        return {k[len("model.") :]: torch.cat([p[k] for p in pieces]) for k in diff}

    def _fallback_only(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, C: float, names: list[str]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        random_layers = _has_randomness(model)
        if random_layers:
            raise ValueError(f"torch.func per-example gradients need a model without active dropout: {random_layers}")
        B = _batch_size(batch, draws)
        per = self._fallback_grads(model, loss_fn, batch, draws, names)
        sq = torch.zeros(B, dtype=torch.float64)
        for g in per.values():
            sq += squared_norms(Dense(g))
        norms = sq.sqrt()
        factors = clip_factors(norms, C)
        dtype = next(iter(per.values())).dtype if per else torch.float32
        return {k: weighted_sum(Dense(g), factors).to(g.dtype) for k, g in per.items()}, norms.to(dtype)
