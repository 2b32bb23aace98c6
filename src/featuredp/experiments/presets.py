"""The preset store: per-dataset, per-method hyperparameters for tabular training.

One store, read by :func:`featuredp.experiments.train_one.train_one` (``featuredp train``,
``featuredp demo``, the benchmarks) and by the grids (``featuredp compare``). Each entry of
:data:`PRESETS` is one dataset's preset::

    {"load": {...}, "quick_load": {...},            # loader options (full / --quick grids)
     "model": "mlp", "hidden": [64],                 # the model
     "loss_split": "padding", "delta": 1e-5,         # the loss split (None: default for Ψ) and δ
     "methods": {method: {Trainer keyword arguments}},
     "tune": {method: {parameter: [candidates]}}}    # the --tune grid

Values were chosen on validation splits carved from the *training* data (never the test set):
Adult with ``benchmarks/adult_methods.py --tune`` (docs/engine.md), the others as described in
docs/experiments.md. The Adult preset is also the default one (:data:`DEFAULT_PRESET`): ``featuredp
train`` uses its method parameters for every dataset, and a grid on a dataset without a preset
starts from it. Every value can be overridden (command line, ``method_params``, ``Trainer(...)``).

A method without an entry in a preset borrows the entry of the registered method most like it
(:func:`method_params`), so adding a method to :mod:`featuredp.methods` needs no change here.

>>> method_defaults("dpsgd")["lr"]
1.0
>>> sorted(unused_params("dpsgd"))
['alpha', 'pretrain_batch_size', 'pretrain_epochs', 'pretrain_lr', 'public_batch_size', 'public_weight']
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from featuredp.methods import METHODS, Method, get_method

__all__ = [
    "ALTERNATIVES",
    "DEFAULT_MODEL",
    "DEFAULT_PRESET",
    "IMAGE_FEATURE_MAPS",
    "IMAGE_PRESETS",
    "LABEL_DP_DEFAULTS",
    "METHOD_DEFAULTS",
    "PRESETS",
    "TEXT_PRESET",
    "fitted_schedule",
    "image_preset_for",
    "method_defaults",
    "method_params",
    "override",
    "preset_for",
    "trainer_arguments",
    "unit_settings",
    "unused_params",
]

#: model used by default for tabular data
DEFAULT_MODEL: dict[str, Any] = {"kind": "mlp", "hidden": [64]}

#: the preset whose method parameters are the defaults (``featuredp train``, datasets without a preset)
DEFAULT_PRESET = "adult"

# Ghost norms: the same clipped sums as per-example ``vmap`` gradients (to 1e-6), several times faster.
_GHOST = {"strategy": "ghost"}
_COMMON_PRIVATE = {**_GHOST, "momentum": 0.9}

PRESETS: dict[str, dict[str, Any]] = {
    "adult": {
        # Sex and race private; the engine's tuned Adult defaults (docs/engine.md, "Default hyperparameters").
        "load": {}, "quick_load": {"n_train": 4_000, "n_test": 2_000},
        "model": "mlp", "hidden": [64], "loss_split": "padding", "delta": 1e-5,
        "methods": {
            "nonprivate": {"epochs": 5, "batch_size": 256, "lr": 0.05, "momentum": 0.9},
            "public": {"epochs": 3, "batch_size": 256, "lr": 0.05, "momentum": 0.9},
            "dpsgd": {"epochs": 5, "batch_size": 1024, "lr": 1.0, "momentum": 0.9, "max_grad_norm": 1.0, **_GHOST},
            "fdp_dpsgd": {"epochs": 3, "batch_size": 512, "lr": 0.2, "momentum": 0.9, "max_grad_norm": 1.0,
                          "pretrain_epochs": 3, "pretrain_lr": 0.05, **_GHOST},
            "fdp": {"epochs": 3, "batch_size": 512, "public_batch_size": 256, "lr": 0.05, "momentum": 0.9,
                    "max_grad_norm": 1.0, "alpha": 0.5, "pretrain_epochs": 3, "pretrain_lr": 0.05, **_GHOST},
        },
        "tune": {"dpsgd": {"lr": [0.2, 0.5, 1.0]}, "fdp_dpsgd": {"lr": [0.1, 0.2, 0.5]},
                 "fdp": {"alpha": [0.3, 1.0, 3.0]}},
    },
    "purchase-style": {
        # The paper's Purchase100 setup (MLP 1×300 ReLU, 100 public features + label public, C = 0.1 for FDP) with
        # two changes chosen on a validation split of the training data (docs/experiments.md, "Purchase-style"):
        # * zero masking instead of Gaussian padding: on these sparse binary features (mean 0.08) the median
        #   per-example ‖∇ℓ_priv‖ after public pre-training is 3.7 with zero masking vs 5.2 with N(0, 0.25²) and
        #   12.2 with the paper's N(0, 1) padding (‖∇ℓ‖: 7–9), so only zero masking keeps FDP's premise;
        # * α·C ≈ ‖∇ℓ_priv‖ (α = 30, C = 0.1) with lr 0.5: the update's noise lr·α·σC/m is half DP-SGD's; the old
        #   α = 150 (α·C = 15 ≫ ‖∇ℓ_priv‖) gave the same noise as DP-SGD and a step that ascends ℓ_pub.
        "load": {"n_train": 20_000, "n_test": 10_000},
        "quick_load": {"n_train": 4_000, "n_test": 2_000},
        "model": "mlp", "hidden": [300], "loss_split": "zero", "delta": 1e-5,
        "methods": {
            "nonprivate": {"epochs": 10, "batch_size": 1024, "lr": 0.2, "momentum": 0.9},
            "public": {"epochs": 10, "batch_size": 1024, "lr": 0.2, "momentum": 0.9},
            "dpsgd": {"epochs": 6, "batch_size": 1250, "lr": 3.0, "max_grad_norm": 1.0, **_COMMON_PRIVATE},
            "fdp_dpsgd": {"epochs": 6, "batch_size": 1250, "lr": 3.0, "max_grad_norm": 1.0, "pretrain_epochs": 4,
                          "pretrain_lr": 0.2, **_COMMON_PRIVATE},
            # m' = 4·m with pre-training kept on batches of m (benchmarks/public_batch.py, validation split, 3 seeds:
            # 75.9 ± 0.8 → 75.2 ± 0.4 at ε = 1, 87.6 ± 2.2 → 89.8 ± 0.8 at ε = 4)
            "fdp": {"epochs": 6, "batch_size": 1250, "public_batch_size": 5000, "pretrain_batch_size": 1250,
                    "lr": 0.5, "max_grad_norm": 0.1, "alpha": 30.0, "pretrain_epochs": 10, "pretrain_lr": 0.2,
                    **_COMMON_PRIVATE},
        },
        "tune": {"dpsgd": {"lr": [2.0, 3.0, 5.0]}, "fdp_dpsgd": {"lr": [1.0, 3.0, 10.0]},
                 "fdp": {"alpha": [15.0, 30.0, 60.0]}},
    },
    "criteo-style": {
        # The paper's Criteo setup: logistic regression, categoricals through sparse embeddings of dimension 1,
        # private categoricals masked to zero in the public loss; 40k/10k rows.
        "load": {"n_train": 40_000, "n_test": 10_000, "categorical": "codes"},
        "quick_load": {"n_train": 5_000, "n_test": 2_000, "categorical": "codes"},
        "model": "sparse_logreg", "loss_split": "zero", "delta": 1e-5,
        "methods": {
            "nonprivate": {"epochs": 5, "batch_size": 512, "lr": 0.5, "momentum": 0.9},
            "public": {"epochs": 5, "batch_size": 512, "lr": 0.5, "momentum": 0.9},
            "dpsgd": {"epochs": 5, "batch_size": 2000, "lr": 2.0, "max_grad_norm": 1.0, **_COMMON_PRIVATE},
            "fdp_dpsgd": {"epochs": 5, "batch_size": 2000, "lr": 2.0, "max_grad_norm": 1.0, "pretrain_epochs": 10,
                          "pretrain_lr": 0.5, **_COMMON_PRIVATE},
            "fdp": {"epochs": 5, "batch_size": 2000, "public_batch_size": 2000, "lr": 1.0, "max_grad_norm": 1.0,
                    "alpha": 1.0, "pretrain_epochs": 10, "pretrain_lr": 0.5, **_COMMON_PRIVATE},
        },
        "tune": {"dpsgd": {"lr": [0.5, 2.0, 5.0], "max_grad_norm": [0.1, 1.0]},
                 "fdp_dpsgd": {"lr": [0.5, 2.0, 5.0], "max_grad_norm": [0.1, 1.0]},
                 # the same budget of 6 candidates as the baselines (issue 25: every method tuned alike)
                 "fdp": {"lr": [0.5, 1.0, 3.0], "alpha": [0.5, 1.0]}},
    },
    "census-income": {
        # Sex and race private; everything else and the label public. MLP 1×64.
        "load": {"n_train": 50_000, "n_test": 20_000},
        "quick_load": {"n_train": 5_000, "n_test": 2_000},
        "model": "mlp", "hidden": [64], "loss_split": "padding", "delta": 1e-6,
        "methods": {
            "nonprivate": {"epochs": 3, "batch_size": 512, "lr": 0.1, "momentum": 0.9},
            "public": {"epochs": 3, "batch_size": 512, "lr": 0.1, "momentum": 0.9},
            "dpsgd": {"epochs": 3, "batch_size": 1000, "lr": 0.5, "max_grad_norm": 1.0, **_COMMON_PRIVATE},
            "fdp_dpsgd": {"epochs": 2, "batch_size": 1000, "lr": 0.2, "max_grad_norm": 1.0, "pretrain_epochs": 3,
                          "pretrain_lr": 0.1, **_COMMON_PRIVATE},
            # m' = 4·m, pre-training on the old m' = 512 (benchmarks/public_batch.py: 94.7 ± 0.2 → 95.0 ± 0.0 at ε 1, 4)
            "fdp": {"epochs": 2, "batch_size": 1000, "public_batch_size": 4000, "pretrain_batch_size": 512,
                    "lr": 0.1, "max_grad_norm": 0.3, "alpha": 1.0, "pretrain_epochs": 3, "pretrain_lr": 0.1,
                    **_COMMON_PRIVATE},
        },
        "tune": {"dpsgd": {"lr": [0.2, 0.5, 1.0]}, "fdp_dpsgd": {"lr": [0.1, 0.2, 0.5]},
                 "fdp": {"alpha": [0.3, 1.0, 3.0]}},
    },
}  # fmt: skip

#: the public feature maps of the image-classification task (``--feature-map``; here because the CLI's parser
#: reads them and must not import torch)
IMAGE_FEATURE_MAPS = ("blur", "pixelate")

#: Presets of the image-classification task (``featuredp compare --task image-classification``), per image
#: dataset, in the same format; ``model`` is a CNN spec (its channels, size and classes come from the data) and
#: ``loss_split`` the Ψ of :func:`featuredp.experiments.image_classification.feature_map_spec`. Kept apart from
#: :data:`PRESETS`, whose names are tabular datasets (``featuredp train --dataset``).
IMAGE_PRESETS: dict[str, dict[str, Any]] = {
    "fashion-mnist": {
        # All 60,000 training images, one private epoch (m = 512, T = 117), chosen for a ~35 min CPU grid. Values
        # picked on a validation split of the training images (first 48,000 / last 12,000; ε = 2, one seed;
        # docs/image-classification.md): DP-SGD lr ∈ {0.5, 1, 2} → 0.5; FDP (DP-SGD) lr ∈ {0.03, 0.3} → 0.3;
        # FDP (Alg. 1) (C, α) ∈ {(1, 1), (1, 3), (0.3, 5)} at lr 0.03 → (0.3, 5): tied with (1, 3) at 85.8%,
        # with half the noise lr·α·σC. Algorithm 1's public batch m' = 4·m = 512 (pre-training keeps batches of
        # 128): with m' = 128 its sampling noise was 3.1–3.5 × the DP noise (issue 25's review). Per-example
        # gradients by vmap: 1.3× faster than ghost norms for ℓ_priv's two passes through this CNN's conv layers
        # on a CPU (for ℓ the two were within timing noise).
        "load": {"n_train": 60_000, "n_test": 10_000}, "quick_load": {"n_train": 512, "n_test": 256},
        "model": {"kind": "small_cnn", "widths": [16, 32], "groups": 4}, "hidden": None,
        "loss_split": {"map": "blur", "sigma": 1.0}, "delta": 1e-5,
        "methods": {
            "nonprivate": {"epochs": 2, "batch_size": 128, "lr": 0.02, "momentum": 0.9},
            "public": {"epochs": 2, "batch_size": 128, "lr": 0.02, "momentum": 0.9},
            "dpsgd": {"epochs": 1, "batch_size": 512, "lr": 0.5, "max_grad_norm": 1.0, "momentum": 0.9,
                      "strategy": "vmap"},
            "fdp_dpsgd": {"epochs": 1, "batch_size": 512, "lr": 0.3, "max_grad_norm": 1.0, "momentum": 0.9,
                          "pretrain_epochs": 1, "pretrain_lr": 0.02, "public_batch_size": 128, "strategy": "vmap"},
            "fdp": {"epochs": 1, "batch_size": 512, "public_batch_size": 512, "pretrain_batch_size": 128, "lr": 0.03,
                    "max_grad_norm": 0.3, "alpha": 5.0, "momentum": 0.9, "pretrain_epochs": 1, "pretrain_lr": 0.02,
                    "strategy": "vmap"},
        },
        # --tune: the same budget for every private method (3 candidates per ε, on the validation split of the
        # training images), around the values above. Algorithm 1's spans 10× like FDP (DP-SGD)'s, upwards: with
        # {0.01, 0.03, 0.1} it chose the edge, 0.1, at every ε of the pixelated grid; 0.3 diverges or loses there.
        "tune": {"dpsgd": {"lr": [0.25, 0.5, 1.0]}, "fdp_dpsgd": {"lr": [0.1, 0.3, 1.0]},
                 "fdp": {"lr": [0.03, 0.1, 0.3]}},
    },
}  # fmt: skip

#: The text task's preset (``featuredp compare --task text``, ``featuredp train --task text``; docs/text.md): the
#: generated support corpus (``load``: records, length in byte tokens), the causal transformer, the audits'
#: sizes and per-method Trainer arguments; ``quick`` holds what ``--quick`` changes (a ≤ 10 min grid on 2 cores).
#: Per-example gradients by vmap: at 128 tokens per text a Linear layer's ghost norm materialises the per-example
#: gradient anyway, and vmap took 0.47 of ghost's time per DP-SGD step here (benchmarks/text_throughput.py has the
#: model-level ratios). Algorithm 1's public batch is m, not 4·m: it doubles the step's cost on a CPU.
TEXT_PRESET: dict[str, Any] = {
    "load": {"n_train": 4000, "n_test": 500, "max_len": 128, "canary_repeats": [1, 10, 100], "canaries_per_repeat": 2},
    "model": {"kind": "causal_transformer", "d_model": 96, "n_layers": 2, "n_heads": 4},
    "audit": {"digits": 4, "extraction": 100, "span_targets": 200, "span_k": 10},
    "delta": 1e-5,
    "methods": {
        "nonprivate": {"epochs": 4, "batch_size": 64, "lr": 3e-3, "optimizer": "adam"},
        "public": {"epochs": 4, "batch_size": 64, "lr": 3e-3, "optimizer": "adam"},
        "dpsgd": {"epochs": 4, "batch_size": 256, "lr": 3e-3, "optimizer": "adam", "max_grad_norm": 1.0,
                  "strategy": "vmap"},
        # The private phase of the FDP methods is DP-SGD's (4 epochs, m = 256, lr 3e-3, C = 1): tuned alike. With
        # 2 epochs at lr 1e-3 FDP (DP-SGD) had perplexity 23.8 on the quick corpus at ε = 3; with DP-SGD's, 12.5.
        "fdp_dpsgd": {"epochs": 4, "batch_size": 256, "lr": 3e-3, "optimizer": "adam", "max_grad_norm": 1.0,
                      "pretrain_epochs": 4, "pretrain_lr": 3e-3, "pretrain_batch_size": 64, "strategy": "vmap"},
        # α = 3 for Algorithm 1: on the quick corpus at ε = 3 (one seed, 2 private epochs at lr 1e-3) held-out
        # perplexity 35.9 at α = 1, 31.0 at α = 3 and 32.5 at w = 0.5; the noise-free public gradient otherwise
        # swamps what the private part teaches of the spans
        "fdp": {"epochs": 4, "batch_size": 256, "lr": 3e-3, "optimizer": "adam", "max_grad_norm": 1.0, "alpha": 3.0,
                "public_batch_size": 256, "pretrain_epochs": 4, "pretrain_lr": 3e-3, "pretrain_batch_size": 64,
                "strategy": "vmap"},
    },
    "quick": {
        # 700 texts (was 1,000): `compare --task text --quick` took 11.8 min on the 2 cores here in November 2026
        # (the code of 6.5 min before took within 4 % of the same that day: the machine was slower); the issue's
        # budget is 10 minutes.
        "load": {"n_train": 700, "n_test": 200},
        "model": {"d_model": 64},
        "audit": {"extraction": 50, "span_targets": 100},
    },
}  # fmt: skip

#: Trainer keyword arguments per method of the default preset (Adult); read-only view, copy before changing
METHOD_DEFAULTS: dict[str, dict[str, Any]] = PRESETS[DEFAULT_PRESET]["methods"]

#: changes to the defaults of the methods that read Ψ when the label is private (LabelDPSplit):
#: ℓ_pub = logsumexp(logits) has no minimiser, so no public pre-training; g_pub + α·g_priv is the cross-entropy
#: gradient only for α = 1 and when clipping leaves ∇ℓ_priv mostly intact (C = 5; C = 1 collapsed to the
#: majority class on Adult).
LABEL_DP_DEFAULTS: dict[str, Any] = {"pretrain_epochs": 0, "alpha": 1.0, "max_grad_norm": 5.0}

# The Trainer arguments that only some methods read, and the record field that says whether a method does.
_PRIVATE_ONLY = ("noise_multiplier", "max_grad_norm", "strategy", "physical_batch_size")  # clipping and noise
_PUBLIC_BATCH_ONLY = ("alpha", "public_weight")  # α and w of Algorithm 1's w·g_pub + α·g_priv
_PRETRAIN_ONLY = ("pretrain_epochs", "pretrain_lr", "pretrain_batch_size")


def trainer_arguments(method: str | Method, params: dict[str, Any], *, epsilon: float | None, delta: float,
                      device: str | None = None) -> dict[str, Any]:
    """``params`` completed for a Trainer: a private method's target ε and δ (it needs ε or a noise multiplier), and
    the device when given.

    >>> trainer_arguments("dpsgd", {"lr": 0.1}, epsilon=2.0, delta=1e-5)
    {'lr': 0.1, 'target_epsilon': 2.0, 'delta': 1e-05}
    """
    record = method if isinstance(method, Method) else get_method(method)
    out = dict(params)
    if record.private:
        if epsilon is None and out.get("noise_multiplier") is None:
            raise ValueError(f"method {record.name!r} needs an epsilon (a target) or a noise_multiplier")
        out.update(target_epsilon=epsilon, delta=delta)
    elif out.get("record_epsilon") is not None:
        out["delta"] = delta  # the record-level backstop makes the public method's steps DP steps: they need δ
    if device is not None:
        out["device"] = device
    return out


#: the Trainer settings that only mean something at user level (``user_key=``)
USER_LEVEL_SETTINGS = ("records_per_user", "num_users")


def unit_settings(settings: Mapping[str, Any], users: Any) -> dict[str, Any]:
    """``settings`` for a run whose unit is a user (``users``: each record's user) or a record (None): at record
    level the user-level settings are dropped; at user level the strategy is vmap unless one is given (a preset's
    strategy is a speed choice, and a user's gradient is the sum of its records').

    >>> unit_settings({"lr": 0.1, "records_per_user": 8, "strategy": "ghost"}, None)
    {'lr': 0.1, 'strategy': 'ghost'}
    >>> unit_settings({"records_per_user": 8}, ["a", "b"])["strategy"]
    'vmap'
    """
    if users is None:
        return {k: v for k, v in settings.items() if k not in USER_LEVEL_SETTINGS}
    return {**settings, "strategy": settings.get("strategy") or "vmap"}


def unused_params(method: str | Method) -> frozenset[str]:
    """The Trainer keyword arguments ``method`` does not read (dropped from presets and overrides).

    Derived from the method's record: clipping and noise settings need a private method, α and the
    public weight w need a public batch in every step, pre-training settings (their batch size
    included) need a method that pre-trains, and the public batch size m' is read by the public
    batch and by public pre-training (its default batch).

    >>> sorted(unused_params("fdp"))
    []
    >>> sorted(unused_params("fdp_dpsgd"))
    ['alpha', 'public_weight']
    """
    m = get_method(method)
    unused: set[str] = set()
    if not m.private:
        unused.update(_PRIVATE_ONLY)
    if not m.public_batch:
        unused.update(_PUBLIC_BATCH_ONLY)
    if not m.pretrains:
        unused.update(_PRETRAIN_ONLY)
    if not (m.public_batch or m.pretrains):
        unused.add("public_batch_size")
    return frozenset(unused)


def _likeness(a: Method, b: Method) -> int:
    """How many of the fields that decide a method's hyperparameters ``a`` and ``b`` share."""
    fields = ("private", "needs_feature_map", "public_batch", "clipped_loss", "public_steps", "pretrains")
    return sum(getattr(a, f) == getattr(b, f) for f in fields)


def method_params(methods: dict[str, dict[str, Any]], method: str | Method) -> dict[str, Any]:
    """A copy of ``method``'s entry in a preset's ``methods``, without the keys it does not read.

    A method without an entry borrows the entry of the method most like it (the most shared
    record fields; the first registered on a tie), so a newly registered method trains with
    sensible values until it gets tuned ones.

    >>> method_params({"dpsgd": {"lr": 1.0, "alpha": 2.0}}, "fdp_dpsgd")
    {'lr': 1.0}
    """
    m = get_method(method)
    if m.name in methods:
        entry = methods[m.name]
    elif methods:
        order = list(METHODS)
        like = max(methods, key=lambda name: (_likeness(m, get_method(name)), -order.index(name)))
        entry = methods[like]
    else:
        entry = {}
    unused = unused_params(m)
    return {k: copy.deepcopy(v) for k, v in entry.items() if k not in unused}


def preset_for(dataset: str) -> dict[str, Any]:
    """A deep copy of the preset of ``dataset``, with an entry for every registered method.

    Datasets without a preset get the default preset's methods and model.

    >>> preset_for("my-table")["loss_split"] is None  # the default split for the dataset's Ψ
    True
    """
    preset = copy.deepcopy(PRESETS.get(dataset, PRESETS[DEFAULT_PRESET]))
    if dataset not in PRESETS:
        # Another dataset: the loader's own sizes and the default split for its Ψ; the model and the
        # method parameters are the defaults.
        preset.update(load={}, quick_load={}, model=DEFAULT_MODEL["kind"], hidden=list(DEFAULT_MODEL["hidden"]),
                      loss_split=None, delta=1e-5)  # fmt: skip
    methods = preset["methods"]
    for name in METHODS:  # every registered method has an entry (a new one borrows, see method_params)
        if name not in methods:
            methods[name] = method_params(methods, name)
    return preset


def image_preset_for(dataset: str) -> dict[str, Any]:
    """A deep copy of the image-classification preset of ``dataset`` (Fashion-MNIST's for other image sets).

    Like :func:`preset_for`, every registered method gets an entry. Another image set keeps the
    Fashion-MNIST model, Ψ and method parameters and its loader's own sizes.

    >>> image_preset_for("fashion-mnist")["loss_split"]
    {'map': 'blur', 'sigma': 1.0}
    """
    preset = copy.deepcopy(IMAGE_PRESETS.get(dataset, IMAGE_PRESETS["fashion-mnist"]))
    if dataset not in IMAGE_PRESETS:
        preset.update(load={}, quick_load={"n_train": 512, "n_test": 256})
    methods = preset["methods"]
    for name in METHODS:
        if name not in methods:
            methods[name] = method_params(methods, name)
    return preset


def method_defaults(method: str, dataset: str | None = None) -> dict[str, Any]:
    """A copy of the default Trainer arguments of ``method`` (from ``dataset``'s preset, else the default one).

    Keys the method does not read are left out.
    """
    get_method(method)  # a ValueError naming the choices for an unknown method
    preset = PRESETS.get(dataset or DEFAULT_PRESET, PRESETS[DEFAULT_PRESET])
    return method_params(preset["methods"], method)


#: Trainer arguments of which one is given: the run's length, and its batch size or sampling rate
ALTERNATIVES = (("epochs", "steps"), ("batch_size", "sampling_rate"))


def override(params: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``params`` updated by ``given``, where a given ``steps`` also drops ``epochs`` (and ``sampling_rate``
    ``batch_size``), and the other way round: the Trainer takes one of each pair.

    >>> override({"epochs": 3, "batch_size": 512, "lr": 0.1}, {"steps": 100})
    {'batch_size': 512, 'lr': 0.1, 'steps': 100}
    """
    out = dict(params)
    for pair in ALTERNATIVES:
        if any(k in given for k in pair):
            for k in pair:
                out.pop(k, None)
    out.update(given)
    return out


#: the data-fitted schedule (:func:`fitted_schedule`): about this many private steps, batches of about n / 32
#: (at least 32, at most 512), at least this many epochs, and the public batch and pre-training of the default
FITTED_STEPS = 600
FITTED_BATCH_SHARE = 32
FITTED_BATCH_RANGE = (32, 512)
FITTED_MIN_EPOCHS = 3.0
#: DP-SGD's learning rate under the fitted schedule (about 600 steps with momentum 0.9; Adult's lr of 1 was set for
#: about 130): chosen on Adult training samples, scored on other Adult training rows (benchmarks/fitted_dpsgd_lr.py)
FITTED_DPSGD_LR = 0.1


def fitted_schedule(n: int, method: str | Method) -> dict[str, Any]:
    """Batch sizes and epochs for a table of ``n`` training records that has no preset of its own.

    The default preset was tuned on Adult (26,000 training rows): 3 epochs of batches of 512 give a table of a few
    thousand rows only a few dozen private steps (FDP at ε = 2 then lands 2–5 points below a plain logistic
    regression), and refuse a table of a few hundred (the batch is larger than the data). Instead: batches of
    ``round(n / 32)`` clamped to [32, 512] (the public batch ≤ 256 and ≤ the batch), and ``max(3, 600·m/n)``
    epochs, i.e. about 600 private steps whatever n (more epochs on small tables). The learning rates, C, α and
    the pre-training stay the default preset's.

    The rule was set on subsamples of the bundled Adult training data (300 to 10,000 rows; FDP at ε = 2 with sex
    and race private, docs/own-data.md "Defaults that fit the data"), never on a user's data. The ``public``
    and ``nonprivate`` references get the same batch and epochs. Values the caller gives win.

    DP-SGD also gets ``lr`` = :data:`FITTED_DPSGD_LR` (0.1): with Adult's lr of 1 it fell below the majority
    class on small tables; on Adult samples of 1,000–10,000 rows lr 0.05–0.1 beat 1 by 1.6–7 points.

    >>> fitted_schedule(300, "fdp")
    {'batch_size': 32, 'epochs': 64.0, 'public_batch_size': 32}
    >>> fitted_schedule(30_000, "dpsgd")
    {'batch_size': 512, 'epochs': 10.24, 'lr': 0.1}
    """
    m_lo, m_hi = FITTED_BATCH_RANGE
    m = int(min(m_hi, max(m_lo, round(n / FITTED_BATCH_SHARE)), max(1, n // 2)))
    epochs = round(max(FITTED_MIN_EPOCHS, FITTED_STEPS * m / max(1, n)), 2)
    out: dict[str, Any] = {"batch_size": m, "epochs": epochs}
    if "public_batch_size" not in unused_params(method):
        out["public_batch_size"] = min(256, m)
    if get_method(method).name == "dpsgd":
        out["lr"] = FITTED_DPSGD_LR
    return out
