"""A Keras user's habits, kept under DP: a tf.data pipeline, the usual callbacks, saving and
loading, and a second `fit` that continues the same budget.

A small Conv2D net on synthetic 12x12 images. The pipeline is finite and unbatched: `fit` takes
one pass over it for the examples, then draws every batch itself as a Poisson sample (a
pipeline you batch and shuffle yourself would not be one, so the library does the drawing).
`ModelCheckpoint` saves your model, not the privacy machinery: the file loads with Keras alone,
and privacy.json lists it. `CSVLogger` and the History carry `epsilon` after each epoch.

    python examples/keras_habits.py               # about a minute on a 2-core CPU
"""
import argparse
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import edp_tf

SIZE = 12


def private_images(count: int, seed: int = 0):
    """Stand-ins for private images: a bright bar, across or down, to tell apart."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(2, size=count)
    images = rng.normal(0.0, 0.3, size=(count, SIZE, SIZE, 1)).astype("float32")
    rows = rng.integers(2, SIZE - 2, size=count)
    for image, label, row in zip(images, labels, rows):
        if label:
            image[:, row, 0] += 1.0
        else:
            image[row, :, 0] += 1.0
    return images, labels.astype("int32")


def main(examples: int = 4000, epochs: int = 3, target_epsilon: float = 8.0, run_dir=None):
    run_dir = run_dir or tempfile.mkdtemp(prefix="keras_habits_")
    os.makedirs(run_dir, exist_ok=True)  # CSVLogger opens its file before the first epoch
    images, labels = private_images(examples)
    held_images, held_labels = private_images(500, seed=1)  # held out: not training data
    pipeline = tf.data.Dataset.from_tensor_slices((images, labels))  # finite, unbatched

    model = keras.Sequential([
        keras.Input((SIZE, SIZE, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2),
    ])
    private = edp_tf.make_private(model, target_epsilon=target_epsilon, epochs=epochs,
                                  batch_size=max(16, examples // 20), run_dir=run_dir)
    private.compile(keras.optimizers.Adam(0.02),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"])
    best = os.path.join(run_dir, "best.keras")
    callbacks = [
        keras.callbacks.ModelCheckpoint(best, monitor="val_loss", save_best_only=True),
        keras.callbacks.ModelCheckpoint(os.path.join(run_dir, "last.weights.h5"),
                                        save_weights_only=True),
        keras.callbacks.CSVLogger(os.path.join(run_dir, "history.csv")),
    ]
    history = private.fit(pipeline, validation_data=(held_images, held_labels),
                          callbacks=callbacks, verbose=0)

    served = keras.saving.load_model(best)  # the user's architecture, loaded by Keras alone
    served.compile(metrics=["accuracy"],
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    accuracy = served.evaluate(held_images, held_labels, verbose=0)[1]
    statement = private.privacy_statement()
    print(f"held-out accuracy {accuracy:.3f} (best checkpoint); epsilon per epoch "
          f"{[round(e, 2) for e in history.history['epsilon']]}; epsilon "
          f"{statement['epsilon']:.2f}; private {statement['private']}")
    return private, accuracy


if __name__ == "__main__":
    flags = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_argument("--examples", type=int, default=4000)
    flags.add_argument("--epochs", type=int, default=3)
    flags.add_argument("--target_epsilon", type=float, default=8.0)
    flags.add_argument("--run_dir", default=None, help="write privacy.json here")
    main(**vars(flags.parse_args()))
