"""The optimizer of a run: Adam / AdamW / SGD with warm-up and linear or cosine decay.

Why a schedule matters under DP: the noise added per step is fixed by epsilon, so late steps move
the weights mostly at random; decaying the learning rate to zero averages that noise away (Li et
al. 2022 and Yu et al. 2022 use linear decay for DP fine-tuning). Warm-up keeps Adam's first,
poorly estimated second moments from taking large steps.

Weight averaging (an exponential moving average of the weights, De et al. 2022) averages the
noise of the last steps away without shrinking them; it post-processes the noisy updates, so
epsilon is unchanged. `ema_fraction` is its time constant as a fraction of the run's steps, so
that one value suits runs of 150 and of 3,000 steps.

"adam_bc" is DP-AdamBC (Tang et al. 2023; edp_tf/bias_corrected_adam.py): Adam with the DP noise's
known variance taken out of its second moment, so that it keeps Adam's per-weight step sizes
instead of acting as SGD; `adam_bc_floor` bounds the corrected moment below (a fraction of the
noise variance). Non-private runs have no noise to take out: for them it is Adam.

`noise_filter` puts a filter of the noisy updates in front of the optimizer (edp_tf/filtering.py:
"lowpass" is DOPPLER's low-pass filter, "kalman" DiSK's simplified Kalman filter in its
single-evaluation form), with the library's default coefficients; post-processing, so epsilon is
unchanged. Private runs only, as adam_bc: plain runs have no privacy noise to filter.
"""
from __future__ import annotations

import math

import keras
from keras import ops

from edp_tf.bias_corrected_adam import BiasCorrectedAdam
from edp_tf.filtering import KalmanFilter, LowPassFilter

OPTIMIZERS = ("adam", "adamw", "sgd", "adam_bc")
SCHEDULES = ("constant", "linear", "cosine")
NOISE_FILTERS = {"none": None, "lowpass": LowPassFilter, "kalman": KalmanFilter}


@keras.saving.register_keras_serializable(package="edp_trainers")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from ~0 to `peak` over `warmup_steps`, then constant, linear or cosine decay
    to `final_fraction * peak` at `total_steps` (and held there after)."""

    def __init__(self, peak: float, total_steps: int, warmup_steps: int = 0,
                 decay: str = "linear", final_fraction: float = 0.0):
        if decay not in SCHEDULES:
            raise ValueError(f"--config.lr_schedule={decay!r} is invalid: expected {SCHEDULES}")
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(f"schedule needs total_steps >= 1 and 0 <= warmup_steps <= "
                             f"total_steps, got {total_steps}, {warmup_steps}")
        self.peak = float(peak)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.final_fraction = float(final_fraction)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warm = self.peak * (step + 1.0) / float(max(self.warmup_steps, 1))
        span = float(max(self.total_steps - self.warmup_steps, 1))
        progress = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        floor = self.final_fraction
        if self.decay == "linear":
            fraction = 1.0 - (1.0 - floor) * progress
        elif self.decay == "cosine":
            fraction = floor + (1.0 - floor) * 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            fraction = ops.ones_like(progress)
        return ops.where(step < self.warmup_steps, warm, self.peak * fraction)

    def get_config(self):
        return dict(peak=self.peak, total_steps=self.total_steps, warmup_steps=self.warmup_steps,
                    decay=self.decay, final_fraction=self.final_fraction)


def build_optimizer(name: str, learning_rate: float, total_steps: int, schedule: str = "constant",
                    warmup_fraction: float = 0.0, weight_decay: float = 0.0,
                    ema_fraction: float = 0.0, adam_bc_floor: float = 1.0,
                    private: bool = True):
    """The config's optimizer; ValueError naming the config field for invalid values."""
    if name not in OPTIMIZERS:
        raise ValueError(f"--config.optimizer={name!r} is invalid: expected one of {OPTIMIZERS}")
    if not learning_rate > 0:
        raise ValueError(f"--config.learning_rate={learning_rate!r} is invalid: expected > 0")
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"--config.warmup_fraction={warmup_fraction!r} is invalid: expected "
                         "in [0, 1)")
    if weight_decay < 0:
        raise ValueError(f"--config.weight_decay={weight_decay!r} is invalid: expected >= 0")
    if schedule not in SCHEDULES:
        raise ValueError(f"--config.lr_schedule={schedule!r} is invalid: expected {SCHEDULES}")
    if not 0 <= ema_fraction < 1:
        raise ValueError(f"--config.ema_fraction={ema_fraction!r} is invalid: expected in [0, 1)")
    if not adam_bc_floor > 0:
        raise ValueError(f"--config.adam_bc_floor={adam_bc_floor!r} is invalid: expected > 0")
    warmup = int(round(warmup_fraction * total_steps))
    ema = ema_kwargs(ema_fraction, total_steps)
    lr = (learning_rate if schedule == "constant" and warmup == 0 else
          WarmupDecay(learning_rate, total_steps, warmup, schedule))
    if name == "adam_bc" and private:
        return BiasCorrectedAdam(lr, floor=adam_bc_floor, **ema)
    if name in ("adam", "adam_bc"):
        return keras.optimizers.Adam(lr, **ema)
    if name == "adamw":
        return keras.optimizers.AdamW(lr, weight_decay=weight_decay, **ema)
    return keras.optimizers.SGD(lr, momentum=0.9, **ema)


def with_noise_filter(optimizer, noise_filter: str, private: bool = True):
    """`optimizer` behind the `noise_filter` named by the config (private runs only)."""
    if noise_filter not in NOISE_FILTERS:
        raise ValueError(f"--config.noise_filter={noise_filter!r} is invalid: expected one of "
                         f"{tuple(NOISE_FILTERS)}")
    if NOISE_FILTERS[noise_filter] is None or not private:
        return optimizer
    if isinstance(optimizer, BiasCorrectedAdam):
        raise ValueError(f"--config.noise_filter={noise_filter!r} with --config.optimizer=adam_bc: "
                         "the filtered noise's variance is not the one adam_bc subtracts")
    return NOISE_FILTERS[noise_filter](optimizer)


def ema_kwargs(ema_fraction: float, total_steps: int) -> dict:
    """Keras' weight averaging with a time constant of `ema_fraction * total_steps` steps (at
    least one): momentum 1 - 1 / that. Keras averages from the first update on and writes the
    average into the model when `fit` ends, so everything after training (test metrics, the
    membership attack, the export) sees the averaged weights; the dev metrics of each epoch see
    the raw ones."""
    if ema_fraction <= 0:
        return {}
    return dict(use_ema=True, ema_momentum=1.0 - 1.0 / max(1.0, ema_fraction * total_steps))
