"""Models for FDP training (tabular, a small image CNN, a causal LM) and a spec format to rebuild them from run.json.

``build_model(spec)`` turns a JSON-able dict into a model; ``spec_for(dataset, kind)``
makes that dict for a TabularDataset. Specs are stored in run.json so that a run
(and its checkpoint) can be reloaded without pickling code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from featuredp._validate import check_choice
from featuredp.models.cnn import SmallCNN
from featuredp.models.layers import ColumnLinear
from featuredp.models.linear import LogisticRegression, SparseLogisticRegression
from featuredp.models.mlp import MLP
from featuredp.models.transformer import CausalTransformer

__all__ = [
    "MLP",
    "MODEL_KINDS",
    "CausalTransformer",
    "ColumnLinear",
    "LogisticRegression",
    "SmallCNN",
    "SparseLogisticRegression",
    "build_model",
    "spec_for",
]

MODEL_KINDS = ("mlp", "logreg", "sparse_logreg", "small_cnn", "causal_transformer")
# Kinds with their own spec (not fitted to a TabularDataset by spec_for).
_OWN_SPEC = ("small_cnn", "causal_transformer")
_TRANSFORMER_KEYS = ("vocab_size", "max_len", "d_model", "n_layers", "n_heads", "d_ff", "tie_embeddings",
                     "layer_norm_eps")


def build_model(spec: dict[str, Any], *, seed: int | None = None) -> nn.Module:
    """Build a model from a spec dict ``{"kind": ..., **arguments}``.

    With ``seed`` the initial weights are drawn from a torch generator seeded
    with it, without touching the global torch RNG.
    """
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ValueError(f"a model spec must be a dict with a 'kind' key, got {spec!r}")
    kind = check_choice("model kind", spec["kind"], MODEL_KINDS)
    args = {k: v for k, v in spec.items() if k != "kind"}
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(int(seed))
        if kind == "mlp":
            return MLP(args["in_features"], tuple(args.get("hidden", (300,))), args["n_classes"],
                       args.get("activation", "relu"))
        if kind == "logreg":
            return LogisticRegression(args["in_features"], args["n_classes"], args.get("bias", True))
        if kind == "small_cnn":  # images: in_channels, image_size, num_classes, widths, groups
            return SmallCNN(args.get("in_channels", 1), args.get("image_size", 28), args.get("num_classes", 10),
                            tuple(args.get("widths", (16, 32))), args.get("groups", 4))
        if kind == "causal_transformer":  # text: a typo'd key would silently train another model, so refuse it
            unknown = sorted(set(args) - set(_TRANSFORMER_KEYS))
            if unknown or "vocab_size" not in args:
                raise ValueError(f"causal_transformer spec needs vocab_size and takes {', '.join(_TRANSFORMER_KEYS)}; "
                                 f"got {sorted(args)}")
            return CausalTransformer(**args)
        return SparseLogisticRegression(args["dense_index"], args["cat_cardinalities"], args["n_classes"],
                                        args.get("bias", True))


def spec_for(dataset: Any, kind: str = "mlp", **options: Any) -> dict[str, Any]:
    """A model spec fitted to a TabularDataset's shape (``options``: hidden, activation, bias)."""
    kind = check_choice("model", kind, tuple(k for k in MODEL_KINDS if k not in _OWN_SPEC))  # images, text: own spec
    n_classes = max(2, len(dataset.classes))
    d = int(dataset.X.shape[1])
    if kind == "mlp":
        return {"kind": "mlp", "in_features": d, "hidden": list(options.get("hidden", (300,))),
                "n_classes": n_classes, "activation": options.get("activation", "relu")}
    if kind == "logreg":
        return {"kind": "logreg", "in_features": d, "n_classes": n_classes, "bias": options.get("bias", True)}
    if getattr(dataset, "X_cat", None) is None or not getattr(dataset, "cat_sources", None):
        raise ValueError(f"model 'sparse_logreg' needs categorical codes (X_cat), dataset {dataset.name!r} has none")
    cat = set(dataset.cat_sources)
    dense_index = [i for i, s in enumerate(dataset.feature_sources) if s not in cat]
    return {"kind": "sparse_logreg", "dense_index": dense_index,
            "cat_cardinalities": [int(c) for c in dataset.cat_cardinalities], "n_classes": n_classes,
            "bias": options.get("bias", True)}
