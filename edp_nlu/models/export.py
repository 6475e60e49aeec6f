"""Serving export: a SavedModel that takes raw utterances and returns intent and slot tags.

`serving_default(utterances: string [batch])` returns
  intent             string [batch]   the predicted intent label
  intent_probability float  [batch]   its softmax probability
  slot_tags          string [batch, words]  one BIO tag per whitespace word of the utterance,
                                      "" past the utterance's end, "O" for words past the model's
                                      length limit (those utterances are flagged `truncated`)
  num_words          int64  [batch]
  truncated          bool   [batch]

Tokenisation and the vocabularies are inside the SavedModel. Only the trained model's variables are
written: no optimizer state, no privacy wrapper (pass `PrivateModel.wrapped_model`), no training
data beyond what the vocabularies themselves hold (see `vocabulary_from_training_data`). A CLC
export loads with TensorFlow alone; a BERT export also needs `import tensorflow_text`.
"""

from __future__ import annotations

import tensorflow as tf

from edp_nlu.models.joint_task import JointTagger


def serving_function(task: JointTagger, preprocessor) -> tf.types.experimental.PolymorphicFunction:
    """The tf.function that the SavedModel serves (also usable in memory, e.g. to compare
    outputs)."""
    if not isinstance(task, JointTagger):
        raise ValueError(
            "export needs the trained JointTagger (e.g. PrivateModel.wrapped_model), got "
            f"{type(task).__name__}"
        )
    tag_names = tf.constant(list(preprocessor.tag_vocabulary.labels))
    intent_names = tf.constant(list(preprocessor.intent_vocabulary.labels))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="utterances")],
                 autograph=False)
    def serve(utterances):
        words = preprocessor.split(utterances)
        predictions = task.predict_labels(preprocessor.encode_words(words))
        num_words = words.row_lengths()
        tagged = tf.reduce_sum(tf.cast(predictions["tag_mask"], tf.int64), axis=1)  # kept prefix
        width = tf.reduce_max(tf.concat([num_words, [0]], axis=0))
        tags = tf.gather(tag_names, predictions["tag_ids"])
        batch = tf.shape(tags)[0]
        extra = tf.maximum(width - tf.cast(tf.shape(tags)[1], tf.int64), 0)
        tags = tf.concat([tags, tf.fill(tf.stack([batch, tf.cast(extra, tf.int32)]), "O")], axis=1)
        tags = tags[:, :width]
        position = tf.range(width)[None]
        tags = tf.where(position < tagged[:, None], tags, "O")
        tags = tf.where(position < num_words[:, None], tags, "")
        return {
            "intent": tf.gather(intent_names, predictions["intent_ids"]),
            "intent_probability": predictions["intent_probability"],
            "slot_tags": tags,
            "num_words": num_words,
            "truncated": tagged < num_words,
        }

    return serve


def export_serving_model(task: JointTagger, preprocessor, path: str) -> str:
    """Writes the serving SavedModel of `task` + `preprocessor` to `path`; returns `path`.

    The root holds the serving function traced once (`serve`, also the `serving_default` and
    `serve` signatures), the variables it reads and the preprocessor's lookup tables. Saved as
    a tf.function rather than this concrete function, it was traced a second time inside
    `tf.saved_model.save` (whose save context is part of the trace's cache key): about half of
    an export's time. `task` itself is not tracked: that would trace the model's own calls
    while looking for resources and write every variable a second time, with the dropout
    layers' seed states."""
    serve = serving_function(task, preprocessor).get_concrete_function()
    root = tf.Module()
    root.preprocessor = preprocessor
    root.served_variables = list(serve.variables)
    root.serve = serve
    tf.saved_model.save(root, path, signatures={"serve": serve, "serving_default": serve})
    return path
