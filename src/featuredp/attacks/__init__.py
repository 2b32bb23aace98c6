"""Privacy audits: membership and attribute inference, canary audits, empirical ε lower bounds.

The core works on arrays of scores and imports numpy/scipy/scikit-learn only — never torch
(a subprocess test pins it); :mod:`featuredp.attacks.text` audits language models through scoring and
generation callables (canary exposure, span extraction, span inference).
:mod:`featuredp.attacks.torch_adapter` turns a torch model and data into those arrays; ``featuredp audit``
runs everything on a trained run directory.
"""

from featuredp.attacks.attribute import (
    AttackScore,
    BallEstimate,
    ImputationBaseline,
    confidence_attack,
    estimate_ball,
    loss_attack,
    map_attack,
    score_attack,
    theorem4_bound,
)
from featuredp.attacks.bounds import (
    MultiRunBound,
    OneRunBound,
    clopper_pearson,
    multi_run_ceiling,
    multi_run_epsilon_lower_bound,
    one_run_audit,
    one_run_ceiling,
    one_run_epsilon_lower_bound,
    one_run_p_value,
)
from featuredp.attacks.canaries import (
    CanarySet,
    feature_canaries,
    feature_canary_scores,
    mislabelled_canaries,
    simulate_dpsgd_gradient_canaries,
)
from featuredp.attacks.extraction import extract_logistic_regression
from featuredp.attacks.membership import (
    ShadowModelAttack,
    ThresholdResult,
    lira_scores,
    logit_confidence,
    loss_threshold_scores,
    yeom_attack,
)
from featuredp.attacks.metrics import (
    FPR_LEVELS,
    MembershipMetrics,
    accuracy,
    balanced_accuracy,
    matthews_corrcoef,
    membership_advantage,
    membership_metrics,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
    wilson_interval,
)
from featuredp.attacks.text import (
    TextCanary,
    chance_exposure,
    digit_candidates,
    exposure,
    exposure_report,
    span_inference,
)
from featuredp.attacks.text import extraction as text_extraction  # the name `extraction` is the submodule's

__all__ = [
    "FPR_LEVELS",
    "AttackScore",
    "BallEstimate",
    "CanarySet",
    "ImputationBaseline",
    "MembershipMetrics",
    "MultiRunBound",
    "OneRunBound",
    "ShadowModelAttack",
    "TextCanary",
    "ThresholdResult",
    "accuracy",
    "balanced_accuracy",
    "chance_exposure",
    "clopper_pearson",
    "confidence_attack",
    "digit_candidates",
    "estimate_ball",
    "exposure",
    "exposure_report",
    "extract_logistic_regression",
    "feature_canaries",
    "feature_canary_scores",
    "lira_scores",
    "logit_confidence",
    "loss_attack",
    "loss_threshold_scores",
    "map_attack",
    "matthews_corrcoef",
    "membership_advantage",
    "membership_metrics",
    "mislabelled_canaries",
    "multi_run_ceiling",
    "multi_run_epsilon_lower_bound",
    "one_run_audit",
    "one_run_ceiling",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
    "roc_auc",
    "roc_curve",
    "score_attack",
    "simulate_dpsgd_gradient_canaries",
    "span_inference",
    "text_extraction",
    "theorem4_bound",
    "tpr_at_fpr",
    "wilson_interval",
    "yeom_attack",
]
