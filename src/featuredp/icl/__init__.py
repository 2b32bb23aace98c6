"""Differentially private in-context learning (DP-ICL): prompts built from private demonstrations vote.

In-context learning conditions a fixed model on a few labelled *demonstrations*; when those are
private, the answers can leak them (a 1-shot prompt answers its own demonstration correctly). DP-ICL
(Wu et al., ICLR 2024) splits the demonstrations into disjoint prompts, lets each prompt answer,
and releases only a noisy argmax of the votes (docs/icl.md).

::

    Predictor (protocol): n_classes, predict(demos, query) -> int, scores(demos, query) -> (n_classes,)
    KNNPredictor(n_classes, k=1), LogisticPredictor(n_classes, C=1.0)      # offline stand-ins for an LLM
    HFCausalLMPredictor(model_dir, label_words, template=...)             # a local causal LM (featuredp[llm])
    DPICLClassifier(predictor, shots=N, prompts=M, epsilon=E, delta=1e-5, queries=Q, ...)
        .fit(demonstrations) -> self ; .predict(queries) -> labels (-1 = not answered)
        .epsilon, .queries_answered, .sigma, .event(), .describe()

``HFCausalLMPredictor`` is loaded on first use, so ``import featuredp.icl`` never imports transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

from featuredp.icl.mechanism import DPICLClassifier, partition_demonstrations
from featuredp.icl.predictors import (
    BatchPredictor,
    Demonstration,
    KNNPredictor,
    LogisticPredictor,
    Predictor,
    check_labels,
    predict_many,
)

# Name -> module of the lazily loaded adapter (it imports transformers, an optional dependency).
_LAZY = {"HFCausalLMPredictor": "featuredp.icl.hf", "check_model_dir": "featuredp.icl.hf"}


def __getattr__(name: str) -> Any:
    """Load the transformers adapter on first access (``featuredp.icl.HFCausalLMPredictor``)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'featuredp.icl' has no attribute {name!r}")


__all__ = [
    "BatchPredictor",
    "DPICLClassifier",
    "Demonstration",
    "HFCausalLMPredictor",
    "KNNPredictor",
    "LogisticPredictor",
    "Predictor",
    "check_labels",
    "check_model_dir",
    "partition_demonstrations",
    "predict_many",
]
