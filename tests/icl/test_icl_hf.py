"""The transformers adapter on a tiny randomly initialised GPT-2 built offline (no download, no network)."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys

import numpy as np
import pytest

from featuredp.cli import main
from featuredp.icl import DPICLClassifier

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _vocab():
    return ["<unk>", "<pad>", "Input:", "Label:", *[str(i) for i in range(17)], *WORDS, "good", "bad", "movie", "plot"]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A 1-layer GPT-2 with a word-level tokenizer, saved with save_pretrained (a local model directory)."""
    pytest.importorskip("transformers")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(_vocab())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=len(vocab), n_positions=512, bos_token_id=1,
                        eos_token_id=1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    path = tmp_path_factory.mktemp("tiny-lm")
    fast.save_pretrained(path)
    model.save_pretrained(path)
    return path


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_adapter_reads_the_label_words_next_token_logits(tiny_lm, no_network):
    import torch

    from featuredp.icl.hf import HFCausalLMPredictor

    lm = HFCausalLMPredictor(tiny_lm, ["good", "bad"])
    demos = [("good movie", 0), ("bad plot", 1)]
    text = lm.prompt(demos, "good plot")
    assert text == "Input: good movie\nLabel: good\n\nInput: bad plot\nLabel: bad\n\nInput: good plot\nLabel:"
    s = lm.scores(demos, "good plot")
    assert s.shape == (2,) and np.exp(s).sum() == pytest.approx(1.0)
    # independently: the model's logits at the last position, for the label words' tokens
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        logits = lm.model(input_ids=ids).logits[0, -1]
    good, bad = lm.tokenizer.convert_tokens_to_ids(["good", "bad"])
    assert lm.label_token_ids == [good, bad]
    assert lm.predict(demos, "good plot") == int(logits[bad] > logits[good])
    assert np.allclose(s, torch.log_softmax(logits[[good, bad]].double(), 0).numpy())
    assert lm.predict_batch(demos, ["good plot", "bad movie"]).tolist() == [lm.predict(demos, q)
                                                                           for q in ["good plot", "bad movie"]]


def test_adapter_inside_dp_icl_end_to_end(tiny_lm, no_network):
    from featuredp.icl.hf import HFCausalLMPredictor

    lm = HFCausalLMPredictor(tiny_lm, ["good", "bad"])
    demos = [(f"{w} {n}", i % 2) for i, (w, n) in enumerate(zip(["good", "bad"] * 4, ["movie", "plot"] * 4))]
    for eps, queries in ((math.inf, None), (2.0, 3)):
        clf = DPICLClassifier(lm, shots=2, prompts=3, epsilon=eps, queries=queries).fit(demos)
        out = clf.predict(["good movie", "bad plot", "good plot"])
        assert set(out.tolist()) <= {0, 1} and clf.queries_answered == 3


def test_missing_model_dir_is_refused_before_transformers_is_imported(tmp_path):
    # one interpreter for both checks (starting one costs seconds): import featuredp.icl, then a missing directory
    code = (
        "import sys, featuredp.icl\nprint('transformers' in sys.modules)\n"
        "from featuredp.icl.hf import HFCausalLMPredictor\n"
        f"try:\n    HFCausalLMPredictor({str(tmp_path / 'absent')!r}, ['a', 'b'])\n"
        "except FileNotFoundError as e:\n    print(str(e))\n"
        "print('transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "False", "import featuredp.icl imported transformers"
    assert lines[-1] == "False" and "does not exist" in lines[1] and "nothing is downloaded" in lines[1]
    assert len(lines) == 3  # the message is one line


def test_bad_directories_and_label_words(tiny_lm, tmp_path, no_network):
    pytest.importorskip("transformers")
    from featuredp.icl.hf import HFCausalLMPredictor

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no loadable causal LM"):
        HFCausalLMPredictor(empty, ["good", "bad"])
    with pytest.raises(FileNotFoundError, match="is a file"):
        HFCausalLMPredictor(tiny_lm / "config.json", ["good", "bad"])
    with pytest.raises(ValueError, match="unknown to the tokenizer"):
        HFCausalLMPredictor(tiny_lm, ["good", "excellent"])
    with pytest.raises(ValueError, match="at least 2 distinct"):
        HFCausalLMPredictor(tiny_lm, ["good", "good"])
    with pytest.raises(ValueError, match=r"\{input\} then \{label\}"):
        HFCausalLMPredictor(tiny_lm, ["good", "bad"], template="{label} {input}")


def test_cli_with_a_local_model(tiny_lm, no_network, capsys):
    rc = main(["icl", "--learner", "hf", "--model-dir", str(tiny_lm), "--prompts", "3", "--shots", "1",
               "--queries", "4", "--epsilon", "inf", "--json", "--diagnostics"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["learner"] == "hf" and out["epsilon"] == "inf" and 0 <= out["accuracy"] <= 1
    assert out["diagnostics"]["nonprivate_accuracy"] is None and out["prompts"] == 3 and out["queries_answered"] == 4


def test_a_model_dir_with_only_a_pickled_checkpoint_is_refused(tiny_lm, no_network, tmp_path):
    """pytorch_model.bin is a pickle (loading it may run code): the predictor reads safetensors weights only."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from featuredp.icl.hf import HFCausalLMPredictor

    folder = tmp_path / "pickled"
    shutil.copytree(tiny_lm, folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"^model_dir='.*pickled' holds no loadable causal LM") as info:
        HFCausalLMPredictor(folder, ["good", "bad"])
    assert "\n" not in str(info.value)
