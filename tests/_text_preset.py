"""A tiny text preset (the shape of ``featuredp.experiments.presets.TEXT_PRESET``) for fast tests."""

from __future__ import annotations

from typing import Any

_ADAM = {"epochs": 1, "batch_size": 16, "lr": 3e-3, "optimizer": "adam"}
TINY: dict[str, Any] = {
    "load": {"n_train": 80, "n_test": 20, "max_len": 64, "canary_repeats": [1, 10], "canaries_per_repeat": 1},
    "model": {"kind": "causal_transformer", "d_model": 16, "n_layers": 1, "n_heads": 2},
    "audit": {"digits": 2, "extraction": 5, "span_targets": 10, "span_k": 5},
    "delta": 1e-5,
    "methods": {
        "nonprivate": dict(_ADAM),
        "public": dict(_ADAM),
        "dpsgd": {**_ADAM, "max_grad_norm": 1.0, "strategy": "vmap"},
        "fdp_dpsgd": {**_ADAM, "lr": 1e-3, "max_grad_norm": 1.0, "pretrain_epochs": 1, "pretrain_batch_size": 16,
                      "strategy": "vmap"},
        "fdp": {**_ADAM, "lr": 1e-3, "max_grad_norm": 1.0, "alpha": 1.0, "public_batch_size": 16,
                "pretrain_epochs": 1, "pretrain_batch_size": 16, "strategy": "vmap"},
    },
    "quick": {"load": {"n_train": 60}, "audit": {"extraction": 3}},
}  # fmt: skip
