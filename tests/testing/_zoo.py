"""A model zoo for the replay self-test: ordinary models of several kinds and the adversarial ones of issue 23.

Every model reads a tabular batch ``x`` of 7 columns (the synthetic table of ``_fdp_synth.make_tabular``) and
returns 2 logits, so one dataset, loss split and feature map serve them all.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

D_IN, N_CLASSES = 7, 2


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(D_IN, 32), nn.Tanh(), nn.Linear(32, N_CLASSES))


class GroupNormNet(nn.Module):
    """A 1-d convolution over the columns with GroupNorm (per-example normalisation)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4)
        self.head = nn.Linear(4 * D_IN, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.conv(x.unsqueeze(1)))).flatten(1))


class EmbeddingBagNet(nn.Module):
    """Bucketised columns through an embedding, mean-pooled."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 6)
        self.head = nn.Linear(6, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes = (x.clamp(-1.9, 1.9) * 2 + 4).long() + 8 * (torch.arange(D_IN, device=x.device) % 2)
        return self.head(self.emb(codes).mean(1))


class AttentionNet(nn.Module):
    """Self-attention over the columns as tokens (batch_first: per example)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(1, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x.unsqueeze(-1))
        return self.head(self.attn(h, h, h, need_weights=False)[0].mean(1))


class RecurrentNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(1, 8, batch_first=True)
        self.head = nn.Linear(8, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x.unsqueeze(-1))[0][:, -1])


# -- adversarial models (issue 23, finding 1, and the mixing layer of the power tests) ----------------------------


class TrimToLongest(nn.Module):
    """Reads each row as a sequence whose length is its number of nonzero columns, trims the padding to the
    batch's longest, and mean-pools over the trimmed length: one long record changes every other gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(1, 8)
        self.head = nn.Linear(8, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lengths = (x != 0).sum(1)
        longest = int(lengths.max())
        return self.head(torch.tanh(self.embed(x[:, :longest].unsqueeze(-1))).mean(1))


class PlainRunningMean(nn.Module):
    """Centres with a running mean of private batches kept in a plain attribute (not a buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D_IN, N_CLASSES)
        self.mean = torch.zeros(D_IN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mean = 0.9 * self.mean + 0.1 * x.detach().mean(0)
        return self.lin(x - self.mean)


class LateDataWrite(nn.Module):
    """Adds the batch's first feature into a frozen parameter through ``.data`` (no version bump).

    It accumulates over every forward: a plain overwrite kept only the last forward's batch, which is often one of
    the two rows the every-step ghost check recomputes alone (chosen secretly), so the leak showed only by chance.
    """

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D_IN, N_CLASSES)
        self.stash = nn.Parameter(torch.zeros(1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stash.data[0] += x[:, 0].detach().sum()
        return self.lin(x) + 0 * self.stash


class ScaleByBatch(nn.Module):
    """Centres and scales each column by the batch's mean and largest magnitude (a hand-written batch
    normalisation): parameter-free code that mixes the examples."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D_IN, 16)
        self.head = nn.Linear(16, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x - x.mean(0, keepdim=True)) / x.abs().amax(0, keepdim=True).clamp(min=1.0)
        return self.head(torch.tanh(self.lin(z)))


MARKER = 3.0


class MarkerMixer(nn.Module):
    """Mixes only when a marker row (first column exactly ``MARKER``) is in the batch, and only into that row.

    The marker row's hidden features get the batch mean of one hidden feature (its value: no gradient reaches
    the other rows through it). Every other row is computed on its own, so a check that recomputes a few rows
    alone sees it only when it looks at the marker row: the chunk check's power test
    (tests/clipping/test_ghost_chunk_check.py). Not in ADVERSARIAL: it is caught with a probability per step,
    not on every step."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D_IN, 16)
        self.head = nn.Linear(16, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.lin(x))
        marked = (x[:, :1] == MARKER).to(h.dtype)  # zero without a marker row: then nothing is mixed
        # Values only (no gradient reaches the other rows); no data-dependent branch, so torch.func can vmap it.
        return self.head(h + marked * h[:, :1].detach().mean(0, keepdim=True))


ORDINARY: dict[str, Callable[[], nn.Module]] = {
    "mlp": mlp,
    "groupnorm": GroupNormNet,
    "embedding": EmbeddingBagNet,
    "attention": AttentionNet,
    "lstm": RecurrentNet,
}
ADVERSARIAL: dict[str, Callable[[], nn.Module]] = {
    "trim_to_longest": TrimToLongest,
    "running_mean_attribute": PlainRunningMean,
    "late_data_write": LateDataWrite,
    "scale_by_batch": ScaleByBatch,
}
