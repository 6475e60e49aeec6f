"""Per-variable scales alpha (the paper's per-layer scaling), measured on the model.

Why these live apart from the step: alpha is decided once, before tracing, from gradients of a
batch (public data, or the private query `scaling.choose` charges), on the first replica alone;
the step only multiplies by it (clipping.scale). The numpy side (normalising, the private
query's noise) is edp_tf/scaling.py.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from edp_tf import microbatch, scaling, step_inputs


def on_one_replica(strategy, fn, *args):
    """Runs `fn` once, on the first replica's device only (no all-reduce involved)."""
    device = strategy.extended.worker_devices[0] if hasattr(strategy, "extended") else None
    with tf.device(device):
        return tf.function(fn, autograph=False)(*args)


def gradients(model, loss_fn, strategy, x, y, w) -> list:
    """The whole batch's gradient of every trainable variable (numpy), on one replica."""
    variables = model.trainable_variables
    w = step_inputs.mask(x, w)

    def grads_fn(x, y, w):
        g, _, _ = microbatch.single_microbatch_gradient(model, loss_fn, variables, x, y, w,
                                                        tf.reduce_sum(w))
        return g

    return [g.numpy() for g in on_one_replica(strategy, grads_fn, x, y, w)]


def per_example_variable_norms(model, loss_fn, strategy, x, y, w) -> np.ndarray:
    """[examples, variables] gradient norms (ghost norms where they apply: no per-example
    copies of embedding tables), on one replica."""
    variables = model.trainable_variables
    w = step_inputs.mask(x, w)

    def norms_fn(x, y, w):
        squares, _ = microbatch.per_variable_squared_norms(model, loss_fn, variables, x, y, w, 1,
                                                           1.0)
        return tf.sqrt(squares)

    return on_one_replica(strategy, norms_fn, x, y, w).numpy()


def decide(config, model, loss_fn, strategy, first, earlier, rng) -> tuple:
    """(alpha per trainable variable, the extra events their choice charged) from the first
    batch `first` (x, y, w): edp_tf/scaling.py's choice for `config.scaling`."""
    fx, fy, fw = first
    rows = int(tf.nest.flatten(fx)[0].shape[0])

    def norms(used: int) -> np.ndarray:
        return per_example_variable_norms(
            model, loss_fn, strategy, *tf.nest.map_structure(lambda t: t[:used], (fx, fy, fw)))

    return scaling.choose(config, len(model.trainable_variables), earlier,
                          lambda: gradients(model, loss_fn, strategy, fx, fy, fw), norms, rows,
                          rng)


def for_fit(config, model, loss_fn, strategy, first, decided: tuple, rng,
            batch_changed: bool) -> tuple:
    """(alpha per trainable variable, their extra events) for a fit whose first batch is
    `first` (x, y, mask), given those `decided` earlier ((None, []) before any): decided once,
    and again for another batch size or, when the scales are uniform, for another set of
    trainable variables. Non-uniform scales were decided (and maybe charged) for one set."""
    scales, events = decided
    count = len(model.trainable_variables)
    changed = batch_changed
    if scales is not None and len(scales) != count:
        if config.scaling != "uniform":
            raise ValueError(
                f"the model's trainable variables changed since DPConfig.scaling="
                f"{config.scaling!r} decided {len(scales)} scales (now {count}): set "
                "layer.trainable before the first fit, or wrap the model anew")
        changed = True
    if scales is None or changed:
        return decide(config, model, loss_fn, strategy, first, scales, rng)
    return scales, events


def public(model, loss_fn, strategy, x, y, sample_weight=None) -> tuple:
    """alpha measured on a batch of public (or synthetic) data."""
    return scaling.normalize(scaling.per_variable_norms(
        gradients(model, loss_fn, strategy, x, y, sample_weight)))


def restored(scales, count: int) -> tuple:
    """The alpha a resumed run decided earlier, checked against the `count` variables."""
    scales = tuple(float(a) for a in scales)
    if len(scales) != count or not all(math.isfinite(a) and a > 0 for a in scales):
        raise ValueError(f"restore_layer_scales needs {count} positive finite scales, "
                         f"got {len(scales)}")
    return scales
