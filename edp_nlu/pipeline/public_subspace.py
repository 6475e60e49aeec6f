"""--config.public_subspace: each noisy update projected onto the top directions of public
examples' gradients (edp_tf/projection.py; post-processing, so epsilon is unchanged).

The public examples are utterances of a public corpus: "synthetic" (the built-in generator, with
a seed of its own) or a joint-format directory such as ../shared/data/atis. Their labels need not
be this run's: each utterance gets an intent and tags drawn uniformly from this run's label
vocabularies (seeded, fixed for the run), so their gradients span the directions the heads and the
encoder move in whatever the private labels are; with `public_subspace_labels="own"` a corpus
labelled in this run's schema (a small public in-domain set) keeps its own labels. A directory
may also be one split (seq.in, seq.out, label).

Privacy: which public examples span the subspace is a function of the public corpus and the
config only; this module never reads the training split. Leaving out public utterances that
equal training ones (or refusing a corpus that holds many) would make the chosen set, and so
every projected update, depend on the training data through a channel no noise covers: adding
one training utterance would change the subspace. An utterance of the declared-public corpus is
public even when a training utterance has the same words. privacy.json names the corpus.
"""
from __future__ import annotations

import logging
import typing

import numpy as np

from edp_nlu.data import loading
from edp_nlu.pipeline.spec_parts import PrivacySpec

_log = logging.getLogger(__name__)
SYNTHETIC = "synthetic"
_SYNTHETIC_SEED = 7919  # a corpus of its own: not the default job's (seed 0)
_CHOICE_SEED = 0  # the subset and the drawn labels: fixed, so a function of the corpus alone


class PublicExamples(typing.NamedTuple):
    """The encoded public examples and the corpus they come from, for privacy.json."""

    x: object
    y: object
    count: int
    source: str


def corpus(privacy: PrivacySpec) -> tuple:
    """(utterances, name) of the run's public corpus: the split it draws from, and a name
    saying which corpus, which split and how many utterances (for privacy.json)."""
    source = privacy.public_subspace
    if source == SYNTHETIC:
        size = max(int(privacy.public_subspace_examples) * 2, 1000)
        utterances = list(loading.load_data(None, seed=_SYNTHETIC_SEED,
                                            synthetic_size=size).train)
        return utterances, (f"the train split ({len(utterances)} utterances) of the built-in "
                            f"synthetic corpus 'synthetic' (generator seed {_SYNTHETIC_SEED})")
    try:
        if loading.is_split_dir(source):
            utterances = list(loading.load_joint_split(source))
            return utterances, f"the split directory {source} ({len(utterances)} utterances)"
        utterances = list(loading.load_data(source).train)
    except (ValueError, OSError) as error:
        raise ValueError(f"--privacy.public_subspace={source!r}: cannot read its training "
                         f"split: {error}") from error
    return utterances, f"the train split ({len(utterances)} utterances) of {source}"


def public_examples(privacy: PrivacySpec, preprocessor) -> PublicExamples:
    """`public_subspace_examples` public utterances, encoded, with labels drawn from this run's
    vocabularies (or their own); chosen from the public corpus alone, never the training split."""
    utterances, name = corpus(privacy)
    own = privacy.public_subspace_labels == "own"
    if own:
        _check_own_labels(privacy, preprocessor, utterances)
    rng = np.random.default_rng(_CHOICE_SEED)
    wanted = int(privacy.public_subspace_examples)
    if len(utterances) < wanted:
        raise ValueError(f"--privacy.public_subspace_examples={wanted} is invalid: "
                         f"{privacy.public_subspace!r} has {len(utterances)} utterances")
    chosen = [utterances[i] for i in rng.choice(len(utterances), wanted, replace=False)]
    source = (f"{wanted} utterances of {name}, chosen with a fixed seed without reading the "
              "training split, " + ("with their own labels" if own else
                                    "with labels drawn at random from this run's label sets"))
    tags = preprocessor.tag_vocabulary.labels[1:]  # id 0 is the reserved unknown label
    intents = preprocessor.intent_vocabulary.labels[1:]
    tokens = [u.tokens for u in chosen]
    if own:
        x, y, _ = preprocessor.encode(tokens, [u.tags for u in chosen],
                                      [u.intent for u in chosen])
        return PublicExamples(x, y, wanted, source)
    x, y, _ = preprocessor.encode(
        tokens, [[tags[i] for i in rng.integers(0, len(tags), len(t))] for t in tokens],
        [intents[i] for i in rng.integers(0, len(intents), len(tokens))])
    return PublicExamples(x, y, wanted, source)


def _check_own_labels(privacy: PrivacySpec, preprocessor, utterances) -> None:
    """public_subspace_labels='own' needs the corpus's labels to be this run's."""
    tags = set(preprocessor.tag_vocabulary.labels)
    intents = set(preprocessor.intent_vocabulary.labels)
    foreign = ({u.intent for u in utterances} - intents) | (
        {t for u in utterances for t in u.tags} - tags)
    if foreign:
        raise ValueError(f"--privacy.public_subspace_labels='own' is invalid for "
                         f"{privacy.public_subspace!r}: {len(foreign)} of its labels are not "
                         "this run's (use 'random')")


def attach(privacy: PrivacySpec, trainer, preprocessor) -> None:
    """Sets the projection on `trainer` (an edp_tf.PrivateModel) when the run asks for one.
    It takes no training data: the public set must not depend on it."""
    if not privacy.public_subspace:
        return
    public = public_examples(privacy, preprocessor)
    trainer.project_onto_public_gradients(public.x, public.y, int(privacy.public_subspace_rank),
                                          int(privacy.public_subspace_every),
                                          source=public.source)
    _log.info("updates projected onto %d directions of the gradients of %s, refreshed every %d "
              "steps", int(privacy.public_subspace_rank), public.source,
              int(privacy.public_subspace_every))
