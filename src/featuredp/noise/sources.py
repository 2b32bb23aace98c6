"""Gaussian noise for the private sum, and the secret random sources behind it.

Two sources, one interface (:class:`NoiseSource`):

* :class:`TorchNoise` (the default): float64 uniforms from ``torch.rand`` on the sums'
  device, from a ``torch.Generator`` seeded with 62 secret bits (OS entropy unless the user
  seeded the run). Fast, but the Mersenne Twister is not a cryptographic generator: its state
  can in principle be recovered from enough outputs.
* :class:`SecureNoise` (``secure_rng=True``): a ChaCha20 keystream
  (:class:`ChaCha20Generator`, OpenSSL through the maintained ``cryptography``
  package) keyed with 256 bits from ``os.urandom``.

Both turn uniform 63-bit words into normals with one float64 transform and add them to the sum in float64 before
the result is rounded, once, to the parameters' dtype. The reference transform is :func:`normals_from_words` (three
words per pair); the samplers use :func:`normals_from_words_lazy`, which gives bit-identical outputs from two words
per pair plus a low word only for the pairs whose result it can change (about one pair in 512).

The words, the transform and its cut tail (ARCHITECTURE rule 12: the sampler's support and the δ the engine
adds for it) live in :mod:`featuredp.random_words`, below this package and :mod:`featuredp.sampling`; this module
re-exports them under their old names.

What the float64 noise does and does not do about floating point. Mironov (CCS
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
(Canonne–Kamath–Steinke 2020); the tail bound (:mod:`featuredp.random_words`) treats the uniforms as
exact and does not cover this granularity. Secure mode removes the predictable generator;
neither mode makes the whole computation constant-time.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from featuredp._keys import Uncopyable
from featuredp._validate import check_int, check_nonnegative

# The old import paths (featuredp.noise.sources.ChaCha20Generator, ...) stay valid (``__all__``): the words and the
# transform moved to the bottom module so that featuredp.sampling need not import the noise package.
from featuredp.random_words import (
    BLOCK_PAIRS,
    MAX_RADIUS,
    REFINE_BELOW,
    REFINE_OVERFLOW_BOUND,
    TAIL_MASS_PER_PAIR,
    WORDS_PER_PAIR,
    ChaCha20Generator,
    _draw_normals,
    _Scratch,
    normals_from_words,
    normals_from_words_lazy,
    refinement_words,
)
from featuredp.random_words import _random_words as _random_words  # benchmarks/noise_cost.py reads it from here

__all__ = [
    "BLOCK_PAIRS",
    "MAX_RADIUS",
    "PREFETCH_MAX",
    "REFINE_BELOW",
    "REFINE_OVERFLOW_BOUND",
    "TAIL_MASS_PER_PAIR",
    "WORDS_PER_PAIR",
    "ChaCha20Generator",
    "CorrelatedNoise",
    "NoiseSource",
    "SecureNoise",
    "TorchNoise",
    "add_noise",
    "normals_from_words",
    "normals_from_words_lazy",
    "refinement_words",
]


def _add_in_float64(sums: dict[str, torch.Tensor], z: torch.Tensor, std: float) -> dict[str, torch.Tensor]:
    """``sums`` + ``std``·``z`` (flat float64 normals, consumed), summed in float64, each rounded once to its dtype.

    The results are new tensors: none shares memory with ``z`` or ``sums``.
    """
    out: dict[str, torch.Tensor] = {}
    start = 0
    for k, v in sums.items():
        part = z[start : start + v.numel()].view(v.shape).to(v.device)
        start += v.numel()
        # The sum is widened first, so the only rounding to v's dtype happens after the noise is in.
        # In-place add of v promotes each element to float64 exactly; the copy never aliases z (a reused buffer).
        out[k] = part.mul_(std).add_(v).to(v.dtype, copy=True)
    return out


class NoiseSource(ABC):
    """Adds N(0, std²) to every coordinate of a gradient sum (std = σ·C)."""

    secure: bool = False
    #: The probability that an ideal pair of noise coordinates lies where this source never puts one (its cut
    #: tail; :func:`featuredp.accounting.sampler_tail_delta` turns it into δ). 1.0 unless a source states its
    #: support, so that an unstated one is never taken for an unbounded one.
    tail_mass_per_pair: float = 1.0
    #: What draws the noise and how, for the privacy report.
    description: str = "unstated"

    @abstractmethod
    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``sums`` + noise, as new tensors in the sums' dtypes (the inputs are left unchanged)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The generator state (secret: belongs in the private checkpoint only)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    @abstractmethod
    def rekey(self) -> None:
        """Draw the noise to come from a fresh key (OS entropy), independent of any saved state.

        Called after every resume: a checkpoint that someone else read must not predict the noise after it.
        """


#: the largest draw made ahead (coordinates): a prefetched vector is a float64 copy of the model's size held between
#: steps, so a larger model draws in line (512 MiB of float64 at this bound)
PREFETCH_MAX = 2**26

#: the smallest draw made ahead: below about a millisecond of drawing, a worker costs the step more than it saves (the
#: thread's start and the interpreter lock handed back and forth: measured at 1.4 ms a step for 7k coordinates)
PREFETCH_MIN = 2**16

_PREFETCHING: weakref.WeakSet[_Prefetching] = weakref.WeakSet()


def _finish_all_prefetches() -> None:
    """Before a fork: no noise thread may be mid-draw (the child would inherit a generator in an unknown state)."""
    for source in list(_PREFETCHING):
        source._join()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_finish_all_prefetches)


class _Prefetching(NoiseSource):
    """A source that draws the next step's normals on a worker thread while the step computes (``prefetch=True``).

    The noise does not depend on the data, so the draw after this one can start as soon as this one is used. The
    worker is the only user of the generator while it runs, and it draws exactly what the next in-line call would
    (the same words, in the same order, from the same state), so the released noise is bit for bit the in-line
    noise, whatever the timing. Anything that would make the next call differ (another size or device, std 0,
    a checkpoint, a load, a re-key) first waits for the worker; a draw that is not used puts the generator back
    where the in-line source would be. :meth:`state_dict` is that in-line state, never the one after the draw
    made ahead.

    On CUDA the worker's kernels run on a side stream of their own (a thread's kernels otherwise go to the default
    stream, behind the step's): the step's stream waits for the draw's event only when it uses the draw, and the
    drawn tensor is marked as used by that stream for the allocator. The generator's state (Philox's seed and
    offset) is on the host and advanced at launch, so the words are the in-line call's whatever the streams.
    """

    def __init__(self, prefetch: bool) -> None:
        self.prefetch = bool(prefetch)
        self._thread: threading.Thread | None = None
        # (count, device, normals, the CUDA event after which they are ready: None on the CPU) drawn ahead
        self._ahead: tuple[int, torch.device, torch.Tensor, Any] | None = None
        self._streams: dict[torch.device, Any] = {}  # the side stream of each CUDA device drawn on
        self._before: dict[str, Any] | None = None  # the in-line generator state: before the draw made ahead
        self._failed: BaseException | None = None

    @abstractmethod
    def _normals(self, count: int, device: torch.device) -> torch.Tensor:
        """``count`` float64 N(0, 1) draws on ``device`` from the generator (in line; may be a scratch view)."""

    @abstractmethod
    def _generator_state(self) -> dict[str, Any]:
        """The generator's state (:meth:`state_dict`'s, without the wait)."""

    @abstractmethod
    def _set_generator_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`_generator_state`."""

    def _next(self, count: int, device: torch.device) -> torch.Tensor:
        """The next ``count`` normals: the ones drawn ahead when they are for this call, else drawn now."""
        self._join()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == count and ahead[1] == device:
            self._before = None
            normals, ready = ahead[2], ahead[3]
            if ready is not None:  # drawn on the side stream: this stream waits for it, and the allocator knows
                stream = torch.cuda.current_stream(device)
                stream.wait_event(ready)
                normals.record_stream(stream)
            return normals
        self._rewind()
        return self._normals(count, device)

    def _draw_ahead(self, count: int, device: torch.device) -> None:
        """Start drawing the normals of the next call of the same size, on a worker thread."""
        if not self.prefetch or not PREFETCH_MIN <= count <= PREFETCH_MAX:
            return
        self._before = self._generator_state()
        side = self._side_stream(device)

        def work() -> None:
            try:
                with contextlib.nullcontext() if side is None else torch.cuda.stream(side):
                    # A copy when the draw is a view of the scratch buffer that the next in-line draw would reuse.
                    normals = self._normals(count, device).clone()
                    ready = None
                    if side is not None:
                        ready = torch.cuda.Event()
                        ready.record(side)
                self._ahead = (count, device, normals, ready)
            except BaseException as exc:  # re-raised in the caller's thread at the next use
                self._failed = exc

        # Not a daemon: the interpreter waits for a draw in flight at exit instead of tearing torch down under it.
        self._thread = threading.Thread(target=work, name="featuredp-noise", daemon=False)
        _PREFETCHING.add(self)
        self._thread.start()

    def _side_stream(self, device: torch.device) -> Any:
        """The stream the worker draws on for ``device`` (made once, in the caller's thread); None off CUDA."""
        if device.type != "cuda":
            return None
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def _join(self) -> None:
        """Wait for the worker; re-raise what it raised."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        failed, self._failed = self._failed, None
        if failed is not None:
            self._rewind()
            raise failed

    def _rewind(self) -> None:
        """Drop a draw made ahead and not used: the generator goes back to the in-line state."""
        self._ahead = None
        if self._before is not None:
            before, self._before = self._before, None
            self._set_generator_state(before)

    def _discard(self) -> None:
        """Wait for the worker and drop what it drew (before a load or a re-key)."""
        self._join()
        self._ahead = None
        self._before = None

    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``sums`` + N(0, std²): one flat draw for all tensors, summed in float64, each rounded once to its dtype."""
        std = check_nonnegative("std", std)
        total = sum(int(v.numel()) for v in sums.values())
        if std == 0 or total == 0:
            self._join()
            self._rewind()
            return {k: v.clone() for k, v in sums.items()}
        device = self._device(next(iter(sums.values())).device)
        out = _add_in_float64(sums, self._next(total, device), std)
        self._draw_ahead(total, device)
        return out

    def _device(self, device: torch.device) -> torch.device:
        """Where the normals are drawn for sums on ``device``."""
        return device

    def state_dict(self) -> dict[str, Any]:
        """The generator's state as the in-line source would have it (secret: the private checkpoint only)."""
        self._join()
        return self._before if self._before is not None else self._generator_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self._discard()
        self._set_generator_state(state)


class TorchNoise(_Prefetching):
    """Uniform words from one ``torch.Generator`` through :func:`normals_from_words`, added in float64.

    Fast (see the module docstring for the generator's limits); the uniforms are drawn on the sums' device.
    ``prefetch``: draw the next step's normals on a worker thread while the step computes (the same noise).
    """

    tail_mass_per_pair = TAIL_MASS_PER_PAIR
    description = (
        "torch.Generator 63-bit words (Mersenne Twister on the CPU, Philox on CUDA), float64 Box-Muller with a "
        "126-bit radius uniform (radius <= 13.22), added in float64 and rounded once"
    )

    def __init__(self, generator: torch.Generator, *, prefetch: bool = False) -> None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        super().__init__(prefetch)
        self.generator = generator
        self._scratch = _Scratch()

    def _normals(self, count: int, device: torch.device) -> torch.Tensor:
        return _draw_normals(self._words(device), count, device, self._scratch)

    def _words(self, device: torch.device) -> Callable[[int], torch.Tensor]:
        """``n`` ↦ ``n`` uniform 63-bit words from the generator on ``device`` (see :func:`_random_words`)."""

        def draw(n: int) -> torch.Tensor:
            return self._scratch.get("words", n, torch.int64, device).random_(generator=self.generator)

        return draw

    def _generator_state(self) -> dict[str, Any]:
        return {"torch": self.generator.get_state()}

    def _set_generator_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["torch"])

    def rekey(self) -> None:
        """Re-seed the generator with 63 bits of OS entropy."""
        self._discard()
        self.generator.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


class SecureNoise(_Prefetching):
    """Float64 Gaussians from a :class:`ChaCha20Generator` (:func:`normals_from_words`), added in float64.
    ``prefetch``: as :class:`TorchNoise`'s."""

    secure = True
    tail_mass_per_pair = TAIL_MASS_PER_PAIR
    description = (
        "ChaCha20 CSPRNG 63-bit words, float64 Box-Muller with a 126-bit radius uniform (radius <= 13.22), "
        "added in float64 and rounded once"
    )

    def __init__(self, generator: ChaCha20Generator | None = None, *, prefetch: bool = False) -> None:
        super().__init__(prefetch)
        self.generator = ChaCha20Generator() if generator is None else generator
        if not isinstance(self.generator, ChaCha20Generator):
            raise TypeError(f"generator must be a ChaCha20Generator, got {type(self.generator).__name__}")
        self._scratch = _Scratch()

    def _normals(self, count: int, device: torch.device) -> torch.Tensor:
        return _draw_normals(self.generator.words, count, device, self._scratch)

    def _device(self, device: torch.device) -> torch.device:
        return torch.device("cpu")  # the keystream is made on the CPU; _add_in_float64 moves each part

    def _generator_state(self) -> dict[str, Any]:
        return {"chacha20": self.generator.state_dict()}

    def _set_generator_state(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["chacha20"])

    def rekey(self) -> None:
        """A fresh ChaCha20 key from ``os.urandom``."""
        self._discard()
        self.generator.rekey()


def add_noise(grads: dict[str, torch.Tensor], std: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``grads`` + N(0, std²) per coordinate, drawn from ``generator``, as new tensors (std = σ·C).

    The same draw as :class:`TorchNoise` (the float64 transform, added in float64).
    """
    return TorchNoise(generator).add(grads, std)


class CorrelatedNoise(Uncopyable, NoiseSource):
    """The part that BandMF's and BLT's noise share: w_t = (C⁻¹ z)_t for step t, online, in float64.

    Each call draws z_t ~ N(0, I_dim) from ``source`` (a :class:`~featuredp.noise.TorchNoise` or
    :class:`~featuredp.noise.SecureNoise`: their float64 Box–Muller, their cut tail) and a subclass's recurrence
    turns it into w_t, keeping a few earlier vectors (its ``_buffers``). :meth:`add` adds std·w_t to the sums in
    float64 and rounds once, exactly as the sources add std·z_t.

    ``std`` (σ·C in the Trainer's terms) is fixed by the first :meth:`add` and refused if it changes: the privacy
    analysis is of C x + z with one σ for all steps. ``std = 0`` adds nothing and draws nothing (a non-private run).
    The buffers are secret (they fix part of the next steps' noise): they are in :meth:`state_dict` only, for the
    private checkpoint; the object refuses copies and pickling.
    """

    #: what the mechanism is called in the privacy report
    kind = "correlated"

    def __init__(self, dim: int, source: NoiseSource) -> None:
        self.dim = check_int("dim", dim, minimum=1)
        if not isinstance(source, NoiseSource) or isinstance(source, CorrelatedNoise):
            raise TypeError(f"source must be a featuredp.noise source (TorchNoise, SecureNoise), got "
                            f"{type(source).__name__}")  # fmt: skip
        self.source = source
        self.secure = source.secure
        # The mechanism releases C x + z: the sampler's cut tail is z's, per pair of coordinates, as for DP-SGD.
        self.tail_mass_per_pair = source.tail_mass_per_pair
        self._buffers: torch.Tensor | None = None  # float64, secret
        self._step = 0
        self._std: float | None = None

    @property
    def step(self) -> int:
        """How many noise vectors have been drawn."""
        return self._step

    def _correlate(self, z: torch.Tensor, buffers: torch.Tensor | None) -> torch.Tensor:
        """w_t from z_t (may be consumed) and the buffers, updating the buffers in place."""
        raise NotImplementedError

    def _buffer_rows(self) -> int:
        """How many vectors of length dim the recurrence keeps (0: none)."""
        raise NotImplementedError

    def _params(self) -> dict[str, torch.Tensor]:
        """The public parameters of C, saved with the state so that a resume with other parameters is refused."""
        raise NotImplementedError

    def sample(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The next w_t as a float64 vector of length ``dim`` on ``device`` (secret: it is the step's noise)."""
        dev = torch.device("cpu") if device is None else torch.device(device)
        # The sources' own draw: 0 + 1·z in float64 is z exactly (their add keeps the float64 sum).
        z = self.source.add({"z": torch.zeros(self.dim, dtype=torch.float64, device=dev)}, 1.0)["z"]
        rows = self._buffer_rows()
        if rows and self._buffers is None:
            self._buffers = torch.zeros((rows, self.dim), dtype=torch.float64, device=dev)
        elif self._buffers is not None and self._buffers.device != dev:
            self._buffers = self._buffers.to(dev)
        w = self._correlate(z, self._buffers)
        self._step += 1
        return w

    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``sums`` + std·w_t (one flat draw over all tensors, in order), summed in float64, each rounded once."""
        std = check_nonnegative("std", std)
        total = sum(int(v.numel()) for v in sums.values())
        if total != self.dim:
            raise ValueError(f"sums must hold dim={self.dim} numbers in all, got {total}")
        if self._std is None:
            self._std = std
        elif std != self._std:
            raise ValueError(f"std must stay {self._std!r} for the whole run (one σ for C x + z), got {std!r}")
        if std == 0:
            return {k: v.clone() for k, v in sums.items()}
        w = self.sample(next(iter(sums.values())).device)
        return _add_in_float64(sums, w, std)

    def state_dict(self) -> dict[str, Any]:
        """The source's generator state, the step, the std, C's parameters and the buffers (all secret)."""
        return {
            "source": self.source.state_dict(),
            **self._params(),
            "dim": self.dim,
            "step": self._step,
            "std": self._std,
            "history": (torch.empty(0, dtype=torch.float64) if self._buffers is None
                        else self._buffers.detach().to("cpu").clone()),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; C's parameters and ``dim`` must be this object's."""
        for key, mine in self._params().items():
            saved = state.get(key)
            if saved is None or saved.shape != mine.shape or not torch.equal(saved.to(torch.float64), mine):
                raise ValueError(f"the checkpoint's {self.kind} coefficients differ from this run's ({key}); resume "
                                 "with the same")  # fmt: skip
        if int(state["dim"]) != self.dim:
            raise ValueError(f"the checkpoint's noise dim={int(state['dim'])} differs from this run's dim={self.dim}")
        self.source.load_state_dict(state["source"])
        self._step = int(state["step"])
        self._std = None if state["std"] is None else float(state["std"])
        hist = state["history"]
        self._buffers = None if hist.numel() == 0 else hist.to(torch.float64).clone()

    def rekey(self) -> None:
        """Fresh normals z_t from a re-keyed source; the buffers stay (the correlation with the steps before the
        resume needs them). A checkpoint someone read still tells them the buffered part: hence the refusal of a
        checkpoint left in the shareable run folder (``--accept-legacy-checkpoint``)."""
        self.source.rekey()
