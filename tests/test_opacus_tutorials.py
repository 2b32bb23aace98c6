"""Opacus's tutorial loops, as published, with only the import changed (issue 43's acceptance).

* ``examples/mnist.py``: ``make_private`` without ``grad_sample_mode`` returns three values (Opacus's default
  ``"hooks"``), the loop builds its own ``nn.CrossEntropyLoss()``;
* "Building an image classifier with differential privacy": ``make_private_with_epsilon``, ``RMSprop``, the loop's
  own criterion, accuracy from ``output.detach().cpu().numpy()``, ``BatchMemoryManager``;
* "Building text classifier with differential privacy" (BERT on SNLI): its three loops (``outputs[0]`` with
  ``BatchMemoryManager``; ghost with the returned criterion on ``outputs[1]``; PEFT LoRA), on a tiny BERT built
  from a config.

On sklearn's digits (8×8 images, offline), with a GroupNorm CNN (what Opacus's ``ModuleValidator.fix`` makes of a
BatchNorm one). The ε must be featuredp's own account of (σ, q, T), and the model must learn.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from featuredp import PrivacyEngine  # was: from opacus import PrivacyEngine
from featuredp.cli import main
from featuredp.utils.batch_memory_manager import BatchMemoryManager  # was: from opacus.utils....

DELTA = 1e-5
EPOCHS = 8


def _digits():
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.long)
    return TensorDataset(x[:1500], y[:1500]), TensorDataset(x[1500:], y[1500:])


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip


def _accuracy(model, loader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, target in loader:
            output = model(images)
            correct += int((output.argmax(1) == target).sum())
            total += len(target)
    return correct / total


def _account(sigma: float, q: float, steps: int, capsys, delta: float = DELTA) -> float:
    assert main(["account", "--noise-multiplier", str(sigma), "--sampling-rate", str(q), "--steps", str(steps),
                 "--delta", str(delta), "--json"]) == 0  # fmt: skip
    return float(json.loads(capsys.readouterr().out)["epsilon"])


def test_the_mnist_example_loop_with_only_the_import_changed(capsys):
    train_set, test_set = _digits()
    train_loader = DataLoader(train_set, batch_size=100)
    model = _cnn()
    optimizer = optim.SGD(model.parameters(), lr=2.0, momentum=0.5)
    privacy_engine = PrivacyEngine(secure_mode=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, train_loader = privacy_engine.make_private(
            module=model, optimizer=optimizer, data_loader=train_loader, noise_multiplier=0.8, max_grad_norm=1.0)
        device = torch.device("cpu")
        for _epoch in range(EPOCHS):  # the example's train(), unchanged
            model.train()
            criterion = nn.CrossEntropyLoss()
            losses = []
            for _batch_idx, (data, target) in enumerate(train_loader):
                data, target = data.to(device), target.to(device)
                optimizer.zero_grad()
                output = model(data)
                loss = criterion(output, target)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        epsilon = privacy_engine.accountant.get_epsilon(delta=DELTA)
    steps = EPOCHS * len(train_loader)
    assert privacy_engine.steps == steps
    assert epsilon == pytest.approx(_account(0.8, 1 / len(train_loader), steps, capsys), rel=0.01)
    # chance is 0.1; 0.26-0.68 over seeds here, and Opacus 1.6 as much in the same loop
    assert _accuracy(model, DataLoader(test_set, batch_size=128)) > 0.2


@pytest.mark.parametrize("max_physical", [16, 1000])
def test_the_image_classifier_tutorial_loop_with_only_the_imports_changed(max_physical, capsys):
    train_set, test_set = _digits()
    train_loader = DataLoader(train_set, batch_size=100)
    test_loader = DataLoader(test_set, batch_size=100)
    model = _cnn()
    optimizer = optim.RMSprop(model.parameters(), lr=5e-3)
    privacy_engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, train_loader = privacy_engine.make_private_with_epsilon(
            module=model, optimizer=optimizer, data_loader=train_loader, epochs=EPOCHS, target_epsilon=8.0,
            target_delta=DELTA, max_grad_norm=1.2)  # fmt: skip

        def accuracy(preds, labels):
            return (preds == labels).mean()

        for _epoch in range(EPOCHS):  # the tutorial's train(), unchanged
            model.train()
            criterion = nn.CrossEntropyLoss()
            losses, top1_acc = [], []
            with BatchMemoryManager(data_loader=train_loader, max_physical_batch_size=max_physical,
                                    optimizer=optimizer) as memory_safe_data_loader:  # fmt: skip
                for _i, (images, target) in enumerate(memory_safe_data_loader):
                    optimizer.zero_grad()
                    output = model(images)
                    loss = criterion(output, target)
                    preds = np.argmax(output.detach().cpu().numpy(), axis=1)
                    labels = target.detach().cpu().numpy()
                    top1_acc.append(accuracy(preds, labels))
                    losses.append(loss.item())
                    loss.backward()
                    optimizer.step()
        epsilon = privacy_engine.get_epsilon(DELTA)
    steps = EPOCHS * len(train_loader)
    assert privacy_engine.steps == steps and epsilon <= 8.0
    assert epsilon == pytest.approx(_account(optimizer.noise_multiplier, 1 / len(train_loader), steps, capsys),
                                    rel=0.01)  # fmt: skip
    assert _accuracy(model, test_loader) > 0.2


def _sentence_pairs(n: int = 240, length: int = 12):
    """SNLI-shaped rows: input_ids, attention_mask, token_type_ids (two segments), a label of three."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (n, length), generator=g)
    ids[:, 0] = 1
    lengths = torch.randint(4, length + 1, (n,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    ids = ids * mask
    segments = (torch.arange(length)[None] >= (lengths[:, None] // 2)).long() * mask
    labels = (ids[:, 1] >= 23).long() + (ids[:, 1] >= 41).long()
    return TensorDataset(ids, mask, segments, labels)


def _tiny_bert() -> nn.Module:
    """BERT for sequence classification (3 labels) built from a config: nothing is downloaded."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=3,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def test_the_text_classifier_tutorial_loop_with_only_the_imports_changed(capsys):
    """"Building text classifier with differential privacy" (BERT on SNLI): the last encoder layer, the pooler and
    the classifier trainable, AdamW over all parameters, ``make_private_with_epsilon`` on a SequentialSampler loader,
    ``BatchMemoryManager``, ``outputs = model(**inputs); loss = outputs[0]``, and its evaluate() under no_grad. A
    tiny BERT built from a config (no download); stock transformers attention (sdpa)."""
    from torch.utils.data import SequentialSampler

    model = _tiny_bert()
    train_dataset = test_dataset = _sentence_pairs()
    trainable_layers = [model.bert.encoder.layer[-1], model.bert.pooler, model.classifier]
    raw = model
    frozen = {k: v.detach().clone() for k, v in model.named_parameters()
              if not any(v is p for layer in trainable_layers for p in layer.parameters())}  # fmt: skip
    head = model.classifier.weight.detach().clone()
    for p in model.parameters():  # the tutorial's cells, unchanged from here
        p.requires_grad = False
    for layer in trainable_layers:
        for p in layer.parameters():
            p.requires_grad = True
    train_dataloader = DataLoader(train_dataset, sampler=SequentialSampler(train_dataset), batch_size=30)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, eps=1e-8)
    privacy_engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, train_dataloader = privacy_engine.make_private_with_epsilon(
            module=model, optimizer=optimizer, data_loader=train_dataloader, target_delta=DELTA, target_epsilon=7.5,
            epochs=2, max_grad_norm=0.1)  # fmt: skip

        def evaluate(model):
            model.eval()
            loss_arr, accuracy_arr = [], []
            for batch in DataLoader(test_dataset, batch_size=60):
                inputs = {"input_ids": batch[0], "attention_mask": batch[1], "token_type_ids": batch[2],
                          "labels": batch[3]}  # fmt: skip
                with torch.no_grad():
                    outputs = model(**inputs)
                    loss, logits = outputs[:2]
                    preds = np.argmax(logits.detach().cpu().numpy(), axis=1)
                    labels = inputs["labels"].detach().cpu().numpy()
                    loss_arr.append(loss.item())
                    accuracy_arr.append((preds == labels).mean())
            model.train()
            return np.mean(loss_arr), np.mean(accuracy_arr)

        for _epoch in range(1, 3):
            losses = []
            with BatchMemoryManager(data_loader=train_dataloader, max_physical_batch_size=8,
                                    optimizer=optimizer) as memory_safe_data_loader:  # fmt: skip
                for _step, batch in enumerate(memory_safe_data_loader):
                    optimizer.zero_grad()
                    inputs = {"input_ids": batch[0], "attention_mask": batch[1], "token_type_ids": batch[2],
                              "labels": batch[3]}  # fmt: skip
                    outputs = model(**inputs)  # output = loss, logits, hidden_states, attentions
                    loss = outputs[0]
                    loss.backward()
                    losses.append(loss.item())
                    optimizer.step()
            eval_loss, eval_accuracy = evaluate(model)
            eps = privacy_engine.get_epsilon(DELTA)
    steps = 2 * len(train_dataloader)
    assert privacy_engine.steps == steps and eps <= 7.5
    assert eps == pytest.approx(_account(optimizer.noise_multiplier, 1 / len(train_dataloader), steps, capsys),
                                rel=0.01)  # fmt: skip
    assert np.isfinite(eval_loss) and 0.0 <= eval_accuracy <= 1.0
    after = dict(raw.named_parameters())
    assert all(torch.equal(after[k], v) for k, v in frozen.items())
    assert not torch.equal(after["classifier.weight"], head)


@pytest.mark.parametrize("variant", ["ghost", "ghost_lora"])
def test_the_text_classifiers_ghost_and_lora_loops_with_only_the_imports_changed(variant, capsys):
    """The same tutorial's fast-gradient-clipping loops: ``grad_sample_mode="ghost"`` with the returned criterion
    on ``outputs[1]`` (the logits of a model called with labels), ``model_gc.to(device)`` after ``make_private``,
    ``DELTA = 1 / len(train_dataloader)``; and PEFT LoRA (``TaskType.SEQ_CLS``, ``lora_dropout=0.05``, the first
    layers frozen)."""
    model = _tiny_bert()
    if variant == "ghost_lora":
        peft = pytest.importorskip("peft")
        lora_config = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, inference_mode=False, r=4, lora_alpha=32,
                                      lora_dropout=0.05)  # fmt: skip
        model = peft.get_peft_model(model, lora_config)
        for param in model.base_model.bert.encoder.layer[:-1].parameters():
            param.requires_grad = False
    else:
        for p in model.parameters():
            p.requires_grad = False
        for layer in [model.bert.encoder.layer[-1], model.bert.pooler, model.classifier]:
            for p in layer.parameters():
                p.requires_grad = True
    raw = model
    before = {k: v.detach().clone() for k, v in raw.named_parameters() if v.requires_grad}
    train_dataloader = DataLoader(_sentence_pairs(), batch_size=30)
    delta = 1 / len(train_dataloader)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, eps=1e-8)
    model = model.train()
    privacy_engine = PrivacyEngine()
    criterion = nn.CrossEntropyLoss(reduction="mean")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model_gc, optimizer_gc, criterion_gc, train_dataloader = privacy_engine.make_private_with_epsilon(
            module=model, optimizer=optimizer, data_loader=train_dataloader, criterion=criterion, target_delta=delta,
            target_epsilon=7.5, epochs=2, max_grad_norm=0.1, grad_sample_mode="ghost")  # fmt: skip
        model_gc = model_gc.to("cpu")
        model_gc = model_gc.train()
        for _epoch in range(1, 3):
            losses = []
            for _step, batch in enumerate(train_dataloader):
                optimizer_gc.zero_grad()
                batch = tuple(t.to("cpu") for t in batch)
                inputs = {"input_ids": batch[0], "attention_mask": batch[1], "token_type_ids": batch[2],
                          "labels": batch[3]}  # fmt: skip
                outputs = model_gc(**inputs)  # output = loss, logits, hidden_states, attentions
                loss = criterion_gc(outputs[1], batch[3])
                loss.backward()
                optimizer_gc.step()
                losses.append(loss.item())
        eps = privacy_engine.get_epsilon(delta)
    steps = 2 * len(train_dataloader)
    assert privacy_engine.steps == steps and eps <= 7.5
    assert eps == pytest.approx(_account(optimizer_gc.noise_multiplier, 1 / len(train_dataloader), steps, capsys,
                                         delta), rel=0.01)  # fmt: skip
    after = dict(raw.named_parameters())
    assert all(not torch.equal(after[k], v) for k, v in before.items())

