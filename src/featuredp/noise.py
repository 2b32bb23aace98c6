"""Gaussian noise for the private sum, and the secret random sources behind it.

Two sources, one interface (:class:`NoiseSource`):

* :class:`TorchNoise` (the default): ``torch.randn`` from a ``torch.Generator``
  seeded with 62 secret bits (OS entropy unless the user seeded the run), drawn
  in the parameters' dtype and added in place. Fast, but the Mersenne Twister is
  not a cryptographic generator: its state can in principle be recovered from
  enough outputs, and a float32 draw has the floating-point weaknesses below.
* :class:`SecureNoise` (``secure_rng=True``): a ChaCha20 keystream
  (:class:`ChaCha20Generator`, OpenSSL through the maintained ``cryptography``
  package) keyed with 256 bits from ``os.urandom``. Gaussians are drawn in
  float64 with the Box–Muller transform from 53-bit uniforms and added to the
  sum in float64 before the result is rounded to the parameters' dtype.

What the secure mode does and does not do about floating point. Mironov (CCS
2012) showed that the textbook floating-point Laplace sampler leaves holes in
the output distribution that reveal the unnoised value; Jin et al. (S&P 2022)
showed the same for Gaussian samplers (Box–Muller and the polar method) used in
DP-SGD, and timing attacks on discrete samplers. Drawing in float64 and adding
in float64 before rounding to float32 means every released coordinate is the
float32 rounding of a float64 sum whose noise has ~2⁻⁵³ relative granularity: the
holes of the float64 noise are about 2²⁹ times finer than the float32 grid the
attacker sees, which is the mitigation Jin et al. recommend short of exact
discrete sampling. It is **not** a proof: the noise is still a floating-point
approximation of N(0, σ²C²), not an exact discrete Gaussian on a grid
(Canonne–Kamath–Steinke 2020), and Box–Muller's tails are truncated at about
√(2·53·ln 2) ≈ 8.6 standard deviations. Secure mode removes the predictable
generator and the float32 holes; it does not make the computation constant-time.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from featuredp._validate import check_int, check_nonnegative

__all__ = ["ChaCha20Generator", "NoiseSource", "SecureNoise", "TorchNoise", "add_noise"]

_BLOCK = 64  # bytes of ChaCha20 keystream per block
_COUNTER_SPAN = 1 << 32  # OpenSSL's ChaCha20 counter is 32 bits: never let one call cross its wrap-around


def _keystream(key: bytes, position: int, n_blocks: int) -> bytes:
    """``n_blocks`` keystream blocks starting at block ``position`` of the stream keyed by ``key``.

    The 128-bit IV is a 32-bit little-endian block counter followed by a 96-bit nonce; the
    position's low 32 bits go into the counter and the rest into the nonce, so every block
    of the 2⁹⁶·2³² block stream is used at most once.
    """
    out = bytearray()
    while n_blocks > 0:
        counter = position % _COUNTER_SPAN
        take = min(n_blocks, _COUNTER_SPAN - counter)
        iv = counter.to_bytes(4, "little") + (position // _COUNTER_SPAN).to_bytes(12, "little")
        enc = Cipher(algorithms.ChaCha20(key, iv), mode=None).encryptor()
        out += enc.update(bytes(take * _BLOCK))
        position += take
        n_blocks -= take
    return bytes(out)


class ChaCha20Generator:
    """A cryptographically secure generator: the ChaCha20 keystream of a 256-bit key.

    ``key=None`` (the default) draws the key from ``os.urandom`` (the kernel's CSPRNG). A
    given key makes the stream reproducible (tests, or a run the user seeded). The state is the key
    and the number of 64-byte blocks used; :meth:`state_dict` holds the key, so it belongs
    only in the private checkpoint.
    """

    def __init__(self, key: bytes | None = None) -> None:
        if key is None:
            key = os.urandom(32)
        if not isinstance(key, bytes | bytearray) or len(key) != 32:
            raise ValueError(f"key must be 32 bytes, got {type(key).__name__} of length {len(key)}")
        self._key = bytes(key)
        self._position = 0

    def bytes(self, n: int) -> bytes:
        """``n`` fresh keystream bytes (whole blocks are consumed; the unused tail is discarded)."""
        n = check_int("n", n, minimum=0)
        blocks = -(-n // _BLOCK)
        out = _keystream(self._key, self._position, blocks)
        self._position += blocks
        return out[:n]

    def random(self, size: int) -> np.ndarray:
        """``size`` uniforms in [0, 1) with 53 random bits each (float64)."""
        size = check_int("size", size, minimum=0)
        words = np.frombuffer(self.bytes(8 * size), dtype="<u8")
        return (words >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))

    def standard_normal(self, size: int) -> np.ndarray:
        """``size`` independent N(0, 1) draws in float64 (Box–Muller, both outputs of each pair used)."""
        size = check_int("size", size, minimum=0)
        pairs = -(-size // 2)
        u = self.random(2 * pairs).reshape(2, pairs)
        # 1 − u lies in (0, 1]: log never sees 0.
        r = np.sqrt(-2.0 * np.log1p(-u[0]))
        theta = (2.0 * math.pi) * u[1]
        out = np.empty(2 * pairs, dtype=np.float64)
        np.multiply(r, np.cos(theta), out=out[:pairs])
        np.multiply(r, np.sin(theta), out=out[pairs:])
        return out[:size]

    def state_dict(self) -> dict[str, Any]:
        """The key and position (tensors and ints only; secret)."""
        return {"key": torch.frombuffer(bytearray(self._key), dtype=torch.uint8).clone(), "position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        key = bytes(state["key"].to(torch.uint8).tolist())
        if len(key) != 32:
            raise ValueError("a ChaCha20 generator state needs a 32-byte key")
        self._key = key
        self._position = int(state["position"])

    def __repr__(self) -> str:  # never show the key
        return f"ChaCha20Generator(position={self._position})"


class NoiseSource(ABC):
    """Adds N(0, std²) to every coordinate of a gradient sum (std = σ·C)."""

    secure: bool = False

    @abstractmethod
    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``sums`` + noise, as new tensors in the sums' dtypes (the inputs are left unchanged)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The generator state (secret: belongs in the private checkpoint only)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class TorchNoise(NoiseSource):
    """``torch.randn`` from one ``torch.Generator`` (fast; see the module docstring for its limits)."""

    def __init__(self, generator: torch.Generator) -> None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self.generator = generator

    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``sums`` + N(0, std²) from ``torch.randn`` in the sums' dtype, on their device."""
        std = check_nonnegative("std", std)
        if std == 0:
            return {k: v.clone() for k, v in sums.items()}
        # Draw, scale and add in place: one temporary per tensor instead of three (same values as v + std·z).
        return {
            k: torch.randn(v.shape, generator=self.generator, dtype=v.dtype, device=v.device).mul_(std).add_(v)
            for k, v in sums.items()
        }

    def state_dict(self) -> dict[str, Any]:
        """The torch generator's state."""
        return {"torch": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.generator.set_state(state["torch"])


class SecureNoise(NoiseSource):
    """Float64 Box–Muller Gaussians from a :class:`ChaCha20Generator`, added in float64."""

    secure = True

    def __init__(self, generator: ChaCha20Generator | None = None) -> None:
        self.generator = ChaCha20Generator() if generator is None else generator
        if not isinstance(self.generator, ChaCha20Generator):
            raise TypeError(f"generator must be a ChaCha20Generator, got {type(self.generator).__name__}")

    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``sums`` + float64 ChaCha20 Gaussians, added in float64 and only then rounded to the sums' dtype."""
        std = check_nonnegative("std", std)
        if std == 0:
            return {k: v.clone() for k, v in sums.items()}
        total = sum(int(v.numel()) for v in sums.values())
        z = torch.from_numpy(self.generator.standard_normal(total))
        out: dict[str, torch.Tensor] = {}
        start = 0
        for k, v in sums.items():
            part = z[start : start + v.numel()].view(v.shape).to(v.device)
            start += v.numel()
            # The sum is widened first, so the only rounding to v's dtype happens after the noise is in.
            out[k] = part.mul_(std).add_(v.to(torch.float64)).to(v.dtype)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The ChaCha20 key and position (secret)."""
        return {"chacha20": self.generator.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.generator.load_state_dict(state["chacha20"])


def add_noise(grads: dict[str, torch.Tensor], std: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``grads`` + N(0, std²) per coordinate, drawn from ``generator``, as new tensors (std = σ·C)."""
    std = check_nonnegative("std", std)
    if std == 0:
        return {k: v.clone() for k, v in grads.items()}
    # Draw, scale and add in place: one temporary per tensor instead of three (same values as v + std·z).
    return {
        k: torch.randn(v.shape, generator=generator, dtype=v.dtype, device=v.device).mul_(std).add_(v)
        for k, v in grads.items()
    }
