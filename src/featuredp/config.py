"""The Trainer's settings as three small frozen configs, validated once (no torch import).

* :class:`PrivacyConfig` — what decides the guarantee and its randomness: σ or a target ε,
  δ, the clipping norm C, α and the public weight w, the neighbouring relation, the accountant,
  seeds, secure mode.
* :class:`ScheduleConfig` — how long and how: steps or epochs, batch sizes, pre-training,
  the optimiser and its learning rates, projection, iterate averaging.
* :class:`PerformanceConfig` — what changes speed, never the result beyond float
  rounding: the clipping strategy, physical batches, the device, progress output.

``Trainer(model, "fdp", lr=0.05, target_epsilon=1.0)`` sorts flat keywords into these
(:func:`split_settings`); ``Trainer(model, "fdp", privacy=PrivacyConfig(...))`` passes them whole.

>>> ScheduleConfig(steps=10).batch_size
256
>>> sorted(split_settings({"lr": 0.1, "target_epsilon": 1.0, "device": "cpu"}))
['performance', 'privacy', 'schedule']
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from featuredp._validate import (
    check_choice,
    check_delta,
    check_int,
    check_nonnegative,
    check_positive,
    check_real,
    check_sampling_rate,
)
from featuredp.accounting.events import check_accountant, check_relation
from featuredp.noise import NOISE_PLANS, Independent, NoisePlan, noise_plan, plan_settings

__all__ = ["PerformanceConfig", "PrivacyConfig", "ScheduleConfig", "resolve_config", "split_settings"]


@dataclass(frozen=True)
class PrivacyConfig:
    """σ or a target ε (with δ), clipping, α, w, accounting, and where the private randomness comes from.

    ``alpha`` (α) and ``public_weight`` (w >= 0) shape Algorithm 1's step (method ``fdp``):
    g = w·g_pub + α·(Σ_i clip_C ∇(ℓ − w·ℓ_pub)(x_i) + N(0, σ²C²)) / m. w = 1 is the published
    algorithm; w = 0 clips ∇ℓ and draws no public batch (with α = 1: ``fdp_dpsgd``).
    ``seed`` (secret, research only) seeds every stream; ``public_seed`` only the public ones;
    ``secure_rng`` draws the noise and the private sampling from ChaCha20 (see ``docs/engine.md``).
    ``noise``: the noise plan of the private steps (:mod:`featuredp.noise`), an instance (``BandMF(bands=4)``) or
    a registered name (:data:`featuredp.noise.NOISE_PLANS`): ``"independent"`` (DP-SGD's fresh Gaussian noise every
    step, the default), ``"bandmf"`` (banded matrix-factorization correlated noise with cyclic Poisson sampling) or
    ``"blt"`` (buffered-linear-Toeplitz correlated noise over epochs of ⌊n/m⌋ steps, accounted without
    amplification); it is held as the (unplanned) plan object, which the Trainer plans for the run. ``bands``:
    BandMF's bands (None lets the plan choose), folded into the plan; only for a plan that takes bands.
    ``record_epsilon`` (E, default None: no backstop): make the whole run also (E, δ)-DP for whole records —
    every step that reads the public view Ψ(S) is Poisson-sampled from a secret stream, clipped and noised
    (docs/engine.md, "The record-level backstop"); what Ψ misses is otherwise public and not covered.
    ``records_per_user`` (k): with a user key (``user_key=``, docs/users.md), the most records a sampled user
    contributes to a step (a secret uniform subset of a larger user's); None: all of them.
    """

    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    delta: float | None = 1e-5
    max_grad_norm: float = 1.0
    alpha: float = 1.0
    public_weight: float = 1.0
    relation: str = "add-remove"
    accountant: str = "pld"
    seed: int | None = None
    public_seed: int | None = None
    secure_rng: bool = False
    noise: NoisePlan | str = Independent()  # noqa: RUF009 - frozen, hashable
    bands: int | None = None
    record_epsilon: float | None = None
    records_per_user: int | None = None

    def __post_init__(self) -> None:
        _set(self, "noise_multiplier", _opt(check_nonnegative, "noise_multiplier", self.noise_multiplier))
        _set(self, "target_epsilon", _opt(check_positive, "target_epsilon", self.target_epsilon))
        _set(self, "delta", None if self.delta is None else check_delta(self.delta))
        _set(self, "max_grad_norm", check_positive("max_grad_norm", self.max_grad_norm, allow_inf=True))
        _set(self, "alpha", check_real("alpha", self.alpha))
        _set(self, "public_weight", check_nonnegative("public_weight", self.public_weight))
        _set(self, "relation", check_relation(self.relation))
        _set(self, "accountant", check_accountant(self.accountant))
        _set(self, "seed", None if self.seed is None else check_int("seed", self.seed, minimum=0))
        _set(self, "public_seed", None if self.public_seed is None else check_int("public_seed", self.public_seed,
                                                                                 minimum=0))
        if not isinstance(self.secure_rng, bool):
            raise TypeError(f"secure_rng must be True or False, got {self.secure_rng!r}")
        noise = noise_plan(self.noise)
        if self.bands is not None:
            _set(self, "bands", check_int("bands", self.bands, minimum=1))
            if "bands" not in plan_settings(type(noise)):
                takes = " or ".join(repr(k) for k, c in NOISE_PLANS.items() if "bands" in plan_settings(c))
                raise ValueError(f"bands is for noise={takes}, got bands={self.bands!r} with noise={noise.kind!r}")
            given = noise.settings().get("bands")
            if given is not None and given != self.bands:
                raise ValueError(f"bands={self.bands!r} disagrees with the noise plan's bands={given!r}")
            noise = replace(noise, bands=self.bands)  # type: ignore[type-var]
        _set(self, "noise", noise)
        _set(self, "record_epsilon", _opt(check_positive, "record_epsilon", self.record_epsilon))
        _set(self, "records_per_user", None if self.records_per_user is None else check_int(
            "records_per_user", self.records_per_user, minimum=1))
        if self.record_epsilon is not None and noise.correlated:
            raise ValueError(f"record_epsilon (the record-level backstop) is not supported with noise={noise.kind!r} "
                             f"yet; use noise={Independent.kind!r}")  # fmt: skip

    @property
    def noise_plan(self) -> NoisePlan:
        """``noise`` as its (unplanned) plan object (it is always one after construction)."""
        assert not isinstance(self.noise, str)
        return self.noise


@dataclass(frozen=True)
class ScheduleConfig:
    """The length of the run, its batch sizes and its optimiser.

    Exactly one of ``epochs`` / ``steps``; ``batch_size`` (the expected private batch m) or
    ``sampling_rate`` (p = m/n), default m = 256; with a user key (``user_key=``) m and p count users, and
    ``num_users`` declares how many the data holds (the analogue of ``dataset_size``). ``public_batch_size``:
    m', the public batch of Algorithm 1 in records (default 4·m, at most n); ``pretrain_batch_size``: the
    batches of public pre-training (default: a given ``public_batch_size``, else m).
    """

    epochs: float | None = None
    steps: int | None = None
    batch_size: int | None = None
    sampling_rate: float | None = None
    public_batch_size: int | None = None
    pretrain_batch_size: int | None = None
    dataset_size: int | None = None
    num_users: int | None = None
    pretrain_epochs: float = 0.0
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    pretrain_lr: float | None = None
    projection_radius: float | None = None
    averaging: str | None = None
    average_fraction: float = 0.5
    ema_decay: float = 0.99

    def __post_init__(self) -> None:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of epochs= or steps=")
        _set(self, "epochs", _opt(check_positive, "epochs", self.epochs))
        _set(self, "steps", None if self.steps is None else check_int("steps", self.steps, minimum=1))
        if self.batch_size is not None and self.sampling_rate is not None:
            raise ValueError("give batch_size= or sampling_rate=, not both")
        if self.batch_size is None and self.sampling_rate is None:
            _set(self, "batch_size", 256)
        _set(self, "sampling_rate", _opt(check_sampling_rate, "sampling_rate", self.sampling_rate))
        for name in ("batch_size", "public_batch_size", "pretrain_batch_size", "dataset_size", "num_users"):
            value = getattr(self, name)
            _set(self, name, None if value is None else check_int(name, value, minimum=1))
        _set(self, "pretrain_epochs", check_nonnegative("pretrain_epochs", self.pretrain_epochs))
        _set(self, "optimizer", check_choice("optimizer", self.optimizer, ("sgd", "adam")))
        _set(self, "lr", check_positive("lr", self.lr))
        _set(self, "pretrain_lr", self.lr if self.pretrain_lr is None else check_positive("pretrain_lr",
                                                                                          self.pretrain_lr))
        _set(self, "momentum", check_nonnegative("momentum", self.momentum))
        _set(self, "weight_decay", check_nonnegative("weight_decay", self.weight_decay))
        _set(self, "projection_radius", _opt(check_positive, "projection_radius", self.projection_radius))
        if self.averaging is not None:
            _set(self, "averaging", check_choice("averaging", self.averaging, ("uniform", "ema")))
        _set(self, "average_fraction", check_real("average_fraction", self.average_fraction))
        if not 0 < self.average_fraction <= 1:
            raise ValueError(f"average_fraction must be in (0, 1], got {self.average_fraction!r}")
        _set(self, "ema_decay", check_real("ema_decay", self.ema_decay))
        if not 0 < self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in (0, 1), got {self.ema_decay!r}")


@dataclass(frozen=True)
class PerformanceConfig:
    """How the run is computed: none of these changes the result beyond float rounding.

    ``strategy``: a registered clipping strategy name (``featuredp.clipping.STRATEGIES``)
    or a strategy object; None (default): ``"auto"`` (ghost or vmap, timed once on a stand-in batch of zeros),
    ``"ghost"`` in a data-parallel run, ``"vmap"`` for a user-level run. ``device``:
    ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"auto"`` or None (the model's device). ``distributed``: ``"auto"``
    joins a data-parallel run when ``torch.distributed`` is initialised or ``torchrun`` launched
    several processes (:mod:`featuredp.distributed`); ``"off"`` never does. ``precision``:
    ``"fp32"`` (default) or ``"bf16"`` — forward and backward under bfloat16 autocast, with the
    per-example norms, clip factors, clipped sums and noise in float32 or better. ``prefetch_noise`` (default
    True): draw the next step's noise on a worker thread while the step computes; the noise is bit for bit the same
    (:class:`featuredp.noise.sources.TorchNoise`), False draws it in line. ``sharding``: ``"none"`` (default; a model
    already wrapped with ``fully_shard`` is sharded all the same) or ``"fsdp"``: under torchrun the model is sharded
    with FSDP2 (:func:`featuredp.sharding.shard_model`), each rank holding a shard of every parameter, its gradient
    and its optimiser state; the released steps are those of one process (docs/distributed.md).
    """

    strategy: Any = None
    physical_batch_size: int | str | None = "auto"
    device: Any = None
    distributed: str = "auto"
    precision: str = "fp32"
    progress: bool = True
    log_points: int = 5
    prefetch_noise: bool = True
    sharding: str = "none"

    def __post_init__(self) -> None:
        pbs = self.physical_batch_size
        if pbs is not None and pbs != "auto":
            _set(self, "physical_batch_size", check_int("physical_batch_size", pbs, minimum=1))
        _set(self, "distributed", check_choice("distributed", self.distributed, ("auto", "off")))
        _set(self, "precision", check_choice("precision", self.precision, ("fp32", "bf16")))
        _set(self, "sharding", check_choice("sharding", self.sharding, ("none", "fsdp")))
        _set(self, "progress", bool(self.progress))
        _set(self, "prefetch_noise", bool(self.prefetch_noise))
        _set(self, "log_points", check_int("log_points", self.log_points, minimum=1))


_CONFIGS: dict[str, type] = {"privacy": PrivacyConfig, "schedule": ScheduleConfig, "performance": PerformanceConfig}
_OWNER = {f.name: kind for kind, cls in _CONFIGS.items() for f in fields(cls)}


def split_settings(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Sort flat keyword settings into ``{"privacy": {...}, "schedule": {...}, "performance": {...}}``.

    An unknown keyword is a ``TypeError`` that names it.
    """
    out: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        if key not in _OWNER:
            raise TypeError(f"unknown Trainer setting {key!r}; settings are {', '.join(sorted(_OWNER))}")
        out.setdefault(_OWNER[key], {})[key] = value
    return out


def _set(obj: object, name: str, value: Any) -> None:
    # Frozen dataclasses: normalised values are written once, here, during validation.
    object.__setattr__(obj, name, value)


def _opt(check: Any, name: str, value: Any) -> Any:
    return None if value is None else check(name, value)


def resolve_config(cls: Any, kind: str, given: Any, flat: dict[str, dict[str, Any]]) -> Any:
    """The config of ``kind``: the object given, or one built from the flat keywords for it (not both)."""
    keys = flat.get(kind, {})
    if given is not None:
        if not isinstance(given, cls):
            raise TypeError(f"{kind} must be a {cls.__name__}, got {type(given).__name__}")
        if keys:
            raise TypeError(f"give {kind}= or the flat settings {sorted(keys)}, not both")
        return given
    return cls(**keys)
