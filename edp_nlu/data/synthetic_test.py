"""The built-in synthetic corpus: deterministic, well-formed, diverse, canaries where promised."""
import collections

import pytest

from edp_nlu.data import synthetic
from edp_nlu.data.corpus import bio_error
from edp_nlu.data.loading import conform, describe
from edp_nlu.data.schema import schema_from_training_data
from edp_nlu.scoring.metrics import slot_spans


@pytest.fixture(scope="module")
def corpus():
    return synthetic.synthetic_corpus(seed=0)


def slot_values(utterances):
    values = collections.defaultdict(collections.Counter)
    for utterance in utterances:
        for slot_type, start, end in slot_spans(utterance.tags):
            values[slot_type][utterance.tokens[start:end]] += 1
    return values


def test_deterministic_for_a_seed_and_different_across_seeds(corpus):
    assert synthetic.synthetic_corpus(seed=0) == corpus
    other = synthetic.synthetic_corpus(seed=1)
    assert other != corpus
    assert len(set(other.train) & set(corpus.train)) < len(corpus.train) // 4


def test_default_sizes_labels_and_format(corpus):
    assert (len(corpus.train), len(corpus.dev), len(corpus.test)) == (2400, 300, 300)
    everything = corpus.train + corpus.dev + corpus.test
    assert {u.intent for u in everything} == set(synthetic.TEMPLATES)
    assert len(synthetic.TEMPLATES) == 12
    labels = schema_from_training_data(corpus.train)
    assert set(labels.slot_types) == set(synthetic.SLOT_GENERATORS)  # every slot type in train
    assert len(labels.slot_types) == 10
    for utterance in everything:
        assert utterance.tokens and bio_error(utterance.tags) is None
        assert all(t == t.lower() and t.strip() == t and t for t in utterance.tokens)
    for split in (corpus.dev, corpus.test):
        _, counts = conform(split, labels.tag_vocabulary, labels.intent_vocabulary,
                            "held out")
        assert counts.remapped_tag_tokens == counts.unknown_intent_utterances == 0
    assert corpus.canaries == corpus.canary_controls == ()
    assert "seed 0" in corpus.source


def test_no_utterance_repeats_within_or_across_splits(corpus):
    token_sequences = [u.tokens for u in corpus.train + corpus.dev + corpus.test]
    assert len(set(token_sequences)) == len(token_sequences) == 3000


def test_slot_values_are_diverse_with_a_long_tail(corpus):
    values = slot_values(corpus.train)
    # Thresholds are about half of what seed 0 gives, so they hold for other seeds too while
    # still failing if a generator collapses to a handful of values.
    minimum_distinct = {"contact_name": 120, "phone_number": 80, "time": 100, "date": 100,
                        "title": 100, "medication": 30, "city": 30, "doctor": 40,
                        "message": 40, "dosage": 25}
    for slot_type, minimum in minimum_distinct.items():
        assert len(values[slot_type]) >= minimum, slot_type
    # Phone numbers are random: (almost) all distinct. Many values of every kind occur once.
    phones = values["phone_number"]
    assert max(phones.values()) <= 2
    singletons = sum(count == 1 for counter in values.values() for count in counter.values())
    assert singletons >= 500
    # Zipf-like: the most frequent medication is several times the median one.
    medication_counts = sorted(values["medication"].values())
    assert medication_counts[-1] >= 4 * medication_counts[len(medication_counts) // 2]


def test_intents_are_unbalanced_but_all_present(corpus):
    counts = collections.Counter(u.intent for u in corpus.train)
    assert min(counts.values()) >= 40
    assert max(counts.values()) >= 2.5 * min(counts.values())


def test_canaries_are_planted_in_train_only_and_leave_the_rest_unchanged(corpus):
    planted = synthetic.synthetic_corpus(seed=0, canaries=6, canary_repeats=7)
    assert len(planted.canaries) == len(planted.canary_controls) == 6
    assert len(set(planted.canaries + planted.canary_controls)) == 12
    train_counts = collections.Counter(planted.train)
    held_out = set(planted.dev + planted.test)
    for canary in planted.canaries:
        assert train_counts[canary] == 7 and canary not in held_out
        assert bio_error(canary.tags) is None and canary.intent in synthetic.TEMPLATES
    for control in planted.canary_controls:
        assert control not in train_counts and control not in held_out
    # Canaries have their own random stream: without them the corpus is exactly the default.
    assert (planted.dev, planted.test) == (corpus.dev, corpus.test)
    canary_set = set(planted.canaries)
    assert tuple(u for u in planted.train if u not in canary_set) == corpus.train
    assert len(planted.train) == 2400 + 6 * 7
    assert describe(planted)["canaries"] == 6
    assert "6 canaries x 7" in planted.source


def test_size_and_ratios():
    small = synthetic.synthetic_corpus(seed=5, size=100, ratios=(0.6, 0.2, 0.2))
    assert (len(small.train), len(small.dev), len(small.test)) == (60, 20, 20)


@pytest.mark.parametrize("kwargs, name", [
    ({"size": 5}, "size"), ({"size": 2.5}, "size"), ({"canaries": -1}, "canaries"),
    ({"canary_repeats": 0}, "canary_repeats"), ({"seed": "x"}, "seed"),
    ({"ratios": (0.5, 0.5, 0.0)}, "ratios"), ({"ratios": (0.8, 0.1)}, "ratios"),
])
def test_bad_parameters_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        synthetic.synthetic_corpus(**kwargs)


def test_exhausted_templates_raise_instead_of_looping(monkeypatch):
    with pytest.raises(ValueError, match="size must be <= 200000"):
        synthetic.synthetic_corpus(size=200_001)
    monkeypatch.setattr(synthetic, "TEMPLATES", {"greet": (1.0, ("hello", "hi there"))})
    # 2 templates x (1 + prefixes) x (1 + suffixes) distinct utterances exist.
    distinct = 2 * (1 + len(synthetic.PREFIXES)) * (
        1 + len(synthetic.SUFFIXES))
    with pytest.raises(ValueError, match="stopped yielding new utterances after"):
        synthetic.synthetic_corpus(size=distinct + 1)


def test_utterances_have_skewed_users_from_their_own_stream():
    corpus = synthetic.synthetic_corpus(seed=3, size=1200)
    counts = collections.Counter(u.user for u in corpus.train + corpus.dev + corpus.test)
    assert None not in counts and len(counts) <= synthetic.users_for(1200)
    speakers = [{u.user for u in part} for part in (corpus.train, corpus.dev, corpus.test)]
    assert not (speakers[0] & speakers[1]) and not (speakers[0] & speakers[2])  # by user
    ordered = sorted(counts.values(), reverse=True)
    # Zipf-like: the heaviest user speaks far more than the median one, and a tail exists
    assert ordered[0] >= 10 * ordered[len(ordered) // 2] and ordered[-1] <= 2
    again = synthetic.synthetic_corpus(seed=3, size=1200)
    assert again == corpus  # deterministic, users included
