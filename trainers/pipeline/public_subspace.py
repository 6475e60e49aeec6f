"""--config.public_subspace: each noisy update projected onto the top directions of public
examples' gradients (edp_tf/projection.py; post-processing, so epsilon is unchanged).

The public examples are utterances of a public corpus: "synthetic" (the built-in generator, with
a seed of its own) or a joint-format directory such as ../shared/data/atis. Their labels need not
be this run's: each utterance gets an intent and tags drawn uniformly from this run's label
vocabularies (seeded, fixed for the run), so their gradients span the directions the heads and the
encoder move in whatever the private labels are. A corpus directory that shares an utterance with
this run's training set is refused, as for `init_from`: epsilon would treat private data as
public. The synthetic generator is public by construction, so its utterances that happen to equal
a training one are left out instead (short commands recur).
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
    if shared and config.public_subspace == SYNTHETIC:
        utterances = [u for u in utterances if tuple(u.tokens) not in ours]
        _log.info("public subspace: %d generated utterances equal training ones: left out",
                  shared)
    elif shared:
        raise ValueError(f"--config.public_subspace={config.public_subspace!r}: {shared} of its "
                         "utterances are in this run's training set; its gradients would not be "
                         "public, and epsilon would not count that use of the data. Use a "
                         "public corpus.")
    rng = np.random.default_rng(0)
    wanted = int(config.public_subspace_examples)
    if len(utterances) < wanted:
        raise ValueError(f"--config.public_subspace_examples={wanted} is invalid: "
                         f"{config.public_subspace!r} has {len(utterances)} training utterances")
    chosen = [utterances[i] for i in rng.choice(len(utterances), wanted, replace=False)]
    tags = preprocessor.tag_vocabulary.labels[1:]  # id 0 is the reserved unknown label
    intents = preprocessor.intent_vocabulary.labels[1:]
    tokens = [u.tokens for u in chosen]
    x, y, _ = preprocessor.encode(
        tokens, [[tags[i] for i in rng.integers(0, len(tags), len(t))] for t in tokens],
        [intents[i] for i in rng.integers(0, len(intents), len(tokens))])
    return x, y, wanted


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
