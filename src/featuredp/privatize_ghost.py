"""Deprecated import path (one release): use :mod:`featuredp.clipping.ghost`."""

import warnings

from featuredp.clipping.ghost import GhostGradients, GhostPlan  # noqa: F401

warnings.warn("featuredp.privatize_ghost is deprecated: import GhostGradients from featuredp.clipping",
              DeprecationWarning, stacklevel=2)
