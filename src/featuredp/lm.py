"""Language-model helpers: per-example token NLL, perplexity, a suffix scorer and a greedy generator.

They work for any model that maps token ids ``(B, L)`` to logits ``(B, L, V)`` (called through
:func:`featuredp.batches.forward`, so a ``takes_batch`` model gets the dict), with the batch layout of
:class:`featuredp.data.text.TextDataset`: inputs ``[BOS, t_1, ...]`` right-padded with PAD, targets
``[t_1, ..., EOS]`` right-padded with ``-100`` (ignored), rows of a fixed length.

* :func:`token_nll` — the per-example loss of a causal LM: mean NLL over the example's own targets (B,);
* :func:`perplexity` — exp(total NLL / number of target tokens) of a whole batch (corpus level);
* :func:`lm_scorer` — ``score(prefixes, suffixes)``: NLL in nats of each suffix's tokens given BOS + prefix
  (the :data:`ScoreFn` audits take: exposure of canaries, span inference);
* :func:`lm_generator` — ``generate(prompt, max_new_tokens)``: greedy continuation (extraction audits).

The three evaluation helpers put the model in eval mode under ``torch.no_grad()`` and restore its mode.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as nnf

from featuredp._validate import check_int
from featuredp.batches import forward
from featuredp.data.text import IGNORE_INDEX, Tokenizer
from featuredp.features.base import Batch

__all__ = ["GenerateFn", "ScoreFn", "lm_generator", "lm_scorer", "perplexity", "token_nll"]

#: ``score(prefixes, suffixes)`` → NLL (nats) of each suffix given its prefix, shape (n,)
ScoreFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]
#: ``generate(prompt, max_new_tokens)`` → the greedy continuation (the prompt not included)
GenerateFn = Callable[[str, int], str]


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per example, the mean NLL (nats) of its targets that are not ``-100``: shape (B,).

    ``logits`` (B, L, V), ``targets`` (B, L). Nothing is mixed across examples (vmap-able). A row with no
    target at all has loss 0 (and gradient 0), rather than 0/0.

    >>> logits = torch.zeros(2, 3, 4)  # uniform over 4 tokens: log 4 per target
    >>> [round(v, 4) for v in token_nll(logits, torch.tensor([[1, 2, -100], [-100, -100, -100]])).tolist()]
    [1.3863, 0.0]
    """
    if logits.dim() != 3 or tuple(targets.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"logits must be (B, L, V) and targets (B, L), got {tuple(logits.shape)} and "
                         f"{tuple(targets.shape)}")  # fmt: skip
    nll = nnf.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")
    count = (targets != IGNORE_INDEX).sum(1).clamp(min=1).to(nll.dtype)
    return nll.sum(1) / count


def _target_key(key: str) -> str:
    if not key.startswith("x"):
        raise ValueError(f"key must name an input key starting with 'x' ('x' or 'x_pub'), got {key!r}")
    return "y" + key[1:]


def _device(model: nn.Module) -> torch.device:
    return next((t.device for t in (*model.parameters(), *model.buffers())), torch.device("cpu"))


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was)


def perplexity(model: nn.Module, batch: Any, *, batch_size: int = 256, key: str = "x") -> float:
    """exp(Σ NLL / Σ tokens) over every target token of ``batch`` (corpus level, not a mean of per-text values).

    ``batch``: a dict of tensors or a dataset with ``batch()`` (a TextDataset); ``key``: ``"x"`` scores the full
    text (targets ``"y"``), ``"x_pub"`` the public view (targets ``"y_pub"``). A batch without any target token
    is a ValueError.
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    data: Batch = batch.batch() if callable(getattr(batch, "batch", None)) else batch
    ykey = _target_key(key)
    for k in (key, ykey):
        if k not in data:
            raise ValueError(f"key={key!r}: the batch has no {k!r} (keys {sorted(data)})")
    x, y = data[key], data[ykey]
    device = _device(model)
    total, count = 0.0, 0
    with _evaluating(model):
        for s in range(0, x.shape[0], batch_size):
            xs, ys = x[s : s + batch_size].to(device), y[s : s + batch_size].to(device)
            logits = forward(model, {"x": xs, "y": ys})
            # per-token NLL in float32 (a float64 copy of a large vocabulary's logits would not fit), summed in float64
            nll = nnf.cross_entropy(logits.transpose(1, 2).float(), ys, ignore_index=IGNORE_INDEX, reduction="none")
            total += float(nll.double().sum())
            count += int((ys != IGNORE_INDEX).sum())
    if count == 0:
        raise ValueError(f"batch: no target tokens in {key!r}/{ykey!r} (every target is -100)")
    return math.exp(total / count)


def lm_scorer(model: nn.Module, tokenizer: Tokenizer, max_len: int, *, batch_size: int = 256) -> ScoreFn:
    """``score(prefixes, suffixes)`` → NLL in nats of each suffix's tokens given BOS + prefix, as float64 (n,).

    Each pair becomes a row as the training data are made: inputs ``[BOS, prefix, suffix]`` (the prefix and the
    suffix encoded separately), targets only at the suffix's tokens (no EOS), right-padded. Rows are scored
    ``batch_size`` at a time, sorted by length and padded to the longest of their chunk. A pair whose suffix
    would not fit in ``max_len`` targets (len(prefix) + len(suffix) > max_len tokens) is a ValueError naming it:
    a cut suffix would be scored silently short. An empty suffix scores 0. Score whole texts with
    ``score([""] * n, texts)``.
    """
    max_len = check_int("max_len", max_len, minimum=2)
    batch_size = check_int("batch_size", batch_size, minimum=1)

    def score(prefixes: Sequence[str], suffixes: Sequence[str]) -> np.ndarray:
        if isinstance(prefixes, str) or isinstance(suffixes, str):
            raise TypeError("prefixes and suffixes must be sequences of strings, not one string")
        if len(prefixes) != len(suffixes):
            raise ValueError(f"prefixes and suffixes must have the same length, got {len(prefixes)} and "
                             f"{len(suffixes)}")  # fmt: skip
        rows: list[tuple[list[int], list[int]]] = []
        for i, (prefix, suffix) in enumerate(zip(prefixes, suffixes)):
            pre, suf = tokenizer.encode(prefix), tokenizer.encode(suffix)
            if len(pre) + len(suf) > max_len:
                raise ValueError(f"suffixes[{i}]: prefix ({len(pre)} tokens) + suffix ({len(suf)} tokens) exceed "
                                 f"max_len={max_len}; the suffix would be cut")  # fmt: skip
            seq = [tokenizer.bos_id, *pre, *suf]
            rows.append((seq[:max_len], [IGNORE_INDEX] * len(pre) + suf))
        out = np.zeros(len(rows), np.float64)
        device = _device(model)
        # Rows of similar length share a chunk, padded only to the chunk's longest: with right padding a causal
        # model's logits at the real positions are the same as at full length (evaluation only, no gradients).
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
        with _evaluating(model):
            for s in range(0, len(rows), batch_size):
                idx = order[s : s + batch_size]
                width = max(1, max(len(rows[i][0]) for i in idx))
                xs = torch.tensor([rows[i][0] + [tokenizer.pad_id] * (width - len(rows[i][0])) for i in idx],
                                  dtype=torch.int64, device=device)  # fmt: skip
                ys = torch.tensor([rows[i][1] + [IGNORE_INDEX] * (width - len(rows[i][1])) for i in idx],
                                  dtype=torch.int64, device=device)  # fmt: skip
                logits = forward(model, {"x": xs, "y": ys})
                nll = nnf.cross_entropy(logits.transpose(1, 2).float(), ys, ignore_index=IGNORE_INDEX,
                                        reduction="none")  # fmt: skip
                out[idx] = nll.double().sum(1).cpu().numpy()
        return out

    return score


def lm_generator(model: nn.Module, tokenizer: Tokenizer, max_len: int, *, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> GenerateFn:  # fmt: skip
    """``generate(prompt, max_new_tokens)`` → the continuation of ``prompt`` (the prompt not included): greedy
    (``temperature`` 0, the default) or sampled at ``temperature`` from ``generator`` (the model is public: its
    samples need no secret randomness).

    The input is ``[BOS, prompt, generated so far]`` (no padding: a causal model's last position never sees
    it); each step appends the most likely token among the tokenizer's vocabulary (or a draw from its softmax).
    Generation stops at EOS (or BOS or PAD, which never occur in text), after ``max_new_tokens`` tokens, or when the
    input is full (``max_len`` tokens: the model never saw a longer context). A prompt that does not fit is a
    ValueError.
    """
    max_len = check_int("max_len", max_len, minimum=2)
    temperature = float(temperature)
    if not temperature >= 0.0 or math.isinf(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    stop = {tokenizer.eos_id, tokenizer.bos_id, tokenizer.pad_id}

    def generate(prompt: str, max_new_tokens: int) -> str:
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
        ids = [tokenizer.bos_id, *tokenizer.encode(prompt)]
        if len(ids) > max_len:
            raise ValueError(f"prompt: {len(ids) - 1} tokens do not fit max_len={max_len} with BOS")
        new: list[int] = []
        device = _device(model)
        with _evaluating(model):
            while len(new) < max_new_tokens and len(ids) <= max_len:
                # no padding after the context: a causal model's last real position does not see it anyway
                x = torch.tensor([ids], dtype=torch.int64, device=device)
                logits = forward(model, {"x": x})
                last = logits[0, len(ids) - 1, : tokenizer.vocab_size].float()
                if temperature == 0.0:
                    token = int(last.argmax())
                else:
                    probs = torch.softmax(last / temperature, dim=0).cpu()
                    token = int(torch.multinomial(probs, 1, generator=generator))
                if token in stop:
                    break
                new.append(token)
                ids.append(token)  # once ids outgrow max_len, the last position has predicted its token
        return tokenizer.decode(new)

    return generate
