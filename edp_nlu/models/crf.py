"""A linear-chain CRF layer for Keras 3 (TensorFlow backend).

tensorflow-addons' `CRF` / `crf_log_likelihood` cannot be used: tensorflow-addons does not import on
Keras 3 (`No module named 'keras.src.engine'`), so the project owns this small layer.

Why it looks the way it does:
* The private step runs the model and the loss inside `tf.vectorized_map` (one micro-batch, often a
  single example, per iteration) and takes gradients there. A `tf.while_loop` / `tf.scan` over time
  vectorises badly (and its gradient worse), so when the sequence length is static -- it always is
  with this project's fixed-shape preprocessors -- the recursions are unrolled in Python: plain
  tensor ops that `pfor` handles well. A dynamic length falls back to `tf.scan`.
* Masks may have holes, not only right padding: a masked position is skipped (the recursion state is
  carried over unchanged), so the result equals the CRF on the sequence with masked positions
  removed. An all-masked sequence has log-likelihood 0 (the empty path) and decodes to all zeros.
* Scores are computed in float32 whatever the compute dtype, in log space (logsumexp).
"""

from __future__ import annotations

import keras
import tensorflow as tf

# Sequences up to this static length are unrolled; longer ones use tf.scan.
MAX_UNROLLED_LENGTH = 256


def _prepare(potentials, mask):
    """Casts potentials to float32 and the mask to bool [batch, length] (all True when None)."""
    potentials = tf.cast(potentials, tf.float32)
    if mask is None:
        mask = tf.ones(tf.shape(potentials)[:2], dtype=tf.bool)
    else:
        mask = tf.cast(mask, tf.bool)
    return potentials, mask


def _time_major_steps(potentials):
    """Returns the static sequence length if the recursion should be unrolled, else None."""
    length = potentials.shape[1]
    if length is not None and length <= MAX_UNROLLED_LENGTH:
        return int(length)
    return None


def crf_log_norm(potentials, mask, transitions, start, end):
    """log Z per sequence: logsumexp over all tag paths of the unmasked positions. Shape [batch]."""
    potentials, mask = _prepare(potentials, mask)

    def step(carry, inputs):
        alpha, started = carry
        emission, valid = inputs
        # alpha[b, i] + transitions[i, j] -> logsumexp over i.
        extended = tf.reduce_logsumexp(alpha[:, :, None] + transitions[None], axis=1) + emission
        fresh = start[None] + emission
        new_alpha = tf.where(started[:, None], extended, fresh)
        alpha = tf.where(valid[:, None], new_alpha, alpha)
        return alpha, tf.logical_or(started, valid)

    batch = tf.shape(potentials)[0]
    carry = (tf.zeros_like(potentials[:, 0, :]), tf.zeros([batch], dtype=tf.bool))
    carry = _run_forward(step, carry, potentials, mask)
    alpha, started = carry
    log_z = tf.reduce_logsumexp(alpha + end[None], axis=1)
    return tf.where(started, log_z, tf.zeros_like(log_z))


def crf_sequence_score(potentials, tags, mask, transitions, start, end):
    """Unnormalised score of the given tag path over the unmasked positions. Shape [batch]."""
    potentials, mask = _prepare(potentials, mask)
    tags = tf.cast(tags, tf.int32)
    num_tags = tf.shape(potentials)[2]
    one_hot = tf.one_hot(tags, num_tags, dtype=tf.float32)  # [b, t, k]
    maskf = tf.cast(mask, tf.float32)
    emission_score = tf.reduce_sum(tf.reduce_sum(potentials * one_hot, axis=2) * maskf, axis=1)

    def step(carry, inputs):
        score, prev_one_hot, started = carry
        cur_one_hot, valid = inputs
        # transitions[prev, cur] = prev_one_hot^T T cur_one_hot.
        trans = tf.reduce_sum(tf.matmul(prev_one_hot, transitions) * cur_one_hot, axis=1)
        first = tf.reduce_sum(start[None] * cur_one_hot, axis=1)
        add = tf.where(started, trans, first)
        score = score + tf.where(valid, add, tf.zeros_like(add))
        prev_one_hot = tf.where(valid[:, None], cur_one_hot, prev_one_hot)
        return score, prev_one_hot, tf.logical_or(started, valid)

    batch = tf.shape(potentials)[0]
    carry = (
        tf.zeros([batch], tf.float32),
        tf.zeros_like(one_hot[:, 0, :]),
        tf.zeros([batch], dtype=tf.bool),
    )
    score, last_one_hot, started = _run_forward(step, carry, one_hot, mask)
    end_score = tf.reduce_sum(end[None] * last_one_hot, axis=1)
    return emission_score + score + tf.where(started, end_score, tf.zeros_like(end_score))


def crf_log_likelihood(potentials, tags, mask, transitions, start, end):
    """log p(tags | potentials) per sequence, shape [batch] (0 for an all-masked sequence)."""
    return crf_sequence_score(potentials, tags, mask, transitions, start, end) - crf_log_norm(
        potentials, mask, transitions, start, end
    )


def crf_decode(potentials, mask, transitions, start, end):
    """Viterbi decoding. Returns (tags [batch, length] int32, 0 at masked positions; best score
    [batch])."""
    potentials, mask = _prepare(potentials, mask)

    def step(carry, inputs):
        delta, started = carry
        emission, valid = inputs
        scores = delta[:, :, None] + transitions[None]  # [b, prev, cur]
        best_prev = tf.argmax(scores, axis=1, output_type=tf.int32)
        extended = tf.reduce_max(scores, axis=1) + emission
        fresh = start[None] + emission
        identity = tf.broadcast_to(tf.range(tf.shape(delta)[1])[None], tf.shape(best_prev))
        # A skipped position, or the first unmasked one, keeps the tag it is given (identity
        # pointer).
        pointer = tf.where(tf.logical_and(valid, started)[:, None], best_prev, identity)
        new_delta = tf.where(started[:, None], extended, fresh)
        delta = tf.where(valid[:, None], new_delta, delta)
        return (delta, tf.logical_or(started, valid)), pointer

    batch = tf.shape(potentials)[0]
    carry = (tf.zeros_like(potentials[:, 0, :]), tf.zeros([batch], dtype=tf.bool))
    (delta, started), pointers = _run_forward_collect(step, carry, potentials, mask)
    final = delta + end[None]
    best_last = tf.argmax(final, axis=1, output_type=tf.int32)
    best_score = tf.where(started, tf.reduce_max(final, axis=1), tf.zeros_like(final[:, 0]))
    tags = _backtrack(pointers, best_last)
    tags = tf.where(mask, tags, tf.zeros_like(tags))
    return tags, best_score


def _run_forward(step, carry, sequence, mask):
    """Folds `step` over time (axis 1 of `sequence` and `mask`), unrolled when the length is
    static."""
    steps = _time_major_steps(sequence)
    if steps is not None:
        for x_t, m_t in zip(*_unstacked(sequence, mask)):
            carry = step(carry, (x_t, m_t))
        return carry
    elems = (tf.transpose(sequence, [1, 0, 2]), tf.transpose(mask, [1, 0]))
    final = tf.scan(lambda c, x: step(c, x), elems, initializer=carry)
    return tf.nest.map_structure(lambda x: x[-1], final)


def _run_forward_collect(step, carry, sequence, mask):
    """Like `_run_forward` for a step returning (carry, output); outputs stacked on axis 1."""
    steps = _time_major_steps(sequence)
    if steps is not None:
        outputs = []
        for x_t, m_t in zip(*_unstacked(sequence, mask)):
            carry, out = step(carry, (x_t, m_t))
            outputs.append(out)
        return carry, tf.stack(outputs, axis=1)
    elems = (tf.transpose(sequence, [1, 0, 2]), tf.transpose(mask, [1, 0]))
    batch, num_tags = tf.shape(sequence)[0], tf.shape(sequence)[2]
    init = (carry, tf.zeros([batch, num_tags], tf.int32))
    carries, outs = tf.scan(lambda c, x: step(c[0], x), elems, initializer=init)
    final = tf.nest.map_structure(lambda x: x[-1], carries)
    return final, tf.transpose(outs, [1, 0, 2])


def _unstacked(sequence, mask):
    """The time steps of `sequence` and `mask` (axis 1) as lists. Why not `sequence[:, t]`: the
    gradient of each slice is a full-size tensor of zeros around one step (StridedSliceGrad was a
    third of CLC's step time, docs/benchmarks.md); the gradient of one unstack is one stack."""
    return tf.unstack(sequence, axis=1), tf.unstack(mask, axis=1)


def _backtrack(pointers, best_last):
    """Follows back-pointers [batch, length, tags] from the best last tag; returns
    [batch, length]."""
    steps = pointers.shape[1]
    if steps is not None and steps <= MAX_UNROLLED_LENGTH:
        tags = [best_last]
        current = best_last
        by_step = tf.unstack(pointers, axis=1)
        for t in range(steps - 1, 0, -1):
            current = tf.gather(by_step[t], current, batch_dims=1)
            tags.append(current)
        return tf.stack(tags[::-1], axis=1)
    reversed_pointers = tf.reverse(tf.transpose(pointers, [1, 0, 2])[1:], axis=[0])
    previous = tf.scan(
        lambda cur, ptr: tf.gather(ptr, cur, batch_dims=1), reversed_pointers, initializer=best_last
    )
    tags = tf.concat([tf.reverse(previous, axis=[0]), best_last[None]], axis=0)
    return tf.transpose(tags, [1, 0])


@keras.saving.register_keras_serializable(package="edp_models")
class CRF(keras.layers.Layer):
    """Linear-chain CRF: learned tag transitions plus start and end scores.

    The layer holds the CRF parameters only; emission potentials ([batch, length, num_tags]) come
    from a Dense layer in the model. `call` returns the Viterbi path (for serving / metrics); the
    training loss uses `log_likelihood`, which reads the same variables, so a loss computed outside
    the model's `call` still trains the transitions. `allowed_start` / `allowed_transitions`
    (bools, e.g. `edp_nlu.models.labels.bio_transitions`) restrict decoding to paths of allowed
    steps.
    """

    def __init__(self, num_tags: int, allowed_start=None, allowed_transitions=None, **kwargs):
        super().__init__(**kwargs)
        if num_tags < 1:
            raise ValueError(f"CRF num_tags must be >= 1, got {num_tags}")
        self.num_tags = int(num_tags)
        self.allowed_start, self.allowed_transitions = _check_allowed(
            self.num_tags, allowed_start, allowed_transitions)
        init = keras.initializers.Zeros()
        self.transitions = self.add_weight(
            name="transitions", shape=(self.num_tags, self.num_tags), initializer=init
        )
        self.start_scores = self.add_weight(
            name="start_scores", shape=(self.num_tags,), initializer=init
        )
        self.end_scores = self.add_weight(
            name="end_scores", shape=(self.num_tags,), initializer=init
        )
        self.supports_masking = True
        self.built = True

    def _params(self):
        return (
            tf.cast(self.transitions, tf.float32),
            tf.cast(self.start_scores, tf.float32),
            tf.cast(self.end_scores, tf.float32),
        )

    def log_likelihood(self, potentials, tags, mask=None):
        """log p(tags | potentials), one value per sequence: shape [batch]."""
        return crf_log_likelihood(potentials, tags, mask, *self._params())

    @property
    def constrained(self) -> bool:
        return self.allowed_transitions is not None

    def decode(self, potentials, mask=None, constrained: bool = True):
        """Viterbi path [batch, length] (int32, 0 where masked) and its score [batch].

        With `constrained` (and allowed transitions given) the path is the best one among those
        that take only allowed transitions between unmasked positions (masked ones read 0; the
        preprocessors' masks are prefixes); the training likelihood never uses the constraint
        (a gold path through a masked hole could break it), so it stays a decoding choice.
        """
        transitions, start, end = self._params()
        if constrained and self.constrained:
            transitions = _forbid(transitions, self.allowed_transitions)
            start = _forbid(start, self.allowed_start)
        return crf_decode(potentials, mask, transitions, start, end)

    def call(self, potentials, mask=None):
        """The constrained path when the layer has a constraint (the joint models decode through
        `decode` with their own choice, not through this)."""
        return self.decode(potentials, mask)[0]

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:2])

    def get_config(self):
        config = super().get_config()
        config.update({"num_tags": self.num_tags, "allowed_start": self.allowed_start,
                       "allowed_transitions": self.allowed_transitions})
        return config


# Added to a forbidden score: far below any reachable path score (potentials are O(10) per word,
# at most a few hundred words) and still finite after summing a path, so no inf - inf = NaN.
FORBIDDEN_SCORE = -1e6


def _forbid(scores, allowed):
    """`scores` with FORBIDDEN_SCORE added where `allowed` (same shape, bools) is False."""
    return scores + tf.where(tf.constant(allowed, tf.bool), 0.0, FORBIDDEN_SCORE)


def _check_allowed(num_tags: int, allowed_start, allowed_transitions):
    """The constraint as plain lists (serialisable), or (None, None); ValueError when malformed or
    when no path could satisfy it."""
    if allowed_start is None and allowed_transitions is None:
        return None, None
    if allowed_start is None or allowed_transitions is None:
        raise ValueError("CRF: give both allowed_start and allowed_transitions, or neither")
    start = [bool(a) for a in allowed_start]
    transitions = [[bool(a) for a in row] for row in allowed_transitions]
    if len(start) != num_tags or len(transitions) != num_tags or any(
            len(row) != num_tags for row in transitions):
        raise ValueError(f"CRF: allowed_start must have {num_tags} entries and "
                         f"allowed_transitions {num_tags}x{num_tags}")
    # Some tag to start with, and every tag able to go on: else some lengths have no allowed path.
    if not any(start) or not all(any(row) for row in transitions):
        raise ValueError("CRF: the allowed transitions leave some sequences without any path")
    return start, transitions
