"""The one exception and warning taxonomy of featuredp, and the warnings shared across layers.

Errors about a value are also ``ValueError`` (and type errors ``TypeError``), so
callers that catch the built-in classes keep working.

:func:`warn_record_level_statistics` lives here, at the bottom of the package, because the
engine, the data loaders and the record-level mechanisms all raise it: it reads only the
``statistics_from_data`` attribute a dataset carries.
"""

from __future__ import annotations

import warnings


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


def warn_record_level_statistics(data: object, mechanism: str, *, stacklevel: int = 3) -> None:
    """Warn (``PrivacyLeakWarning``) that a mechanism protecting whole records (DP-SGD, PATE, DP-ICL, DP-ERM)
    is trained on encoding statistics read from the data: *every* column's escape its guarantee (for FDP only the
    private columns' do; ``Columns.bind`` checks those).

    ``data`` is anything with a ``statistics_from_data`` mapping (column -> what was computed), such as
    :class:`featuredp.data.tabular.TabularDataset`; without one there is nothing to warn about.
    """
    from_data = getattr(data, "statistics_from_data", None) or {}
    if from_data:
        listed = ", ".join(f"{col} ({what})" for col, what in sorted(from_data.items()))
        warnings.warn(
            f"{mechanism} protects whole records, but these encoding statistics were computed from the training "
            f"data and are outside its guarantee: {listed}; declare them in a schema (featuredp data schema, "
            "docs/own-data.md) or pass public bounds=/categories=/classes= to the loader",
            PrivacyLeakWarning,
            stacklevel=stacklevel,
        )
