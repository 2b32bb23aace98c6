"""Deprecated import path (one release): use :mod:`featuredp.clipping` and :mod:`featuredp.noise`."""

import warnings

from featuredp.clipping import (  # noqa: F401
    ForwardStateGuard,
    GradientStrategy,
    LossFn,
    VmapGradients,
    check_no_batch_mixing,
    clip_factors,
    get_strategy,
    trainable_parameters,
)
from featuredp.errors import BatchMixingError, ForwardSideEffectError  # noqa: F401
from featuredp.noise import add_noise  # noqa: F401

warnings.warn("featuredp.privatize is deprecated: import from featuredp.clipping (and featuredp.noise for add_noise)",
              DeprecationWarning, stacklevel=2)
