"""Per-method default hyperparameters for tabular training (used by ``featuredp train`` and ``demo``).

Chosen on a validation split carved from the Adult *training* set (never the
test set) with ``benchmarks/adult_methods.py --tune``; see docs/engine.md.
Every value can be overridden on the command line or in ``Trainer(...)``.
"""

from __future__ import annotations

from typing import Any

#: model used by default for tabular data
DEFAULT_MODEL: dict[str, Any] = {"kind": "mlp", "hidden": [64]}

#: Trainer keyword arguments per method
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "nonprivate": {"epochs": 5, "batch_size": 256, "lr": 0.05, "momentum": 0.9},
    "public": {"epochs": 3, "batch_size": 256, "lr": 0.05, "momentum": 0.9},
    "dpsgd": {"epochs": 5, "batch_size": 1024, "lr": 1.0, "momentum": 0.9, "max_grad_norm": 1.0},
    "fdp_dpsgd": {"epochs": 3, "batch_size": 512, "lr": 0.2, "momentum": 0.9, "max_grad_norm": 1.0,
                  "pretrain_epochs": 3, "pretrain_lr": 0.05},
    "fdp": {"epochs": 3, "batch_size": 512, "public_batch_size": 256, "lr": 0.05, "momentum": 0.9,
            "max_grad_norm": 1.0, "alpha": 0.5, "pretrain_epochs": 3, "pretrain_lr": 0.05},
}  # fmt: skip

#: changes to the fdp / fdp_dpsgd defaults when the label is private (LabelDPSplit): ℓ_pub = logsumexp(logits)
#: has no minimiser, so no public pre-training; g_pub + α·g_priv is the cross-entropy gradient only for α = 1
#: and when clipping leaves ∇ℓ_priv mostly intact (C = 5; C = 1 collapsed to the majority class on Adult).
LABEL_DP_DEFAULTS: dict[str, Any] = {"pretrain_epochs": 0, "alpha": 1.0, "max_grad_norm": 5.0}


def method_defaults(method: str) -> dict[str, Any]:
    """A copy of the defaults for ``method``."""
    if method not in METHOD_DEFAULTS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHOD_DEFAULTS))}; got {method!r}")
    return dict(METHOD_DEFAULTS[method])
