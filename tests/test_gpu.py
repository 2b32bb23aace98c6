"""The CUDA path, end to end: every method × strategy trains and passes the replay self-test on the GPU, the
noise drawn there has the right scale and tail, σ = 0 with C = ∞ is still plain SGD, a resumed run equals an
uninterrupted one, and the commands run with ``--device cuda``.

All skipped without CUDA (``pytest -m gpu`` on a machine with one). The CPU suite covers the same properties on
the CPU; these tests catch what only a device changes: generators on the wrong device, a tensor left on the
CPU, or kernels whose rounding breaks an exact reduction.
"""

from __future__ import annotations

import copy
import json
import math
import os

import pytest
import torch
from torch import nn

from _fdp_synth import make_tabular
from featuredp.clipping import STRATEGIES
from featuredp.engine import Trainer
from featuredp.features import Columns
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS, get_method
from featuredp.noise import ChaCha20Generator, SecureNoise, TorchNoise
from featuredp.testing import verdict

#: FEATUREDP_TEST_DEVICE=cpu runs these tests' logic on the CPU (to check the tests themselves without a GPU)
DEVICE = os.environ.get("FEATUREDP_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs CUDA")]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 16), nn.Tanh(), nn.Linear(16, 2))


def _trainer(method: str, strategy: str = "ghost", *, secure: bool = False, **kw) -> Trainer:
    record = get_method(method)
    args = dict(steps=4, batch_size=24, progress=False, device=DEVICE)
    if record.private:
        args.update(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5, strategy=strategy, secure_rng=secure)
    if record.needs_feature_map:
        args.update(feature_map=Columns(["sex", "race"]))
    return Trainer(_mlp(), method, **{**args, **kw})


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_every_method_and_strategy_trains_on_the_device(method, strategy):
    if not get_method(method).private and strategy != "ghost":
        pytest.skip("the strategy is a private method's setting")
    t = _trainer(method, strategy)
    res = t.fit(make_tabular(300, seed=1))
    assert res.steps == 4
    assert all(p.device.type == torch.device(DEVICE).type and torch.isfinite(p).all() for p in t.model.parameters())
    assert (0 < res.epsilon < math.inf) if get_method(method).private else res.epsilon in (0.0, math.inf)


@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("method", PRIVATE_METHODS)
def test_replay_self_test_passes_on_the_device(method, strategy, secure):
    reports = _trainer(method, strategy, secure=secure).check_model(make_tabular(200, seed=2), records=2, batch_size=16)
    assert all(r.outcome == "passed" for r in reports), verdict(reports)


@pytest.mark.parametrize("make", [
    lambda: TorchNoise(torch.Generator(device=DEVICE).manual_seed(5)),
    # A fixed key: with OS entropy a 3-standard-error test fails one run in 370 (it did, in CI).
    lambda: SecureNoise(ChaCha20Generator(bytes(range(32)))),
], ids=["torch", "secure"])  # fmt: skip
def test_noise_drawn_on_the_device_has_the_right_scale_and_tail(make):
    n, std = 4_000_000, 1.7
    z = make().add({"w": torch.zeros(n, device=DEVICE)}, std)["w"]
    assert z.device.type == torch.device(DEVICE).type
    z = z.double().cpu()
    # The sample std of 4M normals is within 0.07% of σ (3 standard errors σ/√(2n)); a noise 0.5% too small fails.
    assert abs(z.std().item() / std - 1) < 3 / math.sqrt(2 * n)
    assert abs(z.std().item() / (std * 0.995) - 1) > 3 / math.sqrt(2 * n)
    assert abs(z.mean().item()) < 4 * std / math.sqrt(n)
    # The tail is there: beyond 4σ a normal puts 6.33e-5 of its mass (253 of 4M; ±4 binomial std devs).
    beyond = int((z.abs() > 4 * std).sum())
    assert 253 - 4 * 16 < beyond < 253 + 4 * 16


def test_noise_drawn_ahead_on_the_side_stream_is_the_in_line_noise_bit_for_bit():
    # The worker's draw runs on a CUDA side stream while the step's stream is busy; what the step releases is the
    # in-line draw, bit for bit, every step (the stream discipline: tests/noise/test_prefetch.py).
    from featuredp.noise import sources

    device = torch.device(DEVICE)
    ahead = TorchNoise(torch.Generator(device=device).manual_seed(5), prefetch=True)
    inline = TorchNoise(torch.Generator(device=device).manual_seed(5), prefetch=False)
    streams = []
    real = ahead._normals

    def spy(count, where):
        streams.append(torch.cuda.current_stream(where) if where.type == "cuda" else None)
        return real(count, where)

    ahead._normals = spy
    n = 2 * sources.PREFETCH_MIN
    busy = torch.randn(2048, 2048, device=device)
    for step in range(6):
        sums = {"w": torch.full((n,), float(step), device=device)}
        for _ in range(3):
            busy = busy @ busy / busy.norm()  # the step's own kernels, queued behind or beside the draw
        a, b = ahead.add(sums, 1.5), inline.add(sums, 1.5)
        assert torch.equal(a["w"], b["w"]), step
    if device.type == "cuda":
        side = [s for s in streams[1:] if s is not None]
        assert side and all(s != torch.cuda.default_stream(device) for s in side)


def test_noise_of_two_runs_differs_on_the_device():
    data = make_tabular(300, seed=1)
    a, b = _trainer("dpsgd", seed=None), _trainer("dpsgd", seed=None)
    a.fit(data)
    b.fit(data)
    assert not torch.equal(a.model[0].weight, b.model[0].weight)


def test_dpsgd_without_noise_and_clipping_is_plain_sgd_on_the_device(monkeypatch):
    from featuredp import sampling

    seen: list = []
    original = sampling.PoissonSampler.sample

    def record(self):
        idx = original(self)
        seen.append(idx)
        return idx

    monkeypatch.setattr(sampling.PoissonSampler, "sample", record)
    data = make_tabular(200, seed=1)
    base = _mlp().to(DEVICE)
    model = copy.deepcopy(base)
    Trainer(model, "dpsgd", steps=10, batch_size=20, noise_multiplier=0.0, max_grad_norm=math.inf, lr=0.1,
            momentum=0.9, device=DEVICE, progress=False).fit(data)  # fmt: skip
    ref = copy.deepcopy(base)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    X = torch.as_tensor(data.X, dtype=torch.float32, device=DEVICE)
    y = torch.as_tensor(data.y, device=DEVICE)
    for idx in seen:
        i = torch.as_tensor(idx, device=DEVICE)
        loss = nn.functional.cross_entropy(ref(X[i]), y[i], reduction="sum") / 20
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("secure", [False, True])
def test_resume_equals_uninterrupted_on_the_device(tmp_path, secure, keys_kept_on_resume):
    # every state restored exactly on the device (the re-key of a resume is off here)
    data = make_tabular(240, seed=8)

    def make():
        return _trainer("fdp", secure=secure, steps=None, epochs=2, pretrain_epochs=0.5, seed=9)

    a = make()
    ra = a.fit(data)
    b = make()
    assert b.fit(data, checkpoint=tmp_path / "ck.pt", max_steps=13).stopped_early
    c = make()
    rc = c.fit(data, checkpoint=tmp_path / "ck.pt", resume=True)
    assert rc.epsilon == ra.epsilon and rc.steps == ra.steps
    for (k, v), (_, w) in zip(a.model.state_dict().items(), c.model.state_dict().items()):
        assert torch.equal(v, w), k


def test_train_command_runs_on_the_device(tmp_path, capsys):
    from featuredp.cli import main

    out = tmp_path / "run"
    assert main(["train", "--method", "fdp", "--epsilon", "2", "--epochs", "1", "--device", DEVICE, "--out", str(out),
                 "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["epsilon"] <= 2 + 1e-9
    assert json.loads((out / "run.json").read_text())["config"]["device"].startswith(DEVICE)


def test_diffusion_and_text_quick_runs_on_the_device(tmp_path):
    from featuredp.cli import main

    assert main(["compare", "--task", "diffusion", "--quick", "--device", DEVICE, "--methods", "public,fdp",
                 "--out", str(tmp_path / "diff")]) == 0  # fmt: skip
    assert (tmp_path / "diff" / "fdp" / "result.json").exists()


class _SeesFloat32Mode(nn.Module):
    """A small conv net that records, at every forward, whether TF32 or nondeterministic kernels were allowed."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.head = nn.Conv2d(1, 8, 3, padding=1), nn.Linear(8 * 36, 2)
        self.seen: list[tuple[bool, bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = torch.backends
        self.seen.append((b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.deterministic))
        return self.head(torch.tanh(self.conv(x.reshape(-1, 1, 6, 6))).flatten(1))


def test_private_steps_run_in_exact_float32_and_convolutions_stay_on_the_ghost_path(recwarn):
    if torch.device(DEVICE).type != "cuda":
        pytest.skip("TF32 and cuDNN exist on CUDA only")
    # With cuDNN's default TF32 convolutions two backward passes of one example differed by ~1e-3, so ghost's
    # validation demoted every convolution to torch.func and its separability check refused the U-Net.
    torch.backends.cudnn.allow_tf32 = True
    g = torch.Generator().manual_seed(0)
    data = {"x": torch.randn(200, 36, generator=g), "y": torch.randint(0, 2, (200,), generator=g)}
    model = _SeesFloat32Mode()
    t = Trainer(model, "dpsgd", steps=3, batch_size=32, noise_multiplier=1.0, max_grad_norm=1.0, strategy="ghost",
                device=DEVICE, progress=False)  # fmt: skip
    t.fit(data)
    assert model.seen and all(s == (False, False, True) for s in model.seen)
    assert torch.backends.cudnn.allow_tf32  # restored after the run
    assert not [w for w in recwarn if "torch.func" in str(w.message)]


@pytest.mark.parametrize("method", ["dpsgd", "fdp"])
def test_text_model_trains_on_the_device(tmp_path, capsys, method):
    from featuredp.cli import main

    out = tmp_path / method
    assert main(["train", "--task", "text", "--method", method, "--epsilon", "3", "--epochs", "1",
                 "--text-train-size", "200", "--max-len", "64", "--device", DEVICE, "--out", str(out),
                 "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["epsilon"] <= 3 + 1e-9
