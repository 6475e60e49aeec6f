"""A model with two outputs (intent and slots, as a joint NLU model) trained privately.

Keras' dict of losses and `loss_weights` work as usual: each example's weighted sum of its two
losses is clipped as a whole, so the guarantee is per utterance, whatever the heads.

    python examples/two_outputs.py                # about a minute on a 2-core CPU
"""
import argparse

import keras
import numpy as np
from token_tagger import LENGTH, TAGS, WORDS, private_utterances

import edp_tf

INTENTS = ("call_person", "call_later")


def main(examples: int = 4000, epochs: int = 3, target_epsilon: float = 8.0, run_dir=None):
    x, tags = private_utterances(examples)
    held_x, held_tags = private_utterances(500, seed=1)
    # the intent: whether the utterance names a time (a stand-in for a real label)
    time_tag = TAGS.index("B-time")
    intent, held_intent = ((t == time_tag).any(1).astype("int32") for t in (tags, held_tags))

    words = keras.Input((LENGTH,), dtype="int32", name="words")
    hidden = keras.layers.Conv1D(16, 3, padding="same", activation="relu")(
        keras.layers.Embedding(len(WORDS), 16)(words))
    slots = keras.layers.Dense(len(TAGS), name="slots")(hidden)
    intents = keras.layers.Dense(len(INTENTS), name="intent")(
        keras.layers.GlobalMaxPooling1D()(hidden))
    model = keras.Model(words, {"intent": intents, "slots": slots})

    private = edp_tf.make_private(model, target_epsilon=target_epsilon, epochs=epochs,
                                  batch_size=max(16, examples // 20), run_dir=run_dir)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    private.compile(keras.optimizers.Adam(0.05), loss={"intent": loss, "slots": loss},
                    loss_weights={"intent": 1.0, "slots": 2.0})
    private.fit({"words": x}, {"intent": intent, "slots": tags}, verbose=0)

    out = model.predict({"words": held_x}, verbose=0)
    accuracy = float(np.mean(np.argmax(out["intent"], -1) == held_intent))
    print(f"held-out intent accuracy {accuracy:.3f}; epsilon {private.epsilon:.2f}; private "
          f"{private.privacy_statement()['private']}")
    return private, accuracy


if __name__ == "__main__":
    flags = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_argument("--examples", type=int, default=4000)
    flags.add_argument("--epochs", type=int, default=3)
    flags.add_argument("--target_epsilon", type=float, default=8.0)
    flags.add_argument("--run_dir", default=None, help="write privacy.json here")
    main(**vars(flags.parse_args()))
