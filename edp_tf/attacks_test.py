"""Membership-inference metrics against hand-computed and sklearn references."""
import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from edp_tf import attacks


def test_perfect_and_useless_attacks():
    perfect = attacks.loss_threshold_attack([0.1, 0.2, 0.3], [1.0, 2.0, 3.0])
    assert perfect["auc"] == 1.0 and perfect["tpr_at_1pct_fpr"] == 1.0
    assert perfect["advantage"] == 1.0
    inverted = attacks.loss_threshold_attack([1.0, 2.0], [0.1, 0.2])
    assert inverted["auc"] == 0.0 and inverted["tpr_at_1pct_fpr"] == 0.0


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    members = np.round(rng.normal(0.3, 1.0, 500), 1)  # rounding creates ties
    others = np.round(rng.normal(0.0, 1.0, 700), 1)
    got = attacks.attack_summary(members, others)
    labels = np.r_[np.ones(500), np.zeros(700)]
    assert got["auc"] == pytest.approx(roc_auc_score(labels, np.r_[members, others]), abs=1e-12)


def test_tpr_at_low_fpr_by_hand():
    # 4 members, 10 non-members; the top-scored non-member sits above two members.
    members = [10, 9, 5, 4]
    others = [8, 3, 2, 1, 0, -1, -2, -3, -4, -5]
    fpr, tpr = attacks.roc_curve(members, others)
    assert attacks.tpr_at_fpr(fpr, tpr, 0.0) == 0.5  # above 8: two of four members
    assert attacks.tpr_at_fpr(fpr, tpr, 0.1) == 1.0  # one false positive allowed


def test_dp_bound_and_errors():
    assert attacks.dp_tpr_bound(1.0, 1e-5, 0.01) == pytest.approx(np.e * 0.01 + 1e-5)
    assert attacks.dp_tpr_bound(float("inf"), 0.0, 0.001) == 1.0
    with pytest.raises(ValueError, match="members"):
        attacks.attack_summary([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        attacks.attack_summary([np.nan], [1.0])


def test_roc_points_follow_the_curve_and_keep_low_fpr():
    rng = np.random.default_rng(0)
    members, others = rng.normal(1.0, 1.0, 2000), rng.normal(0.0, 1.0, 2000)
    points = attacks.roc_points(members, others, points=50)
    fpr, tpr = attacks.roc_curve(members, others)
    assert points["fpr"][0] == 0.0 and points["fpr"][-1] == 1.0 and points["tpr"][-1] == 1.0
    assert min(f for f in points["fpr"] if f > 0) <= 1e-3  # the low-FPR end is kept
    assert np.all(np.diff(points["tpr"]) >= 0)
    for f, t in zip(points["fpr"], points["tpr"]):
        assert t == attacks.tpr_at_fpr(fpr, tpr, f)


def test_auc_interval_covers_the_true_auc_at_its_level():
    # 2,000 draws of 700 members vs 700 non-members (SNIPS's test size), scores N(0.1, 1) vs
    # N(0, 1): true AUC = Phi(0.1 / sqrt 2) = 0.5282. With 2,000 draws the coverage's binomial
    # standard error is 0.005, so +-0.02 is four of them; the spread of the AUCs is estimated to
    # about 1.6%, so 10% between it and Hanley-McNeil's standard error is a real disagreement.
    rng = np.random.default_rng(1)
    true_auc = 0.5 * (1.0 + math.erf(0.1 / 2.0))  # Phi(0.1 / sqrt(2))
    aucs, covered, widths = [], 0, []
    for _ in range(2000):
        got = attacks.attack_summary(rng.normal(0.1, 1.0, 700), rng.normal(0.0, 1.0, 700))
        lo, hi = got["auc_ci95"]
        aucs.append(got["auc"])
        covered += lo <= true_auc <= hi
        widths.append(hi - lo)
    assert covered / 2000 == pytest.approx(0.95, abs=0.02)
    assert np.mean(widths) / (2 * 1.96) == pytest.approx(np.std(aucs), rel=0.10)


def test_auc_interval_by_hand_and_errors():
    # At AUC 0.5 Hanley-McNeil reduces to the Mann-Whitney null variance (n1 + n2 + 1) / 12 n1 n2.
    lo, hi = attacks.auc_interval(0.5, 700, 700)
    assert (hi - lo) / 2 == pytest.approx(1.96 * math.sqrt(1401 / (12 * 700 * 700)), rel=1e-3)
    assert attacks.auc_interval(1.0, 10, 10) == (1.0, 1.0)
    with pytest.raises(ValueError, match="members"):
        attacks.auc_interval(0.5, 0, 10)
