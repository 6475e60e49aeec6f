"""`python -m tools.audit`: its plan's errors, and the audits of the real step (its measured
signal-to-noise matches the ledger's; without noise every guess is right; the Gaussian audit's
limits bracket the ledger's mu, refute the paper's accounting, and resume from cached runs)."""
import json
import math

import pytest

from edp_tf.strategy import make_strategy
from tools import audit as audit_cmd


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


# The Gaussian audit of the real step, on a tiny plan (2 runs x 400 canaries, seeds fixed so the
# test is deterministic). Its mu estimate has a standard error of about sqrt(4 / 800) = 0.07; at
# beta = 0.01 the one-sided 99% limits lie 2.33 x 0.07 = 0.165 either side (a correct step
# leaves [low, high] with probability 2%), and a step whose noise ignored S or the replicas
# (mu off by a factor 2 or sqrt(2): 0.5 -> 1.0 or 0.71) would leave it.
def test_gaussian_audit_brackets_the_ledgers_mu_and_stays_below_the_claim():
    plan = audit_cmd.AuditPlan("default", 400, 2, 2, 2.0, 1e-5, beta=0.01, seed=11, runs=2)
    result = audit_cmd.audit_mechanism(plan, make_strategy(2), gaussian=True)
    g = result["gaussian"]
    assert g["canaries"] == 800 and g["runs"] == 2 and len(g["mu_per_run"]) == 2
    assert g["mu_low"] <= result["mu_ledger"] <= g["mu_high"]
    assert g["mu_high"] - g["mu_low"] < 0.4 and g["confidence"] == 0.99
    assert 0.6 < g["epsilon_lower_bound"] <= result["claimed_epsilon"]
    assert not g["refutes_claim"]
    # the claim at sampling rate 1 is the Gaussian mechanism: its epsilon is mu_claimed's
    assert g["claimed_epsilon_of_mu_claimed"] == pytest.approx(result["claimed_epsilon"],
                                                               abs=0.01)
    assert "--runs=2 --gaussian" in result["command"] and "--seed=11" in result["command"]


def test_gaussian_audit_refutes_the_paper_accounting_and_agrees_with_the_ledger():
    plan = audit_cmd.AuditPlan("paper", 400, 1, 2, 2.0, 1e-5, seed=5)
    result = audit_cmd.audit_mechanism(plan, make_strategy(2), gaussian=True)
    g = result["gaussian"]
    assert result["claimed_epsilon"] == pytest.approx(2.0, abs=0.01)
    assert g["refutes_claim"] and g["epsilon_lower_bound"] > 4  # mu 1.42 measured, 0.5 claimed
    assert g["epsilon_lower_bound"] <= result["ledger_epsilon"]
    assert g["mu_low"] <= result["mu_ledger"] <= g["mu_high"]


def test_user_level_canaries_have_sensitivity_c():
    plan = audit_cmd.AuditPlan("user", 400, 2, 2, 2.0, 1e-5, seed=3, runs=2)
    assert plan.sensitivity == 1
    result = audit_cmd.audit_mechanism(plan, make_strategy(2), gaussian=True)
    assert result["sensitivity_run"] == 1
    g = result["gaussian"]
    assert g["mu_low"] <= result["mu_ledger"] <= g["mu_high"]
    assert g["epsilon_lower_bound"] <= result["claimed_epsilon"]
    # a user counted as 2C would be charged for mu 0.25: the audit measures twice that
    assert g["mu_low"] > 0.3


def test_runs_are_cached_and_resumed(tmp_path, monkeypatch):
    plan = audit_cmd.AuditPlan("dpsgd", 40, 1, 2, 2.0, 1e-5, seed=1, runs=2)
    first = audit_cmd.audit_mechanism(plan, make_strategy(2), gaussian=True,
                                      cache_dir=str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run0.npz", "run1.npz"]

    def no_training(*args, **kwargs):
        raise AssertionError("a cached run was trained again")

    monkeypatch.setattr(audit_cmd, "run_audit", no_training)
    again = audit_cmd.audit_mechanism(plan, make_strategy(2), gaussian=True,
                                      cache_dir=str(tmp_path))
    assert again["gaussian"] == first["gaussian"]
    one = audit_cmd.AuditPlan("dpsgd", 40, 1, 2, 2.0, 1e-5, seed=1, runs=1)  # fewer runs: reused
    audit_cmd.audit_mechanism(one, make_strategy(2), gaussian=True, cache_dir=str(tmp_path))
    other = audit_cmd.AuditPlan("dpsgd", 40, 2, 2, 2.0, 1e-5, seed=1, runs=1)  # another plan
    with pytest.raises(AssertionError, match="trained again"):
        audit_cmd.audit_mechanism(other, make_strategy(2), gaussian=True,
                                  cache_dir=str(tmp_path))


def test_without_noise_the_gaussian_bound_is_infinite(tmp_path):
    plan = audit_cmd.AuditPlan("dpsgd", 40, 1, 2, 2.0, 1e-5, seed=2)
    result = audit_cmd.audit_mechanism(plan, make_strategy(2), noise_multiplier=0.0,
                                       gaussian=True)
    assert math.isinf(result["gaussian"]["epsilon_lower_bound"])
    (tmp_path / "dpsgd_eps2.json").write_text(json.dumps(result))
    text = open(audit_cmd.write_table(str(tmp_path))).read()
    assert "| **inf** |" in text and result["command"] in text


# AdaFEST: with every row selected the table's canary rows get the gradient's noise z S C / D
# (800 scores: the std ratio's standard error is 1 / sqrt(2 x 798) = 0.025, so 0.1 is 4 of
# them); at the default threshold (3 count-noise stds) a canary's row is almost never selected,
# so its score is exactly 0: the weights cannot show what the claim charges for the counts.
def test_adafest_canaries_see_the_gradient_noise_only_when_rows_are_selected():
    every = audit_cmd.AuditPlan("adafest_all_rows", 400, 1, 2, 2.0, 1e-5, seed=4, runs=2)
    g = audit_cmd.audit_mechanism(every, make_strategy(2), gaussian=True)["gaussian"]
    assert g["std_measured_over_expected"] == pytest.approx(1.0, abs=0.1)
    assert g["epsilon_lower_bound"] <= g["claimed_epsilon_of_mu_claimed"]
    default = audit_cmd.AuditPlan("adafest", 400, 1, 2, 2.0, 1e-5, seed=4)
    scores = audit_cmd.one_run(default, audit_cmd.calibrated_z(default), make_strategy(2), 0)
    assert (scores["scores"] == 0).mean() > 0.95


def test_bandmf_canaries_scored_through_c_match_the_ledger():
    """BandMF (b = 2): canaries in their group's steps 0 and 2 of 4, scored as C u (the
    released noise made white again). The scores' std must be the ledger's z S C / D per
    participation: 800 canaries give it to a standard error of 2.5%, so 0.1 is 4 of them, while
    noise without its history (y_t = z_t / c_0) or drawn on both replicas would be off by 20%
    or more; the mu estimate (standard error about 0.07) within 0.3 of the ledger's."""
    plan = audit_cmd.AuditPlan("bandmf", 800, 4, 2, 2.0, 1e-5, seed=7)
    result = audit_cmd.audit_mechanism(plan, make_strategy(2), gaussian=True)
    g = result["gaussian"]
    assert plan.participations == 2 and result["sensitivity_run"] == 1
    assert g["std_measured_over_expected"] == pytest.approx(1.0, abs=0.1)
    assert result["mu_measured"] == pytest.approx(result["mu_ledger"], abs=0.3)
    assert result["ledger_epsilon"] == pytest.approx(2.0, abs=0.01)
    assert g["epsilon_lower_bound"] <= result["claimed_epsilon"]
