"""Augmentation copies: tags stay aligned and BIO well-formed, slot fillers are public (the
synthetic generator's), and each example's copies come from its own seeded stream (the trainer's
use of them is tests/augmentation_test.py's)."""
import random

import pytest

from edp_nlu.data import augment, synthetic
from edp_nlu.data.corpus import Utterance, bio_error


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
    splits = synthetic.synthetic_corpus(seed=0, size=240)
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
    utterances = synthetic.synthetic_corpus(seed=0, size=240).train[:20]
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
