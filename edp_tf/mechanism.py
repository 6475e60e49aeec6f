"""`Mechanism`: the private step described once, for the step, calibration, the ledger and
`edp_nlu.privacy` alike (plain Python: no TensorFlow).

The formulas the step and the accountant share live here and nowhere else (docs/design.md,
mechanism):
  S     sensitivity of a replica's clipped sum, in units of C, under add/remove adjacency: 1 with
        one example per micro-batch; 2 otherwise (one example can move its micro-batch's clipped
        gradient from c to c' with ||c - c'|| <= 2C);
  z_t   the noise multiplier of 0-based epoch t: z0, z0 / (1 + tau t) or z0 exp(-tau t);
  std   of the noise in the replicas' SUM: z_t S C ("calibrated"), or z_t C / sqrt(N) ("paper":
        Algorithm 1's y / N per replica, y ~ N(0, (C z_t)^2)); each replica's share is std / sqrt(N)
        and the accountant's multiplier is z_eff = std / (S C);
  k_e   expected real examples per micro-batch, and D = expected micro-batches per global batch:
        the update is alpha (clipped sum + noise) / D, normalised by the *expected* batch so that
        Poisson padding never changes it (docs/design.md, sampling).

User-level privacy (McMahan et al. 2018, DP-FedSGD): the unit is a user. Users are Poisson-
sampled, each sampled user's examples (at most `microbatch_size`) make one micro-batch whose loss
is the mean over them, so adding or removing a user adds or removes one clipped micro-batch:
S = 1. D is the expected number of users per step, q W: the fixed-denominator estimator
sum_k Delta_k / (q W) with weights w_k = 1. The clipped-denominator estimator divides by
max(q W, users in the step) instead (less variance when more users than expected are drawn);
adding a user then moves both sum and denominator, and the sensitivity of the average is
2 C / (q W) (McMahan et al. 2018, Lemma 1 with w_k = 1 and W_min = W): S = 2, and the noise is
added to the average at std z S C / (q W) whatever the denominator.

Augmentation multiplicity (De et al. 2022): with `augment_copies` K > 1 each example's
micro-batch holds K rows, augmented copies made from that example and public data only, whose loss
is their mean (as a user's micro-batch is the mean over the user's rows), clipped once. The unit
is still one example and adding or removing it adds or removes one clipped micro-batch: S = 1,
D = q n, the same accounting as K = 1; only the rows per micro-batch (and the padded batch) grow.

Sparse embedding noise (DP-AdaFEST, edp_tf/selection.py) adds a second Gaussian release on the
same sample each step, the noisy row counts (multiplier z_c relative to S C1): the accountant
charges the joint multiplier (z_eff^-2 + z_c^-2)^-1/2, `joint_noise_multiplier`.

BandMF (edp_tf/bandmf.py), b = `bands` >= 2: the summed noise of step t is
y_t = (z_t - sum_{k>=1} c_k y_{t-k}) / c_0 with z_t of the same std z S C, so S, k_e, D and z_eff
are DP-SGD's; the accountant charges ceil(T / b) steps at rate b q instead of T at q.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from edp_tf import bandmf, checks
from edp_tf.sampling_unit import SamplingUnit

NOISE_MODES = ("calibrated", "paper")
DECAYS = ("none", "linear", "exponential")
PRIVACY_UNITS = ("example", "user")
USER_ESTIMATORS = ("fixed", "clipped")


def sensitivity(examples_per_microbatch: int) -> int:
    """S in units of C: 1 for one example per micro-batch, else 2."""
    return 1 if checks.count("examples_per_microbatch", examples_per_microbatch, 1) == 1 else 2


def noise_multiplier_at(epoch: int, z0: float, decay: str, decay_rate: float) -> float:
    """The decayed noise multiplier z_t of the 0-based epoch t."""
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch!r}")
    if decay == "none":
        return float(z0)
    if decay == "linear":
        return float(z0) / (1.0 + float(decay_rate) * epoch)
    if decay == "exponential":
        return float(z0) * math.exp(-float(decay_rate) * epoch)
    raise ValueError(f"decay must be one of {DECAYS}, got {decay!r}")


def effective_noise_multiplier(noise_multiplier: float, noise_mode: str, replicas: int,
                               sensitivity_: float) -> float:
    """z_eff = (std of the summed noise) / (S C): what the accountant composes.

    calibrated: the replicas' draws sum to z S C, so z_eff = z; paper: each replica adds y / N,
    y ~ N(0, (C z)^2), so the sum carries C z / sqrt(N) and z_eff = z / (sqrt(N) S).
    """
    z = checks.number("noise_multiplier", noise_multiplier, 0.0)
    n = checks.count("replicas", replicas, 1)
    s = checks.number("sensitivity", sensitivity_, 0.0, True)
    if noise_mode == "calibrated":
        return z
    if noise_mode == "paper":
        return z / (math.sqrt(n) * s)
    raise ValueError(f"noise_mode must be one of {NOISE_MODES}, got {noise_mode!r}")


def joint_noise_multiplier(effective: float, selection: Optional[float]) -> float:
    """The multiplier of one Gaussian that dominates a step releasing the gradient (z_eff) and
    the noisy row counts (z_c) of the same sample: (z_eff^-2 + z_c^-2)^-1/2 (Gaussian DP
    composition; edp_tf/selection.py). No selection (None): z_eff; a zero multiplier: 0."""
    if selection is None:
        return effective
    z_c = checks.number("selection_noise_multiplier", selection, 0.0)
    if effective == 0.0 or z_c == 0.0:
        return 0.0
    return 1.0 / math.sqrt(effective ** -2 + z_c ** -2)


@dataclasses.dataclass(frozen=True)
class StepNoise:
    """A step's noise as the accountant charges it: z0 and its per-epoch decay, how the
    replicas' draws meet the sensitivity S (`noise_mode`, `replicas`), the sparse rows' z_c and
    BandMF's bands. `Mechanism.step_noise` is the run's; accounting takes this value, not its
    fields one by one."""

    noise_multiplier: float = 1.0
    decay: str = "none"
    decay_rate: float = 0.0
    noise_mode: str = "calibrated"
    replicas: int = 1
    sensitivity: float = 1
    selection_noise_multiplier: Optional[float] = None
    bands: int = 1

    def at(self, epoch: int) -> tuple:
        """(z_t, z_eff_t) of `epoch`: the step's multiplier, and the one the accountant
        charges (per sensitivity of the summed noise, joined with the selection's z_c)."""
        z_t = noise_multiplier_at(epoch, self.noise_multiplier, self.decay, self.decay_rate)
        return z_t, joint_noise_multiplier(
            effective_noise_multiplier(z_t, self.noise_mode, self.replicas, self.sensitivity),
            self.selection_noise_multiplier)


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """What one run's private step does, completely: geometry, clipping, noise and schedule.

    Attributes:
      replicas: N, the replicas whose clipped sums are SUMmed.
      global_batch_size: rows per step over all replicas (the padded batch under Poisson sampling).
      microbatch_size: examples per micro-batch; None: each replica's rows are one micro-batch.
      l2_norm_clip: C.
      noise_multiplier: z0, of epoch 0.
      noise_mode: "calibrated" or "paper" (see the module docstring).
      decay, decay_rate: the per-epoch schedule of z_t.
      expected_batch_size: q n under Poisson sampling (in privacy units); None: the fixed
        global batch.
      privacy_unit: "example", or "user" (one micro-batch per sampled user: S = 1).
      user_estimator: users only: "fixed" (divide by q W) or "clipped" (by max(q W, users
        drawn): S = 2).
      augment_copies: K, the rows of one example's micro-batch (its augmented copies, their
        mean loss clipped once); 1: none. Per-example clipping only.
      bands: b, 1 (independent noise) or >= 2 (BandMF: noise correlated across b steps).
      strategy: BandMF's coefficients c_0 .. c_{b-1} (||c|| <= 1); None: `bandmf.
        default_coefficients(b)`, until a PrivacyPlan fixes the ones optimised for its run.
    """

    replicas: int
    global_batch_size: int
    microbatch_size: Optional[int] = None
    l2_norm_clip: float = 1.0
    noise_multiplier: float = 1.0
    noise_mode: str = "calibrated"
    decay: str = "none"
    decay_rate: float = 0.0
    expected_batch_size: Optional[float] = None
    privacy_unit: str = "example"
    user_estimator: str = "fixed"
    selection_noise_multiplier: Optional[float] = None
    augment_copies: int = 1
    bands: int = 1
    strategy: Optional[tuple] = None

    def __post_init__(self) -> None:
        checks.count("replicas", self.replicas, 1)
        checks.count("global_batch_size", self.global_batch_size, 1)
        if self.microbatch_size is not None:
            checks.count("microbatch_size", self.microbatch_size, 1)
        checks.number("l2_norm_clip", self.l2_norm_clip, 0.0, True)
        checks.number("noise_multiplier", self.noise_multiplier, 0.0)
        if self.noise_mode not in NOISE_MODES:
            raise ValueError(f"noise_mode must be one of {NOISE_MODES}, got {self.noise_mode!r}")
        if self.decay not in DECAYS:
            raise ValueError(f"decay must be one of {DECAYS}, got {self.decay!r}")
        checks.number("decay_rate", self.decay_rate, 0.0)
        if self.expected_batch_size is not None:
            checks.number("expected_batch_size", self.expected_batch_size, 0.0, True)
        if self.privacy_unit not in PRIVACY_UNITS:
            raise ValueError(f"privacy_unit must be one of {PRIVACY_UNITS}, "
                             f"got {self.privacy_unit!r}")
        if self.privacy_unit == "user" and (self.microbatch_size is None
                                            or self.expected_batch_size is None
                                            or self.noise_mode != "calibrated"):
            raise ValueError("privacy_unit='user' needs micro-batches of one user "
                             "(microbatch_size = the per-user cap), Poisson sampling over users "
                             "(expected_batch_size = q x users) and noise_mode='calibrated'")
        if self.user_estimator not in USER_ESTIMATORS:
            raise ValueError(f"user_estimator must be one of {USER_ESTIMATORS}, "
                             f"got {self.user_estimator!r}")
        if self.user_estimator != "fixed" and self.privacy_unit != "user":
            raise ValueError("user_estimator='clipped' needs privacy_unit='user'")
        if self.selection_noise_multiplier is not None:
            checks.number("selection_noise_multiplier", self.selection_noise_multiplier, 0.0,
                          True)
            if self.privacy_unit != "example":
                raise ValueError("sparse embedding noise (selection_noise_multiplier) is "
                                 "example-level only")
        checks.count("augment_copies", self.augment_copies, 1)
        if self.augment_copies > 1 and (self.privacy_unit != "example"
                                        or self.microbatch_size != 1):
            raise ValueError("augment_copies > 1 needs per-example micro-batches "
                             "(microbatch_size=1, privacy_unit='example'): one example's copies "
                             "are one micro-batch")

        self._check_bands()

    def _check_bands(self) -> None:
        b = checks.count("bands", self.bands, 1)
        if self.strategy is not None:
            object.__setattr__(self, "strategy", bandmf.check_coefficients(self.strategy, b))
        if b == 1:
            return
        if (self.noise_mode != "calibrated" or self.decay != "none"
                or self.privacy_unit != "example" or self.expected_batch_size is None
                or self.selection_noise_multiplier is not None or self.augment_copies > 1):
            raise ValueError("BandMF (bands >= 2) needs noise_mode='calibrated', decay='none', "
                             "privacy_unit='example', Poisson sampling (expected_batch_size), "
                             "no sparse embedding noise and no augmented copies")

    @classmethod
    def from_config(cls, config, replicas: int, global_batch_size: int) -> "Mechanism":
        """The mechanism of an `edp_tf.DPConfig` on `replicas` with batches of that many rows."""
        return cls(replicas, global_batch_size, config.microbatch_size, config.l2_norm_clip,
                   config.noise_multiplier, config.noise_mode, config.decay, config.decay_rate,
                   config.expected_batch_size, config.privacy_unit, config.user_estimator,
                   config.selection_noise_multiplier if config.sparse_embeddings else None,
                   config.augment_copies, config.bandmf_bands)

    @property
    def step_noise(self) -> StepNoise:
        """What the accountant charges of each step."""
        return StepNoise(self.noise_multiplier, self.decay, self.decay_rate, self.noise_mode,
                         self.replicas, self.sensitivity, self.selection_noise_multiplier,
                         self.bands)

    # --------------------------------------------------------------- geometry and sensitivity
    @property
    def per_replica_batch(self) -> int:
        return self.global_batch_size // self.replicas

    @property
    def examples_per_microbatch(self) -> int:
        """k: the configured micro-batch size, or the replica's rows (at least 1)."""
        return self.microbatch_size or max(1, self.per_replica_batch)

    @property
    def sampling_unit(self) -> SamplingUnit:
        """The unit this step's micro-batch clips, which the batches' sampler must draw."""
        return SamplingUnit.of_step(self.privacy_unit, self.microbatch_size,
                                    self.augment_copies, self.bands)

    @property
    def rows_per_microbatch(self) -> int:
        """Rows of one micro-batch: k, times the copies of each example (augment_copies)."""
        return self.examples_per_microbatch * self.augment_copies

    @property
    def grouped(self) -> bool:
        """True when a micro-batch's loss is the mean over its real rows (one unit's rows: a
        user's, or one example's augmented copies) rather than sum_i w_i L_i / k_e."""
        return self.privacy_unit == "user" or self.augment_copies > 1

    @property
    def microbatches_per_replica(self) -> int:
        return self.per_replica_batch // self.rows_per_microbatch

    @property
    def sensitivity(self) -> int:
        """S in units of C (for users: 1, or 2 with the clipped denominator)."""
        if self.privacy_unit == "user":
            return 1 if self.user_estimator == "fixed" else 2
        return sensitivity(self.examples_per_microbatch)

    @property
    def expected_batch(self) -> float:
        return float(self.expected_batch_size or self.global_batch_size)

    @property
    def expected_examples_per_microbatch(self) -> Optional[float]:
        """k_e = k * expected / realised rows (1 for one example per micro-batch); None for
        users (a user's micro-batch loss is the mean over that user's examples) and for
        augmented copies (the mean over the example's copies)."""
        if self.grouped:
            return None
        k = self.examples_per_microbatch
        return 1.0 if k == 1 else k * self.expected_batch / self.global_batch_size

    @property
    def expected_microbatches(self) -> float:
        """D, the normaliser of the update (q W, the expected users, for users; q n, the
        expected examples, for augmented copies: one micro-batch each)."""
        if self.grouped:
            return self.expected_batch
        return self.expected_batch / self.expected_examples_per_microbatch

    # --------------------------------------------------------------- noise and schedule
    def noise_multiplier_at(self, epoch: int) -> float:
        return noise_multiplier_at(epoch, self.noise_multiplier, self.decay, self.decay_rate)

    def effective_noise_multiplier(self, noise_multiplier: Optional[float] = None) -> float:
        """The multiplier the accountant charges per step at z (default z0): z_eff, joined with
        the row selection's z_c when embedding noise is sparse."""
        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        return joint_noise_multiplier(self._gradient_multiplier(z), self.selection_noise_multiplier)

    def _gradient_multiplier(self, z: float) -> float:
        return effective_noise_multiplier(z, self.noise_mode, self.replicas, self.sensitivity)

    def summed_noise_std(self, noise_multiplier):
        """std of the noise in the replicas' SUM at z (z_eff S C; a float or a tensor z_t)."""
        return noise_multiplier * (self._gradient_multiplier(1.0) * self.sensitivity
                                   * self.l2_norm_clip)

    def per_replica_noise_std(self, noise_multiplier):
        """std one replica's draws would need so that N independent ones sum to the mechanism's
        std (works on a float or a tensor z_t: one multiply by a constant)."""
        return self.summed_noise_std(noise_multiplier) / math.sqrt(self.replicas)

    @property
    def strategy_coefficients(self) -> tuple:
        """c_0 .. c_{b-1} of the noise recurrence: (1.0,) for independent noise."""
        if self.bands == 1:
            return (1.0,)
        return self.strategy or bandmf.default_coefficients(self.bands)

    def to_dict(self) -> dict:
        """The facts a ledger records (k is the effective micro-batch size); `bands` and the
        strategy only for BandMF."""
        bands = {} if self.bands == 1 else {
            "bands": self.bands, "bandmf_coefficients": list(self.strategy_coefficients)}
        return bands | {
            "replicas": self.replicas,
            "global_batch_size": self.global_batch_size,
            "microbatch_size": self.examples_per_microbatch,
            "microbatches_per_replica": self.microbatches_per_replica,
            "sensitivity": self.sensitivity,
            "noise_mode": self.noise_mode,
            "l2_norm_clip": self.l2_norm_clip,
            "expected_batch_size": self.expected_batch,
            "privacy_unit": self.privacy_unit,
            "user_estimator": self.user_estimator,
            "selection_noise_multiplier": self.selection_noise_multiplier,
            "augment_copies": self.augment_copies,
        }
