"""The private aggregate: per-example gradients, clipping, noise.

A :class:`GradientStrategy` returns Σ_i clip_C(∇_θ loss_i) and the per-example
norms before clipping. Clipping is applied to the gradient of the loss it is
given *as a whole* — for FDP that is ℓ_priv = ℓ − ℓ_pub, never ℓ and ℓ_pub
separately (ARCHITECTURE rule 3). :class:`VmapGradients` computes exact
per-example gradients with ``torch.func`` (functional_call + vmap + grad), in
physical chunks so that a large logical batch fits in memory; the chunking
does not change the result (sums are added up). The faster ghost-norm strategy
lives in ``featuredp.privatize_ghost`` and implements the same protocol.

Noise (:func:`add_noise`) is added to the *sum*, with std σ·C; the engine
divides by the expected batch size afterwards.

Two model properties make per-example clipping meaningless, and both are refused:
layers that mix the examples of a batch (:func:`check_no_batch_mixing`, static) and
forwards that write into the model's parameters or buffers while they see private
data (:class:`ForwardStateGuard`, around every private clipped sum). Either would let
one record move the released model by more than C, so the reported ε would be false.
"""

from __future__ import annotations

import importlib
import math
import weakref
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.parameter import is_lazy

from featuredp._validate import check_int, check_nonnegative, check_positive
from featuredp.errors import BatchMixingError, ForwardSideEffectError
from featuredp.features import Batch

__all__ = [
    "BatchMixingError",
    "ForwardSideEffectError",
    "ForwardStateGuard",
    "GradientStrategy",
    "LossFn",
    "VmapGradients",
    "add_noise",
    "check_no_batch_mixing",
    "clip_factors",
    "get_strategy",
    "trainable_parameters",
]

LossFn = Any  # Callable[[nn.Module, Batch, Batch], Tensor] returning per-example losses (B,)


@runtime_checkable
class GradientStrategy(Protocol):
    """Per-example clipped gradient sums (see DEVELOPING.md)."""

    name: str

    def clipped_sum(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Σ_i clip_C(∇_θ loss_fn(model, batch_i, draws_i)) per named trainable parameter, and the
        per-example norms before clipping, shape (B,). ``max_grad_norm`` may be inf (no clipping)."""
        ...


def trainable_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Named parameters with ``requires_grad`` (the ones that are trained, clipped and noised)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def clip_factors(norms: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
    """Per-example scale min(1, C / ‖g_i‖); the clipped norm is ≤ C (strictly, with the 1e-6 guard)."""
    if math.isinf(max_grad_norm):
        return torch.ones_like(norms)
    return (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)


def _batch_size(batch: Batch) -> int:
    sizes = {int(v.shape[0]) for v in batch.values()}
    if len(sizes) != 1:
        raise ValueError(f"batch tensors must share the first (batch) dimension, got sizes {sorted(sizes)}")
    return sizes.pop()


class _LossModule(nn.Module):
    """Wraps (model, loss_fn) so that ``functional_call`` swaps the model's parameters for every
    use inside the loss — ℓ_priv calls the model twice (ℓ and ℓ_pub), both must see the same θ."""

    def __init__(self, model: nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn

    def forward(self, batch: Batch, draws: Batch) -> torch.Tensor:
        return self._loss_fn(self.model, batch, draws)


class VmapGradients:
    """Exact per-example gradients with ``torch.func`` (vmap of grad of a batch-of-one loss).

    ``physical_batch_size`` bounds how many examples are differentiated at once
    (memory); it does not change the result beyond float summation order.
    """

    name = "vmap"

    def __init__(self, physical_batch_size: int | None = 256) -> None:
        self.physical_batch_size = None if physical_batch_size is None else check_int(
            "physical_batch_size", physical_batch_size, minimum=1
        )
        self._guarded: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # models whose first call was checked

    def per_example_grads(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch
    ) -> dict[str, torch.Tensor]:
        """∇_θ loss_fn for every example: name → tensor of shape (B, *param.shape) (one chunk, no clipping)."""
        wrapper = _LossModule(model, loss_fn)
        params = {f"model.{n}": p.detach() for n, p in trainable_parameters(model).items()}
        frozen = {f"model.{n}": p.detach() for n, p in model.named_parameters() if not p.requires_grad}
        buffers = {f"model.{n}": b.detach() for n, b in model.named_buffers()}

        def one(p: dict[str, torch.Tensor], example: Batch, draw: Batch) -> torch.Tensor:
            # Give the example a batch dimension of 1: models and losses are written for batches.
            ex = {k: v.unsqueeze(0) for k, v in example.items()}
            dr = {k: v.unsqueeze(0) for k, v in draw.items()}
            out = functional_call(wrapper, {**p, **frozen, **buffers}, (ex, dr))
            return out.sum()

        grads = vmap(grad(one), in_dims=(None, 0, 0))(params, batch, draws)
        return {k[len("model.") :]: v for k, v in grads.items()}

    def clipped_sum(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        check_positive("max_grad_norm", max_grad_norm, allow_inf=True)
        n = _batch_size(batch)
        names = trainable_parameters(model)
        sums = {k: torch.zeros_like(p, memory_format=torch.contiguous_format) for k, p in names.items()}
        if n == 0:  # an empty Poisson batch: the sum is zero (noise is still added by the caller)
            return sums, torch.zeros(0)
        chunk = self.physical_batch_size or n
        all_norms = []
        was_training = model.training
        # torch.func already refuses in-place writes to captured parameters and buffers and undoes rebinding,
        # but a tensor registered during the forward escapes vmap and stays in the model: guard this path too.
        with ForwardStateGuard(model, first_call=model not in self._guarded):
            for start in range(0, n, chunk):
                sl = slice(start, min(start + chunk, n))
                g = self.per_example_grads(
                    model, loss_fn, {k: v[sl] for k, v in batch.items()}, {k: v[sl] for k, v in draws.items()}
                )
                sq = sum(t.reshape(t.shape[0], -1).pow(2).sum(1) for t in g.values())
                norms = torch.sqrt(sq)
                factors = clip_factors(norms, float(max_grad_norm))
                for k, t in g.items():
                    sums[k] += torch.einsum("b,b...->...", factors.to(t.dtype), t)
                all_norms.append(norms.detach())
            model.train(was_training)
        self._guarded.add(model)
        return sums, torch.cat(all_norms)


def add_noise(grads: dict[str, torch.Tensor], std: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``grads`` + N(0, std²) per coordinate, drawn from ``generator``, as new tensors (std = σ·C)."""
    std = check_nonnegative("std", std)
    if std == 0:
        return {k: v.clone() for k, v in grads.items()}
    # Draw, scale and add in place: one temporary per tensor instead of three (same values as v + std·z).
    return {
        k: torch.randn(v.shape, generator=generator, dtype=v.dtype, device=v.device).mul_(std).add_(v)
        for k, v in grads.items()
    }


_MIXING_FIX = "use GroupNorm or LayerNorm (per-example normalisation) instead"

_TRANSFORMERS = (
    nn.Transformer,
    nn.TransformerEncoder,
    nn.TransformerDecoder,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
)


def _label(model: nn.Module, name: str, module: nn.Module) -> str:
    return f"{name or type(model).__name__!r} ({type(module).__name__}"


def check_no_batch_mixing(model: nn.Module) -> None:
    """Refuse layers that mix the examples of a batch or write private data into the model during forward.

    Refused (each with a :class:`BatchMixingError` or :class:`ForwardSideEffectError`, both ``ValueError``,
    naming the layer and the fix):

    * BatchNorm (any variant) and InstanceNorm with ``track_running_stats=True``: batch statistics make one
      example's output depend on the others, so per-example clipping no longer bounds one record's influence.
    * ``nn.MultiheadAttention`` and ``nn.Transformer*`` with ``batch_first=False``: featuredp's batches are
      batch-first, which such a layer reads as (sequence, batch, ...), so it attends *across examples*.
    * ``nn.Embedding`` / ``nn.EmbeddingBag`` with ``max_norm``: the forward renormalises the looked-up rows of
      the weight in place, which records which (private) codes were in the batch in the released model.

    Mixing done by parameter-free code (e.g. ``x - x.mean(0)``) cannot be seen statically; ghost clipping
    checks it numerically on its first batch (:class:`featuredp.privatize_ghost.GhostGradients`) and every
    private clipped sum runs under :class:`ForwardStateGuard`.
    """
    for name, module in model.named_modules():
        label = _label(model, name, module)
        if isinstance(module, nn.modules.batchnorm._BatchNorm):  # includes SyncBatchNorm and lazy variants
            raise BatchMixingError(
                f"layer {label}) mixes examples across the batch, which breaks "
                f"per-example clipping in private training; {_MIXING_FIX}"
            )
        if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
            raise BatchMixingError(
                f"layer {label}, track_running_stats=True) carries batch statistics "
                f"across examples; set track_running_stats=False or {_MIXING_FIX}"
            )
        # Parents come before children in named_modules, so a Transformer is named before its attention layers.
        if isinstance(module, (*_TRANSFORMERS, nn.MultiheadAttention)):
            seq_first = [
                n for n, m in module.named_modules() if isinstance(m, nn.MultiheadAttention) and not m.batch_first
            ]
            if seq_first:
                inner = "" if seq_first == [""] else f", attention {', '.join(repr(n) for n in seq_first)}"
                raise BatchMixingError(
                    f"layer {label}, batch_first=False{inner}) reads batch-first private batches as "
                    "(sequence, batch, ...) and attends across examples, which breaks per-example clipping; "
                    "construct it with batch_first=True"
                )
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.max_norm is not None:
            raise ForwardSideEffectError(
                f"layer {label}, max_norm={module.max_norm}) renormalises the looked-up rows of its weight in "
                "place during the forward, which writes which private codes were in the batch into the released "
                "model; use max_norm=None and project/renormalise the weights outside the private forward "
                "(e.g. after each optimizer step)"
            )


# Buffers up to this many elements in total are copied before every private forward, so that a forward that
# writes into them can be undone exactly (models usually hold a few small ones); larger buffers are copied on a
# model's first private call only and are then checked by version and identity alone.
_BUFFER_COPY_LIMIT = 1 << 22


_MISSING = object()


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr() if t.layout == torch.strided else 0


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version  # inference tensors have no version counter (nor autograd use)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
    return torch.equal(a, b)


class ForwardStateGuard:
    """Refuses, and undoes, changes that a private forward makes to a model's parameters and buffers.

    ``with ForwardStateGuard(model, first_call=...):`` around everything that runs ``model`` on private data.
    On entry it records, for every module, which tensors its ``_parameters``, ``_buffers`` and ``_modules``
    hold, and each tensor's ``_version`` and data pointer (identity and version checks: microseconds). It
    also copies the buffers (when they total at most 4M elements, or on the first call) and, on the first
    call only, the parameters. On exit — normal or by an exception — anything rebound, added, removed, modified
    in place (a version bump or a changed data pointer) or, where a copy exists, changed in value (a write
    through ``.data``) is put back from the records and copies, and :class:`ForwardSideEffectError` is raised
    naming the tensor and its module: such state (a running statistic, a renormalised embedding row) would
    carry private-batch information into the released model outside the accounted mechanism.

    Limits: after the first call, a parameter written through ``.data`` (which bumps no version) is not seen,
    and a parameter modified in place cannot be restored (there is no copy; the error says to discard the
    model). Plain tensor attributes that are neither parameters nor buffers are not tracked.
    """

    def __init__(self, model: nn.Module, *, first_call: bool = True) -> None:
        self.model = model
        self.first_call = first_call

    def __enter__(self) -> ForwardStateGuard:
        self._modules = [(m, dict(m._parameters), dict(m._buffers), dict(m._modules)) for m in self.model.modules()]
        tensors: dict[int, tuple[torch.Tensor, bool]] = {}
        # Uninitialised lazy tensors have no data yet (their materialisation depends on shapes, not values).
        for _, params, buffers, _ in self._modules:
            for t in params.values():
                if t is not None and not is_lazy(t):
                    tensors[id(t)] = (t, True)
            for t in buffers.values():
                if t is not None and not is_lazy(t):
                    tensors.setdefault(id(t), (t, False))
        self._state = [(t, _version(t), _ptr(t)) for t, _ in tensors.values()]
        buffer_size = sum(t.numel() for t, is_param in tensors.values() if not is_param)
        copy_buffers = self.first_call or buffer_size <= _BUFFER_COPY_LIMIT
        with torch.no_grad():
            self._copies = {
                id(t): t.detach().clone()
                for t, is_param in tensors.values()
                if (copy_buffers and not is_param) or (self.first_call and is_param)
            }
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        changes = self._changes()
        if not changes:
            return
        unrestored = self._restore()
        what = "; ".join(changes[:5]) + (f"; and {len(changes) - 5} more" if len(changes) > 5 else "")
        if unrestored:
            after = (
                f"The model could NOT be fully restored ({', '.join(unrestored)}: no copy was kept): discard it "
                "and its state_dict, they may hold private data"
            )
        else:
            after = "The model was restored to its state before the call"
        raise ForwardSideEffectError(
            f"the model's forward changed its state during a private step ({what}); that state would carry "
            f"private-batch information into the released model, outside the privacy accounting. {after}. "
            "Keep the forward free of side effects: compute statistics and renormalise weights outside the "
            "private forward (or on public data)"
        ) from exc

    def _names(self) -> dict[int, str]:
        return {id(m): n for n, m in self.model.named_modules(remove_duplicate=False)}

    def _changes(self) -> list[str]:
        names: dict[int, str] | None = None
        out: list[str] = []

        def where(m: nn.Module, attr: str, kind: str) -> str:
            nonlocal names
            if names is None:  # only on a violation: the steady-state path builds no names
                names = self._names()
            mname = names.get(id(m), "?")
            qual = f"{mname}.{attr}" if mname else attr
            return f"{kind} {qual!r} of module {mname or '<root>'!r} ({type(m).__name__})"

        for m, params, buffers, mods in self._modules:
            for kind, now, before in (
                ("parameter", m._parameters, params),
                ("buffer", m._buffers, buffers),
                ("submodule", m._modules, mods),
            ):
                if len(now) == len(before) and all(now.get(k, _MISSING) is v for k, v in before.items()):
                    continue
                for k, v in before.items():
                    if k not in now:
                        out.append(f"{where(m, k, kind)} was removed")
                    elif now[k] is not v:
                        out.append(f"{where(m, k, kind)} was reassigned")
                out.extend(f"{where(m, k, kind)} was added" for k in now if k not in before)
        changed = {id(t) for t, version, ptr in self._state if _version(t) != version or _ptr(t) != ptr}
        for t, _, _ in self._state:
            copy = self._copies.get(id(t))
            if id(t) not in changed and copy is not None and not _same_values(t, copy):
                changed.add(id(t))  # a write that bumps no version (through .data)
        self._changed = changed
        if changed:
            for m, params, buffers, _ in self._modules:
                for kind, d in (("parameter", params), ("buffer", buffers)):
                    out.extend(
                        f"{where(m, k, kind)} was modified in place"
                        for k, t in d.items()
                        if t is not None and id(t) in changed
                    )
        return out

    def _restore(self) -> list[str]:
        """Put every dict entry and every changed tensor back; the tensors that could not be restored."""
        for m, params, buffers, mods in self._modules:
            for now, before in ((m._parameters, params), (m._buffers, buffers), (m._modules, mods)):
                if len(now) != len(before) or any(now.get(k, _MISSING) is not v for k, v in before.items()):
                    now.clear()
                    now.update(before)
        unrestored = []
        names = None
        with torch.no_grad():
            for t, _, ptr in self._state:
                if id(t) not in self._changed:
                    continue
                copy = self._copies.get(id(t))
                if copy is None:
                    if names is None:
                        names = {id(v): n for n, v in self.model.named_parameters(remove_duplicate=False)}
                        names.update({id(v): n for n, v in self.model.named_buffers(remove_duplicate=False)})
                    unrestored.append(repr(names.get(id(t), "?")))
                elif _ptr(t) == ptr and t.shape == copy.shape and t.dtype == copy.dtype:
                    t.copy_(copy)
                else:
                    t.data = copy
        return unrestored


def get_strategy(
    strategy: str | GradientStrategy, *, physical_batch_size: int | str | None = "auto"
) -> GradientStrategy:
    """A strategy object from a name (``"vmap"``, ``"ghost"``) or the object itself.

    ``physical_batch_size="auto"`` chunks vmap at 256 examples (per-example gradients are
    materialised, so memory grows with the chunk) and runs ghost clipping unchunked
    (it never materialises them; chunking only costs time, about 23% at batch 1024).
    """
    if physical_batch_size == "auto":
        physical_batch_size = None if strategy == "ghost" else 256
    if not isinstance(strategy, str):
        if not callable(getattr(strategy, "clipped_sum", None)):
            raise TypeError(f"strategy must be a name or have a clipped_sum method, got {type(strategy).__name__}")
        return strategy
    if strategy == "vmap":
        return VmapGradients(physical_batch_size)
    if strategy == "ghost":
        module = importlib.import_module("featuredp.privatize_ghost")
        for attr in ("GhostGradients", "GhostNormGradients", "GhostClipping"):
            cls = getattr(module, attr, None)
            if cls is not None:
                try:
                    return cls(physical_batch_size=physical_batch_size)
                except TypeError:
                    return cls()
        raise ValueError("featuredp.privatize_ghost defines no ghost strategy class")
    raise ValueError(f"strategy must be 'vmap', 'ghost' or a GradientStrategy object, got {strategy!r}")
