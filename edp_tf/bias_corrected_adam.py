"""`BiasCorrectedAdam`: Adam whose second moment has the DP noise's known variance taken out
(DP-AdamBC, Tang et al. 2023, arXiv 2312.14334).

Why: the private update is g + noise with noise ~ N(0, phi) per coordinate, phi known to the step
(variable k: (alpha_k z_t S C / D)^2). Adam's second moment then estimates g^2 + phi, and under DP
phi dominates nearly every coordinate, so 1 / sqrt(v) is about the same constant everywhere: DP-
Adam behaves like DP-SGD with learning rate lr / sqrt(phi) and loses Adam's per-weight step sizes.
Subtracting phi restores them:

    m <- b1 m + (1 - b1) g~          v <- b2 v + (1 - b2) g~^2       s <- b2 s + (1 - b2) z_t^2
    phi = f^2 s / (1 - b2^t)         (f = alpha_k S C / D: the noise std at z = 1, from the step)
    w <- w - lr m^ / (sqrt(max(v^ - phi, floor * phi)) + epsilon)

s averages z_t^2 with v's own weights, so phi is exactly the noise part of v^ in expectation even
when z_t decays between epochs. v^ - phi is an estimate, negative for most weights early on; the
floor (a fraction of phi, so one value suits every layer's scale) bounds the step of weights whose
signal the estimate cannot yet tell from zero: their step is at most 1 / sqrt(floor) times DP-
Adam's. The default floor, 1, never steps them further than DP-Adam and only lets weights whose
signal exceeds the noise step further (up to sqrt(2) x at signal^2 = phi); Tang et al.'s small
floors (~0.05 phi) made ATIS's private BERT diverge here and SNIPS's CLC worse (docs/results.md).
Everything here uses the released update and public constants: post-processing, so epsilon is
unchanged. `PrivateModel` attaches f and z_t when it decides the step (`attach_noise`);
used without it, the optimizer refuses to step rather than act as plain Adam silently.
"""
from __future__ import annotations

from typing import Sequence

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="edp_tf")
class BiasCorrectedAdam(keras.optimizers.Adam):
    """Adam with the known DP noise variance subtracted from its second moment (DP-AdamBC).

    Args:
      learning_rate, beta_1, beta_2, epsilon, **kwargs: as `keras.optimizers.Adam` (no amsgrad).
      floor: the corrected second moment's lower bound as a fraction of the noise variance phi
        (> 0; 1 makes noise-only weights step as in DP-Adam, smaller lets them step up to
        1 / sqrt(floor) times further).
    """

    def __init__(self, learning_rate=0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, floor: float = 1.0, name: str = "bias_corrected_adam",
                 **kwargs):
        if kwargs.get("amsgrad"):
            raise ValueError("BiasCorrectedAdam does not support amsgrad")
        kwargs.pop("amsgrad", None)
        super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                         epsilon=epsilon, amsgrad=False, name=name, **kwargs)
        if not floor > 0:
            raise ValueError(f"BiasCorrectedAdam floor={floor!r} is invalid: expected > 0 (the "
                             "corrected second moment would reach 0 and steps blow up)")
        self.floor = float(floor)
        # kept out of Keras' and TF's tracking: constants of the step, not optimizer state
        object.__setattr__(self, "_noise", None)

    def attach_noise(self, variables: Sequence, unit_stds: Sequence[float],
                     noise_multiplier) -> None:
        """Tells the optimizer the noise of the update it receives: for variable i, std
        unit_stds[i] * z per coordinate, z read from `noise_multiplier` (a variable) each step."""
        if len(variables) != len(unit_stds):
            raise ValueError(f"attach_noise got {len(variables)} variables and "
                             f"{len(unit_stds)} stds")
        stds = {self._var_key(v): float(s) for v, s in zip(variables, unit_stds)}
        if any(not s >= 0 for s in stds.values()):
            raise ValueError(f"attach_noise needs stds >= 0, got {list(unit_stds)}")
        object.__setattr__(self, "_noise", (stds, lambda: noise_multiplier))

    def unit_noise_std(self, variable) -> float:
        """The noise std per coordinate of `variable`'s updates at z = 1 (as attached)."""
        if self._noise is None:
            raise ValueError("no noise attached: see attach_noise")
        return self._noise[0][self._var_key(variable)]

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        # s: per variable, the b2-average of z_t^2 (a scalar each)
        self._mean_squared_multipliers = [
            self.add_variable((), initializer="zeros", name=f"z2_{i}")
            for i in range(len(var_list))]

    def update_step(self, gradient, variable, learning_rate):
        if self._noise is None:
            raise ValueError("BiasCorrectedAdam needs the noise of its updates: compile it into "
                             "an edp_tf.PrivateModel (which calls attach_noise) or call "
                             "attach_noise(variables, stds, noise_multiplier) first")
        stds, multiplier = self._noise
        key = self._var_key(variable)
        if key not in stds:
            raise ValueError(f"BiasCorrectedAdam has no noise std for variable "
                             f"{getattr(variable, 'path', variable.name)!r}")
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        step = ops.cast(self.iterations + 1, dtype)
        b1, b2 = ops.cast(self.beta_1, dtype), ops.cast(self.beta_2, dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        s = self._mean_squared_multipliers[index]
        z = ops.cast(multiplier(), dtype)
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - b1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - b2))
        self.assign_add(s, ops.multiply(ops.subtract(ops.square(z), s), 1 - b2))
        m_hat = ops.divide(m, 1 - ops.power(b1, step))
        correction = 1 - ops.power(b2, step)
        v_hat = ops.divide(v, correction)
        phi = ops.divide(ops.multiply(s, stds[key] ** 2), correction)
        second = ops.maximum(ops.subtract(v_hat, phi), ops.multiply(phi, self.floor))
        # second >= floor * phi >= 0: no clamp needed before the square root
        self.assign_sub(variable, ops.divide(ops.multiply(m_hat, lr),
                                             ops.add(ops.sqrt(second), self.epsilon)))

    def get_config(self):
        config = super().get_config()
        config.pop("amsgrad", None)
        config["floor"] = self.floor
        return config


def attach_mechanism_noise(optimizer, mechanism, variables: Sequence, scales: Sequence,
                           multiplier) -> None:
    """Tells a `BiasCorrectedAdam` the noise std of each variable's update at z = 1:
    alpha_k x (the replicas' summed std at z = 1) / D, what the private step adds (for the
    clipped-denominator estimator too: its noise is fixed on the average); any other optimizer
    is left as it is."""
    if not isinstance(optimizer, BiasCorrectedAdam):
        return
    unit = mechanism.summed_noise_std(1.0) / mechanism.expected_microbatches
    optimizer.attach_noise(variables, [a * unit for a in scales], multiplier)
