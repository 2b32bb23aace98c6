"""What makes per-example clipping meaningless, refused before it can falsify ε.

Two model properties break the bound "one record moves the clipped sum by at
most C": layers that mix the examples of a batch (:func:`check_no_batch_mixing`,
static) and forwards that write into the model's parameters or buffers while
they see private data (:class:`ForwardStateGuard`, around every private clipped
sum). Mixing by parameter-free code is caught numerically by ghost clipping's
separability cross-check (:mod:`featuredp.clipping.ghost`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parameter import is_lazy

from featuredp.clipping.fsdp import is_fsdp_hook, local_tensor
from featuredp.errors import BatchMixingError, ForwardSideEffectError

__all__ = ["AutogradHookGuard", "ForwardStateGuard", "check_no_batch_mixing"]


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


# Parameters, buffers and plain tensor attributes up to this many elements in total are copied before every
# private forward, so that a write that bumps no version (through ``.data``) is seen and undone exactly. Above
# it (larger models) each floating tensor of more than _EXACT_LIMIT elements gets a keyed fingerprint instead
# (:class:`_Fingerprint`: no copy, one matrix-vector pass): a write is still seen, but such a parameter cannot be
# restored and the error says to discard the model. Smaller and non-floating tensors (counters, running
# statistics, masks) are always copied, so the usual culprits are undone at any model size.
_COPY_LIMIT = 1 << 20
_EXACT_LIMIT = 1 << 12
# Coordinates per fingerprint whose exact values are kept (fresh secret positions on every call).
_SAMPLED = 64


def _as_matrix(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-d (rows, last dim) float32 or float64 view or copy, for :class:`_Fingerprint`."""
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if x.dtype not in (torch.float32, torch.float64):
        x = x.to(torch.float32)  # a low-precision matrix-vector product would round small writes away
    return x.reshape(-1, x.shape[-1]) if x.dim() >= 2 else x.reshape(1, -1)


class _Fingerprint:
    """A keyed fingerprint of a large floating tensor: the exact values at a few secret coordinates and, for
    every row of its (rows, last dim) view X, the product X w with a secret uniform vector w.

    The positions and w are drawn from OS entropy on every call, so no pattern of writes is invisible by
    construction: a write through ``.data`` changes the products of the rows it touches unless it is orthogonal
    to w (probability zero for a fixed write) or below float rounding of a row's product (less than ~1e-7 of
    that row's scale); a write that changes many entries also hits the sampled coordinates, which are compared
    exactly. Ordinary in-place writes and rebinding are caught before this, by version counters and data
    pointers. It keeps one number per row, not a copy.
    """

    __slots__ = ("idx", "proj", "values", "w")

    def __init__(self, t: torch.Tensor, rng: np.random.Generator) -> None:
        x = _as_matrix(t)
        self.idx = torch.as_tensor(rng.integers(0, x.numel(), size=min(_SAMPLED, x.numel())), device=x.device)
        self.w = torch.as_tensor(rng.random(x.shape[1]), dtype=x.dtype, device=x.device)
        self.values, self.proj = self._measure(x)

    def _measure(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.reshape(-1)[self.idx].clone(), torch.mv(x, self.w)

    def same(self, t: torch.Tensor) -> bool:
        """Whether ``t`` still has the fingerprinted values (as far as the fingerprint can tell)."""
        try:
            values, proj = self._measure(_as_matrix(t))
        except RuntimeError:  # a different shape: changed
            return False
        return _same_values(values, self.values) and _same_values(proj, self.proj)


#: how a change report names what changed: (module, attribute, kind) -> "kind 'qual.name' of module ..."
_Where = Callable[[nn.Module, str, str], str]
_MISSING = object()
# What every nn.Module keeps in its __dict__ (hook tables, registries, the training flag): the guard's own
# subject (parameters, buffers, submodules) or torch's book-keeping, which hooks legitimately touch during a call.
# An RNN's ``_flat_weights`` is a list of its own parameters (tracked as parameters), which torch.func rebinds
# while it swaps them during a functional call.
_MODULE_INTERNALS = frozenset(nn.Module().__dict__) | {"_flat_weights", "_flat_weights_names", "_all_weights"}


def _ptr(t: torch.Tensor) -> int:
    t = local_tensor(t)  # a sharded parameter: this rank's shard (clipping/fsdp.py)
    return t.data_ptr() if t.layout == torch.strided else 0


def _version(t: torch.Tensor) -> int:
    t = local_tensor(t)
    return -1 if t.is_inference() else t._version  # inference tensors have no version counter (nor autograd use)


# CPU dtypes numpy compares elementwise exactly as torch.equal does (bfloat16 and the like have no numpy type).
_NUMPY_EQUAL = frozenset({torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
                          torch.int8, torch.uint8, torch.bool})  # fmt: skip


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` of two tensors of one shape, dtype and device. On the CPU and above 8,192 elements numpy's
    comparison, which is vectorised where torch's is not: 23 against 113 µs on a 180k float32 parameter, on every
    guarded call (below, numpy's call costs more than torch's comparison)."""
    if (a.numel() > 8192 and a.device.type == "cpu" and a.dtype in _NUMPY_EQUAL and a.layout == torch.strided
            and not a.is_conj() and not a.is_neg()):  # fmt: skip
        try:
            return bool(np.array_equal(a.detach().numpy(), b.detach().numpy()))
        except (RuntimeError, TypeError):  # a tensor numpy cannot view (a subclass of the user's): torch compares
            pass
    return torch.equal(a, b)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if _equal(a, b):  # the every-call fast path; NaN never equals NaN here, hence the second look
        return True
    return (a.is_floating_point() or a.is_complex()) and bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))


_NUMBER = (bool, int, float, complex, np.generic)


def _holds_data(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray, *_NUMBER))


def _plain(value: Any) -> tuple[Any, ...] | None:
    """The contents of a plain attribute that holds data (a tensor, a number, an array, or a list, tuple or dict
    of them, one level deep), or None for anything else (functions, strings, modules, configuration objects)."""
    if _holds_data(value):
        return (value,)
    if isinstance(value, list | tuple) and any(_holds_data(v) for v in value):
        return tuple(value)
    if isinstance(value, dict) and any(_holds_data(v) for v in value.values()):
        return tuple(value.items())
    return None


def _same_item(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2:  # a dict entry
        return a[0] == b[0] and _same_item(a[1], b[1])
    if isinstance(a, _NUMBER) and isinstance(b, _NUMBER) and type(a) is type(b):
        return bool(a == b) or (a != a and b != b)  # NaN equals NaN here
    return False


def _same_contents(before: tuple[Any, ...], now: tuple[Any, ...] | None) -> bool:
    return now is not None and len(now) == len(before) and all(_same_item(a, b) for a, b in zip(before, now))


def _tensors_in(contents: tuple[Any, ...]) -> list[torch.Tensor]:
    values = [v[1] if isinstance(v, tuple) and len(v) == 2 else v for v in contents]
    return [v for v in values if isinstance(v, torch.Tensor)]


def _put_back(now: dict[str, Any], before: dict[str, Any]) -> None:
    """Make the module dict ``now`` hold exactly the entries of ``before`` again (same objects)."""
    if len(now) != len(before) or any(now.get(k, _MISSING) is not v for k, v in before.items()):
        now.clear()
        now.update(before)


class ForwardStateGuard:
    """Refuses, and undoes, changes that a private forward makes to a model's state, on every call.

    ``with ForwardStateGuard(model):`` around everything that runs ``model`` on private data. On entry it
    records, for every module, which tensors its ``_parameters``, ``_buffers`` and ``_modules`` hold, and the
    plain attributes of its ``__dict__`` that hold data (tensors, numbers, numpy arrays, and lists, tuples or
    dicts of them one level deep: a hand-written running mean or a cache); for every such tensor its
    ``_version``, data pointer and a copy of its values (or, above ``_COPY_LIMIT`` elements in all, a keyed
    fingerprint of each large floating tensor: exact values at secret coordinates and each row's product with a
    secret vector, :class:`_Fingerprint`).
    On exit — normal or by an exception — anything rebound, added, removed, modified in place (a
    version bump or a changed data pointer) or changed in value (a write through ``.data``, which bumps no
    version) is put back, and :class:`ForwardSideEffectError` is raised naming the attribute and its module:
    such state would carry private-batch information into the released model (``state_dict`` or a pickled
    model) outside the accounted mechanism.

    Limits: objects that are neither tensors, arrays nor numbers (a custom class holding a statistic) and
    containers nested more than one level are not looked into; a tensor above the copy limit that changed
    cannot be restored (the error says to discard the model). ``first_call`` is accepted for compatibility and
    changes nothing: every call is checked in full.
    """

    def __init__(self, model: nn.Module, *, first_call: bool = True) -> None:
        self.model = model
        self.first_call = first_call

    def __enter__(self) -> ForwardStateGuard:
        self._modules = [(m, dict(m._parameters), dict(m._buffers), dict(m._modules)) for m in self.model.modules()]
        self._plain: list[tuple[nn.Module, dict[str, tuple[Any, tuple[Any, ...]]]]] = []
        tensors: dict[int, tuple[torch.Tensor, str]] = {}
        arrays: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # Uninitialised lazy tensors have no data yet (their materialisation depends on shapes, not values).
        for m, params, buffers, _ in self._modules:
            for p in params.values():
                if p is not None and not is_lazy(p):
                    tensors[id(p)] = (p, "parameter")
            for b in buffers.values():
                if b is not None and not is_lazy(b):
                    tensors.setdefault(id(b), (b, "buffer"))
            plain = {}
            for attr, value in vars(m).items():
                if attr in _MODULE_INTERNALS:
                    continue
                contents = _plain(value)
                if contents is None:
                    continue
                plain[attr] = (value, contents)
                for item in contents:
                    item = item[1] if isinstance(value, dict) else item
                    if isinstance(item, torch.Tensor) and not is_lazy(item):
                        tensors.setdefault(id(item), (item, "attribute"))
                    elif isinstance(item, np.ndarray):
                        arrays[id(item)] = (item, item.copy())
            if plain:
                self._plain.append((m, plain))
        self._state = [(t, _version(t), _ptr(t)) for t, _ in tensors.values()]
        self._arrays = list(arrays.values())
        small = sum(t.numel() for t, _ in tensors.values()) <= _COPY_LIMIT
        rng = None if small else np.random.default_rng()  # OS entropy: the model cannot know what is compared
        self._copies: dict[int, torch.Tensor] = {}
        self._prints: dict[int, _Fingerprint] = {}
        with torch.no_grad():
            for t, _ in tensors.values():
                if rng is None or t.numel() <= _EXACT_LIMIT or not (t.is_floating_point() or t.is_complex()):
                    self._copies[id(t)] = local_tensor(t).detach().clone()
                else:
                    self._prints[id(t)] = _Fingerprint(local_tensor(t), rng)
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
            "private forward (or on public data), or use strategy='vmap' for a model that needs them"
        ) from exc

    def _names(self) -> dict[int, str]:
        return {id(m): n for n, m in self.model.named_modules(remove_duplicate=False)}

    def _changes(self) -> list[str]:
        names: dict[int, str] | None = None

        def where(m: nn.Module, attr: str, kind: str) -> str:
            nonlocal names
            if names is None:  # only on a violation: the steady-state path builds no names
                names = self._names()
            mname = names.get(id(m), "?")
            qual = f"{mname}.{attr}" if mname else attr
            return f"{kind} {qual!r} of module {mname or '<root>'!r} ({type(m).__name__})"

        out = self._dict_changes(where)
        out += self._plain_changes(where)
        self._changed = self._changed_tensors()
        if self._changed:
            out += self._in_place_changes(where, self._changed)
        out += self._array_changes()
        return out

    def _dict_changes(self, where: _Where) -> list[str]:
        """Parameters, buffers and submodules rebound, added or removed."""
        out: list[str] = []
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
        return out

    def _plain_changes(self, where: _Where) -> list[str]:
        """Plain attributes: rebound to other data, changed in their items, added (holding data) or removed."""
        out: list[str] = []
        self._plain_changed: list[tuple[nn.Module, dict[str, Any], list[str]]] = []
        recorded = {id(m): plain for m, plain in self._plain}
        for m, *_ in self._modules:
            plain = recorded.get(id(m), {})
            now = vars(m)
            bad = [a for a, (_, contents) in plain.items() if a not in now or not _same_contents(contents,
                                                                                               _plain(now[a]))]
            added = [a for a, v in now.items() if a not in plain and a not in _MODULE_INTERNALS
                     and _plain(v) is not None]  # fmt: skip
            out.extend(f"{where(m, a, 'attribute')} was {'removed' if a not in now else 'changed'}" for a in bad)
            out.extend(f"{where(m, a, 'attribute')} was added" for a in added)
            if bad or added:
                self._plain_changed.append((m, plain, added))
        return out

    def _changed_tensors(self) -> set[int]:
        """The ids of the recorded tensors modified in place: a new version or data pointer, or other values."""
        changed = {id(t) for t, version, ptr in self._state if _version(t) != version or _ptr(t) != ptr}
        with torch.no_grad():
            for t, _, _ in self._state:
                if id(t) in changed:
                    continue
                copy = self._copies.get(id(t))
                if copy is not None and not _same_values(local_tensor(t), copy):
                    changed.add(id(t))  # a write that bumps no version (through .data)
                elif copy is None and not self._prints[id(t)].same(local_tensor(t)):
                    changed.add(id(t))
        return changed

    def _in_place_changes(self, where: _Where, changed: set[int]) -> list[str]:
        """The parameters, buffers and plain attributes holding a tensor of ``changed``."""
        out: list[str] = []
        for m, params, buffers, _ in self._modules:
            for kind, d in (("parameter", params), ("buffer", buffers)):
                out.extend(
                    f"{where(m, k, kind)} was modified in place"
                    for k, t in d.items()
                    if t is not None and id(t) in changed
                )
        for m, plain in self._plain:
            out.extend(
                f"{where(m, a, 'attribute')} was modified in place"
                for a, (_, contents) in plain.items()
                if any(id(t) in changed for t in _tensors_in(contents))
            )
        return out

    def _array_changes(self) -> list[str]:
        """The numpy arrays held in attributes whose values changed."""
        return [
            f"a numpy array held in an attribute (shape {array.shape}) was modified in place"
            for array, saved in self._arrays
            if not np.array_equal(array, saved, equal_nan=array.dtype.kind in "fc")
        ]

    def _restore(self) -> list[str]:
        """Put every dict entry, plain attribute and changed tensor back; the tensors that could not be restored."""
        for m, params, buffers, mods in self._modules:
            _put_back(m._parameters, params)
            _put_back(m._buffers, buffers)
            _put_back(m._modules, mods)
        for m, plain, added in self._plain_changed:
            now = vars(m)
            for a in added:
                del now[a]
            for a, (value, contents) in plain.items():
                now[a] = value  # the original object, with its original items (one level deep)
                if isinstance(value, list):
                    value[:] = list(contents)
                elif isinstance(value, dict):
                    value.clear()
                    value.update(contents)
        for array, saved in self._arrays:
            array[...] = saved
        unrestored: list[str] = []
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
                    unrestored.append(repr(names.get(id(t), "a tensor attribute")))
                elif _ptr(t) == ptr and local_tensor(t).shape == copy.shape and t.dtype == copy.dtype:
                    local_tensor(t).copy_(copy)
                else:
                    t.data = copy
        return unrestored



_HOOK_FIX = (
    "a backward hook can rescale or mix the gradients ghost clipping reads after the clip factors are computed, "
    "so one record's influence would no longer be bounded by C; remove the hook from the model's forward"
)


# The getter of Tensor.grad_fn, as a torch function mode sees it (a fresh, equal method-wrapper each access).
_GRAD_FN_GET: Any = inspect.getattr_static(torch.Tensor, "grad_fn").__get__


def _hook_calls() -> dict[Any, str]:
    """The tensor methods that attach something to the backward of the forward's graph, with their names."""
    return {
        torch.Tensor.register_hook: "Tensor.register_hook (also used by register_multi_grad_hook)",
        torch.Tensor.register_post_accumulate_grad_hook: "Tensor.register_post_accumulate_grad_hook",
        # Node hooks (grad_fn.register_hook / register_prehook) and module backward hooks all start from a
        # tensor's grad_fn; nothing else in a forward needs to touch the graph's nodes.
        _GRAD_FN_GET: "Tensor.grad_fn (node hooks: grad_fn.register_hook/register_prehook, module backward hooks)",
    }


class AutogradHookGuard(torch.overrides.TorchFunctionMode):
    """Refuse backward hooks and saved-tensor hooks in a private forward (a context manager; every call).

    Ghost clipping takes per-example gradients from one backward pass of the forward's graph; a hook in that
    graph (``Tensor.register_hook``, ``torch.autograd.graph.register_multi_grad_hook``, a node's
    ``register_hook`` / ``register_prehook``, a module's backward hook) or a saved-tensor hook
    (``torch.autograd.graph.saved_tensors_hooks``, ``save_on_cpu``, non-reentrant ``torch.utils.checkpoint``)
    runs arbitrary code on those gradients. Inside the guard:

    * registering a tensor hook, or reading a non-leaf tensor's ``grad_fn`` (the only way to a node's hooks),
      raises :class:`BatchMixingError` naming the call: seen as a torch function by this
      :class:`~torch.overrides.TorchFunctionMode`;
    * saved-tensor hooks are disabled (``torch.autograd.graph.disable_saved_tensors_hooks``): pushing one, or
      saving a tensor while an outer one is active, raises ``RuntimeError`` with the guard's message.

    Limits (docs/engine.md, "Trust model"): model code that leaves torch function modes on purpose
    (``torch._C.DisableTorchFunction``), custom ``autograd.Function`` backwards, C++/CUDA extensions and hooks
    attached before the forward to tensors the forward does not create are not seen. These are not accidents;
    model code is trusted not to be written against the checks.

    >>> import torch
    >>> x = torch.ones(2, requires_grad=True)
    >>> with AutogradHookGuard("a model"):
    ...     (x * 2).register_hook(lambda g: g)
    Traceback (most recent call last):
    ...
    featuredp.errors.BatchMixingError: a model: the private forward called Tensor.register_hook ...
    """

    def __init__(self, owner: str) -> None:
        super().__init__()
        self.owner = owner
        self._calls = _hook_calls()
        self._grad_fn = _GRAD_FN_GET
        self._saved: Any = None

    def __enter__(self) -> AutogradHookGuard:
        message = f"{self.owner}: the private forward uses saved-tensor hooks (saved_tensors_hooks, save_on_cpu, " \
                  f"non-reentrant checkpointing); {_HOOK_FIX}"  # fmt: skip
        self._saved = torch.autograd.graph.disable_saved_tensors_hooks(message)
        self._saved.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._saved.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._saved.__exit__(*exc)

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Pass every call through, except those that attach a hook to the graph."""
        name = self._calls.get(func)
        if name is None:
            return func(*args, **(kwargs or {}))
        if func is torch.Tensor.register_hook and len(args) > 1 and is_fsdp_hook(args[1]):
            return func(*args, **(kwargs or {}))  # FSDP2's unshard before the backward (clipping/fsdp.py)
        if func == self._grad_fn:
            node = func(*args, **(kwargs or {}))
            if node is None:  # a leaf (nn.Module.register_parameter asks): no node, no hook to attach
                return node
        raise BatchMixingError(f"{self.owner}: the private forward called {name}; {_HOOK_FIX}")
