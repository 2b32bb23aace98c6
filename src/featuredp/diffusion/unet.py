"""A class-conditional DDPM U-Net with GroupNorm only (no BatchNorm: it mixes examples and breaks
per-example gradients, docs/engine.md).

The layout follows the usual DDPM U-Net (residual blocks with a time/class embedding added after the
first convolution, optional self-attention at low resolution), sized by a preset:

=============  ===========================  ====================  ==================
preset          channels / mults / blocks     params at 28×28×1     meant for
=============  ===========================  ====================  ==================
``tiny``        16 / (1, 2, 2) / 1            ≈ 0.26 M              CPU (the default)
``small``       32 / (1, 2, 2) / 1            ≈ 1.0 M               CPU, patient
``base``        64 / (1, 2, 2, 2) / 2 + attn  ≈ 8 M                 GPU
``large``       128 / (1, 2, 2, 2) / 2 + attn ≈ 33 M                GPU (paper scale)
=============  ===========================  ====================  ==================

Class conditioning uses ``num_classes + 1`` embeddings; index ``num_classes`` is the "null" class,
used when the label is not public (and for unconditional sampling).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from featuredp._validate import check_choice, check_int

__all__ = ["PRESETS", "UNet", "UNetConfig", "build_unet", "count_parameters"]


@dataclass(frozen=True)
class UNetConfig:
    """Everything needed to rebuild the network (stored in run files)."""

    in_channels: int = 1
    base_channels: int = 16
    channel_mults: tuple[int, ...] = (1, 2, 2)
    num_res_blocks: int = 1
    attention_levels: tuple[int, ...] = ()
    num_classes: int = 10
    dropout: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (tuples as lists); ``UNetConfig(**d)`` rebuilds it (tuples or lists)."""
        d = asdict(self)
        d["channel_mults"] = list(self.channel_mults)
        d["attention_levels"] = list(self.attention_levels)
        return d


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"base_channels": 16, "channel_mults": (1, 2, 2), "num_res_blocks": 1},
    "small": {"base_channels": 32, "channel_mults": (1, 2, 2), "num_res_blocks": 1},
    "base": {"base_channels": 64, "channel_mults": (1, 2, 2, 2), "num_res_blocks": 2, "attention_levels": (2,)},
    "large": {"base_channels": 128, "channel_mults": (1, 2, 2, 2), "num_res_blocks": 2, "attention_levels": (2,)},
}


def _groups(channels: int) -> int:
    # 8 groups when possible; GroupNorm needs the group count to divide the channels
    return math.gcd(8, channels)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of integer timesteps, shape (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return F.pad(emb, (0, 1)) if dim % 2 else emb


class ResBlock(nn.Module):
    """Pre-activation residual block; the time/class embedding is added after the first convolution."""

    def __init__(self, cin: int, cout: int, emb_dim: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(_groups(cin), cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb_dim, cout)
        self.norm2 = nn.GroupNorm(_groups(cout), cout)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """The block's output for features ``x`` (B, C, H, W) and embeddings ``emb`` (B, E)."""
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(F.silu(emb))[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return h + self.skip(x)


class Attention(nn.Module):
    """Residual single-head self-attention over the pixels of one image (no mixing across the batch)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(_groups(channels), channels)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` plus the attention output, same shape."""
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        attn = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / math.sqrt(c), dim=-1)
        out = torch.einsum("bij,bcj->bci", attn, v).reshape(b, c, h, w)
        return x + self.proj(out)


class UNet(nn.Module):
    """ε_θ(x_t, t, y): predicts the noise in ``x_t`` at integer timestep ``t`` for class ``y``.

    ``y`` may be ``None`` (unconditional: the null class) or contain ``num_classes`` (null) entries.
    Any image size works; the up path resizes to the skip connection's size (28 → 14 → 7 → 4 → 7 ...).
    """

    def __init__(self, config: UNetConfig) -> None:
        super().__init__()
        check_int("in_channels", config.in_channels, minimum=1)
        check_int("base_channels", config.base_channels, minimum=1)
        check_int("num_res_blocks", config.num_res_blocks, minimum=1)
        check_int("num_classes", config.num_classes, minimum=1)
        if not config.channel_mults:
            raise ValueError(f"channel_mults must not be empty, got {config.channel_mults!r}")
        self.config = config
        ch = config.base_channels
        emb_dim = 4 * ch
        self.time_mlp = nn.Sequential(nn.Linear(ch, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.class_emb = nn.Embedding(config.num_classes + 1, emb_dim)
        self.conv_in = nn.Conv2d(config.in_channels, ch, 3, padding=1)

        self.down = nn.ModuleList()
        skips = [ch]
        cur = ch
        n_levels = len(config.channel_mults)
        for level, mult in enumerate(config.channel_mults):
            for _ in range(config.num_res_blocks):
                block = nn.ModuleList([ResBlock(cur, ch * mult, emb_dim, config.dropout)])
                cur = ch * mult
                if level in config.attention_levels:
                    block.append(Attention(cur))
                self.down.append(block)
                skips.append(cur)
            if level < n_levels - 1:
                self.down.append(nn.ModuleList([nn.Conv2d(cur, cur, 3, stride=2, padding=1)]))
                skips.append(cur)

        self.mid1 = ResBlock(cur, cur, emb_dim, config.dropout)
        self.mid_attn = Attention(cur) if config.attention_levels else nn.Identity()
        self.mid2 = ResBlock(cur, cur, emb_dim, config.dropout)

        self.up = nn.ModuleList()
        for level, mult in reversed(list(enumerate(config.channel_mults))):
            for _ in range(config.num_res_blocks + 1):
                block = nn.ModuleList([ResBlock(cur + skips.pop(), ch * mult, emb_dim, config.dropout)])
                cur = ch * mult
                if level in config.attention_levels:
                    block.append(Attention(cur))
                self.up.append(block)
            if level > 0:
                self.up.append(nn.ModuleList([nn.Conv2d(cur, cur, 3, padding=1)]))  # after a resize
        self.norm_out = nn.GroupNorm(_groups(cur), cur)
        self.conv_out = nn.Conv2d(cur, config.in_channels, 3, padding=1)
        # the output starts at zero so an untrained model predicts ε = 0 (loss 1), a stable start
        nn.init.zeros_(self.conv_out.weight)
        assert self.conv_out.bias is not None  # built with bias=True above
        nn.init.zeros_(self.conv_out.bias)

    @property
    def null_class(self) -> int:
        """The class index meaning "no label" (unconditional)."""
        return self.config.num_classes

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Predicted noise, same shape as ``x``; ``t`` (B,) int timesteps, ``y`` (B,) labels or None."""
        if y is None:
            y = torch.full((x.shape[0],), self.null_class, dtype=torch.long, device=x.device)
        emb = self.time_mlp(timestep_embedding(t, self.config.base_channels)) + self.class_emb(y)
        h = self.conv_in(x)
        hs = [h]
        for block in _blocks(self.down):
            if isinstance(block[0], ResBlock):
                h = block[0](h, emb)
                for extra in block[1:]:
                    h = extra(h)
            else:
                h = block[0](h)
            hs.append(h)
        h = self.mid2(self.mid_attn(self.mid1(h, emb)), emb)
        for block in _blocks(self.up):
            if isinstance(block[0], ResBlock):
                h = block[0](torch.cat([h, hs.pop()], dim=1), emb)
                for extra in block[1:]:
                    h = extra(h)
            else:  # upsample to the next skip's size, then smooth
                h = block[0](F.interpolate(h, size=hs[-1].shape[-2:], mode="nearest"))
        return self.conv_out(F.silu(self.norm_out(h)))


def _blocks(stages: nn.ModuleList) -> Iterator[nn.ModuleList]:
    """The stages of a path, each a ModuleList (a ResBlock and its attention, or one resampling conv)."""
    # The paths are ModuleLists of ModuleLists (this layout fixes the state_dict keys of saved models);
    # iterating a ModuleList is typed as yielding plain Modules.
    for stage in stages:
        yield cast(nn.ModuleList, stage)


def build_unet(preset: str = "tiny", *, in_channels: int = 1, num_classes: int = 10, **overrides: Any) -> UNet:
    """A U-Net from a named preset (``tiny``, ``small``, ``base``, ``large``) with optional overrides.

    >>> model = build_unet("tiny", base_channels=8, channel_mults=(1, 2))
    >>> x = torch.zeros(2, 1, 8, 8)
    >>> model(x, torch.tensor([0, 5])).shape
    torch.Size([2, 1, 8, 8])
    """
    check_choice("preset", preset, tuple(PRESETS))
    kw = {**PRESETS[preset], **overrides}
    return UNet(UNetConfig(in_channels=in_channels, num_classes=num_classes, **kw))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
