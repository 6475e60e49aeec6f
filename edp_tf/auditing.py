"""Empirical *lower* bounds on epsilon, to hold beside the accountant's upper bound: the one-run
audit (distribution-free, loose) and the white-box Gaussian audit (tight, assumes Gaussian scores).

One-run audit (Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training Run").
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

White-box Gaussian audit (the approach of Nasr et al. 2023, "Tight Auditing of Differentially
Private Machine Learning", with the f-DP view of Dong, Roth, Su 2019 "Gaussian Differential
Privacy"). The auditor sees the model and inserts *gradient* canaries: examples whose clipped
gradient is a fixed direction e_i that no other example touches, present in every step of
their training (sampling rate 1 *for the canary*). Each canary's score is the projection of the
released updates on e_i, summed over its steps. If the step is what it claims (a sum of clipped
gradients plus isotropic Gaussian noise), the score is N(a_in, s^2) when the canary is in and
N(a_out, s^2) when it is out, with the same s, and the pair of score distributions is exactly a
mu-GDP pair with mu = (a_in - a_out) / s: the best test of "in" against "out" is a threshold on
the score, and its trade-off curve is that of N(0, 1) against N(mu, 1). Every mechanism whose
output this score post-processes is then *at best* mu-GDP for this neighbouring pair, so it is
not (epsilon, delta)-DP for any epsilon below `gdp_epsilon(mu, delta)`, the epsilon at which

    delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)     (`gdp_delta`)

equals delta. mu is estimated from the scores of many canaries (and runs) with an exact
confidence interval (`mu_confidence_interval`: the standardised mean difference of two Gaussian
samples of equal, unknown variance follows a noncentral t); the lower bound at confidence c is
`gdp_epsilon(mu_low, delta)` with mu_low the lower confidence limit at c, so it is below the true
epsilon of the pair with probability >= c (gdp_epsilon is increasing in mu).

What the Gaussian audit assumes and measures:
  * It audits the mechanism *without amplification by subsampling*: the canary is in every step
    (for the canary q = 1), and the claim it is compared with is the accountant's epsilon for
    exactly that inclusion pattern (Gaussian mechanisms composed over the canary's steps, no
    sampling). A Poisson-subsampled step (q < 1) is a mixture, not a Gaussian, so its privacy
    cannot be summarised by one mu; auditing it tightly needs the likelihood-ratio statistic of
    the mixture and far more runs (Nasr et al. 2023; Cebere et al. 2024). The audit therefore
    tests clipping, sensitivity, the noise's scale, its independence across coordinates and
    replicas and the normalisation: everything except the amplification, whose accounting is
    dp-accounting's and whose sampler has its own tests.
  * Gaussian scores of equal variance. This holds if the implementation adds Gaussian noise,
    which is part of what is tested; `gaussian_audit` reports a normality test of the
    standardised residuals and a test of equal variances, and a bound whose checks fail should
    not be trusted. The one-run bound needs no such assumption (and is far looser).
  * Independent scores: canaries of one run use orthogonal directions, so their scores are
    independent when the noise is independent across coordinates; scores of several runs
    (fresh noise, fresh inclusion) are independent in any case.
  * At confidence 95%, a claim that is exactly tight is "refuted" by 5% of audits by design;
    the bound refutes a claim only when it exceeds it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np
from scipy import optimize, special, stats


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


# ------------------------------------------------------------------ white-box Gaussian audit
def gdp_delta(epsilon: float, mu: float) -> float:
    """delta(epsilon) of mu-GDP (Dong, Roth, Su 2019, Corollary 2.13; Balle and Wang 2018's
    analytic Gaussian mechanism with mu = sensitivity / sigma):
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    if not mu >= 0 or not epsilon >= 0 or math.isnan(epsilon):
        raise ValueError(f"need mu >= 0 and epsilon >= 0, got mu={mu}, epsilon={epsilon}")
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    if math.isinf(epsilon):
        return 0.0
    first = special.ndtr(-epsilon / mu + mu / 2)
    second = math.exp(epsilon + special.log_ndtr(-epsilon / mu - mu / 2))
    return float(max(first - second, 0.0))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon at which mu-GDP is (epsilon, delta)-DP: gdp_delta(epsilon, mu) =
    delta, by bisection (gdp_delta decreases in epsilon). 0 for mu <= 0, inf for mu = inf."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if math.isnan(mu):
        raise ValueError("mu is NaN")
    if mu <= 0 or gdp_delta(0.0, mu) <= delta:
        return 0.0
    if math.isinf(mu):
        return math.inf
    lo, hi = 0.0, max(1.0, mu * mu)
    while gdp_delta(hi, mu) > delta:
        lo, hi = hi, 2.0 * hi
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if gdp_delta(mid, mu) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return hi  # the side where delta(eps) <= delta


@dataclasses.dataclass(frozen=True)
class MuInterval:
    """mu_hat and its confidence limits: low and high are each one-sided limits at `confidence`
    (together, the two-sided interval at 2 confidence - 1: 90% for 0.95)."""

    mu_hat: float
    low: float
    high: float
    confidence: float


def _noncentrality_limit(t: float, df: float, tail: float, lower: bool) -> float:
    """The noncentrality delta at which a noncentral t(df, delta) puts `tail` beyond t: above it
    (P[T >= t] = tail, the lower limit) or below it (P[T <= t] = tail, the upper limit)."""
    if lower:
        f = lambda d: float(stats.nct.sf(t, df, d)) - tail  # noqa: E731, increasing in d
    else:
        f = lambda d: float(stats.nct.cdf(t, df, d)) - tail  # noqa: E731, decreasing in d
    width = 2.0 * (1.0 + abs(t) / math.sqrt(2.0 * df)) * stats.norm.isf(tail)
    a, b = t - width, t + width
    for _ in range(60):
        fa, fb = f(a), f(b)
        if math.isfinite(fa) and math.isfinite(fb) and fa * fb < 0:
            return float(optimize.brentq(f, a, b, xtol=1e-10, rtol=1e-12))
        a, b = a - width, b + width
    raise RuntimeError(f"noncentral t limit not found for t={t}, df={df}, tail={tail}")


def mu_confidence_interval(in_scores: Sequence[float], out_scores: Sequence[float],
                           confidence: float = 0.95,
                           sigma: Optional[float] = None) -> MuInterval:
    """mu = (mean in - mean out) / sigma of two Gaussian samples with a common sigma.

    sigma unknown (None): mu_hat is the standardised mean difference over the pooled standard
    deviation, and t = mu_hat sqrt(n_in n_out / (n_in + n_out)) is noncentral t with
    n_in + n_out - 2 degrees of freedom and noncentrality mu sqrt(n_in n_out / (n_in + n_out)),
    so inverting its distribution gives exact limits. sigma known: a z-interval,
    mu_hat +- z_c sqrt(1/n_in + 1/n_out). Each limit is one-sided at `confidence`.
    """
    a = np.asarray(in_scores, np.float64)
    b = np.asarray(out_scores, np.float64)
    if a.ndim != 1 or b.ndim != 1 or len(a) < 2 or len(b) < 2:
        raise ValueError(f"need two 1-D samples of at least 2 scores, got {a.shape}, {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("scores must be finite")
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    n1, n2 = len(a), len(b)
    scale = math.sqrt(n1 * n2 / (n1 + n2))  # mu_hat * scale is the t statistic
    diff = float(a.mean() - b.mean())
    tail = 1.0 - confidence
    if sigma is not None:
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        mu_hat = diff / sigma
        half = float(stats.norm.isf(tail)) / scale
        return MuInterval(mu_hat, mu_hat - half, mu_hat + half, confidence)
    df = n1 + n2 - 2
    pooled = math.sqrt((a.var(ddof=1) * (n1 - 1) + b.var(ddof=1) * (n2 - 1)) / df)
    if pooled == 0:  # no noise at all: the scores separate perfectly or not at all
        mu = math.copysign(math.inf, diff) if diff else 0.0
        return MuInterval(mu, mu, mu, confidence)
    mu_hat = diff / pooled
    t = mu_hat * scale
    low = _noncentrality_limit(t, df, tail, lower=True) / scale
    high = _noncentrality_limit(t, df, tail, lower=False) / scale
    return MuInterval(mu_hat, low, high, confidence)


@dataclasses.dataclass(frozen=True)
class GaussianAuditResult:
    """mu of the canaries' scores with its limits, and the epsilons they imply at delta.

    epsilon_lower_bound = gdp_epsilon(mu_low, delta): at confidence `confidence` the mechanism
    is not (epsilon, delta)-DP for any smaller epsilon (if the scores are Gaussian of equal
    variance: normality_p and equal_variance_p test that). epsilon_estimate is the point estimate
    gdp_epsilon(mu_hat, delta)."""

    mu_hat: float
    mu_low: float
    mu_high: float
    epsilon_lower_bound: float
    epsilon_estimate: float
    epsilon_upper_limit: float
    confidence: float
    delta: float
    n_in: int
    n_out: int
    normality_p: float
    equal_variance_p: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def gaussian_audit(scores: Sequence[float], included: Sequence[bool], delta: float,
                   confidence: float = 0.95,
                   sigma: Optional[float] = None) -> GaussianAuditResult:
    """The white-box Gaussian audit of canaries with these scores (higher: "in")."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and included {included.shape} must be 1-D and "
                         "the same length")
    a, b = scores[included], scores[~included]
    interval = mu_confidence_interval(a, b, confidence, sigma)
    residuals = np.concatenate([a - a.mean(), b - b.mean()])
    spread = residuals.std()
    normality_p = (float(stats.normaltest(residuals / spread).pvalue)
                   if spread > 0 and len(residuals) >= 20 else math.nan)
    equal_variance_p = (float(stats.levene(a, b, center="median").pvalue)
                        if spread > 0 else math.nan)
    return GaussianAuditResult(
        mu_hat=interval.mu_hat, mu_low=interval.low, mu_high=interval.high,
        epsilon_lower_bound=gdp_epsilon(interval.low, delta),
        epsilon_estimate=gdp_epsilon(interval.mu_hat, delta),
        epsilon_upper_limit=gdp_epsilon(interval.high, delta),
        confidence=confidence, delta=delta, n_in=len(a), n_out=len(b),
        normality_p=normality_p, equal_variance_p=equal_variance_p)
