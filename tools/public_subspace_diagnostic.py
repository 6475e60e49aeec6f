"""How much of the private clipped-gradient sum lies in a subspace spanned by public gradients?

Runs SNIPS CLC's private default (per-example DP-SGD, epsilon 8) and, at some epoch ends, takes
1,024 training examples' clipped gradients (their sum: the signal of a step) and 512 gradients of
each candidate public set: SNIPS dev with its labels (in-distribution, an upper bound), SNIPS dev
and ATIS train with the model's predicted labels, ATIS train with random labels. It prints the
share of the signal's energy inside the top k directions of each set (k = 8 ... 512) and, per
example, inside the top 128. From the repository root:

    python tools/public_subspace_diagnostic.py runs/public_subspace_diagnostic

Appends one JSON line per measured epoch to results/public_subspace/diagnostic.jsonl. The rows
committed were measured at epochs 1 and 3 (the run was stopped there).
"""
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.getcwd())
from edp_nlu.configs import snips_clc
from edp_nlu.data import encoding, loading
from edp_nlu.pipeline import training

run_dir = sys.argv[1]
epochs_to_measure = {1, 3, 6, 11, 16, 21}
config = snips_clc.get_config()
rng = np.random.default_rng(0)

atis = loading.load_joint_dir("../shared/data/atis")
out = open(os.path.join("results", "public_subspace", "diagnostic.jsonl"), "a")


def captured_energy(g: np.ndarray, signal: np.ndarray, private: np.ndarray) -> dict:
    """Share of `signal`'s energy in the top k right singular vectors of the public gradients
    `g` (m x d), k = 8 ... 512, and the mean share of each of the first 256 `private`
    gradients' energy in the top 128."""
    # right singular vectors of g via the m x m Gram matrix (m << d)
    w, u = np.linalg.eigh(g @ g.T)
    order = np.argsort(w)[::-1]
    w, u = w[order], u[:, order]
    keep = w > 1e-10 * w[0]
    v = (g.T @ u[:, keep]) / np.sqrt(w[keep])  # d x r, orthonormal columns
    coef = v.T @ signal
    cap = {}
    for k in (8, 32, 128, 256, 512):
        if k <= v.shape[1]:
            cap[k] = float(np.sum(coef[:k] ** 2) / np.sum(signal ** 2))
    pe = v[:, :128].T @ private[:256].T
    cap["per_example_128"] = float(np.mean(np.sum(pe ** 2, 0) / np.sum(private[:256] ** 2, 1)))
    return cap


class Diag(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 not in epochs_to_measure:
            return
        trainer = self.model
        model = trainer.wrapped_model
        loss_fn = model.per_example_loss
        variables = trainer._trained_variables()

        @tf.function
        def per_example(x, y):
            def one(args):
                xi, yi = args
                xi = {k: v[None] for k, v in xi.items()}
                yi = {k: v[None] for k, v in yi.items()}
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(loss_fn(yi, model(xi, training=True)))
                g = tape.gradient(loss, variables)
                return tf.concat([tf.reshape(tf.convert_to_tensor(t), [-1]) for t in g], 0)
            return tf.map_fn(one, (x, y), fn_output_signature=tf.float32)

        def grads(x, y, n):
            rows = []
            for s in range(0, n, 64):
                xs = {k: tf.constant(v[s:s + 64]) for k, v in x.items()}
                ys = {k: tf.constant(v[s:s + 64]) for k, v in y.items()}
                rows.append(per_example(xs, ys).numpy())
            g = np.concatenate(rows)
            norms = np.linalg.norm(g, axis=1, keepdims=True)
            return g / np.maximum(norms, 1.0), norms[:, 0]

        def predicted(x):
            labels = model.predict_labels({k: tf.constant(v) for k, v in x.items()})
            tags = np.asarray(labels["tag_ids"]) * np.asarray(labels["tag_mask"]).astype(np.int32)
            intent = np.asarray(labels["intent_ids"])
            return {"tags": tags.astype(np.int32), "intent": intent.astype(np.int32)}

        def random_labels(x, y_like):
            ntags = int(model.num_tags)
            tags = rng.integers(0, ntags, size=x["word_ids"].shape).astype(np.int32)
            tags = np.where(x["word_ids"] > 0, tags, 0).astype(np.int32)
            return {"tags": tags, "intent": rng.integers(0, int(y_like["intent"].max()) + 1,
                                                          size=len(tags)).astype(np.int32)}


        tr = TRAIN[0]
        n = len(tr.y["intent"])
        idx = rng.choice(n, 1024, replace=False)
        px = {k: v[idx] for k, v in tr.x.items()}
        py = {k: v[idx] for k, v in tr.y.items()}
        gp, pn = grads(px, py, 1024)
        d = gp.shape[1]
        halves = [gp[:512].sum(0), gp[512:].sum(0)]
        signal = gp.sum(0)
        result = {"epoch": epoch + 1, "d": d, "private_norm_median": float(np.median(pn)),
                  "signal_norm_per_example": float(np.linalg.norm(signal) / 1024),
                  "halves_cos": float(halves[0] @ halves[1] / np.linalg.norm(halves[0]) /
                                      np.linalg.norm(halves[1]))}
        publics = {}
        dx, dy = DEV[0]
        publics["snips_dev_true"] = (dx, dy)
        publics["snips_dev_pred"] = (dx, predicted(dx))
        ax = ATIS_X[0]
        publics["atis_pred"] = (ax, predicted(ax))
        publics["atis_random"] = (ax, random_labels(ax, py))
        for name, (x, y) in publics.items():
            m = min(len(y["intent"]), 512)
            g, _ = grads({k: v[:m] for k, v in x.items()}, {k: v[:m] for k, v in y.items()}, m)
            result[name] = captured_energy(g, signal, gp)
        print(json.dumps(result), file=out, flush=True)
        print("GEPDIAG", json.dumps(result), flush=True)


TRAIN, DEV, ATIS_X = [None], [None], [None]
orig_load = training._load_data


def load(spec, splits, resume, *rest):
    data = orig_load(spec, splits, resume, *rest)
    TRAIN[0] = data.train
    dev = encoding.encode(data.preprocessor, data.splits.dev, "dev")
    DEV[0] = (dev.x, dev.y)
    ATIS_X[0] = data.preprocessor.encode([u.tokens for u in atis.train[:512]])[0]
    return data


training._load_data = load
print(training.train(config, run_dir, callbacks=(Diag(),), export=False)["test"])
