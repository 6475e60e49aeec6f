"""`DPConfig`: the mechanism's parameters, immutable and validated once.

Validation happens on construction so that a wrong value fails before any training (and before any
privacy budget is spent), with a message naming the field and its allowed range.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

from edp_tf.mechanism import (DECAYS, NOISE_MODES, PRIVACY_UNITS, USER_ESTIMATORS,
                              noise_multiplier_at)

SCALINGS = ("uniform", "public", "private", "first_batch")
PER_EXAMPLE_METHODS = ("ghost", "vectorized", "loop")
CLIPPINGS = ("flat", "per_layer")


def _finite(name: str, value: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"DPConfig.{name} must be a number, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"DPConfig.{name} must be finite, got {value!r}")
    return value


def _check_bandmf(cfg: "DPConfig") -> None:
    """BandMF's proof covers correlated noise of one constant std on per-step Poisson samples
    of one group: everything else is refused by name."""
    b = cfg.bandmf_bands
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise ValueError(f"DPConfig.bandmf_bands must be an integer >= 1, got {b!r}")
    if b == 1:
        return
    conflicts = [
        (cfg.noise_mode != "calibrated", "noise_mode='calibrated'"),
        (cfg.decay != "none", "decay='none' (the noise of one step is correlated with the "
         "next b - 1 steps', so one std must hold across them; a per-epoch decay is not "
         "covered by the banded analysis)"),
        (cfg.privacy_unit != "example", "privacy_unit='example'"),
        (cfg.sparse_embeddings, "sparse_embeddings=False"),
        (cfg.augment_copies > 1, "augment_copies=1"),
    ]
    for failed, needed in conflicts:
        if failed:
            raise ValueError(f"DPConfig.bandmf_bands={b} (BandMF) needs {needed}")


@dataclasses.dataclass(frozen=True)
class DPConfig:
    """Parameters of (efficient) DP-SGD.

    Attributes:
      l2_norm_clip: C > 0, the clipping norm of each micro-batch gradient in the scaled space.
      noise_multiplier: z0 >= 0, the noise multiplier of epoch 0 (relative to the sensitivity S in
        `calibrated` mode).
      microbatch_size: None: one micro-batch per replica (eDP-SGD as in the paper); 1: per-example
        DP-SGD; k: micro-batches of k examples.
      noise_mode: "calibrated" (summed noise is exactly z_t * S) or "paper" (Algorithm 1 literally,
        weaker by sqrt(N) * S / C: accounted with its effective multiplier).
      decay: "none", "linear" (z0 / (1 + tau t)) or "exponential" (z0 exp(-tau t)), t the 0-based epoch.
      decay_rate: tau >= 0.
      scaling: how the per-variable scales alpha are chosen: "uniform" (flat clipping), "public"
        (norms of a public batch, or `layer_scales`), "private" (a noisy norm query, charged to the
        ledger), "first_batch" (the paper's choice on private data: NOT covered by epsilon).
      layer_scales: explicit alpha, one positive value per trainable variable (normalised so that
        sum alpha_k^2 = K). Implies "public" scaling or is checked against it.
      seed: None draws noise seeds from OS entropy. A fixed seed makes the noise predictable: the
        run is then reported as not private.
      expected_batch_size: with Poisson sampling, the expected global batch q * n; the step
        normalises by it instead of the realised (padded) batch. None: fixed-size batches.
      scaling_noise_multiplier: noise multiplier of the "private" scaling query (sensitivity 1).
      scaling_examples: how many examples of the first batch the "private" query uses.
      physical_batch_size: None, or the most examples a replica processes at once: a larger
        replica batch is processed in chunks one after the other and their clipped sums added
        (the same mechanism, bounded memory). A multiple of microbatch_size.
      per_example_method: how micro-batch gradients are clipped when microbatch_size is set:
        "ghost" (ghost norms where a rule covers the layer, exact per-example gradients elsewhere)
        or "vectorized" (exact per-example gradients of every variable: the reference), both
        vectorised with `tf.vectorized_map`; or "loop" (one micro-batch at a time in a
        while_loop: exact for every layer, e.g. a recurrent layer that is not unrolled; slower).
      privacy_unit: "example", or "user" (user-level DP, DP-FedSGD): batches from
        `edp_tf.sampling.UserPoissonSampler`, one micro-batch per sampled user holding at most
        `microbatch_size` of their examples, its loss the mean over them; S = C per user, and
        epsilon protects a user's whole data. Needs expected_batch_size = q x users.
      local_epochs: 0 (DP-FedSGD: the user's gradient), or E >= 1 with privacy_unit="user"
        (DP-FedAvg, edp_tf/local_training.py): each user's contribution is theta - theta_local
        after E epochs of local SGD (`local_learning_rate`, batches of `local_batch_size` rows,
        None: all of the user's rows at once); the optimizer is the server optimizer.
      user_estimator: with privacy_unit="user", "fixed" (the update is divided by q W, the
        expected users: S = C) or "clipped" (by max(q W, users drawn in the step): S = 2C, the
        noise fixed on the average).
      clipping: "flat" (the whole scaled micro-batch gradient clipped to C) or "per_layer"
        (each trainable variable's scaled part clipped to C / sqrt(K) on its own, McMahan et al.
        2018's per-layer clipping with equal budgets; per-layer scales alpha set unequal ones):
        the clipped vector's norm is <= C either way, so S and epsilon are the same.
      sparse_embeddings: DP-AdaFEST (edp_tf/selection.py): the tables of the model's `Embedding`
        layers are updated only at rows whose noisy count of touching micro-batches exceeds
        `selection_threshold`, with noise drawn for those rows only; every other row's update is
        exactly 0, so SGD leaves it unchanged. The update reaches the optimizer as IndexedSlices
        of the selected rows (with several replicas the step sums those rows over the replicas
        itself), which Keras' Adam and momentum SGD apply row by row: other rows stay
        unchanged under them too. AdamW's decoupled weight decay shrinks every row. Each
        micro-batch's count vector is clipped to
        `selection_clip` (C1) and the summed counts get noise of std
        sigma_c = `selection_noise_multiplier` x S x C1; a row is selected when its noisy count
        exceeds `selection_threshold` x sigma_c (3: an untouched row passes with probability
        0.13%). The accountant charges the joint multiplier (z^-2 + z_c^-2)^-1/2 per step.
        Example-level only; not with the loop method.
      augment_copies: K >= 1, augmentation multiplicity (De et al. 2022): each example's
        micro-batch holds K rows, copies of that example augmented with public data only, whose
        loss is their mean (1/K each), clipped once: the clipped vector carries less of the
        augmentations' variance at the same C, and adding or removing the example still adds or
        removes one clipped micro-batch (S = C, epsilon unchanged). The batches must hold each
        sampled example's K copies in consecutive rows (edp_tf.sampling.AugmentedPoissonSampler);
        sample weights are in [0, 1] and scale the clipped vector, as a user's do. Needs
        per-example clipping (microbatch_size=1) at privacy_unit='example'; 1: no copies.
      bandmf_bands: b >= 1. 1: independent noise at every step (DP-SGD). b >= 2: amplified
        banded matrix factorization (edp_tf/bandmf.py): noise correlated across b steps,
        batches from `edp_tf.sampling.BandMFSampler(bands=b)`, charged as ceil(T / b) steps
        at rate b q. Needs noise_mode='calibrated', no decay, example level, no sparse
        embedding noise and no augmented copies (and, when the step is built, Poisson sampling:
        expected_batch_size).
    """

    l2_norm_clip: float = 1.0
    noise_multiplier: float = 1.0
    microbatch_size: Optional[int] = None
    noise_mode: str = "calibrated"
    decay: str = "none"
    decay_rate: float = 0.0
    scaling: str = "uniform"
    layer_scales: Optional[Tuple[float, ...]] = None
    seed: Optional[int] = None
    expected_batch_size: Optional[float] = None
    scaling_noise_multiplier: float = 5.0
    scaling_examples: int = 64
    per_example_method: str = "ghost"
    physical_batch_size: Optional[int] = None
    privacy_unit: str = "example"
    local_epochs: int = 0
    local_batch_size: Optional[int] = None
    local_learning_rate: float = 0.1
    user_estimator: str = "fixed"
    clipping: str = "flat"
    sparse_embeddings: bool = False
    selection_noise_multiplier: float = 5.0
    selection_clip: float = 1.0
    selection_threshold: float = 3.0
    augment_copies: int = 1
    bandmf_bands: int = 1

    def __post_init__(self) -> None:
        clip = _finite("l2_norm_clip", self.l2_norm_clip)
        if clip <= 0:
            raise ValueError(f"DPConfig.l2_norm_clip must be > 0, got {self.l2_norm_clip!r}")
        z = _finite("noise_multiplier", self.noise_multiplier)
        if z < 0:
            raise ValueError(
                f"DPConfig.noise_multiplier must be >= 0, got {self.noise_multiplier!r}"
            )
        if self.microbatch_size is not None:
            if isinstance(self.microbatch_size, bool) or not isinstance(self.microbatch_size, int):
                raise ValueError(
                    "DPConfig.microbatch_size must be None (one micro-batch per replica) or an "
                    f"integer >= 1, got {self.microbatch_size!r}"
                )
            if self.microbatch_size < 1:
                raise ValueError(
                    f"DPConfig.microbatch_size must be >= 1 or None, got {self.microbatch_size!r}"
                )
        if self.noise_mode not in NOISE_MODES:
            raise ValueError(
                f"DPConfig.noise_mode must be one of {NOISE_MODES}, got {self.noise_mode!r}"
            )
        if self.noise_mode == "paper" and self.microbatch_size is not None:
            raise ValueError(
                "DPConfig.noise_mode='paper' reproduces Algorithm 1, which has one micro-batch per "
                f"replica: microbatch_size must be None, got {self.microbatch_size!r}"
            )
        if self.decay not in DECAYS:
            raise ValueError(f"DPConfig.decay must be one of {DECAYS}, got {self.decay!r}")
        tau = _finite("decay_rate", self.decay_rate)
        if tau < 0:
            raise ValueError(f"DPConfig.decay_rate must be >= 0, got {self.decay_rate!r}")
        if self.scaling not in SCALINGS:
            raise ValueError(f"DPConfig.scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if self.layer_scales is not None:
            scales = tuple(self.layer_scales)
            if not scales:
                raise ValueError("DPConfig.layer_scales must be non-empty when given")
            for i, a in enumerate(scales):
                a = _finite(f"layer_scales[{i}]", a)
                if a <= 0:
                    raise ValueError(f"DPConfig.layer_scales[{i}] must be > 0, got {a!r}")
            if self.scaling not in ("public", "uniform"):
                raise ValueError(
                    "DPConfig.layer_scales are public scales: use scaling='public' with them, "
                    f"not {self.scaling!r}"
                )
            object.__setattr__(self, "layer_scales", tuple(float(a) for a in scales))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"DPConfig.seed must be None or an integer, got {self.seed!r}")
        if self.expected_batch_size is not None:
            e = _finite("expected_batch_size", self.expected_batch_size)
            if e <= 0:
                raise ValueError(
                    f"DPConfig.expected_batch_size must be > 0, got {self.expected_batch_size!r}"
                )
        zq = _finite("scaling_noise_multiplier", self.scaling_noise_multiplier)
        if zq <= 0:
            raise ValueError(
                "DPConfig.scaling_noise_multiplier must be > 0, got "
                f"{self.scaling_noise_multiplier!r}"
            )
        if not isinstance(self.scaling_examples, int) or self.scaling_examples < 1:
            raise ValueError(
                f"DPConfig.scaling_examples must be an integer >= 1, got {self.scaling_examples!r}"
            )

        k = self.augment_copies
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"DPConfig.augment_copies must be an integer >= 1, got {k!r}")
        if self.physical_batch_size is not None:
            p = self.physical_batch_size
            if isinstance(p, bool) or not isinstance(p, int) or p < 1:
                raise ValueError(f"DPConfig.physical_batch_size must be None or an integer >= 1, "
                                 f"got {p!r}")
            rows = (self.microbatch_size or 1) * k  # a micro-batch's rows: whole chunks of them
            if self.microbatch_size is not None and p % rows:
                raise ValueError(f"DPConfig.physical_batch_size={p} must be a multiple of "
                                 f"microbatch_size={self.microbatch_size}"
                                 + (f" x augment_copies={self.augment_copies}" if rows
                                    != self.microbatch_size else ""))
        if self.privacy_unit not in PRIVACY_UNITS:
            raise ValueError(f"DPConfig.privacy_unit must be one of {PRIVACY_UNITS}, "
                             f"got {self.privacy_unit!r}")
        if self.privacy_unit == "user" and self.scaling == "private":
            # the scaling query adds one unit vector per *row* and is charged with sensitivity
            # 1; one user may own up to microbatch_size of those rows, so its true sensitivity
            # is the user's row count and the charge would understate epsilon
            raise ValueError("DPConfig.scaling='private' is an example-level query and cannot be "
                             "combined with privacy_unit='user' (one user moves it by up to "
                             "microbatch_size): use scaling='uniform', or 'public' scales "
                             "measured on public data")
        if self.privacy_unit == "user" and (self.microbatch_size is None
                                            or self.expected_batch_size is None):
            raise ValueError("DPConfig.privacy_unit='user' needs microbatch_size (the cap of "
                             "examples per user) and expected_batch_size (q x users) from a "
                             "UserPoissonSampler")
        e = self.local_epochs
        if isinstance(e, bool) or not isinstance(e, int) or e < 0:
            raise ValueError(f"DPConfig.local_epochs must be an integer >= 0, got {e!r}")
        if e and self.privacy_unit != "user":
            raise ValueError("DPConfig.local_epochs (DP-FedAvg) needs privacy_unit='user': local "
                             "training is per user")
        b = self.local_batch_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ValueError(f"DPConfig.local_batch_size must be None or an integer >= 1, "
                             f"got {b!r}")
        lr = self.local_learning_rate
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
            raise ValueError(f"DPConfig.local_learning_rate must be a positive number, got {lr!r}")
        if self.user_estimator not in USER_ESTIMATORS:
            raise ValueError(f"DPConfig.user_estimator must be 'fixed' or 'clipped', "
                             f"got {self.user_estimator!r}")
        if self.user_estimator == "clipped" and self.privacy_unit != "user":
            raise ValueError("DPConfig.user_estimator='clipped' needs privacy_unit='user'")
        if self.per_example_method not in PER_EXAMPLE_METHODS:
            raise ValueError(f"DPConfig.per_example_method must be one of {PER_EXAMPLE_METHODS}, "
                             f"got {self.per_example_method!r}")
        if self.clipping not in CLIPPINGS:
            raise ValueError(f"DPConfig.clipping must be one of {CLIPPINGS}, "
                             f"got {self.clipping!r}")
        if not isinstance(self.sparse_embeddings, bool):
            raise ValueError(f"DPConfig.sparse_embeddings must be True or False, "
                             f"got {self.sparse_embeddings!r}")
        for name in ("selection_noise_multiplier", "selection_clip"):
            if _finite(name, getattr(self, name)) <= 0:
                raise ValueError(f"DPConfig.{name} must be > 0, got {getattr(self, name)!r}")
        _finite("selection_threshold", self.selection_threshold)
        if self.sparse_embeddings and self.privacy_unit != "example":
            raise ValueError("DPConfig.sparse_embeddings is example-level only (privacy_unit="
                             f"'example'), got privacy_unit={self.privacy_unit!r}")
        if self.sparse_embeddings and self.microbatch_size is not None and (
                self.per_example_method == "loop"):
            raise ValueError("DPConfig.sparse_embeddings does not support per_example_method="
                             "'loop': use 'ghost' or 'vectorized'")
        if k > 1 and self.privacy_unit != "example":
            # a user's micro-batch already averages their rows under one clip; K copies of each
            # would have to share its cap of microbatch_size rows with the user's other
            # examples, which is another sampler than the one whose sensitivity is proven
            raise ValueError("DPConfig.augment_copies > 1 is example-level only: at "
                             "privacy_unit='user' a user's micro-batch already averages their "
                             "rows under one clip")
        if k > 1 and self.microbatch_size != 1:
            # with several examples per micro-batch their copies would share a clip (S = 2C)
            # and their mean would weigh examples by their number of copies drawn
            raise ValueError("DPConfig.augment_copies > 1 needs per-example clipping "
                             f"(microbatch_size=1), got microbatch_size={self.microbatch_size!r}")
        if k > 1 and self.scaling == "private":
            # the scale query adds one unit vector per row and is charged with sensitivity 1:
            # an example owns K rows
            raise ValueError("DPConfig.augment_copies > 1 cannot be combined with "
                             "scaling='private' (a per-row query; one example owns K rows): use "
                             "'uniform' or 'public' scales")

        _check_bandmf(self)

    def noise_multiplier_at(self, epoch: int) -> float:
        """z_t for the 0-based epoch t of the decay schedule."""
        return noise_multiplier_at(epoch, self.noise_multiplier, self.decay, self.decay_rate)

    def replace(self, **changes) -> "DPConfig":
        return dataclasses.replace(self, **changes)

    @property
    def seed_fixed(self) -> bool:
        return self.seed is not None
