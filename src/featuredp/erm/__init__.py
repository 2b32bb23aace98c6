"""scikit-learn–style DP-ERM estimators for convex linear models.

* :class:`OutputPerturbationClassifier` — CMS11 Alg. 1 (vector mechanism / Gaussian).
* :class:`ObjectivePerturbationClassifier` — CMS11 Alg. 2 (ε' correction, extra ridge; Gaussian variant).
* :class:`NoisySGDClassifier` — Algorithm 1 of the paper in the convex setting of Thm 6
  (Poisson sampling, clipping, Gaussian noise, projection, averaging), with a label-DP
  loss split (``label_private=True``).

All need ``data_norm`` (a bound on the rows' L2 norm) and expose ``epsilon_``/``delta_``.
"""

from __future__ import annotations

from featuredp.erm.noisy_sgd import NoisySGDClassifier
from featuredp.erm.perturbation import (
    ObjectivePerturbationClassifier,
    OutputPerturbationClassifier,
    erm_minimizer,
    objective_noise_plan,
)

__all__ = [
    "NoisySGDClassifier",
    "ObjectivePerturbationClassifier",
    "OutputPerturbationClassifier",
    "erm_minimizer",
    "objective_noise_plan",
]
