"""Per-variable scales alpha_k (docs/design.md, per-layer scaling).

Clipping happens on g_k / alpha_k, so a layer with a large alpha gets a proportionally larger
share of the clipping budget C (and of the noise, once unscaled). Scales are normalised so that
sum_k alpha_k^2 = K: alpha = 1 everywhere is flat clipping.

Where alpha comes from matters for privacy: measured on public data it is free; measured on the
first private batch (the paper) it leaks information no epsilon covers; `private_norm_shares`
measures it with a Gaussian query of sensitivity 1 whose cost is recorded for the ledger.
"""
from __future__ import annotations

import secrets
from typing import Callable, Optional, Sequence

import numpy as np

FLOOR_FRACTION = 0.01  # a layer never gets less than 1% of the mean scale: unused layers stay sane


def normalize(norms: Sequence[float]) -> tuple:
    """alpha proportional to `norms` (floored), with sum alpha_k^2 = K."""
    norms = np.asarray(norms, dtype=np.float64)
    if norms.ndim != 1 or norms.size == 0:
        raise ValueError(f"layer norms must be a non-empty vector, got shape {norms.shape}")
    if not np.all(np.isfinite(norms)):
        raise ValueError("layer norms contain NaN/Inf: cannot derive layer scales from them")
    norms = np.maximum(norms, 0.0)
    mean = norms.mean()
    if mean <= 0:
        return tuple([1.0] * norms.size)
    norms = np.maximum(norms, FLOOR_FRACTION * mean)
    alpha = norms * np.sqrt(norms.size / np.sum(norms**2))
    return tuple(float(a) for a in alpha)


def per_variable_norms(grads: Sequence[np.ndarray]) -> np.ndarray:
    """||g_k|| for each variable k."""
    return np.array([float(np.linalg.norm(np.asarray(g, dtype=np.float64))) for g in grads])


def private_norm_shares(
    per_example_norms: np.ndarray, noise_multiplier: float, rng: np.random.Generator
) -> np.ndarray:
    """A noisy mean of each example's per-variable norm *shares* (a unit vector per example).

    Sensitivity 1 under add/remove: one example adds or removes one unit vector. The sum gets
    N(0, z^2 I) and is divided by the (public) count. `per_example_norms` is [examples, K].
    """
    v = np.asarray(per_example_norms, dtype=np.float64)
    lengths = np.linalg.norm(v, axis=1, keepdims=True)
    ok = np.isfinite(lengths[:, 0]) & (lengths[:, 0] > 0)
    units = np.where(ok[:, None], v / np.where(lengths > 0, lengths, 1.0), 0.0)
    noisy_sum = units.sum(axis=0) + rng.normal(0.0, noise_multiplier, size=v.shape[1])
    return noisy_sum / v.shape[0]


def choose(config, count: int, public: Optional[tuple], first_batch_gradients: Callable[[], list],
           per_example_norms: Callable[[int], np.ndarray], rows: int,
           rng: np.random.Generator) -> tuple:
    """(alpha, extra privacy events): the policy of `DPConfig.scaling` for `count` variables.

    Explicit `layer_scales` win; "uniform" is flat clipping; "public" uses the scales measured
    on public data (`public`); "first_batch" measures the first private batch (the paper: not
    covered by epsilon, the ledger says so); "private" asks a Gaussian query of sensitivity 1 on
    the norm shares of the first `scaling_examples` examples, returned as an event to charge.
    """
    if config.layer_scales is not None:
        if len(config.layer_scales) != count:
            raise ValueError(
                f"DPConfig.layer_scales has {len(config.layer_scales)} values but the model has "
                f"{count} trainable variables")
        return normalize(config.layer_scales), []
    if config.scaling == "uniform":
        return tuple([1.0] * count), []
    if config.scaling == "public":
        if public is None:
            raise ValueError(
                "DPConfig.scaling='public' needs public scales: call "
                "set_public_layer_scales(x, y) with public data, or pass layer_scales")
        return public, []
    if config.scaling == "first_batch":
        return normalize(per_variable_norms(first_batch_gradients())), []
    used = min(config.scaling_examples, rows)
    shares = private_norm_shares(per_example_norms(used), config.scaling_noise_multiplier, rng)
    event = {
        "name": "private_layer_scales",
        "id": secrets.token_hex(8),  # lets a ledger charge this query once, across processes
        "noise_multiplier": config.scaling_noise_multiplier,
        "sampling_rate": None,  # no amplification claimed: the examples are fixed
        "steps": 1,
        "sensitivity": 1,
        "examples": used,
    }
    return normalize(shares), [event]
