"""Deprecated import path (one release): use :mod:`featuredp.experiments.runs`."""

import warnings

from featuredp.experiments.runs import Run, load_checkpoint, load_run, save_checkpoint, save_run  # noqa: F401

warnings.warn("featuredp.runs is deprecated: import from featuredp.experiments.runs", DeprecationWarning, stacklevel=2)
