"""The auditing statistics: the epsilon lower bound and p-value of a guessing game."""
import math

import numpy as np
import pytest
from scipy import stats

from edp_tf import auditing


def test_bound_with_every_guess_right_has_a_closed_form():
    # delta = 0, v = r: the p-value is p_eps^r, so the bound solves p_eps^r = beta.
    for r in (10, 100, 1000):
        p = 0.05 ** (1.0 / r)
        expected = math.log(p / (1.0 - p))
        assert auditing.epsilon_lower_bound(2 * r, r, r, 0.0, 0.05) == pytest.approx(
            expected, rel=1e-6)


def test_p_value_is_the_binomial_tail_plus_a_delta_term():
    m, r, v, eps = 1000, 200, 150, 1.0
    tail = stats.binom.sf(v - 1, r, 1 / (1 + math.exp(-eps)))
    assert auditing.p_value(m, r, v, eps, 0.0) == pytest.approx(tail, rel=1e-9)
    assert auditing.p_value(m, r, v, eps, 1e-5) > tail
    # the delta term can only weaken the bound
    assert (auditing.epsilon_lower_bound(m, r, v, 1e-5)
            < auditing.epsilon_lower_bound(m, r, v, 0.0))


def test_chance_level_guesses_bound_nothing():
    assert auditing.epsilon_lower_bound(1000, 200, 100, 1e-5) == 0.0


@pytest.mark.parametrize("bad", [dict(v=5, r=4, m=10), dict(v=1, r=11, m=10)])
def test_p_value_rejects_impossible_counts(bad):
    with pytest.raises(ValueError, match="0 <= v <= r <= m"):
        auditing.p_value(bad["m"], bad["r"], bad["v"], 1.0)


def test_audit_guesses_the_extremes():
    rng = np.random.default_rng(0)
    included = rng.random(400) < 0.5
    separated = auditing.audit(np.where(included, 10.0, -10.0) + rng.random(400), included, 1e-5)
    assert separated.correct == separated.guesses
    random_scores = auditing.audit(rng.normal(size=400), included, 1e-5)
    assert random_scores.epsilon_lower_bound < separated.epsilon_lower_bound
    with pytest.raises(ValueError, match="same length"):
        auditing.audit(np.zeros(3), np.zeros(4, bool), 1e-5)


# ------------------------------------------------------------------ white-box Gaussian audit
def _hockey_stick(eps, mu):
    """delta(eps) of N(mu, 1) against N(0, 1), integrated numerically: int (p - e^eps q)_+."""
    from scipy import integrate

    start = eps / mu + mu / 2  # p > e^eps q exactly where x > eps / mu + mu / 2
    value, _ = integrate.quad(
        lambda x: stats.norm.pdf(x, mu) - math.exp(eps) * stats.norm.pdf(x), start, np.inf,
        epsabs=1e-14, epsrel=1e-10)
    return value


@pytest.mark.parametrize("mu,eps", [(0.5, 0.0), (0.5, 1.0), (1.0, 1.0), (1.0, 4.0), (3.0, 10.0)])
def test_gdp_delta_is_the_hockey_stick_divergence_of_two_gaussians(mu, eps):
    assert auditing.gdp_delta(eps, mu) == pytest.approx(_hockey_stick(eps, mu), rel=1e-6,
                                                        abs=1e-15)


def test_gdp_epsilon_matches_dp_accounting_for_one_gaussian_mechanism():
    # mu-GDP is the Gaussian mechanism of noise multiplier 1/mu, one step, no sampling; the
    # PLD accountant's epsilon of it is an upper bound within its discretisation (1e-4 here)
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    for mu, delta in ((0.5, 1e-5), (1.0, 1e-5), (1.66, 1e-5), (1.0, 1e-3)):
        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        accountant.compose(dp_accounting.GaussianDpEvent(1.0 / mu))
        expected = accountant.get_epsilon(delta)
        got = auditing.gdp_epsilon(mu, delta)
        assert got == pytest.approx(expected, abs=2e-3)
        assert got <= expected + 1e-6  # PLD rounds pessimistically
    assert auditing.gdp_epsilon(1.0, 1e-5) == pytest.approx(4.3772, abs=1e-4)


def test_gdp_epsilon_inverts_gdp_delta():
    for mu in (0.05, 0.3, 1.0, 2.5, 6.0):
        for eps in (0.1, 1.0, 3.0, 8.0):
            delta = auditing.gdp_delta(eps, mu)
            if 1e-300 < delta < 1:
                assert auditing.gdp_epsilon(mu, delta) == pytest.approx(eps, rel=1e-7, abs=1e-9)
    assert auditing.gdp_epsilon(0.0, 1e-5) == 0.0
    assert auditing.gdp_epsilon(-1.0, 1e-5) == 0.0
    assert math.isinf(auditing.gdp_epsilon(math.inf, 1e-5))
    # monotone: more signal, more epsilon; a larger delta, less
    assert auditing.gdp_epsilon(1.0, 1e-5) < auditing.gdp_epsilon(1.1, 1e-5)
    assert auditing.gdp_epsilon(1.0, 1e-3) < auditing.gdp_epsilon(1.0, 1e-5)


def _coverage(mu, n, reps, sigma=None, seed=0):
    """Fractions of repetitions whose lower / upper limit lies below / above the true mu, and
    whose epsilon lower bound exceeds the true epsilon."""
    rng = np.random.default_rng(seed)
    true_eps = auditing.gdp_epsilon(mu, 1e-5)
    low_ok = high_ok = above = 0
    for _ in range(reps):
        scale = 3.0  # sigma of the scores: mu is measured in its units
        inside = rng.normal(mu * scale + 7.0, scale, n)
        outside = rng.normal(7.0, scale, n)
        scores = np.concatenate([inside, outside])
        included = np.arange(2 * n) < n
        r = auditing.gaussian_audit(scores, included, 1e-5, 0.95,
                                    None if sigma is None else scale)
        low_ok += r.mu_low <= mu
        high_ok += r.mu_high >= mu
        assert (r.epsilon_lower_bound > true_eps) == (r.mu_low > mu)  # no other way to exceed
        above += r.epsilon_lower_bound > true_eps
    return low_ok / reps, high_ok / reps, above / reps


# 1,000 repetitions: a 95% limit holds in 950 +- 6.9 (binomial sd sqrt(1000 x 0.95 x 0.05)),
# so [0.929, 0.971] is +- 3 sd. A z-interval that ignored the estimated sigma's own error
# covers about 85% at mu = 3 with 40 scores a side; a two-sided 95% limit would cover 97.5%.
@pytest.mark.parametrize("mu,sigma", [(0.5, None), (3.0, None), (1.0, "known")])
def test_lower_limit_of_mu_covers_the_truth_95_percent_of_the_time(mu, sigma):
    low, high, above = _coverage(mu, 40, 1000, sigma)
    assert 0.929 <= low <= 0.971
    assert 0.929 <= high <= 0.971
    assert above == pytest.approx(1 - low)  # the bound exceeds the truth only when mu_low does


def test_gaussian_audit_refutes_a_false_claim_and_reports_its_checks():
    rng = np.random.default_rng(1)
    included = rng.random(4000) < 0.5
    scores = rng.normal(size=4000) + 2.0 * included  # true mu 2; a claim of mu 1 says 4.38
    r = auditing.gaussian_audit(scores, included, 1e-5)
    assert r.mu_low < 2.0 < r.mu_high
    assert r.epsilon_lower_bound > auditing.gdp_epsilon(1.0, 1e-5)
    assert r.epsilon_lower_bound < r.epsilon_estimate < r.epsilon_upper_limit
    assert r.normality_p > 0.001 and r.equal_variance_p > 0.001
    # heavy tails (Laplace scores) and unequal variances are flagged
    laplace = rng.laplace(size=4000) + 2.0 * included
    assert auditing.gaussian_audit(laplace, included, 1e-5).normality_p < 1e-6
    wide = rng.normal(size=4000) * np.where(included, 2.0, 1.0)
    assert auditing.gaussian_audit(wide, included, 1e-5).equal_variance_p < 1e-6


def test_gaussian_audit_without_noise_and_without_signal():
    included = np.arange(100) % 2 == 0
    exact = auditing.gaussian_audit(np.where(included, 1.0, -1.0), included, 1e-5)
    assert math.isinf(exact.mu_low) and math.isinf(exact.epsilon_lower_bound)
    rng = np.random.default_rng(2)
    null = auditing.gaussian_audit(rng.normal(size=100), included, 1e-5)
    assert null.mu_low < 0.5 and null.epsilon_lower_bound < 2.0
    with pytest.raises(ValueError, match="same length"):
        auditing.gaussian_audit(np.zeros(3), np.zeros(4, bool), 1e-5)
