"""Deprecated import path (one release): use :mod:`featuredp.experiments.train_one`."""

import warnings

from featuredp.experiments.train_one import train_tabular  # noqa: F401

warnings.warn("featuredp.train_tabular is deprecated: import from featuredp.experiments.train_one",
              DeprecationWarning, stacklevel=2)
