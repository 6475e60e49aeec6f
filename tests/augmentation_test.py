"""Augmentation multiplicity in the trainer: the copies (edp_nlu/data/augment.py) keep tags
aligned and BIO well-formed, the configs it cannot serve are refused naming the field, and a
tiny private run with 2 copies per example is charged exactly as one without.

The step's side (one clip per example's copies, S = C whatever K; the ledger of K = 4 equal to
K = 1's) is tested in edp_tf/sensitivity_test.py, sampling_test.py and ledger_test.py.
"""
import math
import random

import pytest

from tests.tiny_runs import corpus, read, strategy, tiny_config
from edp_nlu.data import augment, synthetic
from edp_nlu.data.corpus import Utterance, bio_error
from edp_nlu.pipeline import builders, training


def _snips_like():
    """Slot types of SNIPS and ATIS with and without a public filler, ill-formed BIO aside."""
    return (
        Utterance(("what", "is", "the", "weather", "in", "new", "york", "tonight"),
                  ("O", "O", "O", "O", "O", "B-city", "I-city", "B-timeRange"), "GetWeather"),
        Utterance(("flights", "from", "boston", "to", "san", "francisco", "on", "monday"),
                  ("O", "O", "B-fromloc.city_name", "O", "B-toloc.city_name",
                   "I-toloc.city_name", "O", "B-depart_date.day_name"), "atis_flight"),
        Utterance(("play", "some", "jazz", "by", "miles", "davis"),
                  ("O", "O", "B-genre", "O", "B-artist", "I-artist"), "PlayMusic"),
    )


def test_copies_keep_tags_aligned_and_bio_well_formed():
    splits = corpus(tiny_config())
    utterances = splits.train[:60] + _snips_like()
    augmenter = augment.Augmenter(word_rate=0.5, slot_rate=1.0)
    rows = augment.with_copies(utterances, 4, augmenter, key=7)
    assert len(rows) == 4 * len(utterances)
    changed_slots = masked = 0
    for i, original in enumerate(utterances):
        group = rows[4 * i:4 * i + 4]
        assert group[0] == original  # the example itself, then its augmentations
        for copy in group[1:]:
            assert len(copy.tokens) == len(copy.tags)
            assert bio_error(copy.tags) is None
            assert copy.intent == original.intent and copy.user == original.user
            # the slots keep their types and order; only words tagged O are masked
            assert [t for _, _, t in augment.spans(copy.tags)] == [
                t for _, _, t in augment.spans(original.tags)]
            masked += sum(w == augment.MASK_TOKEN for w in copy.tokens)
            for start, end, slot_type in augment.spans(copy.tags):
                words = copy.tokens[start:end]
                assert augment.MASK_TOKEN not in words
                changed_slots += words != _span(original, slot_type, start, copy)
    assert masked > 0 and changed_slots > 0
    # slot types without a public filler keep their words (SNIPS's genre, artist)
    assert all(c.tokens[2] == "jazz" and c.tokens[-2:] == ("miles", "davis") for c in rows[-4:])


def _span(original, slot_type, start, copy):
    """The original's words of the same-numbered slot as the copy's span at `start`."""
    index = [s for s, _, _ in augment.spans(copy.tags)].index(start)
    s, e, t = augment.spans(original.tags)[index]
    assert t == slot_type
    return original.tokens[s:e]


def test_copies_are_seeded_per_example_by_the_run_key():
    utterances = corpus(tiny_config()).train[:20]
    augmenter = augment.Augmenter()
    a = augment.with_copies(utterances, 3, augmenter, key=1)
    assert a == augment.with_copies(utterances, 3, augmenter, key=1)
    assert a != augment.with_copies(utterances, 3, augmenter, key=2)
    # each example has its own stream: its copies do not depend on the examples after it
    assert augment.with_copies(utterances[:6], 3, augmenter, key=1) == a[:18]


def test_kinds_alone_and_the_fillers_are_public():
    original = _snips_like()[0]
    rng = random.Random(0)
    only_mask = augment.Augmenter(("mask",), word_rate=1.0)(original, rng)
    assert only_mask.tokens[5:] == original.tokens[5:]  # slots untouched
    assert set(only_mask.tokens[:5]) == {augment.MASK_TOKEN}
    only_slots = augment.Augmenter(("substitute",), slot_rate=1.0)(original, rng)
    assert augment.MASK_TOKEN not in only_slots.tokens
    assert only_slots.tokens[:5] == original.tokens[:5]
    # every filler is the synthetic generator's, by slot-type name (none read from a corpus)
    for slot_type in synthetic.SLOT_GENERATORS:
        assert augment.filler(slot_type) is synthetic.SLOT_GENERATORS[slot_type]
    assert augment.filler("toloc.city_name") is synthetic.SLOT_GENERATORS["city"]
    assert augment.filler("artist") is None
    with pytest.raises(ValueError, match="kinds"):
        augment.parse_kinds("mask,shuffle")


@pytest.mark.parametrize("overrides, reason", [
    (dict(mechanism="edp"), "mechanism='edp'"),
    (dict(mechanism="sgd"), "mechanism='sgd'"),
    (dict(mechanism="dpsgd", sampling="shuffle"), "sampling='shuffle'"),
    (dict(mechanism="dpsgd", privacy_unit="user"), "privacy_unit='user'"),
    (dict(mechanism="dpsgd", augment_variants=2), None),
])
def test_where_copies_cannot_apply_the_field_is_named_in_one_line(overrides, reason):
    config = tiny_config(replicas=1, augment_copies=4, **overrides)
    field = "augment_variants" if reason is None else "augment_copies"
    with pytest.raises(ValueError, match=rf"^--config\.{field}=[^\n]*{reason or ''}[^\n]*$"):
        builders.check_config(config)
    for field, value in (("augment", "mask,crop"), ("augment_word_rate", 1.5)):
        bad = tiny_config("clc", "dpsgd", replicas=1, **{field: value})
        with pytest.raises(ValueError, match=rf"^--config\.{field}="):
            builders.check_config(bad)


def test_a_tiny_run_with_two_copies_is_charged_as_one_copy(tmp_path):
    """K = 2 trains (each example's micro-batch its 2 rows) and its privacy.json states the
    epsilon, q, steps and S of the same run without copies, planned by the trainer's builders."""
    config = tiny_config("clc", "dpsgd", replicas=1, augment_copies=2, max_words=8)
    summary = training.train(config, str(tmp_path / "k2"), strategy=strategy(1), export=False)
    ledger = read(summary["run_dir"], "privacy.json")
    assert ledger["augment_copies"] == 2 and ledger["sensitivity"] == 1
    assert ledger["microbatch_size"] == 1 and ledger["private"] is True

    one = tiny_config("clc", "dpsgd", replicas=1, max_words=8)
    resolved = read(summary["run_dir"], "config.json")["config"]
    one.update(batch_size=resolved["batch_size"], epochs=resolved["epochs"])
    n = ledger["dataset_size"]
    assert n == len(corpus(one).train)  # examples, not rows
    q = one.batch_size / n
    sampler = builders.poisson_sampler(one, n, q, 1, 1)
    steps = sampler.steps_per_epoch
    _, plan = builders.private_run(one, 1, sampler.expected_batch_size, None, 1, sampler, q, n,
                                   ledger["delta"], steps)
    assert ledger["sampling_rate"] == pytest.approx(q)
    assert [e["steps"] for e in ledger["epochs"]] == [steps] * one.epochs
    assert ledger["epsilon"] == pytest.approx(plan.epsilon(), rel=1e-9)
    assert ledger["global_batch_size"] == 2 * sampler.max_batch_size
    assert math.isfinite(summary["test"]["ser"])  # it trained and was scored
