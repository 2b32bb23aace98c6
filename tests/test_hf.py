"""``featuredp.hf.DPTrainer``: Hugging Face's Trainer that samples correctly.

A tiny GPT-2 built from a config (no download) trains through ``DPTrainer``, with and without PEFT LoRA. Written as
an attacker reads a run: the batches are featuredp's secret Poisson draws (Hugging Face's sampler is never asked),
ε is ``featuredp account``'s for the steps run, gradient accumulation is the one-large-batch step, nothing
statistic of a private batch reaches the logs or ``trainer_state.json``, and a resume never takes ε back.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from featuredp.accounting import epsilon_for  # noqa: E402
from featuredp.hf import PRIVACY_FILE, SPENT_FILE, DPTrainer  # noqa: E402

V, L = 50, 12


@pytest.fixture(autouse=True)
def _quiet():
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _gpt2(seed: int = 0) -> torch.nn.Module:
    config = transformers.GPT2Config(vocab_size=V, n_positions=L, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)  # fmt: skip
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(config)


def _records(n: int = 96) -> list[dict[str, torch.Tensor]]:
    """Texts of different lengths, right-padded with the mask and -100 labels a collator writes."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        k = int(torch.randint(3, L, (1,), generator=g))
        ids = torch.randint(1, V, (L,), generator=g)
        mask = (torch.arange(L) < k).long()
        out.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    return out


def _args(tmp_path: Path, name: str = "out", **kw):
    settings = {"per_device_train_batch_size": 8, "num_train_epochs": 1, "learning_rate": 5e-3,
                "report_to": [], "use_cpu": True, "logging_steps": 2, "save_strategy": "no",
                "disable_tqdm": True} | kw  # fmt: skip
    return transformers.TrainingArguments(output_dir=str(tmp_path / name), **settings)


def _train(tmp_path: Path, model=None, *, name: str = "out", train=None, trainer_kw=None, **kw) -> DPTrainer:
    trainer = DPTrainer(model=model or _gpt2(), args=_args(tmp_path, name, **kw), train_dataset=train or _records(),
                        noise_multiplier=1.0, max_grad_norm=1.0, **(trainer_kw or {}))  # fmt: skip
    trainer.train()
    return trainer


def test_a_gpt2_trains_through_dptrainer_and_its_epsilon_is_featuredp_accounts(tmp_path, capsys):
    model = _gpt2()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer = _train(tmp_path, model, num_train_epochs=2)
    draws = 96 // 8  # q = 1/⌈N / logical batch⌉
    assert trainer.engine.steps == trainer.state.global_step == 2 * draws
    assert trainer.privacy.epsilon == pytest.approx(epsilon_for(1.0, 1 / draws, 2 * draws, 1e-5), rel=1e-9)
    assert any(not torch.equal(p, before[k]) for k, p in model.named_parameters())
    # min_new_tokens: the trained weights are random (secret noise), and an early end-of-text token is no failure
    out = trainer.model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, 7)
    assert trainer.privacy.guarantee in capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "privacy.json").read_text())
    assert float(summary["epsilon"]) == pytest.approx(trainer.privacy.epsilon)


def test_dptrainer_never_asks_hugging_faces_sampler(tmp_path, monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("Hugging Face's train sampler was called")

    monkeypatch.setattr(transformers.Trainer, "_get_train_sampler", refuse)
    drawn: list[int] = []
    trainer = DPTrainer(model=_gpt2(), args=_args(tmp_path), train_dataset=_records(), noise_multiplier=1.0,
                        max_grad_norm=1.0)  # fmt: skip
    loader = trainer.get_train_dataloader()
    for batch in loader:  # the engine's secret Poisson draws: sizes vary around the expected 8
        drawn.append(int(batch["input_ids"].shape[0]))
    assert len(drawn) == len(loader) == 12 and len(set(drawn)) > 1
    trainer.engine.close()
    # and a whole training run, through Hugging Face's loop, never asks it either
    again = DPTrainer(model=_gpt2(), args=_args(tmp_path, "again"), train_dataset=_records(), noise_multiplier=1.0,
                      max_grad_norm=1.0)  # fmt: skip
    again.train()
    assert again.engine.steps == again.state.global_step == 12


def test_batches_drawn_by_hand_before_train_are_charged(tmp_path):
    """A hurried loop peeks at the train loader first: those draws are charged (ε counts what was drawn), and
    training still draws its own planned batches."""
    trainer = DPTrainer(model=_gpt2(), args=_args(tmp_path), train_dataset=_records(), noise_multiplier=1.0,
                        max_grad_norm=1.0)  # fmt: skip
    peek = iter(trainer.get_train_dataloader())
    for _ in range(3):
        next(peek)
    del peek
    trainer.train()
    assert trainer.engine.steps == 3 + 12 and trainer.state.global_step == 12
    assert trainer.privacy.epsilon == pytest.approx(epsilon_for(1.0, 1 / 12, 15, 1e-5), rel=1e-9)
    # a resume asked of a trainer whose run has started would be ignored: refused
    started = DPTrainer(model=_gpt2(), args=_args(tmp_path, "started"), train_dataset=_records(),
                        noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    started.get_train_dataloader()
    with pytest.raises(ValueError, match="already started"):
        started.train(resume_from_checkpoint=str(tmp_path / "out"))


def test_a_subclass_with_its_own_sampler_is_refused(tmp_path):
    class Sorted(DPTrainer):
        def _get_train_sampler(self, train_dataset=None):
            return torch.utils.data.SequentialSampler(train_dataset)

    with pytest.raises(TypeError, match=r"Sorted\._get_train_sampler is overridden"):
        Sorted(model=_gpt2(), args=_args(tmp_path), train_dataset=_records(), noise_multiplier=1.0, max_grad_norm=1.0)


@pytest.mark.parametrize(("name", "value"), [
    ("fsdp", "full_shard"), ("deepspeed", "ds.json"), ("fp16", True), ("neftune_noise_alpha", 5.0),
    ("label_smoothing_factor", 0.1), ("auto_find_batch_size", True), ("include_num_input_tokens_seen", "all"),
    ("train_sampling_strategy", "group_by_length"), ("torch_compile", True), ("activation_checkpointing", True),
    ("gradient_checkpointing", True),
])  # fmt: skip
def test_settings_dptrainer_cannot_honour_are_refused_in_one_line(tmp_path, monkeypatch, name, value):
    args = _args(tmp_path)
    monkeypatch.setattr(args, name, value, raising=False)
    with pytest.raises(ValueError, match=rf"TrainingArguments\({name}=") as info:
        DPTrainer(model=_gpt2(), args=args, train_dataset=_records(), noise_multiplier=1.0, max_grad_norm=1.0)
    assert "\n" not in str(info.value)


def test_pushing_checkpoints_with_the_secret_run_state_to_the_hub_is_refused(tmp_path, monkeypatch):
    args = _args(tmp_path)
    monkeypatch.setattr(args, "push_to_hub", True)
    monkeypatch.setattr(args, "hub_strategy", "all_checkpoints")
    with pytest.raises(ValueError, match=r"hub_strategy='all_checkpoints'.*secret"):
        DPTrainer(model=_gpt2(), args=args, train_dataset=_records(), noise_multiplier=1.0, max_grad_norm=1.0)


def test_evaluating_on_the_training_set_is_warned_about(tmp_path):
    from featuredp.errors import PrivacyLeakWarning

    train = _records()
    warnings.simplefilter("always")
    with pytest.warns(PrivacyLeakWarning, match="eval_dataset is train_dataset"):
        DPTrainer(model=_gpt2(), args=_args(tmp_path), train_dataset=train, eval_dataset=train, noise_multiplier=1.0,
                  max_grad_norm=1.0)  # fmt: skip


def test_exactly_one_of_noise_multiplier_and_target_epsilon(tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        DPTrainer(model=_gpt2(), args=_args(tmp_path), train_dataset=_records(), max_grad_norm=1.0)


def test_gradient_accumulation_is_the_one_large_batch_step(tmp_path):
    """4 chunks of 2 rows per draw against 1 chunk of 8, with one fixed secret key: the same Poisson draws, the same
    noise, the same parameters up to float rounding, the same ε."""
    runs = []
    for per_device, accumulate in ((2, 4), (8, 1)):
        model = _gpt2()
        trainer = _train(tmp_path, model, name=f"gas{accumulate}", per_device_train_batch_size=per_device,
                         gradient_accumulation_steps=accumulate, trainer_kw={"privacy_seed": 11})  # fmt: skip
        runs.append((trainer.privacy.epsilon, trainer.engine.steps, dict(model.named_parameters())))
    (eps_a, steps_a, a), (eps_b, steps_b, b) = runs
    assert (eps_a, steps_a) == (eps_b, steps_b) == (eps_b, 12)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_a_different_key_gives_a_different_run(tmp_path):
    """The comparison above can fail: another key draws other batches and other noise."""
    params = []
    for seed in (11, 12):
        model = _gpt2()
        _train(tmp_path, model, name=f"key{seed}", trainer_kw={"privacy_seed": seed})
        params.append(model.transformer.wte.weight.detach().clone())
    assert not torch.allclose(params[0], params[1], atol=1e-6)


def test_nothing_computed_from_a_private_batch_reaches_the_logs(tmp_path):
    trainer = _train(tmp_path, save_strategy="steps", save_steps=6, eval_strategy="steps", eval_steps=6,
                     trainer_kw={"eval_dataset": _records(16)})
    logged = [k for entry in trainer.state.log_history for k in entry]
    assert {"loss", "grad_norm", "train_loss"}.isdisjoint(logged)
    assert "epsilon" in logged and "replacement_epsilon" in logged
    state = json.loads((tmp_path / "out" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["total_flos"] == 0 and all("loss" not in e for e in state["log_history"])


def test_evaluation_during_training_runs_on_the_eval_set(tmp_path):
    trainer = DPTrainer(model=_gpt2(), args=_args(tmp_path, eval_strategy="steps", eval_steps=4),
                        train_dataset=_records(), eval_dataset=_records(16), noise_multiplier=1.0,
                        max_grad_norm=1.0)  # fmt: skip
    trainer.train()
    assert sum("eval_loss" in e for e in trainer.state.log_history) >= 3
    assert trainer.engine.steps == 12  # evaluation draws nothing and charges nothing


def test_bf16_trains_with_the_same_accounting(tmp_path):
    model = _gpt2()
    before = model.transformer.wte.weight.detach().clone()
    trainer = _train(tmp_path, model, bf16=True)
    assert trainer.engine.steps == 12 and not torch.equal(before, model.transformer.wte.weight)
    assert trainer.privacy.epsilon == pytest.approx(epsilon_for(1.0, 1 / 12, 12, 1e-5), rel=1e-9)


def test_a_resume_continues_the_accounting_and_an_older_checkpoint_never_takes_it_back(tmp_path):
    first = _train(tmp_path, num_train_epochs=2, save_strategy="steps", save_steps=8)
    assert first.engine.steps == 24
    out = tmp_path / "out"
    assert (out / "checkpoint-8" / PRIVACY_FILE).exists() and json.loads((out / SPENT_FILE).read_text())

    # A resume of the last checkpoint: the run is finished; nothing more is charged.
    again = DPTrainer(model=_gpt2(), args=_args(tmp_path, num_train_epochs=2, save_strategy="steps", save_steps=8),
                      train_dataset=_records(), noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    again.train(resume_from_checkpoint=str(out / "checkpoint-24"))
    assert again.engine.steps == 24 and again.privacy.epsilon == pytest.approx(first.privacy.epsilon)

    # checkpoint-8 is older than what ran (24 steps): all 24 stay charged, plus the 16 run again.
    older = DPTrainer(model=_gpt2(), args=_args(tmp_path, num_train_epochs=2, save_strategy="steps", save_steps=8),
                      train_dataset=_records(), noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    with pytest.warns(UserWarning, match="all 24 stay charged"):
        warnings.simplefilter("always")
        older.train(resume_from_checkpoint=str(out / "checkpoint-8"))
    assert older.engine.steps == 24 + 16
    assert older.privacy.epsilon == pytest.approx(epsilon_for(1.0, 1 / 12, 40, 1e-5), rel=1e-9)


def test_a_crash_after_the_last_checkpoint_stays_charged(tmp_path):
    """The spent record is current at every draw: steps run after the last save count after a resume."""
    trainer = DPTrainer(model=_gpt2(), args=_args(tmp_path, save_strategy="steps", save_steps=4),
                        train_dataset=_records(), noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip

    class Crash(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 7:
                raise KeyboardInterrupt

    trainer.add_callback(Crash())
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    resumed = DPTrainer(model=_gpt2(), args=_args(tmp_path, save_strategy="steps", save_steps=4),
                        train_dataset=_records(), noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))
    assert resumed.engine.steps == 7 + (12 - 4)


def test_a_new_run_does_not_overwrite_another_runs_output_dir(tmp_path):
    _train(tmp_path, save_strategy="steps", save_steps=6)
    with pytest.raises(ValueError, match="holds another private run"):
        _train(tmp_path)


def test_a_checkpoint_not_written_by_dptrainer_cannot_resume(tmp_path):
    plain = transformers.Trainer(model=_gpt2(), args=_args(tmp_path, name="plain", save_strategy="steps",
                                                           save_steps=6, max_steps=6), train_dataset=_records())
    plain.train()
    trainer = DPTrainer(model=_gpt2(), args=_args(tmp_path, name="dp"), train_dataset=_records(),
                        noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    with pytest.raises(ValueError, match=f"has no {PRIVACY_FILE}"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "plain" / "checkpoint-6"))


def test_a_second_train_call_is_refused(tmp_path):
    trainer = _train(tmp_path)
    with pytest.raises(ValueError, match="one DPTrainer is one private run"):
        trainer.train()


def test_target_epsilon_is_met_for_the_planned_steps(tmp_path):
    trainer = DPTrainer(model=_gpt2(), args=_args(tmp_path, num_train_epochs=2), train_dataset=_records(),
                        target_epsilon=3.0, target_delta=1e-5, max_grad_norm=1.0)  # fmt: skip
    trainer.train()
    assert trainer.engine.steps == 24
    assert 2.9 < trainer.privacy.epsilon <= 3.0 + 1e-9


@pytest.mark.parametrize("mode", ["ghost", "vmap"])
def test_peft_lora_trains_through_dptrainer_and_generates(tmp_path, mode):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_gpt2(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"],
                                                         lora_dropout=0.0, fan_in_fan_out=True))  # fmt: skip
    frozen = {k: v.detach().clone() for k, v in model.named_parameters() if not v.requires_grad}
    adapters = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    trainer = _train(tmp_path, model, trainer_kw={"grad_sample_mode": mode})
    after = dict(model.named_parameters())
    assert all(torch.equal(after[k], v) for k, v in frozen.items())
    assert all(not torch.equal(after[k], v) for k, v in adapters.items())
    assert trainer.privacy.epsilon == pytest.approx(epsilon_for(1.0, 1 / 12, 12, 1e-5), rel=1e-9)
    assert model.generate(input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False).shape == (1, 5)


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("mode", ["ghost", "functorch"])
def test_a_stock_gpt2_trains_in_the_users_loop_through_outputs_loss(mode, lora):
    """``outputs = model(**batch); outputs.loss.backward()`` on a stock GPT-2 (sdpa attention, attention mask,
    -100 labels), with and without PEFT LoRA: ε is ``featuredp account``'s, ``generate()`` works afterwards, and the
    user's model keeps its own attention (the engine's per-example passes run eager attention)."""
    from torch.utils.data import DataLoader

    from featuredp import PrivacyEngine

    model = _gpt2()
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"],
                                                           lora_dropout=0.0, fan_in_fan_out=True))  # fmt: skip
    attention = model.config._attn_implementation
    before = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    engine = PrivacyEngine()
    out = engine.make_private(module=model, optimizer=torch.optim.SGD([p for p in model.parameters()
                              if p.requires_grad], lr=0.1), data_loader=DataLoader(_records(32), batch_size=8),
                              noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode)  # fmt: skip
    m, o, loader = out[0], out[1], out[-1]
    for batch in loader:
        o.zero_grad()
        m(**batch).loss.backward()
        o.step()
    assert engine.steps == 4 and model.config._attn_implementation == attention
    assert engine.get_epsilon(1e-5) == pytest.approx(epsilon_for(1.0, 1 / 4, 4, 1e-5), rel=1e-9)
    assert all(not torch.equal(p, before[k]) for k, p in model.named_parameters() if p.requires_grad)
    assert m.generate(input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False).shape == (1, 5)


def test_a_bidirectional_encoder_with_padding_trains_in_the_users_loop():
    """BERT's mask code reads the mask's values too (``padding_mask.all()``): the per-example pass builds the mask
    instead (old code: vmap refused the data-dependent branch)."""
    from torch.utils.data import DataLoader

    from featuredp import PrivacyEngine

    config = transformers.BertConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=L, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    rows = [{"input_ids": r["input_ids"], "attention_mask": r["attention_mask"],
             "labels": r["input_ids"][1] % 2} for r in _records(32)]  # fmt: skip
    engine = PrivacyEngine()
    m, o, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                       data_loader=DataLoader(rows, batch_size=8), noise_multiplier=1.0,
                                       max_grad_norm=1.0, grad_sample_mode="functorch")  # fmt: skip
    for batch in loader:
        o.zero_grad()
        m(**batch).loss.backward()
        o.step()
    assert engine.steps == 4


# -- feature DP of text spans through DPTrainer ------------------------------------------------------------------
def _texts(n: int, seed: int):
    from featuredp.data.text import TextDataset
    from featuredp.data.text_corpus import support_dialogues

    return TextDataset(support_dialogues(n, seed=seed), _spans(), max_len=48)


def _byte_gpt2() -> torch.nn.Module:
    from featuredp.data.text import ByteTokenizer

    config = transformers.GPT2Config(vocab_size=ByteTokenizer().vocab_size, n_positions=48, n_embd=16, n_layer=1,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def _spans():
    from featuredp.features.text import TextSpans

    return TextSpans(("name", "email"))


@pytest.fixture
def psi():
    return _spans()


@pytest.mark.parametrize("mode", ["ghost", "vmap"])
def test_feature_dp_of_text_spans_trains_through_dptrainer(tmp_path, psi, mode):
    model = _byte_gpt2()
    before = model.transformer.wte.weight.detach().clone()
    trainer = DPTrainer(model=model, args=_args(tmp_path, eval_strategy="steps", eval_steps=6),
                        train_dataset=_texts(96, 3), eval_dataset=_texts(16, 4), feature_map=psi,
                        noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode)  # fmt: skip
    trainer.train()
    assert trainer.engine.steps == 12 and not torch.equal(before, model.transformer.wte.weight)
    assert trainer.privacy.epsilon == pytest.approx(epsilon_for(1.0, 1 / 12, 12, 1e-5), rel=1e-9)
    assert "FDP protecting the contents of spans of types name, email" in trainer.privacy.guarantee
    logged = [k for e in trainer.state.log_history for k in e]
    assert "public_loss" in logged and "eval_loss" in logged and "loss" not in logged
    assert model.generate(torch.tensor([[256, 104]]), max_new_tokens=3, do_sample=False).shape == (1, 5)


def test_the_replay_self_test_passes_on_a_stock_gpt2_with_text_spans_in_the_users_loop(psi):
    """One more text (any length) moves the engine's clipped private sum by at most C, with Ψ's views read from the
    draw itself."""
    from torch.utils.data import DataLoader

    from featuredp import PrivacyEngine
    from featuredp.features.tokens import TokenView
    from featuredp.hf import TokenRows
    from featuredp.losses import CausalLMSplit
    from featuredp.models.hf import HFCausalLM

    for mode in ("ghost", "vmap"):
        model = _byte_gpt2()
        engine = PrivacyEngine()
        engine.make_private(module=HFCausalLM(model), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                            data_loader=DataLoader(TokenRows(_texts(40, 3)), batch_size=8), noise_multiplier=1.0,
                            max_grad_norm=0.05, loss_split=CausalLMSplit(TokenView(psi)), grad_sample_mode=mode,
                            public_batch_size=8)  # fmt: skip
        assert [str(r.outcome) for r in engine.check_model(records=2)] == ["passed", "passed"]


def test_the_backstop_covers_whole_records_through_dptrainer(tmp_path, psi):
    trainer = DPTrainer(model=_byte_gpt2(), args=_args(tmp_path), train_dataset=_texts(96, 3), feature_map=psi,
                        noise_multiplier=1.0, max_grad_norm=1.0, record_epsilon=8.0)  # fmt: skip
    trainer.train()
    assert trainer.privacy.record_epsilon is not None and trainer.privacy.record_epsilon <= 8.0 + 1e-6
    assert "record-level backstop" in trainer.privacy.guarantee


def test_lora_with_private_spans_through_dptrainer(tmp_path, psi):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_byte_gpt2(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"],
                                                               lora_dropout=0.0, fan_in_fan_out=True))  # fmt: skip
    adapters = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    trainer = DPTrainer(model=model, args=_args(tmp_path), train_dataset=_texts(96, 3), feature_map=psi,
                        noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    trainer.train()
    after = dict(model.named_parameters())
    assert all(not torch.equal(after[k], v) for k, v in adapters.items())
    assert trainer.engine.steps == 12


def test_feature_dp_data_that_is_not_a_text_dataset_of_the_same_psi_is_refused(tmp_path, psi):
    from featuredp.features.text import TextSpans

    with pytest.raises(TypeError, match=r"train_dataset must be a featuredp\.data\.text\.TextDataset"):
        DPTrainer(model=_byte_gpt2(), args=_args(tmp_path), train_dataset=_records(), feature_map=psi,
                  noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    with pytest.raises(ValueError, match="one Ψ"):
        DPTrainer(model=_byte_gpt2(), args=_args(tmp_path), train_dataset=_texts(8, 3),
                  feature_map=TextSpans(("email",)), noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    with pytest.raises(TypeError, match="feature_map must be a TextSpans"):
        DPTrainer(model=_byte_gpt2(), args=_args(tmp_path), train_dataset=_texts(8, 3), feature_map=object(),
                  noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip


def test_gradient_accumulation_with_text_spans_is_the_one_large_batch_step(tmp_path, psi):
    """Chunks of a draw of byte-token texts (old code: a chunk's exact rows were not recognised) add up to the
    one-batch step of Algorithm 1, with one fixed secret key."""
    runs = []
    for per_device, accumulate in ((2, 4), (8, 1)):
        model = _byte_gpt2()
        args = _args(tmp_path, f"text{accumulate}", per_device_train_batch_size=per_device,
                     gradient_accumulation_steps=accumulate)  # fmt: skip
        trainer = DPTrainer(model=model, args=args, train_dataset=_texts(96, 3), feature_map=psi,
                            noise_multiplier=1.0, max_grad_norm=1.0, privacy_seed=5)  # fmt: skip
        trainer.train()
        runs.append((trainer.engine.steps, dict(model.named_parameters())))
    (steps_a, a), (steps_b, b) = runs
    assert steps_a == steps_b == 12
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_dptrainer_at_user_level_draws_users_and_accumulates_whole_users(tmp_path):
    """A person with many records is one unit: q counts users, every accumulation chunk holds whole users, and the
    guarantee says so."""
    authors = [i % 7 if i % 3 else 100 + i for i in range(96)]  # 7 frequent authors and 32 one-record ones
    users = len(set(authors))
    trainer = _train(tmp_path, gradient_accumulation_steps=2, per_device_train_batch_size=4,
                     trainer_kw={"user_key": authors, "records_per_user": 6, "num_users": users})  # fmt: skip
    draws = -(-users // 8)  # ⌈users / (per_device × accumulation)⌉
    plan = trainer.engine.plan
    assert plan.unit == "user" and plan.dataset_size == users and plan.sampling_rate == pytest.approx(1 / draws)
    assert trainer.engine.steps == trainer.state.global_step == draws
    assert trainer.privacy.epsilon == pytest.approx(epsilon_for(1.0, 1 / draws, draws, 1e-5), rel=1e-9)
    assert "whole users" in trainer.privacy.guarantee
    assert trainer.engine.run.strategy.name == "vmap"
    with pytest.raises(ValueError, match="grad_sample_mode='ghost'"):
        _train(tmp_path, name="ghost", trainer_kw={"user_key": authors, "grad_sample_mode": "ghost"})
