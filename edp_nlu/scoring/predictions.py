"""Evaluation of a trained joint model: predictions, per-example losses, the loss-threshold
membership attack and the scores against references (used by `train` and `evaluate`)."""
from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from edp_nlu.data import encoding
from edp_nlu.models.labels import is_well_formed_bio
from edp_nlu.scoring import metrics as metrics_lib
from edp_tf import attacks


def padded_batches(batch_size: int, *arrays: dict):
    """Yields (real rows, [batch dict per input]) with the last batch padded (by wrapping) to
    `batch_size`: one trace of an evaluation function serves every batch (tracing the unrolled
    CLC costs tens of seconds). Callers keep the first `real rows` outputs."""
    rows = encoding.rows(arrays[0])
    for start in range(0, rows, batch_size):
        index = np.arange(start, start + batch_size) % rows
        yield (min(batch_size, rows - start),
               [{k: tf.constant(v[index]) for k, v in a.items()} for a in arrays])


def decoding_step(model):
    """One tf.function giving every decoding the model can run from one forward pass (see
    `predict_by_decoding`): evaluating after each epoch and at the end shares its trace."""
    return tf.function(functools.partial(model.predict_labels_by_decoding,
                                         decodings=model.decodings()), reduce_retracing=True,
                       autograph=False)


def predict_by_decoding(model, preprocessor, x: dict, step=None, decodings=None,
                        batch_size: int = 256) -> dict:
    """{decoding: (intent labels, tag label lists cut to each utterance's kept words)} for
    `decodings` (default: every one the model can run); `step` is a `decoding_step`, so that
    one trace serves every call."""
    step = step or decoding_step(model)
    outputs = [(real, step(batch)) for real, (batch,) in padded_batches(batch_size, x)]
    decodings = decodings or model.decodings()
    return {d: _labels(preprocessor, [(real, out[d]) for real, out in outputs])
            for d in decodings}


def _labels(preprocessor, outputs):
    """(intent labels, tag label lists) from `predict_labels` outputs of padded batches."""
    intents, tags = [], []
    intent_names = preprocessor.intent_vocabulary.labels
    tag_names = preprocessor.tag_vocabulary.labels
    for real, out in outputs:
        ids = out["tag_ids"].numpy()[:real]
        kept = out["tag_mask"].numpy()[:real].sum(axis=1)
        intents.extend(intent_names[i] for i in out["intent_ids"].numpy()[:real])
        tags.extend([tag_names[t] for t in row[:k]] for row, k in zip(ids, kept))
    return intents, tags


def scores_by_decoding(model, preprocessor, references, x: dict, step=None) -> dict:
    """{"viterbi": metrics, "bio": metrics (when the model knows its tag labels)}: both decodings
    of the same model, so the constrained one's effect is measured on every run, not assumed.
    `step` (a `decoding_step`) serves them all from one forward pass."""
    return {decoding: score(references, *labels) for decoding, labels in
            predict_by_decoding(model, preprocessor, x, step=step).items()}


def per_example_losses(model, x: dict, y: dict, batch_size: int = 256, step=None) -> np.ndarray:
    """The joint loss of each utterance under the trained model (inference mode).

    Pass the same `step` (see `loss_step`) across calls to trace it once.
    """
    step = step or loss_step(model)
    out = [step(bx, by).numpy()[:real] for real, (bx, by) in padded_batches(batch_size, x, y)]
    return np.concatenate(out) if out else np.zeros([0], np.float32)


def loss_step(model):
    """The per-example joint loss in inference mode, as one tf.function."""
    return tf.function(lambda bx, by: model.per_example_loss(by, model.infer(bx)),
                       autograph=False)


def membership_attack(model, preprocessor, train_enc, nonmembers, name: str = "test") -> dict:
    """Loss-threshold membership inference: as many training utterances as held-out ones (the
    `name` split's `nonmembers`)."""
    test_enc = encoding.encode(preprocessor, nonmembers, name)
    n = min(encoding.rows(train_enc.x), encoding.rows(test_enc.x))
    index = np.random.default_rng(0).permutation(encoding.rows(train_enc.x))[:n]
    step = loss_step(model)
    members = per_example_losses(model, encoding.subset(train_enc.x, index),
                                 encoding.subset(train_enc.y, index), step=step)
    others = per_example_losses(model, encoding.subset(test_enc.x, np.arange(n)),
                                encoding.subset(test_enc.y, np.arange(n)), step=step)
    summary = attacks.loss_threshold_attack(members, others)
    summary["roc"] = attacks.roc_points(-members, -others)
    return summary


def score(references, intents, tags) -> dict:
    """Metrics against the original references; words past the model's length count as 'O'.
    `ill_formed_utterances`: predictions with an `I-X` not after `B-X` / `I-X` (the chunking
    rule still reads them; the BIO decoding never emits them)."""
    full_tags = [list(t) + ["O"] * (len(r.tokens) - len(t)) for r, t in zip(references, tags)]
    result = metrics_lib.evaluate_utterances(references, intents, full_tags)
    result["ill_formed_utterances"] = sum(not is_well_formed_bio(t) for t in full_tags)
    return result
