"""Issue 23, finding 6: a copy of a noise key is a second budget with the same noise.

The attack: pickle a secure generator, a ``VoteAggregator`` or a fitted ``DPICLClassifier`` into
pool workers (or fork them): every copy answers with the parent's noise and keeps the whole
query budget. Copies are refused; a forked child re-keys its noise and, without a shared
``BudgetLedger``, refuses to answer.
"""

from __future__ import annotations

import copy
import os
import pickle
import select
import time

import numpy as np
import pytest

from featuredp.accounting import BudgetLedger
from featuredp.aggregation import VoteAggregator, aggregation_event, query_event
from featuredp.errors import BudgetExceededError
from featuredp.icl import DPICLClassifier
from featuredp.icl.predictors import KNNPredictor
from featuredp.mechanisms.pate import PATE
from featuredp.noise import ChaCha20Generator, SecureNoise
from featuredp.noise.sharded import ShardedNoise

fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

COPIES = {
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
    "pickle-protocol-2": lambda obj: pickle.loads(pickle.dumps(obj, protocol=2)),
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
}


def _fitted_icl(**kwargs) -> DPICLClassifier:
    X = np.r_[np.zeros((20, 2)), np.ones((20, 2))]
    y = np.r_[np.zeros(20, int), np.ones(20, int)]
    return DPICLClassifier(KNNPredictor(2), shots=2, prompts=20, epsilon=4.0, queries=20, **kwargs).fit(list(zip(X, y)))


HOLDERS = {
    "ChaCha20Generator": lambda: ChaCha20Generator(),
    "SecureNoise": lambda: SecureNoise(),  # holds a ChaCha20Generator: the refusal carries through
    "ShardedNoise": lambda: ShardedNoise(),  # FSDP2's keyed per-shard noise
    "VoteAggregator": lambda: VoteAggregator(3, sigma=20.0, max_epsilon=1.0),
    "VoteAggregator-secure": lambda: VoteAggregator(3, sigma=20.0, max_epsilon=1.0, secure_rng=True),
    "DPICLClassifier": _fitted_icl,
}


@pytest.mark.parametrize(
    ("holder", "how"),
    # a shallow copy of SecureNoise shares its one generator object: it continues the stream, never replays it
    [(h, c) for h in HOLDERS for c in COPIES if (h, c) != ("SecureNoise", "copy")],
)
def test_copies_of_a_noise_key_are_refused(holder, how):
    obj = HOLDERS[holder]()
    with pytest.raises(TypeError, match=r"must not be copied|a copy would answer .*BudgetLedger") as info:
        COPIES[how](obj)
    assert "BudgetLedger" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_copied_generator_would_have_replayed_the_noise():
    # what the refusal prevents: the same key gives the same bytes
    key = os.urandom(32)
    assert ChaCha20Generator(key).bytes(64) == ChaCha20Generator(key).bytes(64)


def test_the_explicit_private_checkpoint_still_works():
    g = ChaCha20Generator()
    g.bytes(100)
    h = ChaCha20Generator()
    h.load_state_dict(g.state_dict())
    assert h.bytes(64) == g.bytes(64)


# ---------------------------------------------------------------------------------------------- fork


CHILD_TIMEOUT = 120.0  # generous: the bound only keeps a hung child from hanging the run, never decides a pass


def _wait(pid: int, deadline: float) -> int:
    """The child's exit code; kills it once ``deadline`` (``time.monotonic``) has passed (a hung child fails)."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"forked child {pid} did not finish in {CHILD_TIMEOUT} s")


def _in_child(body) -> tuple[int, bytes]:
    """Run ``body(write)`` in a forked child; returns its exit code and all it wrote to the pipe.

    The pipe is read to its end (the child's exit closes it), waiting as long as the one deadline
    allows: a slow child on a busy machine is waited for, never cut off after a short poll.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(r)
            code = body(lambda data: os.write(w, data))
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + CHILD_TIMEOUT
    with os.fdopen(r, "rb", buffering=0) as fh:
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([fh], [], [], left)[0]:
                break  # past the deadline: _wait kills the child and fails the test
            chunk = fh.read(65536)
            if not chunk:
                break  # end of file: the child has exited (or closed its end)
            chunks.append(chunk)
    return _wait(pid, deadline), b"".join(chunks)


@fork_only
def test_forked_generator_draws_a_stream_of_its_own():
    g = ChaCha20Generator(bytes(32))  # a fixed key: without the re-key both would print the same stream

    def child(write):
        write(g.bytes(64))
        return 0

    code, child_bytes = _in_child(child)
    assert code == 0
    assert len(child_bytes) == 64
    assert g.bytes(64) == ChaCha20Generator(bytes(32)).bytes(64)  # the parent's stream is unchanged
    assert child_bytes != ChaCha20Generator(bytes(32)).bytes(64)


@fork_only
@pytest.mark.parametrize("secure_rng", [False, True])
def test_forked_aggregator_without_a_ledger_refuses_to_answer(secure_rng):
    # Four workers each answering the full budget was the attack: the child must release nothing.
    agg = VoteAggregator(10, sigma=40.0, max_epsilon=1.0, secure_rng=secure_rng)
    votes = [0] * 10 + [1] * 10

    def child(write):
        for ask in (lambda: agg.answer(votes), lambda: agg.answer_all([votes, votes])):
            try:
                ask()
            except BudgetExceededError as exc:
                if "forked process" not in str(exc) or "ledger" not in str(exc):
                    return 4
                continue
            return 1  # answered: the copy spent a budget of its own
        return 0 if agg.queries_asked == 0 else 5

    code, _ = _in_child(child)
    assert code == 0
    assert agg.answer(votes) in range(10) and agg.queries_asked == 1  # the parent keeps its budget and answers


@fork_only
def test_forked_classifier_without_a_ledger_refuses_before_computing_votes():
    clf = _fitted_icl()

    class Spy:
        calls = 0

    def child(write):
        original = clf._votes

        def counted(queries):
            Spy.calls += 1
            return original(queries)

        clf._votes = counted
        try:
            clf.predict([[0.0, 0.0]])
        except BudgetExceededError:
            return 0 if Spy.calls == 0 else 4
        return 1

    code, _ = _in_child(child)
    assert code == 0
    assert clf.predict([[0.0, 0.0]]).tolist() in ([0], [1])


@fork_only
def test_forked_aggregators_share_a_ledger_and_draw_independent_noise(tmp_path):
    n_per_process = 12
    per_query = query_event("gnmax", sigma=30.0)
    probe = BudgetLedger(tmp_path / "probe.json", total_epsilon=1e9, delta=1e-5)
    total = probe.projected(event=aggregation_event(per_query, 2 * n_per_process))
    # room for exactly 2 × n_per_process queries, for all processes together
    ledger = BudgetLedger(tmp_path / "shared.json", total_epsilon=total * (1 + 1e-9), delta=1e-5)
    assert ledger.projected(event=aggregation_event(per_query, 2 * n_per_process + 1)) > ledger.total_epsilon
    agg = VoteAggregator(10, sigma=30.0, delta=1e-5, ledger=ledger)  # no budget of its own: the ledger's only
    tied = np.tile(np.arange(10), (n_per_process, 3))  # every class 3 votes: the label is the noise's argmax

    def child(write):
        labels = agg.answer_all(tied, stop_at_budget=False)
        write(labels.astype(np.int64).tobytes())
        return 0

    code, data = _in_child(child)
    assert code == 0
    child_labels = np.frombuffer(data, dtype=np.int64)
    assert child_labels.shape == (n_per_process,) and (child_labels >= 0).all()
    # the parent answers the same queries: with the inherited key it would repeat the child's labels exactly
    parent_labels = agg.answer_all(tied, stop_at_budget=False)
    assert (parent_labels >= 0).all()
    assert not np.array_equal(parent_labels, child_labels)  # chance of a tie: 10**-12
    # the shared ledger now holds both processes' spends and refuses one query more
    assert len(ledger.records) == 2
    assert ledger.spent() <= ledger.total_epsilon
    with pytest.raises(BudgetExceededError):
        agg.answer(tied[0])


@fork_only
def test_forked_pate_with_a_given_aggregator_refuses_before_training_a_teacher():
    agg = VoteAggregator(2, sigma=40.0, max_epsilon=1.0)
    X = np.r_[np.zeros((10, 2)), np.ones((10, 2))]
    y = np.r_[np.zeros(10, int), np.ones(10, int)]

    class Spy:
        trained = 0

    def teacher(X_part, y_part, X_query):
        Spy.trained += 1
        return np.zeros(len(X_query), dtype=int)

    def child(write):
        try:
            PATE(teacher, 4, n_classes=2, aggregator=agg).fit(X, y, X[:3])
        except BudgetExceededError:
            return 0 if Spy.trained == 0 else 4
        return 1

    code, _ = _in_child(child)
    assert code == 0
    assert PATE(teacher, 4, n_classes=2, aggregator=agg).fit(X, y, X[:3]).queries_asked_ == 3  # the parent's own


# ---------------------------------------------------------------------------------------------- torch.save
# Issue 42: torch.save(path) opens the file before it pickles, so a refusal used to leave a ~670-byte zip at
# path that looks like a saved model (and a user who kept the file would ship or load it later).
def _wrapped():
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from featuredp import PrivacyEngine

    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    y = (x[:, 0] > 0).long()
    raw = nn.Linear(3, 2)
    model, optimizer, criterion, _loader = PrivacyEngine().make_private(
        module=raw, optimizer=torch.optim.SGD(raw.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=10), criterion=nn.CrossEntropyLoss(),
        noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost")  # fmt: skip
    return raw, {"model": model, "optimizer": optimizer, "criterion": criterion}


@pytest.mark.parametrize("zipfile", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("as_str", [True, False], ids=["str", "path"])
def test_a_refused_torch_save_leaves_no_file(tmp_path, zipfile, as_str):
    import torch

    raw, wrappers = _wrapped()
    for name, obj in wrappers.items():
        for what in (obj, {"epoch": 3, "model": obj}):  # the wrapper alone, or inside a checkpoint dict
            path = tmp_path / f"{name}.pt"
            with pytest.raises(TypeError, match=r"state_dict|secret"):
                torch.save(what, str(path) if as_str else path, _use_new_zipfile_serialization=zipfile)
            assert not path.exists(), f"a refused torch.save of the {name} left {path.stat().st_size} bytes"
    torch.save(raw.state_dict(), tmp_path / "weights.pt")  # the weights alone are still saved
    assert set(torch.load(tmp_path / "weights.pt")) == {"weight", "bias"}


def test_a_refused_torch_save_into_a_file_object_leaves_the_callers_file_alone(tmp_path):
    import torch

    _raw, wrappers = _wrapped()
    path = tmp_path / "mine.pt"
    with open(path, "wb") as fh:
        fh.write(b"header")
        with pytest.raises(TypeError, match=r"state_dict|secret"):
            torch.save(wrappers["model"], fh)
    assert path.exists()  # the caller opened it and owns it: not ours to delete
