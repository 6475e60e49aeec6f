"""`DPConfig`: the mechanism's parameters in groups, immutable, validated once; `compatibility`:
every rule on which features combine, in one place.

A group validates its own fields (a wrong value fails with a message naming the field and its
range); `compatibility` holds every rule between fields of different groups and between the
config and what a run adds outside it (`Features`: a freeze, a projection, the optimizer, the
workers, the sampling). `DPConfig` calls it on construction, `PrivateModel` again with the
features it sees, and an application before building anything, so a combination with no proof
fails before any privacy budget is spent, with the same words wherever it is found.

Flat names stay: `DPConfig(l2_norm_clip=..., decay=...)`, `config.decay` and a saved config's
flat dict all work; the groups are the structure (`config.schedule.decay`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple

from edp_tf import checks
from edp_tf.mechanism import (
    DECAYS,
    NOISE_MODES,
    PRIVACY_UNITS,
    USER_ESTIMATORS,
    noise_multiplier_at,
)
from edp_tf.sampling_unit import SamplingUnit

SCALINGS = ("uniform", "public", "private", "first_batch")
PER_EXAMPLE_METHODS = ("ghost", "vectorized", "loop")
CLIPPINGS = ("flat", "per_layer")
SAMPLINGS = ("poisson", "shuffle")


def _set(group, name: str, value) -> None:
    object.__setattr__(group, name, value)


def _choice(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise checks.FieldError(name, f"DPConfig.{name} must be one of {allowed}, got {value!r}")


def _optional_count(group, name: str, minimum: int, none_means: str = "") -> None:
    value = getattr(group, name)
    if value is None:
        return
    try:
        _set(group, name, checks.count(f"DPConfig.{name}", value, minimum))
    except ValueError:
        raise checks.FieldError(name, f"DPConfig.{name} must be None{none_means} or an integer "
                                      f">= {minimum}, got {value!r}") from None


@dataclasses.dataclass(frozen=True)
class Core:
    """What every private step has.

    Attributes:
      l2_norm_clip: C > 0, the clipping norm of each micro-batch gradient in the scaled space.
      noise_multiplier: z0 >= 0, the noise multiplier of epoch 0 (relative to the sensitivity S).
      microbatch_size: None: one micro-batch per replica (eDP-SGD as in the paper); 1: per-example
        DP-SGD; k: micro-batches of k examples (at privacy_unit='user': a user's cap of rows).
      expected_batch_size: with Poisson sampling, the expected global batch q * n; the step
        normalises by it instead of the realised (padded) batch. None: fixed-size batches.
      seed: None draws noise seeds from OS entropy. A fixed seed makes the noise predictable: the
        run is then reported as not private.
      secure_noise: Opacus' secure mode: the noise generator's whole state from the OS's
        CSPRNG, and each Gaussian sample the normalised sum of 4 draws, against floating-point
        attacks on the sampler (edp_tf.noise.SecureNormal). The same distribution, so the same
        epsilon; about 4x the noise draws' time. Not with a fixed seed.
      clipping: "flat" (the whole scaled micro-batch gradient clipped to C) or "per_layer"
        (each trainable variable's scaled part clipped to C / sqrt(K) on its own, McMahan et al.
        2018; per-layer scales alpha set unequal budgets): the clipped vector's norm is <= C
        either way, so S and epsilon are the same.
    """

    l2_norm_clip: float = 1.0
    noise_multiplier: float = 1.0
    microbatch_size: Optional[int] = None
    expected_batch_size: Optional[float] = None
    seed: Optional[int] = None
    clipping: str = "flat"
    secure_noise: bool = False

    def __post_init__(self) -> None:
        _set(self, "l2_norm_clip", checks.number("DPConfig.l2_norm_clip", self.l2_norm_clip,
                                                 low=0, low_open=True))
        _set(self, "noise_multiplier", checks.number("DPConfig.noise_multiplier",
                                                     self.noise_multiplier, low=0))
        _optional_count(self, "microbatch_size", 1, " (one micro-batch per replica)")
        if self.expected_batch_size is not None:
            _set(self, "expected_batch_size", checks.number(
                "DPConfig.expected_batch_size", self.expected_batch_size, low=0, low_open=True))
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int)):
            raise checks.FieldError(
                "seed", f"DPConfig.seed must be None or an integer, got {self.seed!r}")
        _choice("clipping", self.clipping, CLIPPINGS)
        if not isinstance(self.secure_noise, bool):
            raise checks.FieldError("secure_noise", "DPConfig.secure_noise must be True or "
                                    f"False, got {self.secure_noise!r}")
        if self.secure_noise and self.seed is not None:
            raise checks.FieldError(
                "secure_noise", "DPConfig.secure_noise takes the noise seed from the OS's "
                f"CSPRNG: it cannot be combined with seed={self.seed}")


@dataclasses.dataclass(frozen=True)
class NoiseSchedule:
    """How z is spread over replicas and epochs.

    Attributes:
      noise_mode: "calibrated" (summed noise is exactly z_t * S) or "paper" (Algorithm 1
        literally, weaker by sqrt(N) * S / C: accounted with its effective multiplier).
      decay: "none", "linear" (z0 / (1 + tau t)) or "exponential" (z0 exp(-tau t)), t the
        0-based epoch.
      decay_rate: tau >= 0.
    """

    noise_mode: str = "calibrated"
    decay: str = "none"
    decay_rate: float = 0.0

    def __post_init__(self) -> None:
        _choice("noise_mode", self.noise_mode, NOISE_MODES)
        _choice("decay", self.decay, DECAYS)
        _set(self, "decay_rate", checks.number("DPConfig.decay_rate", self.decay_rate, low=0))


@dataclasses.dataclass(frozen=True)
class LayerScaling:
    """Per-variable scales alpha (the gradient is clipped in the scaled space).

    Attributes:
      scaling: "uniform" (flat clipping), "public" (norms of a public batch, or `layer_scales`),
        "private" (a noisy norm query, charged to the ledger), "first_batch" (the paper's choice
        on private data: NOT covered by epsilon).
      layer_scales: explicit alpha, one positive value per trainable variable (normalised so
        that sum alpha_k^2 = K). Implies "public" scaling or is checked against it.
      scaling_noise_multiplier: noise multiplier of the "private" scaling query (sensitivity 1).
      scaling_examples: how many examples of the first batch the "private" query uses.
    """

    scaling: str = "uniform"
    layer_scales: Optional[Tuple[float, ...]] = None
    scaling_noise_multiplier: float = 5.0
    scaling_examples: int = 64

    def __post_init__(self) -> None:
        _choice("scaling", self.scaling, SCALINGS)
        if self.layer_scales is not None:
            scales = tuple(self.layer_scales)
            if not scales:
                raise checks.FieldError("layer_scales",
                                        "DPConfig.layer_scales must be non-empty when given")
            _set(self, "layer_scales", tuple(
                checks.number(f"DPConfig.layer_scales[{i}]", a, low=0, low_open=True)
                for i, a in enumerate(scales)))
        _set(self, "scaling_noise_multiplier", checks.number(
            "DPConfig.scaling_noise_multiplier", self.scaling_noise_multiplier, low=0,
            low_open=True))
        _set(self, "scaling_examples", checks.count("DPConfig.scaling_examples",
                                                    self.scaling_examples, 1))


@dataclasses.dataclass(frozen=True)
class UserLevel:
    """User-level DP (DP-FedSGD, DP-FedAvg).

    Attributes:
      privacy_unit: "example", or "user": batches from `edp_tf.sampling.UserPoissonSampler`, one
        micro-batch per sampled user holding at most `microbatch_size` of their examples, its
        loss the mean over them; S = C per user, and epsilon protects a user's whole data.
        Needs expected_batch_size = q x users.
      user_estimator: "fixed" (the update is divided by q W, the expected users: S = C) or
        "clipped" (by max(q W, users drawn in the step): S = 2C, the noise fixed on the average).
      local_epochs: 0 (DP-FedSGD: the user's gradient), or E >= 1 (DP-FedAvg,
        edp_tf/local_training.py): each user's contribution is theta - theta_local after E
        epochs of local SGD (`local_learning_rate`, batches of `local_batch_size` rows, None: all
        of the user's rows at once); the optimizer is the server optimizer.
    """

    privacy_unit: str = "example"
    user_estimator: str = "fixed"
    local_epochs: int = 0
    local_batch_size: Optional[int] = None
    local_learning_rate: float = 0.1

    def __post_init__(self) -> None:
        _choice("privacy_unit", self.privacy_unit, PRIVACY_UNITS)
        _choice("user_estimator", self.user_estimator, USER_ESTIMATORS)
        _set(self, "local_epochs", checks.count("DPConfig.local_epochs", self.local_epochs, 0))
        _optional_count(self, "local_batch_size", 1)
        _set(self, "local_learning_rate", checks.number(
            "DPConfig.local_learning_rate", self.local_learning_rate, low=0, low_open=True))


@dataclasses.dataclass(frozen=True)
class SparseEmbeddings:
    """DP-AdaFEST (edp_tf/selection.py).

    Attributes:
      sparse_embeddings: the tables of the model's `Embedding` layers are updated only at rows
        whose noisy count of touching micro-batches exceeds `selection_threshold`, with noise
        drawn for those rows only; every other row's update is exactly 0. The update reaches the
        optimizer as IndexedSlices of the selected rows, which Keras' Adam and momentum SGD apply
        row by row (AdamW's decoupled weight decay shrinks every row). Each micro-batch's count
        vector is clipped to `selection_clip` (C1) and the summed counts get noise of std
        sigma_c = `selection_noise_multiplier` x S x C1; a row is selected when its noisy count
        exceeds `selection_threshold` x sigma_c (3: an untouched row passes with probability
        0.13%). The accountant charges the joint multiplier (z^-2 + z_c^-2)^-1/2 per step.
    """

    sparse_embeddings: bool = False
    selection_noise_multiplier: float = 5.0
    selection_clip: float = 1.0
    selection_threshold: float = 3.0

    def __post_init__(self) -> None:
        if not isinstance(self.sparse_embeddings, bool):
            raise checks.FieldError("sparse_embeddings", f"DPConfig.sparse_embeddings must be "
                                    f"True or False, got {self.sparse_embeddings!r}")
        for name in ("selection_noise_multiplier", "selection_clip"):
            _set(self, name, checks.number(f"DPConfig.{name}", getattr(self, name), low=0,
                                           low_open=True))
        _set(self, "selection_threshold", checks.number("DPConfig.selection_threshold",
                                                        self.selection_threshold))


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """Augmentation multiplicity (De et al. 2022).

    Attributes:
      augment_copies: K >= 1: each example's micro-batch holds K rows, copies of that example
        augmented with public data only, whose loss is their mean, clipped once: adding or
        removing the example still adds or removes one clipped micro-batch (S = C, epsilon
        unchanged). The batches hold each sampled example's K copies in consecutive rows
        (edp_tf.sampling.AugmentedPoissonSampler). 1: no copies.
    """

    augment_copies: int = 1

    def __post_init__(self) -> None:
        _set(self, "augment_copies", checks.count("DPConfig.augment_copies",
                                                  self.augment_copies, 1))


@dataclasses.dataclass(frozen=True)
class CorrelatedNoise:
    """Amplified banded matrix factorization (BandMF, Choquette-Choo et al. 2023).

    Attributes:
      bandmf_bands: b >= 1. 1: independent noise at every step (DP-SGD). b >= 2: noise
        correlated across b steps (edp_tf/bandmf.py), batches from
        `edp_tf.sampling.BandMFSampler(bands=b)`, charged as ceil(T / b) steps at rate b q. Its
        proof covers one constant noise std on per-step Poisson samples of one group: the rules
        of `compatibility` refuse the rest by name.
    """

    bandmf_bands: int = 1

    def __post_init__(self) -> None:
        _set(self, "bandmf_bands", checks.count("DPConfig.bandmf_bands", self.bandmf_bands, 1))


@dataclasses.dataclass(frozen=True)
class Execution:
    """How the step computes the same mechanism: no effect on S, the noise or epsilon.

    Attributes:
      per_example_method: how micro-batch gradients are clipped when microbatch_size is set:
        "ghost" (ghost norms where a rule covers the layer, exact per-example gradients
        elsewhere) or "vectorized" (exact per-example gradients of every variable), both with
        `tf.vectorized_map`; or "loop" (one micro-batch at a time in a while_loop: exact for
        every layer, e.g. a recurrent layer that is not unrolled; slower).
      physical_batch_size: None, or the most rows a replica processes at once: a larger replica
        batch is clipped in chunks one after the other and their clipped sums added (bounded
        memory). A multiple of a micro-batch's rows.
    """

    per_example_method: str = "ghost"
    physical_batch_size: Optional[int] = None

    def __post_init__(self) -> None:
        _choice("per_example_method", self.per_example_method, PER_EXAMPLE_METHODS)
        _optional_count(self, "physical_batch_size", 1)


# group attribute of DPConfig -> its class; a new mechanism adds its group here
GROUPS = {"core": Core, "schedule": NoiseSchedule, "layer_scaling": LayerScaling,
          "user_level": UserLevel, "sparse": SparseEmbeddings, "augmentation": Augmentation,
          "correlated": CorrelatedNoise, "execution": Execution}
# flat field name (the keyword argument, the attribute, a saved config's key) -> its group
FLAT_FIELDS = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


@dataclasses.dataclass(frozen=True, init=False)
class DPConfig:
    """Parameters of (efficient) DP-SGD, in groups (each documented on its class): `core`
    (Core), and the optional `schedule` (NoiseSchedule), `layer_scaling` (LayerScaling),
    `user_level` (UserLevel), `sparse` (SparseEmbeddings), `augmentation` (Augmentation),
    `correlated` (CorrelatedNoise), each off at its default; `execution` (Execution) changes how
    the step runs, not what it releases.

    Built from groups, flat names, or both (flat names override the given groups' fields):
    `DPConfig(l2_norm_clip=1.0, microbatch_size=1, decay="linear", decay_rate=0.2)` is
    `DPConfig(core=Core(l2_norm_clip=1.0, microbatch_size=1), schedule=NoiseSchedule(
    decay="linear", decay_rate=0.2))`. Every flat name is an attribute (`config.decay`).
    """

    core: Core
    schedule: NoiseSchedule
    layer_scaling: LayerScaling
    user_level: UserLevel
    sparse: SparseEmbeddings
    augmentation: Augmentation
    correlated: CorrelatedNoise
    execution: Execution

    def __init__(self, **fields: Any) -> None:
        unknown = sorted(set(fields) - set(GROUPS) - set(FLAT_FIELDS))
        if unknown:
            raise TypeError(f"DPConfig got unexpected field(s) {unknown}: the fields are "
                            f"{sorted(FLAT_FIELDS)} (or the groups {sorted(GROUPS)})")
        for group, cls in GROUPS.items():
            given = fields.get(group) or cls()
            if not isinstance(given, cls):
                raise TypeError(f"DPConfig.{group} must be an edp_tf.config.{cls.__name__}, "
                                f"got {type(given).__name__}")
            flat = {name: fields[name] for name in fields if FLAT_FIELDS.get(name) == group}
            object.__setattr__(self, group, dataclasses.replace(given, **flat) if flat else given)
        compatibility(self)

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> "DPConfig":
        """A config from `to_dict()`'s nested form or the flat one older files hold."""
        fields = {}
        for key, value in saved.items():
            if key in GROUPS and isinstance(value, Mapping):
                fields.update(value)
            else:
                fields[key] = value
        if fields.get("layer_scales") is not None:
            fields["layer_scales"] = tuple(fields["layer_scales"])
        return cls(**fields)

    def to_dict(self) -> dict:
        """{group: {field: value}}: what a run saves (`from_dict` reads it back)."""
        return {group: dataclasses.asdict(getattr(self, group)) for group in GROUPS}

    def flat(self) -> dict:
        """{flat field name: value}."""
        return {name: getattr(self, name) for name in FLAT_FIELDS}

    def noise_multiplier_at(self, epoch: int) -> float:
        """z_t for the 0-based epoch t of the decay schedule."""
        return noise_multiplier_at(epoch, self.noise_multiplier, self.decay, self.decay_rate)

    def replace(self, **changes: Any) -> "DPConfig":
        """A copy with these flat fields or groups changed (checked again)."""
        return DPConfig(**{group: getattr(self, group) for group in GROUPS}, **changes)

    @property
    def seed_fixed(self) -> bool:
        return self.seed is not None

    @property
    def microbatch_rows(self) -> Optional[int]:
        """Rows of one micro-batch, the one definition: microbatch_size times the augmented
        copies of each example; None for one micro-batch per replica (its rows then are the
        replica's, `Mechanism.rows_per_microbatch`)."""
        k = self.microbatch_size
        return None if k is None else k * self.augment_copies

    @property
    def sampling_unit(self) -> SamplingUnit:
        """The unit one micro-batch clips: what the batches' sampler must draw
        (`edp_tf.sampling.for_unit` makes that sampler)."""
        return SamplingUnit.of_step(self.privacy_unit, self.microbatch_size,
                                    self.augment_copies, self.bandmf_bands)


def _flat_property(name: str, group: str) -> property:
    return property(lambda self: getattr(getattr(self, group), name),
                    doc=f"`{group}.{name}` (see {GROUPS[group].__name__}).")


for _name, _group in FLAT_FIELDS.items():
    setattr(DPConfig, _name, _flat_property(_name, _group))


def defaults() -> dict:
    """{flat field name: its default}."""
    return {f.name: f.default for cls in GROUPS.values() for f in dataclasses.fields(cls)}


@dataclasses.dataclass(frozen=True)
class Features:
    """What a run combines with its DPConfig outside it, for `compatibility`.

    Attributes:
      freeze: `PrivateModel.freeze_until` freezes variables for the first epochs.
      projection: `PrivateModel.project_onto_public_gradients` projects each update.
      bias_corrected_adam: the optimizer is `edp_tf.BiasCorrectedAdam`.
      multi_worker: the strategy spans several workers.
      sampling: "poisson" or "shuffle" (fixed-size shuffled batches); None: not known here.
      per_example_method: the method the step runs when it differs from the config's (the loop
        PrivateModel falls back to for layers tf.vectorized_map cannot split); None: the config's.
    """

    freeze: bool = False
    projection: bool = False
    bias_corrected_adam: bool = False
    multi_worker: bool = False
    sampling: Optional[str] = None
    per_example_method: Optional[str] = None


class Incompatible(ValueError):
    """A combination with no proof (or no implementation); `field` is the flat DPConfig field
    or the `Features` attribute at fault, for an application to name its own flag."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def compatibility(config: DPConfig, features: Features = Features(), why: str = "") -> None:
    """Every rule on which fields and features combine: an `Incompatible` naming the first
    field at fault, else None. Called by DPConfig on construction (no features), by
    PrivateModel with what it sees, and by applications before they build anything. `why`:
    the reason a feature was chosen for the user, added to the refusal."""
    for field, broken, message in _rules(config, features):
        if broken:
            raise Incompatible(field, f"{message} ({why})" if why else message)


def _rules(c: DPConfig, f: Features):
    """(field at fault, whether the rule is broken, why) for each rule, in the order they are
    reported."""
    k, user, copies = c.microbatch_size, c.privacy_unit == "user", c.augment_copies
    method = f.per_example_method or c.per_example_method
    rows = c.microbatch_rows  # the chunks hold whole micro-batches
    p = c.physical_batch_size
    yield ("noise_mode", c.noise_mode == "paper" and k is not None,
           "DPConfig.noise_mode='paper' reproduces Algorithm 1, which has one micro-batch per "
           f"replica: microbatch_size must be None, got {k!r}")
    yield ("layer_scales", c.layer_scales is not None and c.scaling not in ("public", "uniform"),
           "DPConfig.layer_scales are public scales: use scaling='public' with them, "
           f"not {c.scaling!r}")
    yield ("physical_batch_size", p is not None and k is not None and p % rows != 0,
           f"DPConfig.physical_batch_size={p} must be a multiple of microbatch_size={k}"
           + (f" x augment_copies={copies}" if copies > 1 else ""))
    # the scaling query adds one unit vector per row and is charged with sensitivity 1; one
    # user may own up to microbatch_size rows, so the charge would understate epsilon
    yield ("scaling", user and c.scaling == "private",
           "DPConfig.scaling='private' is an example-level query and cannot be combined with "
           "privacy_unit='user' (one user moves it by up to microbatch_size): use "
           "scaling='uniform', or 'public' scales measured on public data")
    yield ("privacy_unit", user and (k is None or c.expected_batch_size is None),
           "DPConfig.privacy_unit='user' needs microbatch_size (the cap of examples per user) "
           "and expected_batch_size (q x users) from a UserPoissonSampler")
    yield ("privacy_unit", user and f.sampling == "shuffle",
           "DPConfig.privacy_unit='user' needs Poisson sampling over users, not sampling="
           "'shuffle'")
    yield ("local_epochs", c.local_epochs > 0 and not user,
           "DPConfig.local_epochs (DP-FedAvg) needs privacy_unit='user': local training is "
           "per user")
    yield ("user_estimator", c.user_estimator == "clipped" and not user,
           "DPConfig.user_estimator='clipped' needs privacy_unit='user'")
    yield ("sparse_embeddings", c.sparse_embeddings and c.privacy_unit != "example",
           "DPConfig.sparse_embeddings is example-level only (privacy_unit='example'), got "
           f"privacy_unit={c.privacy_unit!r}")
    yield ("sparse_embeddings", c.sparse_embeddings and k is not None and method == "loop",
           "DPConfig.sparse_embeddings does not support per_example_method='loop' (one "
           "micro-batch at a time): use 'ghost' or 'vectorized'")
    # a user's micro-batch already averages their rows under one clip; K copies of each would
    # share its cap with the user's other examples: another sampler than the proven one
    yield ("augment_copies", copies > 1 and c.privacy_unit != "example",
           "DPConfig.augment_copies > 1 is example-level only: at privacy_unit='user' a user's "
           "micro-batch already averages their rows under one clip")
    # several examples per micro-batch would share a clip (S = 2C), weighed by copies drawn
    yield ("augment_copies", copies > 1 and k != 1,
           "DPConfig.augment_copies > 1 needs per-example clipping (microbatch_size=1), got "
           f"microbatch_size={k!r}")
    # the scale query adds one unit vector per row, charged with sensitivity 1: an example
    # owns K rows
    yield ("augment_copies", copies > 1 and c.scaling == "private",
           "DPConfig.augment_copies > 1 cannot be combined with scaling='private' (a per-row "
           "query; one example owns K rows): use 'uniform' or 'public' scales")
    yield ("augment_copies", copies > 1 and f.sampling == "shuffle",
           "DPConfig.augment_copies > 1 needs Poisson sampling over examples, each bringing "
           "its copies, not sampling='shuffle'")
    yield from _bandmf_rules(c, f)
    yield from _feature_rules(c, f)


def _bandmf_rules(c: DPConfig, f: Features):
    """BandMF's proof covers correlated noise of one constant std on per-step Poisson samples
    of one group."""
    b = c.bandmf_bands
    needs = f"DPConfig.bandmf_bands={b} (BandMF) needs"
    yield ("bandmf_bands", b > 1 and c.noise_mode != "calibrated",
           f"{needs} noise_mode='calibrated'")
    yield ("bandmf_bands", b > 1 and c.decay != "none",
           f"{needs} decay='none' (the noise of one step is correlated with the next b - 1 "
           "steps', so one std must hold across them; a per-epoch decay is not covered by the "
           "banded analysis)")
    yield ("bandmf_bands", b > 1 and c.privacy_unit != "example",
           f"{needs} privacy_unit='example'")
    yield ("bandmf_bands", b > 1 and c.sparse_embeddings, f"{needs} sparse_embeddings=False")
    yield ("bandmf_bands", b > 1 and c.augment_copies > 1, f"{needs} augment_copies=1")
    yield ("bandmf_bands", b > 1 and f.sampling == "shuffle",
           f"{needs} Poisson sampling of its groups, not sampling='shuffle'")
    yield ("bias_corrected_adam", b > 1 and f.bias_corrected_adam,
           "BiasCorrectedAdam with DPConfig.bandmf_bands > 1: BandMF's noise variance changes "
           "over the first steps and is correlated across steps, which DP-AdamBC's correction "
           "does not model; use Adam")


def _feature_rules(c: DPConfig, f: Features):
    yield ("freeze", f.freeze and f.projection,
           "freeze_until cannot be combined with project_onto_public_gradients")
    # both select variables of their own (the tables; the model's own variables)
    yield ("freeze", f.freeze and (c.sparse_embeddings or c.local_epochs > 0),
           "freeze_until cannot be combined with DPConfig.sparse_embeddings or local_epochs")
    yield ("projection", f.projection and c.sparse_embeddings,
           "project_onto_public_gradients cannot be combined with DPConfig.sparse_embeddings "
           "(the tables' updates are sparse rows)")
    yield ("projection", f.projection and f.multi_worker,
           "project_onto_public_gradients runs on one worker: each worker would compute its "
           "own basis, and the projection must be one")
    yield ("bias_corrected_adam", f.bias_corrected_adam and f.projection,
           "BiasCorrectedAdam with project_onto_public_gradients: the projected noise's "
           "variance per weight is not one known constant; use Adam")
    yield ("bias_corrected_adam", f.bias_corrected_adam and c.sparse_embeddings,
           "BiasCorrectedAdam with DPConfig.sparse_embeddings=True: the tables' rows get noise "
           "only when selected, so their noise variance is not one known constant; use Adam")
    # each worker would measure its own part of the first batch and scale differently
    yield ("scaling", f.multi_worker and c.scaling in ("private", "first_batch"),
           f"DPConfig.scaling={c.scaling!r} measures the scales on one worker's data: use "
           "'uniform' or 'public' with several workers")
