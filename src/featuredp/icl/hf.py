"""A local causal language model as an in-context predictor (``transformers``; install ``featuredp[llm]``).

:class:`HFCausalLMPredictor` turns a prompt's demonstrations into text with a template, appends the
query and reads the model's next-token logits at the position where the label would follow: the
predicted class is the one whose label word's first token has the highest logit (the usual
"label words" reading of in-context classification).

The model is loaded from a directory the user supplies, with ``local_files_only=True``: nothing is
ever downloaded at run time. A missing directory is a one-line ``FileNotFoundError`` raised before
``transformers`` is even imported. This module is loaded only when the adapter is used
(``featuredp.icl`` imports it lazily), so ``import featuredp.icl`` never imports ``transformers``.
"""

from __future__ import annotations

import os
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from featuredp.errors import DataValidationError
from featuredp.icl.predictors import Demonstration, check_labels

__all__ = ["DEFAULT_SEPARATOR", "DEFAULT_TEMPLATE", "HFCausalLMPredictor", "check_model_dir"]

#: one demonstration block; the query block is the same text up to ``{label}``
DEFAULT_TEMPLATE = "Input: {input}\nLabel: {label}"
#: between blocks
DEFAULT_SEPARATOR = "\n\n"


def check_model_dir(model_dir: str | os.PathLike[str], *, name: str = "model_dir") -> Path:
    """``model_dir`` as a Path if it is an existing directory, else a one-line ``FileNotFoundError``.

    >>> check_model_dir("/nonexistent/llm")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileNotFoundError: model_dir='/nonexistent/llm' does not exist: give the directory of a model saved locally ...
    """
    if not isinstance(model_dir, str | os.PathLike):
        raise TypeError(f"{name} must be a path, got {model_dir!r} ({type(model_dir).__name__})")
    path = Path(model_dir)
    if not path.exists():
        raise FileNotFoundError(f"{name}={str(model_dir)!r} does not exist: give the directory of a model saved "
                                "locally (model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)); nothing "
                                "is downloaded")  # fmt: skip
    if not path.is_dir():
        raise FileNotFoundError(f"{name}={str(model_dir)!r} is a file, not a model directory (the folder holding "
                                "config.json and the tokenizer files)")  # fmt: skip
    return path


def _check_template(template: object) -> tuple[str, str]:
    """(template, the part before ``{label}``); exactly the fields {input} and {label}, in that order."""
    if not isinstance(template, str):
        raise TypeError(f"template must be a string with {{input}} and {{label}}, got {template!r}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ValueError(f"template must be a format string with {{input}} and {{label}}, got {template!r} ({exc})"
                         ) from None  # fmt: skip
    if fields != ["input", "label"]:
        raise ValueError(f"template must hold {{input}} then {{label}}, once each and nothing else in braces, got "
                         f"{template!r}")  # fmt: skip
    return template, template[: template.index("{label}")]


class HFCausalLMPredictor:
    """Label-word classification with a local causal LM (``AutoModelForCausalLM``) through ``transformers``.

    Args:
        model_dir: a directory holding a causal LM and its tokenizer (``save_pretrained``). Loaded with
            ``local_files_only=True``; a missing directory is a ``FileNotFoundError``.
        label_words: one word per class, in class-index order (public: the task's class names). Their
            first tokens (after the whitespace that precedes ``{label}`` in the template) must differ.
        template: one demonstration as text, with ``{input}`` and ``{label}``; the query is the same text
            up to ``{label}``, so the model's next token is read where a label would stand.
        separator: the text between demonstration blocks.
        device: where the model runs (``"cpu"`` by default).

    Inputs are texts (``str``). ``scores`` are the log-probabilities of the label words' first
    tokens, renormalised over the label words; ``predict`` is their argmax (ties: the smallest index).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        label_words: Sequence[str],
        *,
        template: str = DEFAULT_TEMPLATE,
        separator: str = DEFAULT_SEPARATOR,
        device: str = "cpu",
    ) -> None:
        path = check_model_dir(model_dir)
        if isinstance(label_words, str) or not all(isinstance(w, str) and w.strip() for w in label_words):
            raise TypeError(f"label_words must be a list of non-empty strings, one per class, got {label_words!r}")
        words = [w.strip() for w in label_words]
        if len(words) < 2 or len(set(words)) != len(words):
            raise ValueError(f"label_words must hold at least 2 distinct words, got {list(label_words)!r}")
        self.template, self._query_template = _check_template(template)
        if not isinstance(separator, str):
            raise TypeError(f"separator must be a string, got {separator!r}")
        self.separator = separator
        self.label_words = words
        self.n_classes = len(words)
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:  # the optional dependency: say how to get it
            raise ImportError(f"HFCausalLMPredictor needs transformers: pip install 'featuredp[llm]' ({exc})"
                              ) from None  # fmt: skip
        self._torch = torch
        try:
            # Any: transformers' stubs differ between versions and are absent where it is not installed
            self.tokenizer: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            # safetensors only: a pickled pytorch_model.bin runs code when loaded
            model: Any = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, use_safetensors=True)
        except (OSError, ValueError, KeyError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"model_dir={str(model_dir)!r} holds no loadable causal LM and tokenizer: {first}"
                             ) from None  # fmt: skip
        self.model = model.to(device).eval()
        self.device = device
        self.model_dir = str(path)
        config = self.model.config
        self.max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        # The whitespace right before {label} belongs to the label word's token (BPE tokenizers fold a
        # leading space into the word: " positive" is one token, "positive" another), so it is cut from the
        # prompt and put in front of each label word.
        lead = self._query_template[len(self._query_template.rstrip(" ")):]
        ids = []
        for w in words:
            tok = self.tokenizer(lead + w, add_special_tokens=False)["input_ids"]
            if not tok:
                raise ValueError(f"label word {w!r} tokenizes to nothing")
            if self.tokenizer.unk_token_id is not None and tok[0] == self.tokenizer.unk_token_id:
                raise ValueError(f"label word {w!r} is unknown to the tokenizer of {self.model_dir}")
            ids.append(int(tok[0]))
        if len(set(ids)) != len(ids):
            raise ValueError(f"label_words {words!r} must start with different tokens, got token ids {ids}: choose "
                             "words whose first tokens differ")  # fmt: skip
        self.label_token_ids = ids

    def __repr__(self) -> str:
        return f"HFCausalLMPredictor({self.model_dir!r}, label_words={self.label_words!r})"

    def prompt(self, demonstrations: Sequence[Demonstration], query: Any) -> str:
        """The text the model reads: every demonstration block, then the query block up to its label.

        Demonstration labels are class indices, written as their label words.
        """
        labels = check_labels("demonstration labels", [label for _, label in demonstrations], self.n_classes)
        blocks = [self.template.format(input=_text(x), label=self.label_words[int(y)])
                  for (x, _), y in zip(demonstrations, labels)]  # fmt: skip
        blocks.append(self._query_template.format(input=_text(query)))
        return self.separator.join(blocks).rstrip(" ")

    def scores(self, demonstrations: Sequence[Demonstration], query: Any) -> np.ndarray:
        """Log-probabilities over the label words (renormalised), shape ``(n_classes,)``."""
        torch = self._torch
        text = self.prompt(demonstrations, query)
        ids = self.tokenizer(text, return_tensors="pt")["input_ids"]
        if self.max_positions is not None and ids.shape[1] > self.max_positions:
            raise ValueError(f"the prompt has {ids.shape[1]} tokens, more than the model's {self.max_positions}: use "
                             f"fewer shots ({len(demonstrations)} now) or shorter inputs")  # fmt: skip
        with torch.inference_mode():
            logits = self.model(input_ids=ids.to(self.device)).logits[0, -1]
            picked = logits[self.label_token_ids].double()
            return torch.log_softmax(picked, dim=0).cpu().numpy()

    def predict(self, demonstrations: Sequence[Demonstration], query: Any) -> int:
        """The class whose label word the model ranks highest after the prompt."""
        return int(np.argmax(self.scores(demonstrations, query)))

    def scores_batch(self, demonstrations: Sequence[Demonstration], queries: Sequence[Any]) -> np.ndarray:
        """:meth:`scores` of each query (one forward pass each), shape ``(n_queries, n_classes)``."""
        if not len(queries):
            return np.zeros((0, self.n_classes))
        return np.stack([self.scores(demonstrations, q) for q in queries])

    def predict_batch(self, demonstrations: Sequence[Demonstration], queries: Sequence[Any]) -> np.ndarray:
        """:meth:`predict` of each query, shape ``(n_queries,)``."""
        return np.argmax(self.scores_batch(demonstrations, queries), axis=1).astype(np.int64).reshape(-1)


def _text(x: Any) -> str:
    if not isinstance(x, str):
        raise DataValidationError(f"HFCausalLMPredictor reads text inputs, got {type(x).__name__} {x!r:.60}")
    return x
