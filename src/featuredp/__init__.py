"""featuredp: machine learning with feature differential privacy.

Feature differential privacy (FDP) protects only the private part of each record
(some columns, the label, the fine detail of an image) while the public part,
given by a declared public feature map Ψ, is used freely.

Subpackages are imported lazily by users; importing ``featuredp`` itself stays
light (no torch import) so that ``featuredp.accounting`` can be used on its own.
"""

from featuredp.errors import (
    BudgetExceededError,
    DataValidationError,
    FeatureDPError,
    PrivacyLeakWarning,
    PrivacyRiskWarning,
    UnreachableTargetError,
)

__version__ = "0.1.0"

__all__ = [
    "BudgetExceededError",
    "DataValidationError",
    "FeatureDPError",
    "PrivacyLeakWarning",
    "PrivacyRiskWarning",
    "UnreachableTargetError",
    "__version__",
]
