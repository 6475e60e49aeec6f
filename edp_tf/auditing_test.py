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
