"""featuredp: machine learning with feature differential privacy.

Feature differential privacy (FDP) protects only the private part of each record
(some columns, the label, the fine detail of an image) while the public part,
given by a declared public feature map Ψ, is used freely.

Importing ``featuredp`` stays light (no torch import) so that
``featuredp.accounting`` can be used on its own; the training API
(``from featuredp import Trainer``) is loaded on first use.

The stable library (documented in ``docs/``, what user code imports):

* training — :mod:`~featuredp.engine` (``Trainer``), ``featuredp.privacy_engine`` (``PrivacyEngine``),
  :mod:`~featuredp.config`, :mod:`~featuredp.plan`, :mod:`~featuredp.methods`;
* privacy — :mod:`~featuredp.accounting`, :mod:`~featuredp.clipping`, :mod:`~featuredp.noise`,
  :mod:`~featuredp.sampling`, :mod:`~featuredp.mechanisms`, :mod:`~featuredp.aggregation`,
  :mod:`~featuredp.testing` (the replay self-test);
* data and models — :mod:`~featuredp.features` (Ψ), :mod:`~featuredp.losses`, :mod:`~featuredp.data`
  (loaders), :mod:`~featuredp.models`, :mod:`~featuredp.diffusion`, :mod:`~featuredp.lm`;
  other learners :mod:`~featuredp.erm`, :mod:`~featuredp.icl`;
* auditing — :mod:`~featuredp.attacks`, :mod:`~featuredp.metrics`.

The experiments, built on the library and free to change with the measurements:
:mod:`~featuredp.experiments` (grids, presets, the paper's and the systems' runs) and
:mod:`~featuredp.cli` (the ``featuredp`` command). Library modules never import them
(``tests/test_architecture.py``).

>>> import featuredp
>>> featuredp.PrivacyPlan.__name__
'PrivacyPlan'
"""

from __future__ import annotations

import importlib
from typing import Any

from featuredp.errors import (
    BudgetExceededError,
    DataValidationError,
    FeatureDPError,
    PrivacyLeakWarning,
    PrivacyRiskWarning,
    UnreachableTargetError,
)

__version__ = "0.1.0"

# Name -> module for the lazily loaded API: these pull in torch, which ``import featuredp`` must not.
_LAZY = {
    "Trainer": "featuredp.engine",
    "PrivacyEngine": "featuredp.privacy_engine",
    "PrivacyConfig": "featuredp.config",
    "ScheduleConfig": "featuredp.config",
    "PerformanceConfig": "featuredp.config",
    "PrivacyPlan": "featuredp.plan",
    "TrainResult": "featuredp.plan",
    "Disclosure": "featuredp.plan",
    "Columns": "featuredp.features",
    "LabelPrivate": "featuredp.features",
    "FunctionMap": "featuredp.features",
    "GaussianBlur": "featuredp.features",
    "Pixelate": "featuredp.features",
    "BoxMask": "featuredp.features",
    "METHODS": "featuredp.methods",
    "get_method": "featuredp.methods",
    "evaluate": "featuredp.batches",
    "BudgetLedger": "featuredp.accounting",
}


def __getattr__(name: str) -> Any:
    """Load the training API on first access (``featuredp.Trainer``), keeping ``import featuredp`` light."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'featuredp' has no attribute {name!r}")


__all__ = [
    "METHODS",
    "BoxMask",
    "BudgetExceededError",
    "BudgetLedger",
    "Columns",
    "DataValidationError",
    "Disclosure",
    "FeatureDPError",
    "FunctionMap",
    "GaussianBlur",
    "LabelPrivate",
    "PerformanceConfig",
    "Pixelate",
    "PrivacyConfig",
    "PrivacyEngine",
    "PrivacyLeakWarning",
    "PrivacyPlan",
    "PrivacyRiskWarning",
    "ScheduleConfig",
    "TrainResult",
    "Trainer",
    "UnreachableTargetError",
    "__version__",
    "evaluate",
    "get_method",
]
