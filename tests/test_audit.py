"""`python -m trainers.audit`: its plan's errors, and the audit of the real step (its measured
signal-to-noise matches the ledger's; without noise every guess is right)."""
import math

import pytest

from edp_tf.strategy import make_strategy
from trainers import audit as audit_cmd


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
