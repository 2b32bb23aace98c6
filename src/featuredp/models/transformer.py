"""A small decoder-only causal language model whose every parameter has a ghost clipping rule.

:class:`CausalTransformer` is GPT-shaped: token and position embeddings, pre-LayerNorm blocks of causal
multi-head self-attention and a GELU MLP, a final LayerNorm and an output head tied to the token
embedding. It is built only from ``nn.Embedding``, ``nn.Linear`` and ``nn.LayerNorm``, so ghost
clipping (``featuredp.clipping.rules``) computes its per-example gradient norms without per-example
gradients; the tied head and token embedding share one parameter, whose norm ghost clipping combines
exactly from the two layers' contributions (``featuredp.clipping.mixed.Mixed``).

Every operation acts on each example alone: attention runs over the positions of one sequence with an
explicit causal mask, positions are looked up with an index tensor of shape (B, L), and there is no
dropout and no cross-example normalisation. With right padding (the text batches of issue 26) padding
never reaches a real position, so an example's logits at its real positions depend on that example's
real tokens alone and no attention padding mask is needed.

>>> m = CausalTransformer(vocab_size=20, max_len=8, d_model=16, n_layers=1, n_heads=2)
>>> m(torch.zeros(3, 5, dtype=torch.long)).shape
torch.Size([3, 5, 20])
>>> m.head.weight is m.tok.weight
True
"""

from __future__ import annotations

import math

import torch
from torch import nn

from featuredp._validate import check_int

__all__ = ["CausalTransformer"]


class _Block(nn.Module):
    """x + attn(LN(x)), then x + MLP(LN(x)): causal multi-head self-attention and a GELU MLP (pre-LN)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, eps: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model, eps=eps)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model, eps=eps)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Causal self-attention of each sequence of x (B, L, d) over its own earlier positions."""
        B, L, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(x).view(B, L, 3, h, d // h).permute(2, 0, 3, 1, 4)  # each (B, h, L, d/h)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // h)  # (B, h, L, L): within one example
        future = torch.ones(L, L, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))  # position t sees positions ≤ t only
        out = torch.matmul(scores.softmax(-1), v)  # (B, h, L, d/h)
        return self.proj(out.transpose(1, 2).reshape(B, L, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output (B, L, d)."""
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class CausalTransformer(nn.Module):
    """A decoder-only causal language model: token ids (B, L) → next-token logits (B, L, vocab_size).

    Parameters
    ----------
    vocab_size:
        Number of token ids (inputs must lie in ``[0, vocab_size)``).
    max_len:
        Longest sequence (number of learned positions).
    d_model, n_layers, n_heads:
        Width, number of blocks, attention heads (``d_model`` must be a multiple of ``n_heads``).
    d_ff:
        Hidden width of each block's MLP; ``None`` means ``4 * d_model``.
    tie_embeddings:
        The output head's weight *is* the token embedding's (one parameter, as in GPT-2); ghost clipping
        handles the shared parameter exactly without falling back to per-example gradients.
    layer_norm_eps:
        LayerNorm's epsilon.

    Weights are drawn N(0, 0.02²) and biases are zero (GPT-2's initialisation) from the global torch
    generator (``featuredp.models.build_model`` seeds it without touching the caller's state).
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int = 128,
        d_model: int = 128,
        n_layers: int = 2,
        n_heads: int = 4,
        d_ff: int | None = None,
        tie_embeddings: bool = True,
        layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=2)
        self.max_len = check_int("max_len", max_len, minimum=1)
        d_model = check_int("d_model", d_model, minimum=1)
        n_layers = check_int("n_layers", n_layers, minimum=0)
        n_heads = check_int("n_heads", n_heads, minimum=1)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
        d_ff = 4 * d_model if d_ff is None else check_int("d_ff", d_ff, minimum=1)
        self.tie_embeddings = bool(tie_embeddings)
        self.tok = nn.Embedding(self.vocab_size, d_model)
        self.pos = nn.Embedding(self.max_len, d_model)
        self.blocks = nn.ModuleList([_Block(d_model, n_heads, d_ff, layer_norm_eps) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.head = nn.Linear(d_model, self.vocab_size, bias=False)
        self._init_weights()
        if self.tie_embeddings:
            self.head.weight = self.tok.weight

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, L, vocab_size) of the next token at every position of the token ids ``x`` (B, L)."""
        if x.dim() != 2 or x.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"x must be integer token ids of shape (B, L), got {x.dtype} {tuple(x.shape)}")
        batch, length = x.shape
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len={self.max_len}")
        # Positions as a (B, L) index: every layer call's first dimension is the batch (ghost rules rely on it).
        positions = torch.arange(length, device=x.device).expand(batch, length)
        h = self.tok(x) + self.pos(positions)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))
