"""The noise drawn ahead (on a worker thread, while a step computes) is the noise drawn in line, bit for bit.

Written as an attacker would read a run: if drawing ahead changed which words became which step's noise, skipped
a draw, or reused one, two runs from one key would differ, and a checkpoint would hold a generator state that
predicts noise already released. Every case compares a prefetching source with an in-line one from the same key.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from featuredp.engine import Trainer
from featuredp.noise import sources
from featuredp.noise.sources import ChaCha20Generator, SecureNoise, TorchNoise

KEY = bytes(range(32))


@pytest.fixture(autouse=True)
def _draw_every_size_ahead(monkeypatch):
    """The tests' sizes are small; the bit-for-bit claims hold at every size, so every size is drawn ahead here."""
    monkeypatch.setattr(sources, "PREFETCH_MIN", 1)


def test_a_small_draw_is_made_in_line_and_a_large_one_ahead(monkeypatch):
    monkeypatch.setattr(sources, "PREFETCH_MIN", 4096)
    source = TorchNoise(torch.Generator().manual_seed(0), prefetch=True)
    source.add(_sums(4095), 1.0)
    assert source._thread is None and source._ahead is None
    source.add(_sums(4096), 1.0)
    source._join()
    assert source._ahead is not None


def _sources(kind: str) -> tuple:
    if kind == "torch":
        return (TorchNoise(torch.Generator().manual_seed(7), prefetch=True),
                TorchNoise(torch.Generator().manual_seed(7), prefetch=False))  # fmt: skip
    return SecureNoise(ChaCha20Generator(KEY), prefetch=True), SecureNoise(ChaCha20Generator(KEY), prefetch=False)


def _sums(n: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    return {"w": torch.ones(n // 2, dtype=dtype), "b": torch.zeros(n - n // 2, dtype=dtype)}


@pytest.mark.parametrize("kind", ["torch", "secure"])
def test_every_call_pattern_gives_the_in_line_noise_bit_for_bit(kind):
    ahead, inline = _sources(kind)
    # the same size repeatedly (the draw made ahead is used), a std of 0 (nothing drawn: the draw ahead is taken
    # back), another size (likewise), a float64 sum, a large draw of several blocks, then the first size again
    pattern = [(1000, 1.0), (1000, 2.0), (1000, 0.0), (1000, 1.5), (37, 1.0), (1000, 1.0), (1000, 1.0),
               (70_001, 0.5), (70_001, 0.5), (1000, 3.0)]  # fmt: skip
    for n, std in pattern:
        a, b = ahead.add(_sums(n), std), inline.add(_sums(n), std)
        for k in a:
            assert torch.equal(a[k], b[k]), (n, std, k)
    assert ahead.state_dict().keys() == inline.state_dict().keys()


@pytest.mark.parametrize("kind", ["torch", "secure"])
def test_a_checkpoint_holds_the_in_line_state_not_the_one_after_the_draw_made_ahead(kind):
    ahead, inline = _sources(kind)
    for _ in range(3):
        ahead.add(_sums(500), 1.0)
        inline.add(_sums(500), 1.0)
    saved = ahead.state_dict()  # a draw is ahead now: the state saved must be the one before it
    fresh = _sources(kind)[1]
    fresh.load_state_dict(copy.deepcopy(saved) if kind == "torch" else saved)
    for _ in range(3):
        a, b, c = ahead.add(_sums(500), 1.0), inline.add(_sums(500), 1.0), fresh.add(_sums(500), 1.0)
        assert torch.equal(a["w"], b["w"]) and torch.equal(a["w"], c["w"])


@pytest.mark.parametrize("kind", ["torch", "secure"])
def test_a_rekey_drops_the_draw_made_ahead(kind):
    ahead, _ = _sources(kind)
    ahead.add(_sums(500), 1.0)
    replay = _sources(kind)[1]
    replay.add(_sums(500), 1.0)
    predicted = replay.add(_sums(500), 1.0)  # what the old key gives next (and what was drawn ahead)
    ahead.rekey()
    after = ahead.add(_sums(500), 1.0)
    assert not torch.equal(after["w"], predicted["w"])


@pytest.mark.parametrize(("noise", "secure"), [("independent", False), ("independent", True), ("bandmf", False),
                                               ("blt", False)])  # fmt: skip
def test_a_run_with_noise_drawn_ahead_is_the_run_drawn_in_line(noise, secure, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 6, generator=g)
    data = {"x": x, "y": (x[:, 0] > 0).long()}
    params, states = [], []
    for prefetch in (True, False):
        m = copy.deepcopy(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = Trainer(m, "dpsgd", noise_multiplier=1.0, max_grad_norm=1.0, batch_size=20, steps=8, delta=1e-5,
                        seed=3, secure_rng=secure, noise=noise, prefetch_noise=prefetch, progress=False,
                        strategy="vmap")  # fmt: skip
            t.fit(data, checkpoint=tmp_path / f"{prefetch}.pt", checkpoint_every=3)
        params.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
        states.append(t.run.state.noise.state_dict())
    assert torch.equal(params[0], params[1])
    assert _same(*states)  # the checkpointed generator state is the in-line one


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_a_failure_on_the_worker_is_raised_in_the_step_that_uses_it(monkeypatch):
    source = TorchNoise(torch.Generator().manual_seed(0), prefetch=True)

    def broken(count, device):
        raise RuntimeError("device lost")

    monkeypatch.setattr(source, "_normals", broken)
    source._draw_ahead(100, torch.device("cpu"))  # the worker fails
    with pytest.raises(RuntimeError, match="device lost"):
        source.add(_sums(100), 1.0)


class _Stream:
    """A stand-in for a CUDA stream: what waited on which event, and which thread drew under it."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def wait_event(self, event) -> None:
        self.log.append(("wait", self.name, event.id))


def test_on_cuda_the_draw_ahead_runs_on_a_side_stream_the_step_waits_for_only_when_it_uses_it(monkeypatch):
    # The stream discipline, with CUDA's calls stood in for on the CPU (the real streams: tests/test_gpu.py): the
    # worker draws under its own stream and records an event after the draw; the step's stream waits for that
    # event (and marks the tensor as its own) before it reads the draw, and never for a draw it drops.
    import threading

    log: list = []
    main, side = _Stream("main", log), _Stream("side", log)
    events = iter(range(100))

    class Event:
        def __init__(self) -> None:
            self.id = next(events)

        def record(self, stream) -> None:
            log.append(("record", stream.name, self.id))

    class Inside:
        def __init__(self, stream) -> None:
            self.stream = stream

        def __enter__(self) -> None:
            log.append(("enter", self.stream.name, threading.current_thread().name))

        def __exit__(self, *exc) -> None:
            return None

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", Inside)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: log.append(("owned", stream.name)),
                        raising=False)  # fmt: skip
    ahead, inline = _sources("torch")
    monkeypatch.setattr(ahead, "_side_stream", lambda device: side)
    for n in (1000, 1000, 37, 1000):
        a, b = ahead.add(_sums(n), 1.0), inline.add(_sums(n), 1.0)
        assert all(torch.equal(a[k], b[k]) for k in a)
    ahead._join()
    draws = [e for e in log if e[0] == "enter"]
    assert draws and all(e[1] == "side" and e[2] == "featuredp-noise" for e in draws)
    recorded = [e[2] for e in log if e[0] == "record"]
    waited = [e[2] for e in log if e[0] == "wait"]
    # 4 draws ahead; the 2nd call uses the 1st, the 3rd (another size) drops the 2nd, the 4th drops the 3rd's.
    assert len(recorded) == 4 and waited == [recorded[0]]
    assert log.index(("wait", "main", recorded[0])) < log.index(("owned", "main"))
