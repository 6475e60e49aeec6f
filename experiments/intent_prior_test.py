"""The intent prior (experiments/intent_prior.py): the adjustment, the rare-intent accuracy and
that tau is chosen on dev alone."""
import numpy as np

from experiments import intent_prior


def test_adjustment_favours_the_rare_intent_by_tau_log_of_the_count_ratio():
    logits = np.array([[2.0, 1.0]])  # intent 0 seen 100 times, intent 1 once (log 100 = 4.6)
    counts = np.array([100.0, 1.0])
    assert intent_prior.adjusted(logits, counts, 0.0).argmax(-1)[0] == 0
    assert intent_prior.adjusted(logits, counts, 0.1).argmax(-1)[0] == 0  # 2 - 0.46 > 1
    assert intent_prior.adjusted(logits, counts, 0.5).argmax(-1)[0] == 1  # 2 - 2.3 < 1
    # an intent never seen in training is floored at one example, not log(0)
    np.testing.assert_array_equal(intent_prior.adjusted(logits, np.array([1.0, 0.0]), 1.0),
                                  logits)


def test_rare_accuracy_counts_only_intents_under_the_threshold():
    counts = {"flight": 3000, "meal": 5}
    got = intent_prior.accuracies(["flight", "flight", "meal", "flight"],
                                  ["flight", "meal", "meal", "meal"], counts)
    assert got == {"intent_accuracy": 0.5, "rare_utterances": 3, "rare_accuracy": 1 / 3}
    assert intent_prior.accuracies(["flight"], ["flight"], counts)["rare_accuracy"] is None


def test_tau_is_chosen_on_dev_alone_the_smallest_of_the_best():
    rows = [{"tau": 0.0, "dev": {"intent_accuracy": 0.80}, "test": {"intent_accuracy": 0.99}},
            {"tau": 0.5, "dev": {"intent_accuracy": 0.85}, "test": {"intent_accuracy": 0.10}},
            {"tau": 1.0, "dev": {"intent_accuracy": 0.85}, "test": {"intent_accuracy": 0.95}}]
    assert intent_prior.choose(rows)["tau"] == 0.5
