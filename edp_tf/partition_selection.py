"""Differentially private partition selection: which keys (e.g. labels) occur in the private
data, released by Gaussian thresholding.

Why: a model's output layers are sized by its label sets, and the sets are exported with it. Taken
verbatim from the training split they reveal any label only one training example carries, which
no epsilon covers. Selecting them with DP keeps every frequent label and drops the rare ones, for a
cost charged to the same ledger as the training steps.

The mechanism (Gaussian thresholding: Wilson et al., "Differentially Private SQL with Bounded User
Contribution", PoPETs 2020; Desfontaines et al., "Differentially private partition selection",
PoPETs 2022; Google's differential-privacy library, `GaussianPartitionSelection` in
cc/algorithms/partition-selection.h, which PipelineDP uses):

1. each privacy unit (an example, or a user) keeps at most `max_partitions` (m) of its distinct
   partitions, a uniformly random subset when it has more;
2. each partition's count is the number of units that kept it;
3. each count gets N(0, sigma^2) noise, and the partitions whose noisy count exceeds tau are
   released (only the set: never the counts).

Privacy under adding or removing one unit x (D' = D + x). Fix every unit's kept subset (the
bound holds for each, so for their mixture). Let P be the partitions counted in D and N the at
most m partitions x alone brings. On P the two count vectors differ by at most 1 in at most m
entries: L2 sensitivity sqrt(m), so the release restricted to P is post-processing of a Gaussian
mechanism with noise multiplier sigma / sqrt(m), and composed with any later (adaptive) mechanism
T it is dominated by that Gaussian composed with T: delta_comp(epsilon) from the accountant. A
partition of N is released only if 1 + N(0, sigma^2) > tau, with probability
p = Q((tau - 1) / sigma); the event E that any of them is, is independent of the rest and has
probability at most 1 - (1 - p)^m. Adding x: P[E] is added to delta. Removing x: the output
under D' is (1 - P[E]) times the restricted one plus E's part, which moves epsilon by
-ln(1 - P[E]); since the hockey-stick divergence H_{e^s} falls with slope at most 1 in s, that is
again at most -ln(1 - P[E]) more delta. Both are at most

    delta_threshold = -m ln(1 - p)   (= m p (1 + p/2 + ...), the "m P[N(0, sigma^2) > tau - 1]"
                                      of the literature, with the removal direction's term),

so the run is (epsilon, delta_comp(epsilon) + delta_threshold)-DP: the accountant charges the
Gaussian part as an `accounting.ExtraEvent` (sensitivity sqrt(m), no sampling) and computes
epsilon at the run's delta minus `delta_threshold` (`ExtraEvent.delta`). Google's library states
the same split: delta = noise_delta + threshold_delta, the threshold from the Gaussian's quantile
at the per-partition delta 1 - (1 - threshold_delta)^(1/m).

The noise comes from OS entropy. A fixed seed makes it reproducible, and then the release is not
private (a seed drawn from OS entropy and kept secret, as workers share one, is as good as none).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Hashable, Iterable, Optional

import numpy as np
from scipy import stats

from edp_tf import accounting, checks

DEFAULT_EVENT_NAME = "partition_selection"


def _check(noise_stddev, max_partitions) -> tuple:
    return (checks.number("noise_stddev", noise_stddev, 0.0, True),
            checks.count("max_partitions", max_partitions, 1))


def threshold_delta(noise_stddev: float, threshold: float, max_partitions: int) -> float:
    """delta_threshold = -m ln(1 - Q((tau - 1) / sigma)): the delta the thresholding adds
    (module docstring); inf when a partition of one unit is released with certainty."""
    sigma, m = _check(noise_stddev, max_partitions)
    tau = checks.number("threshold", threshold)
    p = float(stats.norm.sf((tau - 1.0) / sigma))
    return math.inf if p >= 1.0 else -m * math.log1p(-p)


def threshold_for_delta(noise_stddev: float, max_partitions: int, delta: float) -> float:
    """The smallest tau whose `threshold_delta` is at most `delta` (to the float)."""
    sigma, m = _check(noise_stddev, max_partitions)
    delta = checks.number("delta", delta, 0.0, True, 1.0, True)
    per_partition = -math.expm1(-delta / m)  # Q((tau - 1) / sigma) that spends exactly delta
    tau = 1.0 + sigma * float(stats.norm.isf(per_partition))
    while threshold_delta(sigma, tau, m) > delta:  # isf's rounding: step up to the next float
        tau = math.nextafter(tau, math.inf)
    return tau


@dataclasses.dataclass(frozen=True)
class GaussianThresholding:
    """The mechanism's parameters: noise std sigma (in counts), threshold tau, and m, the most
    partitions one unit counts in.

    Build it with `for_delta` to spend a chosen delta on the threshold; `extra_event` is what the
    ledger charges for one release.
    """

    noise_stddev: float
    threshold: float
    max_partitions: int

    def __post_init__(self) -> None:
        sigma, m = _check(self.noise_stddev, self.max_partitions)
        object.__setattr__(self, "noise_stddev", sigma)
        object.__setattr__(self, "max_partitions", m)
        object.__setattr__(self, "threshold", checks.number("threshold", self.threshold))
        if not self.delta < 1.0:
            raise ValueError(
                f"threshold={self.threshold:g} with noise_stddev={sigma:g} and max_partitions={m} "
                f"spends delta {self.delta:.3g} >= 1 on the partitions one unit alone brings: "
                "raise the threshold")

    @classmethod
    def for_delta(cls, noise_stddev: float, max_partitions: int,
                  delta: float) -> "GaussianThresholding":
        """The mechanism at `noise_stddev` whose threshold spends at most `delta`."""
        return cls(noise_stddev, threshold_for_delta(noise_stddev, max_partitions, delta),
                   max_partitions)

    @property
    def delta(self) -> float:
        """delta_threshold: spent from the run's delta (module docstring)."""
        return threshold_delta(self.noise_stddev, self.threshold, self.max_partitions)

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the count vector: sqrt(m)."""
        return math.sqrt(self.max_partitions)

    @property
    def effective_noise_multiplier(self) -> float:
        """sigma / sqrt(m): the Gaussian mechanism the accountant charges."""
        return self.noise_stddev / self.sensitivity

    def release_probability(self, count: float) -> float:
        """P[count + N(0, sigma^2) > tau]: the chance a partition counted `count` times is kept."""
        return float(stats.norm.sf((self.threshold - count) / self.noise_stddev))

    def extra_event(self, name: str = DEFAULT_EVENT_NAME) -> accounting.ExtraEvent:
        """One release, as the accountant charges it: a Gaussian of std sigma on a query of L2
        sensitivity sqrt(m), no sampling, plus `delta` spent from the run's delta."""
        return accounting.ExtraEvent(name, self.noise_stddev, None, 1, self.sensitivity,
                                     self.delta)

    def to_dict(self) -> dict:
        return {"noise_stddev": self.noise_stddev, "threshold": self.threshold,
                "max_partitions": self.max_partitions, "delta": self.delta,
                "effective_noise_multiplier": self.effective_noise_multiplier}


def count_partitions(contributions: Iterable[Iterable[Hashable]], max_partitions: int,
                     rng: np.random.Generator) -> dict:
    """{partition: count}: each unit adds 1 to each of at most `max_partitions` of its distinct
    partitions, a uniformly random subset (from `rng`) when it has more.

    Why random: keeping the first ones would favour whatever order the data lists them in (for
    an utterance, the slot types that come first), and the bound must hold whichever are kept.
    """
    m = checks.count("max_partitions", max_partitions, 1)
    counts: dict = {}
    for parts in contributions:
        distinct = list(dict.fromkeys(parts))  # first occurrence order: reproducible per seed
        if len(distinct) > m:
            distinct = [distinct[i] for i in sorted(rng.choice(len(distinct), m, replace=False))]
        for p in distinct:
            counts[p] = counts.get(p, 0) + 1
    return counts


def select_partitions(contributions: Iterable[Iterable[Hashable]],
                      mechanism: GaussianThresholding,
                      seed: Optional[int] = None) -> frozenset:
    """The partitions released by `mechanism` over `contributions` (one iterable of hashable
    partition keys per privacy unit: an example's labels, or all of one user's).

    `seed` None draws from OS entropy. A fixed seed makes the release reproducible and not
    private, unless it is itself a secret drawn from OS entropy (e.g. the key workers share).
    Only the set is returned: the noisy counts would be a further release.
    """
    if not isinstance(mechanism, GaussianThresholding):
        raise ValueError(f"mechanism must be a GaussianThresholding, got "
                         f"{type(mechanism).__name__}")
    rng = np.random.default_rng(seed)
    counts = count_partitions(contributions, mechanism.max_partitions, rng)
    keys = list(counts)
    noisy = (np.array([counts[k] for k in keys], dtype=np.float64)
             + rng.normal(0.0, mechanism.noise_stddev, size=len(keys)))
    return frozenset(k for k, v in zip(keys, noisy) if v > mechanism.threshold)
