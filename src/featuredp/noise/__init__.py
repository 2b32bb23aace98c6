"""The noise family: noise plans (what kind of noise a run adds and how it is accounted) and noise sources (the
secret Gaussian draws behind every kind).

* plans, torch-free: :class:`NoisePlan` (:mod:`featuredp.noise.plans`), :class:`Independent` (DP-SGD's, the
  default), :class:`BandMF` and :class:`BLT` (correlated noise), the registry :data:`NOISE_PLANS` and
  :func:`noise_plan` / :func:`noise_plan_from_dict` / :func:`plan_settings` (the settings a kind takes);
* sources (torch, loaded on first use): :class:`NoiseSource`, :class:`TorchNoise`, :class:`SecureNoise`,
  :class:`ChaCha20Generator`, ... (:mod:`featuredp.noise.sources`; the generator and the words-to-normals transform
  are :mod:`featuredp.random_words`'s, re-exported);
* building blocks of the correlated plans: :mod:`featuredp.noise.bandmf`, :mod:`featuredp.noise.blt` (torch).

A new noise kind is one new module in this package whose class is decorated
:func:`featuredp.noise.plans.register_noise_plan`: every module here other than the torch ones is imported below.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from featuredp.noise.bandmf_plan import BandMF
from featuredp.noise.blt_plan import BLT
from featuredp.noise.independent import Independent
from featuredp.noise.plans import (
    NOISE_PLANS,
    NoisePlan,
    noise_plan,
    noise_plan_from_dict,
    plan_settings,
    register_noise_plan,
)

#: the kind of the default noise (DP-SGD's independent Gaussian): what a run without ``noise=`` uses
DEFAULT_NOISE: str = Independent.kind

if TYPE_CHECKING:
    from featuredp.noise.sources import (
        MAX_RADIUS,
        TAIL_MASS_PER_PAIR,
        WORDS_PER_PAIR,
        ChaCha20Generator,
        CorrelatedNoise,
        NoiseSource,
        SecureNoise,
        TorchNoise,
        add_noise,
        normals_from_words,
        normals_from_words_lazy,
        refinement_words,
    )

_SOURCES = (
    "MAX_RADIUS",
    "TAIL_MASS_PER_PAIR",
    "WORDS_PER_PAIR",
    "ChaCha20Generator",
    "CorrelatedNoise",
    "NoiseSource",
    "SecureNoise",
    "TorchNoise",
    "add_noise",
    "normals_from_words",
    "normals_from_words_lazy",
    "refinement_words",
)
#: the modules that import torch at import time (not plan modules)
_TORCH_MODULES = frozenset({"sources", "bandmf", "blt", "sharded"})

__all__ = [
    "BLT",
    "DEFAULT_NOISE",
    # the sources (loaded on first use)
    "MAX_RADIUS",
    "NOISE_PLANS",
    "TAIL_MASS_PER_PAIR",
    "WORDS_PER_PAIR",
    "BandMF",
    "ChaCha20Generator",
    "CorrelatedNoise",
    "Independent",
    "NoisePlan",
    "NoiseSource",
    "SecureNoise",
    "TorchNoise",
    "add_noise",
    "noise_plan",
    "noise_plan_from_dict",
    "normals_from_words",
    "normals_from_words_lazy",
    "plan_settings",
    "refinement_words",
    "register_noise_plan",
]

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _TORCH_MODULES:
        importlib.import_module(f"{__name__}.{_module.name}")


def __getattr__(name: str) -> Any:
    """The noise sources, loaded (with torch) on first use: ``from featuredp.noise import TorchNoise``."""
    if name in _SOURCES:
        value = getattr(importlib.import_module("featuredp.noise.sources"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'featuredp.noise' has no attribute {name!r}")
