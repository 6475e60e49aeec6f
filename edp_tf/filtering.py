"""Noise filters: optimizer wrappers that smooth the released noisy updates before any Keras
optimizer applies them (post-processing, so epsilon is unchanged).

Why: the noise of a private step is white (independent across steps), while the gradient it
hides changes slowly from step to step. A filter that keeps slow components and damps fast
ones removes much of the noise and little of the gradient.

`LowPassFilter` (DOPPLER, Zhang, Bu, Hong and Razaviyayn 2024) runs a linear IIR filter over the
sequence of updates and divides by the same filter's response to a constant 1, so that the
output is unbiased from the first step on (a constant update passes unchanged):

    m_t = sum_k b_k g_{t-k} - sum_k a_k m_{t-k}      c_t = the same recursion with g = 1
    the inner optimizer steps with m_t / c_t

`KalmanFilter` (DiSK, Zhang, Bu, Balle, Hong, Razaviyayn and Mirrokni 2024) is the paper's
simplified Kalman filter in its single-evaluation form. DiSK's prediction step needs a Hessian-
vector product H (x_t - x_{t-1}), which the paper estimates by evaluating the per-example
gradient at two points and clipping their combination; that changes what the private step
clips, so it is not post-processing. With gamma = (1 - kappa) / kappa the weight of the second
point is zero and one evaluation, at the extrapolated point x_t + gamma (x_t - x_{t-1}), remains:

    g~_t = the private step's update at y_t = x_t + gamma (x_t - x_{t-1})
    m_t = (1 - kappa) m_{t-1} + kappa g~_t   (kappa weighs the new observation; / c_t as above)
    x_{t+1} = inner optimizer's step from x_t with m_t

The model's variables hold y_t between steps (that is where the next gradient is taken); the
filter keeps x_t in its state and writes it back when `fit` ends (`finalize_variable_values`).
The released update is a function of the data only through the private step; where it is
evaluated (x_t, x_{t-1}) is itself a function of earlier releases, so the composition is the
same mechanism the ledger counts.

Both see only the update the optimizer is given, after the replicas' all-reduce: the mechanism's
release. Their state (past updates, filtered updates, x_t) is optimizer state, checkpointed with
the optimizer; it is a function of released updates alone.
"""
from __future__ import annotations

from typing import Sequence

import keras
import numpy as np
import tensorflow as tf
from keras.src.utils import tracking

from edp_tf import bias_corrected_adam, replica_sum


def impulse_response(b: Sequence[float], a: Sequence[float], steps: int) -> np.ndarray:
    """h_0..h_{steps-1}: the filter's output for an input of 1 at step 0 and 0 after."""
    h = np.zeros(steps)
    for t in range(steps):
        h[t] = (b[t] if t < len(b) else 0.0) - sum(
            a_k * h[t - k] for k, a_k in enumerate(a, start=1) if t - k >= 0)
    return h


def noise_variance_gain(b: Sequence[float], a: Sequence[float], steps: int) -> float:
    """Var(output) / Var(input) after `steps` updates of i.i.d. noise: sum_k h_k^2 / c^2, with
    c = sum_k h_k the normaliser (the response to a constant 1) at that step."""
    h = impulse_response(b, a, steps)
    return float(np.sum(h ** 2) / np.sum(h) ** 2)


@keras.saving.register_keras_serializable(package="edp_tf")
class FilteredOptimizer(keras.optimizers.Optimizer):
    """The shared wrapper: `inner_optimizer` steps with the filtered update. Learning rate,
    iterations, weight averaging and weight decay are the inner optimizer's."""

    def __init__(self, inner_optimizer, name: str = "filtered", **kwargs):
        if kwargs:
            raise ValueError(f"{type(self).__name__} takes no optimizer arguments of its own "
                             f"({sorted(kwargs)}): set them on the inner optimizer")
        inner_optimizer = keras.optimizers.get(inner_optimizer)
        if isinstance(inner_optimizer, bias_corrected_adam.BiasCorrectedAdam):
            raise ValueError(f"{type(self).__name__} around BiasCorrectedAdam: the filtered "
                             "update's noise variance is not the one the step attaches; use Adam")
        for clip in ("clipnorm", "global_clipnorm", "clipvalue"):
            if getattr(inner_optimizer, clip, None):
                raise ValueError(f"inner optimizer's {clip} would clip the noisy update after "
                                 "the privacy step; clipping belongs to DPConfig.l2_norm_clip")
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer

    # ---------------------------------------------------------------- the filter's two halves
    def _build_state(self, variables: list) -> None:
        raise NotImplementedError

    def _filter(self, updates: list, variables: list) -> tuple:
        """(filtered updates, [(state variable, new value)]) from the summed updates."""
        raise NotImplementedError

    def _after_inner_step(self, variables: list) -> None:
        """State the inner optimizer's step changes (Kalman's x_t)."""

    # ---------------------------------------------------------------- Keras plumbing
    @tracking.no_automatic_dependency_tracking
    def build(self, var_list):
        if self.built:
            return
        self._state_index = {self._var_key(v): i for i, v in enumerate(var_list)}
        self._build_state(list(var_list))
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables if trainable_variables is not None
                         else self._trainable_variables)
        if not self.built:
            with keras.name_scope(self.name):
                self.build(variables)
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        if any(isinstance(g, tf.IndexedSlices) for g, _ in pairs):
            raise ValueError(f"{type(self).__name__} needs dense updates; sparse_embeddings=True "
                             "releases only selected rows, which a filter over steps would mix "
                             "with rows that got no update")
        # the mechanism's release: the replicas' SUM of their updates (or of the release's
        # shares, when PrivateModel summed already: edp_tf/replica_sum.py)
        variables = [v for _, v in pairs]
        updates = replica_sum.sum_over_replicas([g for g, _ in pairs])
        filtered, writes = self._filter(updates, variables)
        _assign_all(writes)
        # the inner optimizer SUMs over the replicas in turn: give it the filtered release's
        # shares, so its sum is the filtered release
        self.inner_optimizer.apply(replica_sum.as_shares(filtered), variables)
        self._after_inner_step(variables)

    def apply_gradients(self, grads_and_vars):
        grads, variables = zip(*grads_and_vars)
        self.apply(grads, variables)
        return self.iterations

    def _slot(self, slots: list, variable):
        return slots[self._state_index[self._var_key(variable)]]

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self):
        return {"name": self.name,
                "inner_optimizer": keras.saving.serialize_keras_object(self.inner_optimizer)}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("inner_optimizer"),
                                                      custom_objects=custom_objects)
        return cls(inner, **config)


@keras.saving.register_keras_serializable(package="edp_tf")
class LowPassFilter(FilteredOptimizer):
    """DOPPLER's low-pass filter of the noisy updates in front of `inner_optimizer`.

    Args:
      inner_optimizer: the Keras optimizer that steps with the filtered update.
      b: feed-forward coefficients b_0..b_nb (b_0 > 0). The default pair with `a` is a
        first-order low-pass with a zero at the highest frequency, H(z) = 0.25 (1 + z^-1) /
        (1 - 0.5 z^-1): i.i.d. noise keeps 1/4 of its variance, a constant update all of it,
        and its memory is ~2 steps (short runs of ~100 steps cannot wait for a long one).
      a: feedback coefficients a_1..a_na (the filter must be stable). `b=(1,), a=()` is the
        identity: the inner optimizer alone.
    """

    def __init__(self, inner_optimizer, b: Sequence[float] = (0.25, 0.25),
                 a: Sequence[float] = (-0.5,), name: str = "lowpass_filter", **kwargs):
        b, a = tuple(float(x) for x in b), tuple(float(x) for x in a)
        _check_coefficients(b, a)
        super().__init__(inner_optimizer, name=name, **kwargs)
        self.b, self.a = b, a

    def _build_state(self, variables):
        # past inputs g_{t-1..t-nb} and outputs m_{t-1..t-na} per variable; the normaliser's
        # past values c and past inputs (1 once a step has run) as scalars
        self._inputs = [[self.add_variable_from_reference(v, f"lowpass_g{k}")
                         for k in range(1, len(self.b))] for v in variables]
        self._outputs = [[self.add_variable_from_reference(v, f"lowpass_m{k}")
                          for k in range(1, len(self.a) + 1)] for v in variables]
        self._ones = [self.add_variable((), name=f"lowpass_one{k}")
                      for k in range(1, len(self.b))]
        self._norms = [self.add_variable((), name=f"lowpass_c{k}")
                       for k in range(1, len(self.a) + 1)]

    def _filter(self, updates, variables):
        norm = self._recurse(tf.constant(1.0), self._ones, self._norms)
        writes = _shift(self._ones, tf.constant(1.0)) + _shift(self._norms, norm)
        filtered = []
        for g, v in zip(updates, variables):
            inputs, outputs = self._slot(self._inputs, v), self._slot(self._outputs, v)
            m = self._recurse(tf.cast(g, v.dtype), inputs, outputs)
            writes += _shift(inputs, g) + _shift(outputs, m)
            filtered.append(m / tf.cast(norm, m.dtype))
        return filtered, writes

    def _recurse(self, g, inputs, outputs):
        out = self.b[0] * g
        for b_k, x in zip(self.b[1:], inputs):
            out += b_k * tf.cast(x, g.dtype)
        for a_k, y in zip(self.a, outputs):
            out -= a_k * tf.cast(y, g.dtype)
        return out

    def noise_variance_gain(self, steps: int) -> float:
        """The filtered noise's variance over the input's after `steps` updates."""
        return noise_variance_gain(self.b, self.a, steps)

    def get_config(self):
        return dict(super().get_config(), b=list(self.b), a=list(self.a))


@keras.saving.register_keras_serializable(package="edp_tf")
class KalmanFilter(FilteredOptimizer):
    """DiSK's simplified Kalman filter, single-evaluation form (module docstring), in front of
    `inner_optimizer`.

    Args:
      inner_optimizer: the Keras optimizer that steps with the filtered update.
      kappa: the Kalman gain, the weight of the new noisy update in (0, 1] (0.7: the DiSK
        reference's default); gamma = (1 - kappa) / kappa. kappa = 1 is the inner optimizer
        alone. Noise variance keeps kappa / (2 - kappa) in the long run.
    """

    def __init__(self, inner_optimizer, kappa: float = 0.7, name: str = "kalman_filter",
                 **kwargs):
        if not 0 < kappa <= 1:
            raise ValueError(f"KalmanFilter kappa={kappa!r} is invalid: expected in (0, 1]")
        super().__init__(inner_optimizer, name=name, **kwargs)
        self.kappa = float(kappa)
        self.gamma = (1.0 - self.kappa) / self.kappa

    def _build_state(self, variables):
        self._filtered = [self.add_variable_from_reference(v, "kalman_m") for v in variables]
        self._iterates = [self.add_variable_from_reference(v, "kalman_x") for v in variables]
        self._norm = self.add_variable((), name="kalman_c")  # 0 until the first step

    def _filter(self, updates, variables):
        k = self.kappa
        norm = (1 - k) * self._norm + k
        writes = [(self._norm, norm)]
        filtered = []
        for g, v in zip(updates, variables):
            m_slot, x_slot = self._slot(self._filtered, v), self._slot(self._iterates, v)
            m = (1 - k) * m_slot + k * tf.cast(g, v.dtype)
            # the inner optimizer steps from x_t; before the first step y_0 = x_0 = v
            x_t = tf.where(self._norm > 0, tf.convert_to_tensor(x_slot), tf.convert_to_tensor(v))
            writes += [(m_slot, m), (x_slot, x_t), (v, x_t)]
            filtered.append(m / tf.cast(norm, m.dtype))
        return filtered, writes

    def _after_inner_step(self, variables):
        writes = []
        for v in variables:
            x_slot = self._slot(self._iterates, v)
            x_next = tf.convert_to_tensor(v)
            writes += [(v, x_next + self.gamma * (x_next - tf.convert_to_tensor(x_slot))),
                       (x_slot, x_next)]
        _assign_all(writes)

    def iterate(self, variable) -> np.ndarray:
        """x_t of `variable` (the model holds the extrapolated y_t between steps)."""
        if not self.built or float(self._norm.numpy()) == 0:
            return keras.ops.convert_to_numpy(variable)
        return self._slot(self._iterates, variable).numpy()

    def finalize_variable_values(self, var_list):
        """x_t back into the model (it holds the extrapolated y_t between steps), then the inner
        optimizer's own finalisation (weight averaging)."""
        if self.built and float(self._norm.numpy()) > 0:
            for v in var_list:
                if self._var_key(v) in self._state_index:
                    v.assign(self._slot(self._iterates, v))
        super().finalize_variable_values(var_list)

    def noise_variance_gain(self, steps: int) -> float:
        return noise_variance_gain((self.kappa,), (self.kappa - 1.0,), steps)

    def get_config(self):
        return dict(super().get_config(), kappa=self.kappa)


def _check_coefficients(b: tuple, a: tuple) -> None:
    if not b or not b[0] > 0:
        raise ValueError(f"LowPassFilter b={list(b)} is invalid: expected b_0 > 0")
    roots = np.roots([1.0, *a]) if a else np.array([])
    if np.any(np.abs(roots) >= 1):
        raise ValueError(f"LowPassFilter a={list(a)} is unstable: the poles {roots} must lie "
                         "inside the unit circle")
    norms = np.cumsum(impulse_response(b, a, 1000))
    if not np.all(norms > 0):
        raise ValueError(f"LowPassFilter b={list(b)}, a={list(a)}: the response to a constant "
                         "update must stay positive (it normalises the output)")


def _shift(history: list, newest) -> list:
    """Writes that push `newest` into a history of variables, newest first."""
    values = [newest] + [tf.convert_to_tensor(h) for h in history[:-1]]
    return list(zip(history, values))


def _assign_all(writes: list) -> None:
    """Writes each (variable, value) on every replica's copy. The values are functions of the
    all-reduced update, the same on every replica, so each copy takes its replica's."""
    if not writes:
        return

    def merge(distribution, writes):
        for variable, value in writes:
            distribution.extended.update(_tf_variable(variable), _write, args=(value,),
                                         group=False)

    strategy = tf.distribute.get_strategy()
    if tf.distribute.in_cross_replica_context():
        merge(strategy, writes)
    else:
        tf.__internal__.distribute.interim.maybe_merge_call(merge, strategy, writes)


def _write(variable, value):
    variable.assign(tf.cast(value, variable.dtype))


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable
