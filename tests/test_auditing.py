"""The one-run audit: its bound (edp_tf.auditing) and the canary run of trainers.audit."""
import math

import numpy as np
import pytest
from scipy import stats

from edp_tf import auditing
from edp_tf.strategy import make_strategy
from trainers import audit as audit_cmd


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


def test_plan_errors_name_the_flag():
    with pytest.raises(ValueError, match="--canaries=401 must be a multiple of --replicas=2"):
        audit_cmd.AuditPlan("default", 401, 2, 2, 2.0, 1e-5).check()
    with pytest.raises(ValueError, match="--mechanism"):
        audit_cmd.AuditPlan("bogus", 400, 2, 2, 2.0, 1e-5).check()


# The step, audited: the measured signal-to-noise ratio of 800 canaries must match the mu the
# ledger's accounting assumes. With about 400 canaries per group and unit-variance scores the
# estimate's standard error is sqrt(1/400 + 1/400 + mu^2 / 1600) <= 0.08 for mu <= 1.5, so 0.3
# is about 4 standard errors (the seed is fixed, so the test is deterministic anyway). A step
# whose noise ignored S, or the replica count, would be off by a factor of 2 or sqrt(2).
@pytest.mark.parametrize("mechanism", ["default", "dpsgd", "paper"])
def test_measured_signal_to_noise_matches_the_ledger(mechanism):
    plan = audit_cmd.AuditPlan(mechanism, 800, 2, 2, 2.0, 1e-5, seed=7)
    result = audit_cmd.audit_mechanism(plan, make_strategy(2))
    assert result["sensitivity_run"] == plan.sensitivity
    assert result["mu_measured"] == pytest.approx(result["mu_ledger"], abs=0.3)
    assert result["epsilon_lower_bound"] <= result["ledger_epsilon"]
    if mechanism == "paper":
        # Algorithm 1's own accounting claims 2 with mu 0.5; the step gives mu = 2 sqrt(2) x that
        assert result["claimed_epsilon"] == pytest.approx(2.0, abs=0.01)
        assert result["mu_measured"] > result["mu_claimed"] + 0.6
        assert result["ledger_epsilon"] > 5
    else:
        assert result["ledger_epsilon"] == pytest.approx(2.0, abs=0.01)


def test_without_noise_every_guess_is_right():
    plan = audit_cmd.AuditPlan("default", 400, 1, 2, 2.0, 1e-5, seed=3)
    result = audit_cmd.audit_mechanism(plan, make_strategy(2), noise_multiplier=0.0)
    assert result["correct"] == result["guesses"] >= 200  # all right at the largest k that fits
    assert math.isinf(result["ledger_epsilon"])
