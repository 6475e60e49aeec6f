"""--config.public_subspace: each noisy update projected onto the top directions of public
examples' gradients (edp_tf/projection.py; post-processing, so epsilon is unchanged).

The public examples are utterances of a public corpus: "synthetic" (the built-in generator, with
a seed of its own) or a joint-format directory such as ../shared/data/atis. Their labels need not
be this run's: each utterance gets an intent and tags drawn uniformly from this run's label
vocabularies (seeded, fixed for the run), so their gradients span the directions the heads and the
encoder move in whatever the private labels are; with `public_subspace_labels="own"` a corpus
labelled in this run's schema (a small public in-domain set) keeps its own labels. A directory
may also be one split (seq.in, seq.out, label). Public utterances that equal a training one are
left out (short commands recur across corpora: 15 of SNIPS's 700 dev utterances are in its
training split), so no training utterance is ever used; a corpus of which more than half are
training utterances is refused: it is not public, and epsilon would not count that use.
"""
from __future__ import annotations

import logging

import numpy as np

from trainers.data import loading

_log = logging.getLogger(__name__)
SYNTHETIC = "synthetic"
_SYNTHETIC_SEED = 7919  # a corpus of its own: not the default job's (seed 0)


def _public_utterances(config) -> list:
    source = config.public_subspace
    if source == SYNTHETIC:
        size = max(int(config.public_subspace_examples) * 2, 1000)
        return list(loading.load_data(None, seed=_SYNTHETIC_SEED, synthetic_size=size).train)
    try:
        if loading.is_split_dir(source):
            return list(loading.load_joint_split(source))
        return list(loading.load_data(source).train)
    except (ValueError, OSError) as error:
        raise ValueError(f"--config.public_subspace={source!r}: cannot read its training "
                         f"split: {error}") from error


def public_examples(config, preprocessor, train) -> tuple:
    """(x, y, count): up to `public_subspace_examples` public utterances, encoded, with labels
    drawn from this run's vocabularies."""
    utterances = _public_utterances(config)
    ours = {tuple(u.tokens) for u in train}
    shared = sum(tuple(u.tokens) in ours for u in utterances)
    if shared * 2 > len(utterances):
        raise ValueError(f"--config.public_subspace={config.public_subspace!r}: {shared} of its "
                         f"{len(utterances)} utterances are in this run's training set: that is "
                         "not a public corpus, and epsilon would not count that use of the "
                         "data. Use a public corpus.")
    if shared:  # short commands recur across corpora: those are left out, never used
        utterances = [u for u in utterances if tuple(u.tokens) not in ours]
        _log.info("public subspace: %d public utterances equal training ones: left out", shared)
    if config.get("public_subspace_labels", "random") == "own":
        _check_own_labels(config, preprocessor, utterances)
    rng = np.random.default_rng(0)
    wanted = int(config.public_subspace_examples)
    if len(utterances) < wanted:
        raise ValueError(f"--config.public_subspace_examples={wanted} is invalid: "
                         f"{config.public_subspace!r} has {len(utterances)} training utterances")
    chosen = [utterances[i] for i in rng.choice(len(utterances), wanted, replace=False)]
    tags = preprocessor.tag_vocabulary.labels[1:]  # id 0 is the reserved unknown label
    intents = preprocessor.intent_vocabulary.labels[1:]
    tokens = [u.tokens for u in chosen]
    if config.get("public_subspace_labels", "random") == "own":
        x, y, _ = preprocessor.encode(tokens, [u.tags for u in chosen],
                                      [u.intent for u in chosen])
        return x, y, wanted
    x, y, _ = preprocessor.encode(
        tokens, [[tags[i] for i in rng.integers(0, len(tags), len(t))] for t in tokens],
        [intents[i] for i in rng.integers(0, len(intents), len(tokens))])
    return x, y, wanted


def _check_own_labels(config, preprocessor, utterances) -> None:
    """public_subspace_labels='own' needs the corpus's labels to be this run's."""
    tags = set(preprocessor.tag_vocabulary.labels)
    intents = set(preprocessor.intent_vocabulary.labels)
    foreign = ({u.intent for u in utterances} - intents) | (
        {t for u in utterances for t in u.tags} - tags)
    if foreign:
        raise ValueError(f"--config.public_subspace_labels='own' is invalid for "
                         f"{config.public_subspace!r}: {len(foreign)} of its labels are not "
                         "this run's (use 'random')")


def attach(config, trainer, preprocessor, train) -> None:
    """Sets the projection on `trainer` (an edp_tf.PrivateModel) when the config asks for one."""
    if not config.get("public_subspace", ""):
        return
    x, y, count = public_examples(config, preprocessor, train)
    trainer.project_onto_public_gradients(x, y, int(config.public_subspace_rank),
                                          int(config.public_subspace_every))
    _log.info("updates projected onto %d directions of %d public gradients (%s), refreshed "
              "every %d steps", int(config.public_subspace_rank), count,
              config.public_subspace, int(config.public_subspace_every))
