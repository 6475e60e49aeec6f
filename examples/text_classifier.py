"""A text classifier trained privately with one edp_tf call.

The vocabulary comes from public text (here a list of public sentences; in practice a public
corpus or a pretrained tokenizer's vocabulary): it ships inside the exported model, so it must not
come from the private utterances. Text is turned into ids outside the trained model, the way Keras
recommends for tf.data, and the serving model puts the two back together.

    python examples/text_classifier.py            # about a minute on a 2-core CPU
"""
import argparse

import keras
import numpy as np

import edp_tf

INTENTS = ("call", "refill", "weather")
PUBLIC_TEXT = [  # public sentences: the vocabulary's only source
    "call my mother at home", "call the office now", "phone my brother please",
    "refill my prescription", "refill the aspirin order", "order more medicine please",
    "what is the weather today", "will it rain tomorrow", "is it sunny at home",
]
_WORDS = {
    "call": (["call", "phone"], ["my mother", "my brother", "the office"],
             ["now", "at home", "please"]),
    "refill": (["refill", "order"], ["my prescription", "the aspirin order", "more medicine"],
               ["please", "now", "today"]),
    "weather": (["what is the weather", "will it rain", "is it sunny"], ["today", "tomorrow"],
                ["at home", "please", "now"]),
}


def private_utterances(count: int, seed: int = 0):
    """Stand-ins for private utterances (what a user's logs would hold)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(len(INTENTS), size=count)
    texts = [" ".join(rng.choice(part) for part in _WORDS[INTENTS[label]]) for label in labels]
    return np.array(texts), labels.astype("int32")


def main(examples: int = 4000, epochs: int = 3, target_epsilon: float = 8.0, run_dir=None):
    vectorize = keras.layers.TextVectorization(output_sequence_length=8)
    vectorize.adapt(PUBLIC_TEXT)  # public text only
    texts, labels = private_utterances(examples)
    held_texts, held_labels = private_utterances(500, seed=1)  # held out: not training data
    x, held_x = vectorize(texts).numpy(), vectorize(held_texts).numpy()

    model = keras.Sequential([
        keras.Input((8,), dtype="int64"),
        keras.layers.Embedding(vectorize.vocabulary_size(), 16),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(len(INTENTS)),
    ])
    private = edp_tf.make_private(model, target_epsilon=target_epsilon, epochs=epochs,
                                  batch_size=max(16, examples // 20), run_dir=run_dir)
    private.compile(keras.optimizers.Adam(0.05),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"])
    private.fit(x, labels, validation_data=(held_x, held_labels), verbose=0)

    accuracy = float(np.mean(np.argmax(model.predict(held_x, verbose=0), -1) == held_labels))
    print(f"held-out accuracy {accuracy:.3f}; epsilon {private.epsilon:.2f} at delta "
          f"{private.privacy_statement()['delta']:.2g}; private "
          f"{private.privacy_statement()['private']}")
    serving = keras.Sequential([keras.Input((), dtype="string"), vectorize, model])
    return private, serving, accuracy


if __name__ == "__main__":
    flags = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_argument("--examples", type=int, default=4000)
    flags.add_argument("--epochs", type=int, default=3)
    flags.add_argument("--target_epsilon", type=float, default=8.0)
    flags.add_argument("--run_dir", default=None, help="write privacy.json here")
    main(**vars(flags.parse_args()))
