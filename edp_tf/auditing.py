"""One-run privacy auditing (Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1)
Training Run"): an empirical *lower* bound on epsilon, to hold beside the accountant's upper bound.

m canaries are each included independently with probability 1/2; after training, an auditor
scores every canary, guesses "in" for the k_in highest scores and "out" for the k_out lowest,
and abstains on the rest. If training is (epsilon, delta)-DP, the number of correct guesses W
out of r is stochastically dominated by Binomial(r, e^eps / (1 + e^eps)) up to a delta term
(their Theorem 3.1 / Proposition 5.2):

    P[W >= v] <= P[Binomial(r, p_eps) >= v] + 2 m delta * max_i P[v - i <= Binomial < v] / i.

So an epsilon at which v correct guesses would have a p-value below beta is ruled out; the
largest such epsilon is the lower bound at confidence 1 - beta. A lower bound above the claimed
epsilon is evidence that the claim is false; one below it says only that the audit could not
refute it (one-run audits are loose, especially with subsampling).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats


def p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """Upper bound on P[>= v of r guesses correct] for an (epsilon, delta)-DP mechanism."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and 0 <= delta <= 1, got {epsilon}, {delta}")
    if v == 0:
        return 1.0
    p_eps = 1.0 / (1.0 + math.exp(-epsilon))  # accuracy of epsilon-DP randomised response
    tail = float(stats.binom.sf(v - 1, r, p_eps))  # P[Binomial(r, p_eps) >= v]
    if delta == 0:
        return min(tail, 1.0)
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, p_eps)  # P[B = v-1], P[B = v-2], ...
    alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float = 0.0,
                        beta: float = 0.05) -> float:
    """Largest epsilon whose p-value for (r guesses, v correct) is below beta (0 if none)."""
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < beta:
        lo, hi = hi, 2.0 * hi
        if hi > 200:  # every guess right and r huge: report the finite edge of the search
            return lo
    for _ in range(50):  # p_value is increasing in epsilon: bisect
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) < beta:
            lo = mid
        else:
            hi = mid
    return lo


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """The best guess count over the pre-registered k values, and its lower bound."""

    epsilon_lower_bound: float
    guesses: int
    correct: int
    canaries: int
    k: int
    beta: float
    delta: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def default_guess_counts(m: int) -> tuple:
    """The k values tried (k "in" and k "out" guesses each), fixed before seeing scores."""
    return tuple(k for k in (5, 10, 20, 50, 100, 200, 500, 1000, 2000) if 2 * k <= m)


def audit(scores: Sequence[float], included: Sequence[bool], delta: float, beta: float = 0.05,
          guess_counts: Sequence[int] | None = None) -> AuditResult:
    """Guesses "in" for the k highest and "out" for the k lowest scores, for each pre-registered
    k; the confidence is split over the k values (Bonferroni) so the maximum stays valid."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and included {included.shape} must be 1-D and "
                         "the same length")
    if not np.all(np.isfinite(scores)):
        raise ValueError("audit scores must be finite")
    m = len(scores)
    ks = tuple(guess_counts) if guess_counts is not None else default_guess_counts(m)
    if not ks or any(k < 1 or 2 * k > m for k in ks):
        raise ValueError(f"guess counts {ks} need 1 <= k <= m/2 with m={m}")
    order = np.argsort(scores, kind="stable")
    best = None
    for k in ks:
        correct = int(included[order[-k:]].sum() + (~included[order[:k]]).sum())
        bound = epsilon_lower_bound(m, 2 * k, correct, delta, beta / len(ks))
        if best is None or bound > best.epsilon_lower_bound:
            best = AuditResult(bound, 2 * k, correct, m, k, beta, delta)
    return best
