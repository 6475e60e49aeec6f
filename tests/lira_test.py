"""Offline LiRA scoring (tools.lira): the attack itself, on synthetic log-likelihoods."""
import numpy as np

from edp_tf import attacks
from tools import lira


def _likelihoods(masks, member_bonus, rng):
    """Per-utterance difficulty (shared by all models) + noise + a bonus when trained on."""
    models, pool = masks.shape
    difficulty = rng.normal(0.0, 3.0, size=pool)
    return difficulty + rng.normal(0.0, 1.0, size=(models, pool)) + member_bonus * masks


def test_lira_separates_members_when_training_leaks():
    rng = np.random.default_rng(0)
    masks = lira.membership_masks(17, 600)
    leaky = lira.summarise(_likelihoods(masks, 2.0, rng), masks)
    # A bonus of 2 noise std: members' z-scores sit about 2 above the out fit; with ~5,000
    # non-member pairs, 0.1% FPR is ~5 pairs, and TPR there is far above 0.001.
    assert leaky["auc"] > 0.85
    assert leaky["tpr_at_0.1pct_fpr"] > 0.05


def test_lira_is_at_chance_without_leakage():
    rng = np.random.default_rng(1)
    masks = lira.membership_masks(17, 600)
    blind = lira.summarise(_likelihoods(masks, 0.0, rng), masks)
    # ~5,000 pairs per class: the AUC's standard error is about 0.006; 0.04 is > 6 of them.
    assert abs(blind["auc"] - 0.5) < 0.04
    assert blind["pairs"] == blind["members"] + blind["nonmembers"]


def test_per_utterance_calibration_is_what_makes_lira_strong():
    """Without subtracting each utterance's own out-distribution, the shared difficulty (std 3)
    hides a bonus of 1; LiRA's per-utterance z-score recovers it."""
    rng = np.random.default_rng(2)
    masks = lira.membership_masks(17, 600)
    phi = _likelihoods(masks, 1.0, rng)

    global_threshold = attacks.attack_summary(phi[masks], phi[~masks])
    assert lira.summarise(phi, masks)["auc"] > global_threshold["auc"] + 0.1


def test_masks_are_the_fixed_design():
    a, b = lira.membership_masks(17, 100), lira.membership_masks(17, 100)
    assert np.array_equal(a, b) and 0.4 < a.mean() < 0.6
