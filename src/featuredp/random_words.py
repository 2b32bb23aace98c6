"""Secret random words and the exact transform that turns them into Gaussians: the bottom of the noise.

Two things live here, below both :mod:`featuredp.sampling` (whose secure Poisson sampler draws its coins from the
ChaCha20 keystream) and :mod:`featuredp.noise` (whose sources add the normals to the private sum), so that neither
imports the other for them:

* :class:`ChaCha20Generator`: a ChaCha20 keystream (OpenSSL through the maintained ``cryptography`` package) keyed
  with 256 bits from ``os.urandom``; its 63-bit :meth:`~ChaCha20Generator.words`, 53-bit uniforms and normals;
* the words-to-normals transform: the reference :func:`normals_from_words` (three words per pair) and the exact lazy
  :func:`normals_from_words_lazy` (two words per pair plus a low word only for the pairs whose result it can change,
  about one pair in 512), bit-identical to it, with the cut tail's constants (:data:`TAIL_MASS_PER_PAIR`,
  :data:`MAX_RADIUS`). :mod:`featuredp.noise.sources` re-exports all of it under its old names.

The tail (ARCHITECTURE rule 12). Box–Muller draws a pair of normals from a radius uniform u and
an angle: radius √(−2 ln u). A sampler's smallest u caps the radius, and a value beyond the cap
is one the sampler never produces: with float32 ``torch.randn`` (24-bit uniforms, radius ≤ 5.77)
a release outside that disc around the sum without a record proves the record is in (δ ≥ 1.4e-4
for a claimed (10, 1e-5) at σ = 0.5), and a 53-bit float64 uniform still stops at 8.57. Here u is
a 126-bit uniform on (0, 1] built from two 63-bit words (u = (w₁·2⁶³ + w₂ + 1)·2⁻¹²⁶, rounded to
float64's 53 significant bits), clamped at :data:`TAIL_MASS_PER_PAIR` =
2⁻¹²⁶ whatever the words, so the radius is at most :data:`MAX_RADIUS` ≈ 13.22 by construction and
an ideal pair leaves that disc with probability exactly 2⁻¹²⁶. The engine adds that cut tail to
the reported δ (:func:`featuredp.accounting.sampler_tail_delta`: (1 + e^ε)·pairs·2⁻¹²⁶).

The lazy transform. In float64, w₂ moves u only when w₁ < 2⁵⁴ (u < 2⁻⁹, radius > 3.53): for larger w₁ its term is
below half the spacing of floats at u (proof in :func:`normals_from_words_lazy`). So each block of pairs draws two
words per pair and :func:`refinement_words` low words (≈ 1/64 per pair + 96), and the pairs with w₁ < 2⁵⁴ take
them in order: the output is the reference transform of three independent uniform words, exactly, so the cut tail,
the cap and the δ term are unchanged. Timing: the work per block does not depend on the words (the needing pairs
are gathered into fixed slots, ``nonzero_static``) except on one event: more needing pairs than the budget, of
probability < 2⁻¹⁴⁹ per block (:data:`REFINE_OVERFLOW_BOUND`), when the block draws fresh low words (the result
stays exact). A timing observer learns at most whether that event happened; it is not added to δ: it moves the
view by at most blocks·2⁻¹⁴⁹ in total variation, below 2⁻²³ of the cut tail's term already counted for the same
pairs (blocks·2¹⁷·2⁻¹²⁶ at full blocks). The words: ``random_()`` on an int64 tensor is a 64-bit
output modulo 2⁶³, on the CPU (Mersenne Twister, two 32-bit outputs) and on CUDA (Philox) alike
(ATen's ``uniform_int``; ``tests/test_noise.py`` checks that all 63 bits vary); ChaCha20's are
its keystream's 64-bit words shifted right by one. On the CPU the transform reuses one set of buffers per source
(fresh multi-megabyte tensors cost more than the arithmetic there); results never share them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from featuredp._keys import Uncopyable
from featuredp._validate import check_int

__all__ = [
    "BLOCK_PAIRS",
    "MAX_RADIUS",
    "REFINE_BELOW",
    "REFINE_OVERFLOW_BOUND",
    "TAIL_MASS_PER_PAIR",
    "WORDS_PER_PAIR",
    "ChaCha20Generator",
    "normals_from_words",
    "normals_from_words_lazy",
    "refinement_words",
]

_NOT_COPIED = (
    "ChaCha20Generator holds a secret noise key that must not be copied or pickled: a copy replays the same "
    "noise; to share a privacy budget between processes, share one featuredp.accounting.BudgetLedger(path, ...) "
    "instead"
)
_BLOCK = 64  # bytes of ChaCha20 keystream per block
_COUNTER_SPAN = 1 << 32  # OpenSSL's ChaCha20 counter is 32 bits: never let one call cross its wrap-around

# The Gaussian transform (module docstring, "The tail"): per pair, one 63-bit word for the angle and two for a
# 126-bit radius uniform, so the cut tail is 2⁻¹²⁶ per pair; the δ it adds, (1 + e^ε)·η, stays negligible up to
# ε ≈ 45 for runs of 10¹² noised coordinates.
#: Uniform 63-bit words per pair of normals in the reference transform (:func:`normals_from_words`): the angle's and
#: two for the radius uniform. The samplers draw 2 per pair plus :func:`refinement_words` per block (lazy transform).
WORDS_PER_PAIR = 3
_WORD_BITS = 63
#: The smallest radius uniform the transform produces (it is clamped there): an ideal pair of N(0, 1)
#: coordinates falls beyond :data:`MAX_RADIUS` with exactly this probability (the sampler's cut tail).
TAIL_MASS_PER_PAIR = 2.0 ** -(2 * _WORD_BITS)
#: The largest radius of a pair of normals, √(−2 ln 2⁻¹²⁶) ≈ 13.22 standard deviations.
MAX_RADIUS = math.sqrt(-2.0 * math.log(TAIL_MASS_PER_PAIR))


def normals_from_words(words: torch.Tensor) -> torch.Tensor:
    """``2·pairs`` N(0, 1) draws in float64 from a ``(WORDS_PER_PAIR, pairs)`` int64 tensor of uniform 63-bit words.

    Box–Muller (module docstring): row 0 gives the angle, rows 1 and 2 the radius uniform
    u = (w₁·2⁶³ + w₂ + 1)·2⁻¹²⁶, uniform on a 2⁻¹²⁶ grid of (0, 1] (in float64: its 53 leading bits).
    Output ``i`` and ``i + pairs`` are the two coordinates of pair ``i``; no pair's radius exceeds
    :data:`MAX_RADIUS`. The work is the same for every pair, whatever the words.

    >>> top = 2**63 - 1
    >>> z = normals_from_words(torch.tensor([[top], [0], [0]]))  # the smallest radius uniform: the largest radius
    >>> round(float(z.norm()), 4), round(MAX_RADIUS, 4)
    (13.2164, 13.2164)
    """
    if words.dtype != torch.int64 or words.dim() != 2 or words.shape[0] != WORDS_PER_PAIR:
        raise ValueError(f"words must be int64 of shape ({WORDS_PER_PAIR}, pairs), got {words.dtype} "
                         f"{tuple(words.shape)}")  # fmt: skip
    pairs = words.shape[1]
    # The angle: the word's top 53 bits, a uniform in [0, 1) that float64 holds exactly.
    theta = (words[0] >> (_WORD_BITS - 53)).to(torch.float64).mul_(2.0 * math.pi * 2.0**-53)
    # The radius uniform: w₁·2⁻⁶³ is exact wherever u is small (w₁ < 2⁵³), where the tail is decided;
    # the +1 keeps u > 0, so log never sees 0.
    low = words[2].to(torch.float64).add_(1.0).mul_(2.0 ** -(2 * _WORD_BITS))
    u = words[1].to(torch.float64).mul_(2.0**-_WORD_BITS).add_(low)
    radius = u.clamp_(min=TAIL_MASS_PER_PAIR).log_().mul_(-2.0).sqrt_()  # the cap holds by construction
    out = torch.empty(2 * pairs, dtype=torch.float64, device=words.device)
    torch.mul(radius, torch.cos(theta), out=out[:pairs])
    torch.mul(radius, theta.sin_(), out=out[pairs:])
    return out


def _random_words(generator: torch.Generator, pairs: int, device: torch.device) -> torch.Tensor:
    """``(WORDS_PER_PAIR, pairs)`` uniform 63-bit words from ``generator`` on ``device`` (the reference layout).

    ``random_()`` on int64 is a 64-bit generator output modulo 2⁶³ on the CPU (Mersenne Twister) and on
    CUDA (Philox): ATen's ``uniform_int``.
    """
    return torch.empty((WORDS_PER_PAIR, pairs), dtype=torch.int64, device=device).random_(generator=generator)


# -- The lazy transform: two words per pair, a third only where it can change the result -------------------------
#: A radius word below this (u < 2⁻⁹, radius > 3.53) is the only case where the low word changes u's float64 value.
REFINE_BELOW = 1 << 54
#: Pairs per block of the lazy sampler on the CPU: bounds its reusable buffers (about 10 MiB) for any model size.
BLOCK_PAIRS = 1 << 17
#: The refinement budget's overflow bound (Chernoff): the probability that a block of pairs needs more low words
#: than :func:`refinement_words` draws for it is below this.
REFINE_OVERFLOW_BOUND = 2.0**-149


def refinement_words(pairs: int) -> int:
    """The low radius words drawn with every block of ``pairs`` pairs: enough for all that need one but for
    probability < :data:`REFINE_OVERFLOW_BOUND`.

    A pair needs one with probability exactly 2⁻⁹ (its radius word < 2⁵⁴), so the count is Binomial(pairs, 2⁻⁹)
    with mean μ = pairs/512; R = min(pairs, ⌈pairs/64⌉ + 96) ≥ 8μ, and Chernoff's P(X ≥ R) ≤ (eμ/R)^R ≤
    (e/8)^96 < 2⁻¹⁴⁹ (R = pairs cannot overflow at all).
    """
    pairs = check_int("pairs", pairs, minimum=0)
    return min(pairs, -(-pairs // 64) + 96)


def normals_from_words_lazy(words: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """:func:`normals_from_words` bit for bit, from two words per pair and low words only for pairs that need one.

    ``words`` is ``(2, pairs)`` int64: row 0 the angle word, row 1 the radius uniform's high word w₁ (rows 0 and 1
    of the reference layout). ``low`` holds the low words w₂, one per pair whose w₁ < :data:`REFINE_BELOW` = 2⁵⁴, in
    pair order; extra words are unused. The output equals ``normals_from_words`` of the three rows
    ``(words[0], words[1], w₂)`` where each needing pair's w₂ is its ``low`` word and every other pair's w₂ is ANY
    word, because for those it cannot change the result:

    The reference computes u = fl(a + ℓ) with a = fl(w₁)·2⁻⁶³ (exact scaling of w₁ rounded to 53 bits) and
    ℓ = fl(fl(w₂) + 1)·2⁻¹²⁶ ∈ (0, 2⁻⁶³]. If w₁ ≥ 2⁵⁴ then fl(w₁) ≥ 2⁵⁴ (rounding is monotone and 2⁵⁴ is a
    float), so a ≥ 2⁻⁹, the spacing of floats at a is ≥ 2⁻⁶¹, and 0 < ℓ ≤ 2⁻⁶³ is below half of it: a + ℓ rounds
    to a whatever w₂ is. So with independent uniform words the output has EXACTLY the reference's distribution (a
    126-bit radius uniform on the 2⁻¹²⁶ grid, clamped at :data:`TAIL_MASS_PER_PAIR`, radius ≤ :data:`MAX_RADIUS`),
    the same cut tail, the same δ term. (The boundary 2⁵⁴ rather than 2⁵³ matters: for 2⁵³ ≤ w₁ < 2⁵⁴ the spacing
    is 2⁻⁶² and ℓ = 2⁻⁶³ is a tie that w₂ decides.)

    Constant work: the needing pairs are gathered into ``len(low) + 1`` fixed slots (``nonzero_static``), so no
    size depends on the words; only the refusal below (more needing pairs than ``low`` holds) does.

    >>> top = 2**63 - 1
    >>> z = normals_from_words_lazy(torch.tensor([[top], [0]]), torch.tensor([0]))  # the largest radius
    >>> round(float(z.norm()), 4), round(MAX_RADIUS, 4)
    (13.2164, 13.2164)
    """
    if words.dtype != torch.int64 or words.dim() != 2 or words.shape[0] != 2:
        raise ValueError(f"words must be int64 of shape (2, pairs), got {words.dtype} {tuple(words.shape)}")
    if low.dtype != torch.int64 or low.dim() != 1:
        raise ValueError(f"low must be a 1-d int64 tensor, got {low.dtype} {tuple(low.shape)}")
    out = torch.empty(2 * words.shape[1], dtype=torch.float64, device=words.device)
    if _lazy_into(words, low, out):
        need = int((words[1] < REFINE_BELOW).sum())
        raise ValueError(f"low must hold a word for each of the {need} pairs whose radius word is below 2**54, "
                         f"got {low.numel()}")  # fmt: skip
    return out


class _Scratch:
    """Reusable CPU buffers for the transform, one set per noise source.

    Why: on the CPU a fresh multi-megabyte tensor is a new mapping that is page-faulted in and unmapped again on
    every call, which cost the old transform more than its arithmetic. The buffers hold secret words and noise
    between calls, like the generator state the source already holds (the same process memory). Accelerators get
    fresh tensors (their caching allocators already reuse memory). One source's buffers serve one call at a time,
    as its generator does: a source is not for concurrent use from several threads.
    """

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}

    def get(self, name: str, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised 1-d tensor of ``n`` elements (a view of the buffer ``name`` on the CPU)."""
        if device.type != "cpu":
            return torch.empty(n, dtype=dtype, device=device)
        buf = self._bufs.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            buf = self._bufs[name] = torch.empty(n, dtype=dtype)
        return buf[:n]


def _nonzero_static(mask: torch.Tensor, size: int, fill: int) -> torch.Tensor:
    """The first ``size`` indices where ``mask`` holds, padded with ``fill``: ``torch.nonzero_static`` (fixed work),
    or, where a device's torch lacks it (older CUDA builds), the same result from ``nonzero`` (work that grows with
    the count, tiny next to the transform)."""
    try:
        return torch.nonzero_static(mask, size=size, fill_value=fill).view(-1)
    except (NotImplementedError, RuntimeError):
        idx = mask.nonzero().view(-1)[:size]
        return torch.cat([idx, idx.new_full((size - idx.numel(),), fill)])


def _lazy_into(words: torch.Tensor, low: torch.Tensor, out: torch.Tensor, scratch: _Scratch | None = None) -> int:
    """:func:`normals_from_words_lazy` into ``out``; returns 0, or (``out`` left unwritten) ``len(low) + 1`` when
    more pairs than ``low`` holds need a low word.

    The same float64 operations, in the same order, as :func:`normals_from_words` for every value that reaches the
    output. What is skipped: the low word's term for pairs whose radius word is ≥ 2⁵⁴ (it cannot change u, see
    :func:`normals_from_words_lazy`) and the clamp at 2⁻¹²⁶ for them (u ≥ 2⁻⁹ there; elsewhere u ≥ ℓ ≥ 2⁻¹²⁶ already,
    so the clamp never binds, but it is kept for the slots that can reach it). The needing pairs are found with
    ``nonzero_static`` into ``len(low) + 1`` slots, padded with places past the end (one each): the work is the
    same whatever the words (how many pairs need a word changes only which slots point past the end).
    """
    pairs, dev = words.shape[1], words.device
    s = _Scratch() if scratch is None else scratch
    slots = low.numel()
    need = torch.lt(words[1], REFINE_BELOW, out=s.get("need", pairs, torch.bool, dev))
    where = _nonzero_static(need, slots + 1, pairs)
    if int(where[slots]) != pairs:
        return slots + 1
    # u for every pair, then one place per slot past the end: each padding slot lands on its own place there, so
    # no index repeats (index_copy_ stays deterministic).
    u = s.get("u", pairs + slots, torch.float64, dev)
    u[:pairs].copy_(words[1]).mul_(2.0**-_WORD_BITS)
    if slots:
        at = where[:slots]
        at = torch.where(at == pairs, pairs + torch.arange(slots, device=dev), at)
        high = words[1].index_select(0, at.clamp(max=pairs - 1)).to(torch.float64).mul_(2.0**-_WORD_BITS)
        ell = low.to(torch.float64).add_(1.0).mul_(2.0 ** -(2 * _WORD_BITS))
        u.index_copy_(0, at, high.add_(ell).clamp_(min=TAIL_MASS_PER_PAIR))
    radius = u[:pairs].log_().mul_(-2.0).sqrt_()
    shifted = torch.bitwise_right_shift(words[0], _WORD_BITS - 53, out=s.get("i1", pairs, torch.int64, dev))
    theta = s.get("f1", pairs, torch.float64, dev).copy_(shifted).mul_(2.0 * math.pi * 2.0**-53)
    torch.cos(theta, out=out[:pairs]).mul_(radius)
    torch.sin(theta, out=out[pairs:]).mul_(radius)
    return 0


def _draw_normals(
    draw: Callable[[int], torch.Tensor], count: int, device: torch.device, scratch: _Scratch | None = None
) -> torch.Tensor:
    """``count`` float64 N(0, 1) draws from the 63-bit words ``draw(n)`` returns, block by block (lazy transform).

    Each block of ``b`` pairs takes one draw of ``2b + refinement_words(b)`` words: the angle and high radius
    words, then the low words. Only when a block needs more low words than that (probability < 2⁻¹⁴⁹,
    :data:`REFINE_OVERFLOW_BOUND`) is a second draw of fresh low words made for it; the words are independent
    uniforms, so the output's distribution is the reference transform's exactly either way. With ``scratch`` the
    result is a view of its buffer, valid until the next call.
    """
    pairs = -(-count // 2)
    s = _Scratch() if scratch is None else scratch
    # Large outputs are fresh: a kept buffer would pin a model-sized float64 vector between steps.
    if pairs <= 4 * BLOCK_PAIRS:
        out = s.get("z", 2 * pairs, torch.float64, device)
    else:
        out = torch.empty(2 * pairs, dtype=torch.float64, device=device)
    step = BLOCK_PAIRS if device.type == "cpu" else max(pairs, 1)  # one block on an accelerator: fewer launches
    for start in range(0, pairs, step):
        b = min(step, pairs - start)
        words = draw(2 * b + refinement_words(b))
        main, low = words[: 2 * b].view(2, b), words[2 * b :]
        block = out[2 * start : 2 * (start + b)]
        if _lazy_into(main, low, block, s):  # see REFINE_OVERFLOW_BOUND: the only branch on the words
            main = main.clone()  # draw may refill the buffer that holds these words
            _lazy_into(main, draw(int((main[1] < REFINE_BELOW).sum())), block, s)
    return out[:count]


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


class ChaCha20Generator(Uncopyable):
    """A cryptographically secure generator: the ChaCha20 keystream of a 256-bit key.

    ``key=None`` (the default) draws the key from ``os.urandom`` (the kernel's CSPRNG). A
    given key makes the stream reproducible (tests, or a run the user seeded). The state is the key
    and the number of 64-byte blocks used; :meth:`state_dict` holds the key, so it belongs
    only in the private checkpoint.

    The key never leaves the process by accident: pickling and ``copy``/``deepcopy`` raise
    ``TypeError`` (a copy would replay the same noise), and a process forked from the one that
    keyed the generator re-keys it from ``os.urandom`` before its first byte, so parent and child
    never draw the same stream. Processes that must share one privacy budget share a
    :class:`featuredp.accounting.BudgetLedger`, not a generator.
    """

    _not_copied = _NOT_COPIED

    def __init__(self, key: bytes | None = None) -> None:
        if key is None:
            key = os.urandom(32)
        if not isinstance(key, bytes | bytearray) or len(key) != 32:
            raise ValueError(f"key must be 32 bytes, got {type(key).__name__} of length {len(key)}")
        self._key = bytes(key)
        self._position = 0
        self._pid = os.getpid()  # the process the key belongs to

    def _rekey_after_fork(self) -> None:
        # A forked child inherits the key and position: without this it would emit the parent's next bytes.
        # The child's stream is fresh OS entropy even for a given key (reproducibility ends at the fork).
        pid = os.getpid()
        if pid != self._pid:
            self._key = os.urandom(32)
            self._position = 0
            self._pid = pid

    def bytes(self, n: int) -> bytes:
        """``n`` fresh keystream bytes (whole blocks are consumed; the unused tail is discarded)."""
        n = check_int("n", n, minimum=0)
        self._rekey_after_fork()
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
        """``size`` independent N(0, 1) draws in float64: the lazy transform (:func:`normals_from_words_lazy`,
        block by block) of this stream's 63-bit words (:meth:`words`)."""
        size = check_int("size", size, minimum=0)
        return _draw_normals(self.words, size, torch.device("cpu")).numpy()

    def words(self, n: int) -> torch.Tensor:
        """``n`` uniform 63-bit words (int64): this stream's 64-bit little-endian words shifted right by one."""
        n = check_int("n", n, minimum=0)
        raw = np.frombuffer(self.bytes(8 * n), dtype="<u8") >> np.uint64(64 - _WORD_BITS)
        return torch.from_numpy(raw.astype(np.int64))

    def rekey(self) -> None:
        """A fresh key from ``os.urandom``: the bytes from here on are independent of every earlier state."""
        self._key = os.urandom(32)
        self._position = 0
        self._pid = os.getpid()

    def state_dict(self) -> dict[str, Any]:
        """The key and position (tensors and ints only; secret)."""
        self._rekey_after_fork()  # a forked child saves its own key, never the parent's
        return {"key": torch.frombuffer(bytearray(self._key), dtype=torch.uint8).clone(), "position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        key = bytes(state["key"].to(torch.uint8).tolist())
        if len(key) != 32:
            raise ValueError("a ChaCha20 generator state needs a 32-byte key")
        self._key = key
        self._position = int(state["position"])
        self._pid = os.getpid()  # an explicit restore keys this process

    def __repr__(self) -> str:  # never show the key
        return f"ChaCha20Generator(position={self._position})"
