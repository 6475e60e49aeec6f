"""A token tagger (slot filling) trained privately with one edp_tf call.

Each utterance is a row of word ids padded to a fixed length with 0; every position has a tag,
and padding positions carry the tag "pad" (class 0), so the per-example loss is Keras' own mean
over the row's positions. The vocabulary is public (fixed word lists).

    python examples/token_tagger.py               # about a minute on a 2-core CPU
"""
import argparse

import keras
import numpy as np

import edp_tf

LENGTH = 8
TAGS = ("pad", "O", "B-person", "B-time")
WORDS = ["<pad>", "call", "my", "at", "mother", "brother", "boss", "noon", "six", "tomorrow"]
PEOPLE, TIMES = ("mother", "brother", "boss"), ("noon", "six", "tomorrow")


def private_utterances(count: int, seed: int = 0):
    """Stand-ins for private utterances: "call my <person> at <time>", tagged."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((count, LENGTH), "int32")
    tags = np.zeros((count, LENGTH), "int32")
    for row in range(count):
        words = ["call", "my", rng.choice(PEOPLE), "at", rng.choice(TIMES)][: rng.integers(3, 6)]
        for position, word in enumerate(words):
            ids[row, position] = WORDS.index(word)
            tags[row, position] = (TAGS.index("B-person") if word in PEOPLE else
                                   TAGS.index("B-time") if word in TIMES else TAGS.index("O"))
    return ids, tags


def main(examples: int = 4000, epochs: int = 3, target_epsilon: float = 8.0, run_dir=None):
    x, y = private_utterances(examples)
    held_x, held_y = private_utterances(500, seed=1)
    model = keras.Sequential([
        keras.Input((LENGTH,), dtype="int32"),
        keras.layers.Embedding(len(WORDS), 16),
        keras.layers.Conv1D(16, 3, padding="same", activation="relu"),
        keras.layers.Dense(len(TAGS)),
    ])
    private = edp_tf.make_private(model, target_epsilon=target_epsilon, epochs=epochs,
                                  batch_size=max(16, examples // 20), run_dir=run_dir)
    private.compile(keras.optimizers.Adam(0.05),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    private.fit(x, y, verbose=0)

    predicted = np.argmax(model.predict(held_x, verbose=0), -1)
    real = held_y > 0
    accuracy = float(np.mean(predicted[real] == held_y[real]))
    print(f"held-out tag accuracy {accuracy:.3f}; epsilon {private.epsilon:.2f}; private "
          f"{private.privacy_statement()['private']}")
    return private, accuracy


if __name__ == "__main__":
    flags = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_argument("--examples", type=int, default=4000)
    flags.add_argument("--epochs", type=int, default=3)
    flags.add_argument("--target_epsilon", type=float, default=8.0)
    flags.add_argument("--run_dir", default=None, help="write privacy.json here")
    main(**vars(flags.parse_args()))
