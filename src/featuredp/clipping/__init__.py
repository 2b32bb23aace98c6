"""Per-example clipping: the strategy protocol, a registry of named strategies, and their safety checks.

* :mod:`~featuredp.clipping.base` — the :class:`GradientStrategy` protocol, clip factors, the shared
  torch.func per-example gradient helper;
* :mod:`~featuredp.clipping.vmap` — :class:`VmapGradients`, exact per-example gradients (the reference);
* :mod:`~featuredp.clipping.ghost` — :class:`GhostGradients`, ghost-norm clipping with per-layer rules
  (:mod:`~featuredp.clipping.rules`: one rule per layer type, added with :func:`register_rule`; the
  contributions they return and their algebra: :mod:`~featuredp.clipping.contributions`,
  :mod:`~featuredp.clipping.mixed`);
* :mod:`~featuredp.clipping.safety` — refusal of layers that mix the batch and of forwards with side effects.

Strategies are chosen by name (``Trainer(strategy="ghost")``); :func:`register_strategy` adds one, which
must then pass the contract suite ``tests/clipping/test_contract.py`` (it is parametrised over
:data:`STRATEGIES`, so a registered strategy is tested automatically). The noise is added by the engine
afterwards (:mod:`featuredp.noise`).

>>> sorted(STRATEGIES)
['auto', 'ghost', 'vmap']
>>> get_strategy("vmap").name
'vmap'
"""

from __future__ import annotations

from collections.abc import Callable

from featuredp.clipping.auto import AutoStrategy
from featuredp.clipping.base import (
    GradientStrategy,
    LossFn,
    clip_factors,
    per_example_grads,
    trainable_parameters,
)
from featuredp.clipping.ghost import GhostGradients
from featuredp.clipping.rules import register_rule
from featuredp.clipping.safety import ForwardStateGuard, check_no_batch_mixing
from featuredp.clipping.vmap import VmapGradients
from featuredp.errors import BatchMixingError, ForwardSideEffectError

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "AutoStrategy",
    "BatchMixingError",
    "ForwardSideEffectError",
    "ForwardStateGuard",
    "GhostGradients",
    "GradientStrategy",
    "LossFn",
    "VmapGradients",
    "check_no_batch_mixing",
    "clip_factors",
    "get_strategy",
    "per_example_grads",
    "register_rule",
    "register_strategy",
    "trainable_parameters",
]

StrategyFactory = Callable[[int | None], GradientStrategy]

# name -> (factory taking physical_batch_size, the physical batch size "auto" means)
STRATEGIES: dict[str, tuple[StrategyFactory, int | None]] = {}

#: The strategy used wherever it applies: same result as "vmap", several times faster.
DEFAULT_STRATEGY = "ghost"


# The classes whose instances may be passed as strategy objects: a registered strategy has passed the
# contract suite (tests/clipping/test_contract.py), an arbitrary object with a clipped_sum has not.
_REGISTERED_TYPES: set[type] = set()


def register_strategy(name: str, factory: StrategyFactory, *, auto_physical_batch_size: int | None = None) -> None:
    """Make ``factory(physical_batch_size) -> GradientStrategy`` available as ``strategy=name``.

    ``auto_physical_batch_size`` is what ``physical_batch_size="auto"`` means for it (None: unchunked).
    When ``factory`` is a class, its instances may also be passed as strategy objects.
    A registered strategy must pass the contract suite in ``tests/clipping/test_contract.py``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"strategy name must be a non-empty string, got {name!r}")
    if name in STRATEGIES:
        raise ValueError(f"a strategy named {name!r} is already registered")
    if not callable(factory):
        raise TypeError(f"factory must be callable (physical_batch_size -> strategy), got {type(factory).__name__}")
    STRATEGIES[name] = (factory, auto_physical_batch_size)
    if isinstance(factory, type):
        _REGISTERED_TYPES.add(factory)


# vmap materialises per-example gradients, so memory grows with the chunk: 256 by default. Ghost never does;
# chunking it only costs time (about 23% at batch 1024).
register_strategy("vmap", VmapGradients, auto_physical_batch_size=256)
register_strategy("ghost", GhostGradients, auto_physical_batch_size=None)
# The faster of the two for the model and the batch shape, timed once on a stand-in batch of zeros.
register_strategy("auto", AutoStrategy, auto_physical_batch_size=None)


def get_strategy(
    strategy: str | GradientStrategy = DEFAULT_STRATEGY, *, physical_batch_size: int | str | None = "auto"
) -> GradientStrategy:
    """A strategy object from a registered name, or an instance of a registered strategy class passed through.

    Any other object is refused: per-example clipping is what bounds one record's influence, so only
    strategies that passed the contract suite (registered ones) may compute it.

    ``physical_batch_size="auto"`` uses the strategy's registered default.

    >>> get_strategy("ghost", physical_batch_size=64)
    GhostGradients(physical_batch_size=64, reweight='matmul')
    """
    if not isinstance(strategy, str):
        if type(strategy) not in _REGISTERED_TYPES:
            raise TypeError(
                f"strategy must be a registered name ({', '.join(sorted(STRATEGIES))}) or an instance of a "
                f"registered strategy class, got {type(strategy).__name__}; register yours with "
                "featuredp.clipping.register_strategy(name, cls) after it passes the contract suite"
            )
        return strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(sorted(STRATEGIES))} (or a strategy object), "
                         f"got {strategy!r}")
    factory, auto = STRATEGIES[strategy]
    if physical_batch_size == "auto":
        return factory(auto)
    if isinstance(physical_batch_size, str):
        raise ValueError(f"physical_batch_size must be an integer, None or 'auto', got {physical_batch_size!r}")
    return factory(physical_batch_size)
