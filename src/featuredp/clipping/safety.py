"""What makes per-example clipping meaningless, refused before it can falsify ε.

Two model properties break the bound "one record moves the clipped sum by at
most C": layers that mix the examples of a batch (:func:`check_no_batch_mixing`,
static) and forwards that write into the model's parameters or buffers while
they see private data (:class:`ForwardStateGuard`, around every private clipped
sum). Mixing by parameter-free code is caught numerically by ghost clipping's
separability cross-check (:mod:`featuredp.clipping.ghost`).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from featuredp.errors import BatchMixingError, ForwardSideEffectError

__all__ = ["ForwardStateGuard", "check_no_batch_mixing"]


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
    checks it numerically on its first batch (:class:`featuredp.clipping.ghost.GhostGradients`) and every
    private clipped sum runs under :class:`ForwardStateGuard`.

    >>> check_no_batch_mixing(nn.Sequential(nn.Linear(2, 2), nn.GroupNorm(1, 2)))  # accepted: returns None
    >>> check_no_batch_mixing(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    Traceback (most recent call last):
    ...
    featuredp.errors.BatchMixingError: layer '1' (BatchNorm1d) mixes examples across the batch, ...
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


def _put_back(now: dict[str, Any], before: dict[str, Any]) -> None:
    """Make the module dict ``now`` hold exactly the entries of ``before`` again (same objects)."""
    if len(now) != len(before) or any(now.get(k, _MISSING) is not v for k, v in before.items()):
        now.clear()
        now.update(before)


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
            for p in params.values():
                if p is not None and not is_lazy(p):
                    tensors[id(p)] = (p, True)
            for b in buffers.values():
                if b is not None and not is_lazy(b):
                    tensors.setdefault(id(b), (b, False))
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
            _put_back(m._parameters, params)
            _put_back(m._buffers, buffers)
            _put_back(m._modules, mods)
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
