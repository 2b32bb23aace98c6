"""Hugging Face causal language models (GPT-2 family) for private fine-tuning, loaded from a local folder only.

:func:`load_causal_lm` reads a model saved with ``save_pretrained`` (any ``AutoModelForCausalLM``; GPT-2 is
the tested family) and its tokenizer from a folder on disk, never from the network, and returns

* :class:`HFCausalLM` — ``model(x)`` with ``x`` (B, L) int64 token ids gives logits (B, L, V), the calling
  convention of featuredp's text batches (docs/text.md): right padding, causal attention, no attention mask
  (padding after an example's end never reaches one of its real positions), and explicit per-example
  position ids, so that every layer sees batch-first inputs and ghost clipping stays exact;
* :class:`HFTokenizer` — the tokenizer interface featuredp's text data layer uses (``encode``, ``decode``,
  ``vocab_size``, ``bos_id``, ``eos_id``, ``pad_id``). Ψ's placeholders (``[EMAIL]``) are ordinary text
  for a BPE tokenizer.

Every dropout probability is set to 0 at load: per-example clipping (ghost's separability check and its
torch.func fallback) needs a forward that is deterministic given the batch.

Ghost clipping has an exact rule for ``transformers.pytorch_utils.Conv1D`` (GPT-2's projections, weight
(in, out)); :func:`register_hf_rules` registers it, and :func:`load_causal_lm` calls it. ``transformers``
is imported only inside these functions, so ``import featuredp.models.hf`` works without it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from featuredp.clipping.contributions import Contribution, Dense, Outer
from featuredp.clipping.rules import RULES, NotPerExampleError, _input, _lead, register_rule

__all__ = ["HFCausalLM", "HFTokenizer", "load_causal_lm", "register_hf_rules", "traceable_attention"]


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # the optional dependency: say how to get it
        raise ImportError(f"Hugging Face models need transformers: pip install 'featuredp[llm]' ({exc})") from None
    return transformers


def _conv1d_rule(
    m: Any, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor, B: int, name: str
) -> dict[str, Contribution]:
    """transformers' Conv1D: y = x W + b with W of shape (in, out), over any number of leading dims."""
    x = _input(args, kwargs, name, "x")
    if x.dim() < 2:
        raise NotPerExampleError(f"layer {name!r} was called without a batch dimension (input {tuple(x.shape)})")
    _lead(x, B, name)
    din, dout = m.weight.shape
    a = x.reshape(B, -1, 1, din)
    g = grad.reshape(B, -1, 1, dout)
    # Outer holds Σ_t g_t a_tᵀ of shape (dout, din), a Linear weight's orientation; Conv1D's weight is the
    # transpose, Σ_t a_t g_tᵀ, which is the same contribution with the roles of input and output gradient swapped.
    out: dict[str, Contribution] = {"weight": Outer(g, a, m.weight.shape)}
    if m.bias is not None:
        out["bias"] = Dense(grad if grad.dim() == 2 else g.sum((1, 2)))
    return out


def register_hf_rules() -> None:
    """Register ghost clipping's rule for ``transformers.pytorch_utils.Conv1D`` (idempotent).

    Without it GPT-2's projections fall back to (slower) torch.func per-example gradients. Call it before
    clipping a transformers model built without :func:`load_causal_lm`.
    """
    conv1d = _transformers().pytorch_utils.Conv1D
    if conv1d not in RULES:
        register_rule(conv1d)(_conv1d_rule)


@contextlib.contextmanager
def traceable_attention(model: nn.Module) -> Iterator[None]:
    """transformers' attention with plain tensor operations for the duration: eager attention in every config of
    ``model``, and masks always materialised (sdpa and the mask shortcuts back after).

    The per-example passes (torch.func's vmap, ghost's fallback for a layer without a rule) trace one example at a
    time, and transformers' mask code decides whether it may skip building a mask by reading the attention mask's
    values (``padding_mask.all()``), which vmap cannot trace. A materialised mask with eager attention computes the
    same function. A model without a ``config._attn_implementation`` is left as it is."""
    configs: dict[int, Any] = {}
    for m in model.modules():
        config: Any = getattr(m, "config", None)
        if isinstance(getattr(config, "_attn_implementation", None), str):
            configs[id(config)] = config
    saved = {k: c._attn_implementation for k, c in configs.items()}
    masks = _mask_module() if configs else None
    shortcuts = {name: getattr(masks, name) for name in _MASK_SHORTCUTS if hasattr(masks, name)}
    try:
        for c in configs.values():
            if c._attn_implementation != "eager":
                c._attn_implementation = "eager"
        for name in shortcuts:
            setattr(masks, name, _never)
        yield
    finally:
        for name, func in shortcuts.items():
            setattr(masks, name, func)
        for k, c in configs.items():
            if c._attn_implementation != saved[k]:
                c._attn_implementation = saved[k]


#: transformers' tests of whether a mask may be skipped (they read the mask's values)
_MASK_SHORTCUTS = ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa")


def _never(*_args: Any, **_kwargs: Any) -> bool:
    return False


def _mask_module() -> Any:
    try:
        from transformers import masking_utils
    except ImportError:  # an older transformers: nothing to patch
        return None
    return masking_utils


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE set for the duration (besides ``local_files_only=True``)."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict.fromkeys(keys, "1"))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _no_dropout(config: Any) -> None:
    """Every float dropout probability of a transformers config (``attn_pdrop``, ``hidden_dropout``, ...) set to 0."""
    for key, value in config.to_dict().items():
        if (key.endswith(("pdrop", "dropout", "dropout_prob", "dropout_rate"))
                and isinstance(value, float) and value > 0):  # fmt: skip
            setattr(config, key, 0.0)


class HFCausalLM(nn.Module):
    """A transformers causal LM called as ``model(x) -> logits``: x (B, L) int64, logits (B, L, V).

    Position ids are passed per example, shape (B, L) (GPT-2 would otherwise look them up with shape
    (1, L), which is not batch-first and would make ghost clipping fall back for the whole model), and no
    attention mask: featuredp's text batches are right-padded, so with causal attention an example's real
    positions never see its padding. The wrapped model is ``self.model``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a transformers causal LM (an nn.Module), got {type(model).__name__}")
        self.model = model
        config = getattr(model, "config", None)
        limit = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
        #: the longest sequence the model has positions for (None: unknown)
        self.max_length: int | None = int(limit) if limit else None
        self._positions = "position_ids" in inspect.signature(model.forward).parameters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, L, V) of the next token at every position of ``x`` (B, L)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.is_floating_point():
            what = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be a (batch, length) tensor of token ids, got {what}")
        B, L = x.shape
        if self.max_length is not None and self.max_length < L:
            raise ValueError(f"x has length {L}, more than the model's {self.max_length} positions: use a shorter "
                             "max length")  # fmt: skip
        kwargs: dict[str, Any] = {"attention_mask": None, "use_cache": False}
        if self._positions:
            kwargs["position_ids"] = torch.arange(L, device=x.device).expand(B, L)
        return self.model(input_ids=x, **kwargs).logits


class HFTokenizer:
    """A transformers tokenizer behind featuredp's text tokenizer interface.

    ``encode`` adds no special tokens (the data layer puts BOS and EOS itself); ``bos_id`` and ``pad_id``
    default to ``eos_id`` where the tokenizer has none (GPT-2's one ``<|endoftext|>``): padding is never a
    target, so its id only has to exist. Placeholders such as ``[EMAIL]`` are text, encoded like any other.

    >>> HFTokenizer("gpt2")
    Traceback (most recent call last):
    ...
    TypeError: tokenizer must be a transformers tokenizer (with encode, decode and eos_token_id), got str
    """

    def __init__(self, tokenizer: Any) -> None:
        if not all(hasattr(tokenizer, a) for a in ("encode", "decode", "eos_token_id")):
            raise TypeError("tokenizer must be a transformers tokenizer (with encode, decode and eos_token_id), "
                            f"got {type(tokenizer).__name__}")  # fmt: skip
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no end-of-sequence token (eos_token_id=None)")
        self.eos_id: int = int(eos)
        self.bos_id: int = self.eos_id if tokenizer.bos_token_id is None else int(tokenizer.bos_token_id)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id: int = self.eos_id if pad is None else int(pad)
        #: ids are in [0, vocab_size): the tokenizer's vocabulary with its added tokens
        self.vocab_size: int = len(tokenizer)

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.tokenizer).__name__}, vocab_size={self.vocab_size})"

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (no special tokens added)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens kept as their strings)."""
        return str(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False))

    def placeholder_id(self, span_type: str) -> int:
        """The one token of ``span_type``'s placeholder (``[EMAIL]``), if the vocabulary has it as a single token.

        A plain BPE vocabulary writes a placeholder as several tokens: ValueError (use ``encode``).
        """
        text = f"[{span_type.upper()}]"
        ids = self.encode(text)
        if len(ids) != 1:
            raise ValueError(f"span_type={span_type!r}: the placeholder {text!r} is {len(ids)} tokens for this "
                             "tokenizer, not one (add it as a token, or encode it as text)")  # fmt: skip
        return ids[0]


def load_causal_lm(
    folder: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32
) -> tuple[HFCausalLM, HFTokenizer]:
    """A causal LM and its tokenizer from a local folder (``save_pretrained``); nothing is downloaded.

    Loaded with ``local_files_only=True`` and ``HF_HUB_OFFLINE=1``, every dropout probability set to 0, in
    ``dtype``; the model is in eval mode with trainable parameters. Ghost clipping's Conv1D rule is registered
    (:func:`register_hf_rules`). A folder that does not exist or holds no ``config.json`` is a ValueError.

    >>> load_causal_lm("/nonexistent/gpt2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: folder='/nonexistent/gpt2' does not exist: give a local folder saved with save_pretrained ...
    """
    if not isinstance(folder, str | os.PathLike):
        raise TypeError(f"folder must be a path, got {type(folder).__name__}")
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"folder={str(folder)!r} does not exist: give a local folder saved with save_pretrained "
                         "(config.json, weights and tokenizer files); nothing is downloaded")  # fmt: skip
    if not (path / "config.json").is_file():
        raise ValueError(f"folder={str(folder)!r} holds no config.json: give a folder saved with save_pretrained")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch dtype, got {dtype!r}")
    transformers = _transformers()
    try:
        with _offline():
            config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
            _no_dropout(config)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                # safetensors only: a pickled pytorch_model.bin runs code when loaded
                str(path), config=config, dtype=dtype, local_files_only=True, use_safetensors=True
            )
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"folder={str(folder)!r} holds no loadable causal LM and tokenizer: {first}") from None
    for m in model.modules():  # dropout a config does not name (hard-coded probabilities)
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
    model.eval()
    register_hf_rules()
    return HFCausalLM(model), HFTokenizer(tokenizer)
