"""Hugging Face causal LMs: loaded offline from a local folder, called batch-first, clipped exactly by ghost.

A tiny random GPT-2 and a byte-level tokenizer are written to a temporary folder (nothing is downloaded) and
loaded with the network blocked. Ghost clipping of the LM's per-example mean token NLL matches per-example
autograd one example at a time (the reference of tests/clipping/test_ghost.py), for full fine-tuning and for
transformers' Conv1D layer on its own; without explicit per-example positions or the Conv1D rule it would
fall back to torch.func.
"""

from __future__ import annotations

import ast
import math
import os
import socket
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as nnf

pytest.importorskip("transformers")

from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer
from transformers.pytorch_utils import Conv1D

from featuredp.clipping import GhostGradients
from featuredp.clipping.rules import RULES
from featuredp.models.hf import HFCausalLM, HFTokenizer, load_causal_lm, register_hf_rules

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clipping"))
from test_ghost import assert_matches, double, single

EOS = 256  # the tokenizer's one special token, after the 256 byte-level characters
TIED = {"model.transformer.wte.weight"}  # lm_head.weight is this parameter


def tiny_gpt2_folder(folder: Path, **config: object) -> Path:
    """A random 2-layer GPT-2 (vocab 300, 64 positions) and a byte-level BPE tokenizer without merges."""
    from tokenizers import pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = EOS
    GPT2Tokenizer(vocab=vocab, merges=[]).save_pretrained(folder)
    torch.manual_seed(0)
    settings = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 300, "n_positions": 64,
                "bos_token_id": EOS, "eos_token_id": EOS, **config}  # fmt: skip
    GPT2LMHeadModel(GPT2Config(**settings)).save_pretrained(folder)
    return folder


def lm_loss(model, batch, draws):
    """Per-example mean token NLL over the targets that are not -100."""
    y = batch["y"]
    nll = nnf.cross_entropy(model(batch["x"]).transpose(1, 2), y, reduction="none", ignore_index=-100)
    mask = y != -100
    return (nll * mask).sum(1) / mask.sum(1).clamp(min=1)


def lm_batch(B: int = 4, L: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded next-token batches of different lengths: x = [BOS, t...], y = [t..., EOS, -100...]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((B, L), EOS)
    y = torch.full((B, L), -100)
    for i in range(B):
        n = int(torch.randint(3, L, (1,), generator=g))
        t = torch.randint(0, 256, (n,), generator=g)
        x[i, 1 : n + 1] = t[: L - 1] if n >= L else t
        y[i, :n] = t
        y[i, n] = EOS
    return {"x": x, "y": y}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tiny_gpt2_folder(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def lm(folder, no_network) -> HFCausalLM:
    return load_causal_lm(folder)[0]


# -- loading ---------------------------------------------------------------------------------------------------


def test_loads_offline_with_the_network_blocked(folder, no_network, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    model, tok = load_causal_lm(folder)
    assert isinstance(model, HFCausalLM) and isinstance(tok, HFTokenizer)
    assert "HF_HUB_OFFLINE" not in os.environ  # set for the call only
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    assert model.max_length == 64
    with pytest.raises(AssertionError, match="network"):  # the block is real
        socket.create_connection(("example.org", 80))


def test_missing_folder_or_config_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"folder=.*nowhere.* does not exist"):
        load_causal_lm(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"folder=.*empty.* holds no config.json"):
        load_causal_lm(tmp_path / "empty")


def test_dropout_is_off_and_dtype_is_honoured(tmp_path, no_network):
    path = tiny_gpt2_folder(tmp_path, attn_pdrop=0.3, resid_pdrop=0.3, embd_pdrop=0.3)
    model, _ = load_causal_lm(path, dtype=torch.float64)
    cfg = model.model.config
    assert (cfg.attn_pdrop, cfg.resid_pdrop, cfg.embd_pdrop) == (0.0, 0.0, 0.0)
    drops = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert drops and all(m.p == 0 for m in drops)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    model.train()  # even in training mode the forward is deterministic
    x = lm_batch()["x"]
    assert torch.equal(model(x), model(x))


# -- the batch-first forward -----------------------------------------------------------------------------------


def test_forward_matches_the_model_and_ignores_right_padding(lm):
    batch = lm_batch()
    x = batch["x"]
    logits = lm(x)
    assert logits.shape == (4, 12, 300)
    torch.testing.assert_close(logits, lm.model(input_ids=x).logits)  # same positions as GPT-2's own
    # Whatever follows a position (padding or not) never changes its logits: causal, no cross-example mixing.
    other = x.clone()
    other[:, 7:] = torch.randint(0, 256, (4, 5))
    torch.testing.assert_close(lm(other)[:, :7], logits[:, :7])
    torch.testing.assert_close(lm(x[1:2]), logits[1:2], rtol=1e-5, atol=1e-5)  # alone = in the batch
    with pytest.raises(ValueError, match="length 65, more than the model's 64"):
        lm(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="x must be a"):
        lm(torch.zeros(3, dtype=torch.long))


def test_tokenizer_interface(folder, no_network):
    tok = load_causal_lm(folder)[1]
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (EOS, EOS, EOS, 257)
    text = "Mail [EMAIL] to Zoë, tel [PHONE]."
    ids = tok.encode(text)
    assert ids and all(0 <= i < tok.vocab_size for i in ids) and EOS not in ids
    assert tok.decode(ids) == text
    assert tok.decode([EOS]) == "<|endoftext|>"
    with pytest.raises(ValueError, match=r"span_type='email'.*7 tokens"):  # placeholders are text here
        tok.placeholder_id("email")
    with pytest.raises(TypeError, match="transformers tokenizer"):
        HFTokenizer(object())


# -- ghost clipping ----------------------------------------------------------------------------------------------


def test_ghost_full_fine_tuning_is_exact(lm):
    """Every parameter trained; per-example norms and clipped sums equal per-example autograd's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tied embedding's fallback says so, and vmap about attention
        strategy = assert_matches(lm, lm_loss, lm_batch(), rtol=1e-4)
    plan = strategy.plan(lm)
    assert not plan.whole_model_fallback  # per-example positions keep every layer batch-first
    # Only the tied input/output embedding may use torch.func: Conv1D, LayerNorm, wpe have exact rules.
    assert set(plan.fallback) <= TIED, plan.fallback_layers


def test_positions_shared_over_the_batch_make_ghost_fall_back(lm):
    """GPT-2's own (1, L) positions are not batch-first: the whole model would fall back (slow), which the
    wrapper's (B, L) positions avoid (previous test)."""

    def shared_positions(model, batch, draws):
        logits = model.model(input_ids=batch["x"], use_cache=False).logits
        y = batch["y"]
        nll = nnf.cross_entropy(logits.transpose(1, 2), y, reduction="none", ignore_index=-100)
        return (nll * (y != -100)).sum(1) / (y != -100).sum(1)

    strategy = GhostGradients()
    with pytest.warns(UserWarning, match="whole model"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(torch.func per-example gradients:|performance drop).*")
        strategy.clipped_sum(lm, shared_positions, lm_batch(), {}, 1.0)
    assert strategy.plan(lm).whole_model_fallback


class Conv1DNet(nn.Module):
    def __init__(self, frozen_bias: bool = False):
        super().__init__()
        self.a = Conv1D(5, 7)  # 7 -> 5
        self.b = Conv1D(3, 5)  # 5 -> 3
        nn.init.normal_(self.a.bias)
        self.a.bias.requires_grad_(not frozen_bias)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


@pytest.mark.parametrize("shape", [(6, 7), (6, 4, 7), (6, 2, 3, 7)])
@pytest.mark.parametrize("passes", ["single", "double"])
@pytest.mark.parametrize("frozen_bias", [False, True])
def test_conv1d_rule_is_exact(shape, passes, frozen_bias):
    register_hf_rules()
    torch.manual_seed(1)
    model = Conv1DNet(frozen_bias)
    x, pad = torch.randn(*shape), torch.randn(*shape)
    strategy = assert_matches(model, single() if passes == "single" else double(), {"x": x}, {"pad": pad})
    assert strategy.fallback_layers == []  # the rule, not torch.func, computed them


def test_conv1d_rule_is_registered_once_and_lazily():
    register_hf_rules()
    register_hf_rules()
    assert Conv1D in RULES
    # featuredp never imports transformers at import time: only inside load_causal_lm / register_hf_rules.
    src = Path(__file__).resolve().parents[2] / "src" / "featuredp"
    for path in (src / "models" / "hf.py", src / "models" / "lora.py", src / "clipping" / "rules.py",
                 src / "clipping" / "contributions.py", src / "clipping" / "mixed.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] == "transformers"], path


def test_clipping_bounds_each_example(lm):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy = GhostGradients()
        batch = lm_batch(6, 10, seed=3)
        one = {k: v[:1] for k, v in batch.items()}
        sums, norms = strategy.clipped_sum(lm, lm_loss, one, {}, 1e-3)
    total = math.sqrt(sum(float(s.double().pow(2).sum()) for s in sums.values()))
    assert float(norms[0]) > 1e-3 and total <= 1e-3 * (1 + 1e-4)


def test_a_folder_with_only_a_pickled_checkpoint_is_refused(tmp_path):
    """pytorch_model.bin is a pickle (loading it may run code): only safetensors weights are read."""
    folder = tiny_gpt2_folder(tmp_path / "m")
    model = GPT2LMHeadModel.from_pretrained(folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")  # the pickled format transformers still reads
    assert (folder / "pytorch_model.bin").is_file() and not list(folder.glob("*.safetensors"))
    with pytest.raises(ValueError, match=r"^folder='.*m' holds no loadable causal LM and tokenizer: ") as info:
        load_causal_lm(folder)
    assert "\n" not in str(info.value) and str(folder) in str(info.value)
