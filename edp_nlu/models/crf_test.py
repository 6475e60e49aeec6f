"""CRF layer vs brute-force enumeration of every tag path, plus the contexts the private step
uses."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_nlu.models import crf as crf_lib
from edp_nlu.models.labels import bio_transitions

NUM_TAGS, LENGTH, BATCH = 3, 4, 7


def _random_case(seed):
    rng = np.random.default_rng(seed)
    potentials = rng.normal(size=(BATCH, LENGTH, NUM_TAGS)).astype(np.float32) * 2
    transitions = rng.normal(size=(NUM_TAGS, NUM_TAGS)).astype(np.float32)
    start = rng.normal(size=NUM_TAGS).astype(np.float32)
    end = rng.normal(size=NUM_TAGS).astype(np.float32)
    mask = rng.random((BATCH, LENGTH)) < 0.7
    mask[0] = True  # full sequence
    mask[1] = False  # empty sequence
    mask[2] = [True, True, False, False]  # right padding
    mask[3] = [False, True, False, True]  # holes: masked positions are skipped
    tags = rng.integers(0, NUM_TAGS, size=(BATCH, LENGTH)).astype(np.int32)
    return potentials, tags, mask, transitions, start, end


def _brute_force(potentials, tags, mask, transitions, start, end):
    """Per sequence: (log-likelihood of `tags`, best path on unmasked positions, best score)."""
    results = []
    for b in range(potentials.shape[0]):
        positions = np.flatnonzero(mask[b])
        if positions.size == 0:
            results.append((0.0, [], 0.0))
            continue

        def score(path):
            s = start[path[0]] + end[path[-1]]
            s += sum(potentials[b, p, k] for p, k in zip(positions, path))
            s += sum(transitions[i, j] for i, j in zip(path[:-1], path[1:]))
            return s

        paths = list(itertools.product(range(NUM_TAGS), repeat=positions.size))
        scores = np.array([score(p) for p in paths], dtype=np.float64)
        log_z = np.logaddexp.reduce(scores)
        gold = score(tuple(tags[b, positions]))
        best = int(np.argmax(scores))
        results.append((gold - log_z, list(paths[best]), scores[best]))
    return results


def _check_against_brute_force(case, log_likelihood, decoded, best_score):
    potentials, tags, mask, transitions, start, end = case
    expected = _brute_force(potentials, tags, mask, transitions, start, end)
    for b, (ll, path, score) in enumerate(expected):
        # float32 forward algorithm vs float64 enumeration over <= 81 paths: 1e-4 is ~100 ulp.
        np.testing.assert_allclose(log_likelihood[b], ll, atol=1e-4, rtol=1e-5)
        np.testing.assert_allclose(best_score[b], score, atol=1e-4, rtol=1e-5)
        assert list(decoded[b][mask[b]]) == path
        assert np.all(decoded[b][~mask[b]] == 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unrolled_matches_brute_force(seed):
    case = _random_case(seed)
    potentials, tags, mask, transitions, start, end = case
    ll = crf_lib.crf_log_likelihood(potentials, tags, mask, transitions, start, end).numpy()
    decoded, best = crf_lib.crf_decode(potentials, mask, transitions, start, end)
    _check_against_brute_force(case, ll, decoded.numpy(), best.numpy())


def test_dynamic_length_scan_matches_brute_force():
    case = _random_case(3)
    potentials, tags, mask, transitions, start, end = case
    spec = [
        tf.TensorSpec([None, None, NUM_TAGS], tf.float32),
        tf.TensorSpec([None, None], tf.int32),
        tf.TensorSpec([None, None], tf.bool),
    ]

    @tf.function(input_signature=spec, autograph=False)
    def run(p, t, m):
        ll = crf_lib.crf_log_likelihood(p, t, m, transitions, start, end)
        decoded, best = crf_lib.crf_decode(p, m, transitions, start, end)
        return ll, decoded, best

    ll, decoded, best = run(potentials, tags, mask)
    _check_against_brute_force(case, ll.numpy(), decoded.numpy(), best.numpy())


def test_layer_gradients_inside_vectorized_map_match_per_example_loop():
    potentials, tags, mask, *_ = _random_case(4)
    layer = crf_lib.CRF(NUM_TAGS)
    rng = np.random.default_rng(5)
    layer.transitions.assign(rng.normal(size=(NUM_TAGS, NUM_TAGS)).astype(np.float32))
    variables = [layer.transitions.value, layer.start_scores.value, layer.end_scores.value]

    def per_example_grads(example):
        p, t, m = example
        with tf.GradientTape() as tape:
            tape.watch(p)
            nll = -layer.log_likelihood(p[None], t[None], m[None])[0]
        return tape.gradient(nll, [p] + [layer.transitions, layer.start_scores, layer.end_scores])

    @tf.function(autograph=False)
    def vectorized(p, t, m):
        return tf.vectorized_map(per_example_grads, (p, t, m), fallback_to_while_loop=False)

    batched = vectorized(tf.constant(potentials), tf.constant(tags), tf.constant(mask))
    for b in range(BATCH):
        single = per_example_grads(
            (tf.constant(potentials[b]), tf.constant(tags[b]), tf.constant(mask[b]))
        )
        for got, want in zip(batched, single):
            np.testing.assert_allclose(got[b].numpy(), want.numpy(), atol=1e-5)
    assert len(variables) == 3
    # The gradient of the empty sequence is exactly zero; a non-empty one is not.
    assert np.all(batched[1][1].numpy() == 0) and np.any(batched[1][0].numpy() != 0)


def test_runs_under_mirrored_strategy():
    strategy = edp_tf.make_strategy(2)  # shared per device set: collective keys never collide
    potentials, tags, mask, *_ = _random_case(6)
    with strategy.scope():
        layer = crf_lib.CRF(NUM_TAGS)

    @tf.function(autograph=False)
    def replica_fn(p, t, m):
        return layer.log_likelihood(p, t, m), layer(p, mask=m)

    results = strategy.run(replica_fn, args=(potentials, tags, mask))
    expected_ll = layer.log_likelihood(potentials, tags, mask).numpy()
    for ll in strategy.experimental_local_results(results[0]):
        np.testing.assert_allclose(ll.numpy(), expected_ll, atol=1e-5)


def test_rejects_zero_tags():
    with pytest.raises(ValueError, match="num_tags"):
        crf_lib.CRF(0)


def test_config_round_trip():
    layer = crf_lib.CRF(5, name="ner_crf")
    clone = crf_lib.CRF.from_config(layer.get_config())
    assert clone.num_tags == 5 and clone.name == "ner_crf"


# Tags O, B-a, I-a, B-b, I-b: enough to break BIO in every way (I after O, after the other type,
# first).
BIO_TAGS = ("O", "B-a", "I-a", "B-b", "I-b")


def _well_formed(path) -> bool:
    names = [BIO_TAGS[t] for t in path]
    return all(not t.startswith("I-") or (i > 0 and names[i - 1][2:] == t[2:])
               for i, t in enumerate(names))


def test_constrained_decode_is_the_best_well_formed_path():
    start_ok, transitions_ok = bio_transitions(BIO_TAGS)
    layer = crf_lib.CRF(len(BIO_TAGS), start_ok, transitions_ok)
    rng = np.random.default_rng(7)
    # Random transitions favour I-x everywhere, so the unconstrained best path is often ill-formed.
    layer.transitions.assign(rng.normal(size=(5, 5)).astype(np.float32) + [0, 0, 2, 0, 2])
    layer.start_scores.assign(rng.normal(size=5).astype(np.float32) + [0, 0, 2, 0, 2])
    layer.end_scores.assign(rng.normal(size=5).astype(np.float32))
    potentials = rng.normal(size=(40, 4, 5)).astype(np.float32) * 2
    mask = rng.random((40, 4)) < 0.8
    mask[0] = [False, True, False, True]  # holes: the rule applies between the kept words
    decoded, best = layer.decode(potentials, mask)
    plain, _ = layer.decode(potentials, mask, constrained=False)
    t, s, e = (v.numpy() for v in (layer.transitions, layer.start_scores, layer.end_scores))
    ill_formed_plain = 0
    for b in range(len(potentials)):
        positions = np.flatnonzero(mask[b])
        ill_formed_plain += not _well_formed(plain.numpy()[b][positions])
        assert np.all(decoded.numpy()[b][~mask[b]] == 0)
        if positions.size == 0:
            continue
        paths = [p for p in itertools.product(range(5), repeat=positions.size) if _well_formed(p)]
        scores = [s[p[0]] + e[p[-1]] + sum(potentials[b, q, k] for q, k in zip(positions, p))
                  + sum(t[i, j] for i, j in zip(p[:-1], p[1:])) for p in paths]
        assert list(decoded.numpy()[b][positions]) == list(paths[int(np.argmax(scores))])
        # float32 Viterbi vs float64 sums of <= 4 words: 1e-4 is ~100 ulp
        np.testing.assert_allclose(best.numpy()[b], max(scores), atol=1e-4, rtol=1e-5)
    assert ill_formed_plain > 5  # else this case would not test the constraint
    # training is unchanged: the likelihood is the unconstrained CRF's
    free = crf_lib.CRF(5)
    for mine, theirs in zip(layer.weights, free.weights):
        theirs.assign(mine)
    tags = rng.integers(0, 5, size=(40, 4)).astype(np.int32)
    np.testing.assert_array_equal(layer.log_likelihood(potentials, tags, mask),
                                  free.log_likelihood(potentials, tags, mask))


def test_constraint_round_trips_and_is_checked():
    layer = crf_lib.CRF(5, *bio_transitions(BIO_TAGS), name="ner_crf")
    clone = crf_lib.CRF.from_config(layer.get_config())
    assert clone.allowed_transitions == layer.allowed_transitions and clone.constrained
    assert clone.allowed_start == [True, True, False, True, False]
    with pytest.raises(ValueError, match="both"):
        crf_lib.CRF(5, allowed_start=[True] * 5)
    with pytest.raises(ValueError, match="5x5"):
        crf_lib.CRF(5, [True] * 5, [[True] * 4] * 5)
    with pytest.raises(ValueError, match="without any path"):
        crf_lib.CRF(2, [True, True], [[True, True], [False, False]])
