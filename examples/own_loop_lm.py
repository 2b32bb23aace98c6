"""A Hugging Face causal LM with LoRA adapters, trained in your own loop with featuredp's PrivacyEngine.

The loop is the usual one: ``logits = model(x)``, ``criterion(logits.view(-1, V), labels.view(-1))``,
``loss.backward()``, ``optimizer.step()``. The labels are shifted by the collator (the next token, -100 where
there is none), because the engine recomputes each example's loss from the model's output or a reshape of it,
never from a slice. Only the LoRA adapters are trained (and noised).

The model is a small GPT-2 built from a config, so the example needs no download; for a pretrained one load it
with ``featuredp.models.hf.load_causal_lm`` (a local folder, safetensors only). ``HFCausalLM`` passes per-example
position ids so that ghost clipping covers every layer.

    python examples/own_loop_lm.py [--steps 30]
"""

from __future__ import annotations

import argparse
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from featuredp import PrivacyEngine
from featuredp.models.hf import HFCausalLM
from featuredp.models.lora import add_lora


def corpus(n: int, length: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences with a learnable pattern (each token is the previous plus one, mod the vocabulary), and
    their next-token labels (-100 at the last position)."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    x = (start + torch.arange(length)) % vocab
    labels = torch.cat([x[:, 1:], torch.full((n, 1), -100)], dim=1)
    return x, labels


def main(steps: int = 30, n: int = 512, batch: int = 32) -> dict[str, float]:
    """Train LoRA adapters of a 2-layer GPT-2 for ``steps`` private steps; return ε and the held-out loss."""
    from transformers import GPT2Config, GPT2LMHeadModel

    warnings.simplefilter("ignore", UserWarning)
    vocab, length = 64, 16
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=vocab, n_positions=length, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = add_lora(HFCausalLM(GPT2LMHeadModel(config)), rank=4, seed=0)
    x, labels = corpus(n, length, vocab)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    criterion = nn.CrossEntropyLoss(ignore_index=-100)
    engine = PrivacyEngine()
    model, optimizer, criterion, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=DataLoader(TensorDataset(x, labels), batch_size=batch),
        criterion=criterion, noise_multiplier=0.8, max_grad_norm=1.0, grad_sample_mode="ghost", steps=steps)
    done = 0
    while done < steps:
        for xb, yb in loader:
            optimizer.zero_grad()
            logits = model(xb)
            loss = criterion(logits.view(-1, vocab), yb.view(-1))
            loss.backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
    held_x, held_labels = corpus(128, length, vocab, seed=1)
    with torch.no_grad():
        net = model._module
        held = nn.functional.cross_entropy(net(held_x).reshape(-1, vocab), held_labels.reshape(-1), ignore_index=-100)
    eps = engine.get_epsilon(1e-5)
    print(f"{steps} private steps of LoRA on a 2-layer GPT-2: epsilon {eps:.3f} at delta 1e-5, held-out loss "
          f"{float(held):.3f} (uniform guess: {torch.log(torch.tensor(float(vocab))):.3f})")
    return {"epsilon": eps, "held_out_loss": float(held)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    main(steps=parser.parse_args().steps)
