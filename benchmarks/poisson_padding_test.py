"""The padding table's epsilons: truncation far above the count costs nothing, near the mean
it costs epsilon (an evicted example doubles the sensitivity), and never less than none."""
import pytest

from benchmarks.poisson_padding import epsilon


def test_truncation_costs_epsilon_only_near_the_expected_batch():
    n, q, z, steps, delta = 2000, 0.05, 1.0, 20, 1e-5  # expected batch 100, std ~9.7
    padded = epsilon(n, q, z, steps, delta)
    # P(count > 200) ~ 1e-19: the mixture's weight on truncation is 0 but for PLD's rounding
    assert epsilon(n, q, z, steps, delta, size=200) == pytest.approx(padded, rel=1e-6)
    near = epsilon(n, q, z, steps, delta, size=105)
    assert near > 1.2 * padded
    assert padded <= epsilon(n, q, z, steps, delta, size=130) < near
