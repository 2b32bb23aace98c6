"""The one exception and warning taxonomy of featuredp.

Errors about a value are also ``ValueError`` (and type errors ``TypeError``), so
callers that catch the built-in classes keep working.
"""

from __future__ import annotations


class FeatureDPError(Exception):
    """Base class of every error featuredp raises on purpose."""


class DataValidationError(FeatureDPError, ValueError):
    """The data does not fit what was declared (unknown column, NaN, one class, ...)."""


class UnreachableTargetError(FeatureDPError, ValueError):
    """A privacy target cannot be met with the given settings (the message says which would)."""


class BudgetExceededError(FeatureDPError, ValueError):
    """A spend would take the privacy budget above its declared total; nothing was spent."""


class BatchMixingError(FeatureDPError, ValueError):
    """The model makes one example's output (or gradient) depend on the other examples of the batch."""


class ForwardSideEffectError(FeatureDPError, ValueError):
    """The model's forward writes into its own parameters or buffers while it sees private data."""


class PrivacyLeakWarning(UserWarning):
    """Something was computed from private data outside the accounted mechanism."""


class SmallSampleWarning(UserWarning):
    """An evaluation set so small that one row moves a reported rate by a sizeable step (e.g. a test split
    under 200 rows: one row is more than half a point of accuracy)."""


class PrivacyRiskWarning(UserWarning):
    """A setting is legal but weak, e.g. delta >= 1/n allows releasing a whole record."""
