"""The cost of selecting the best of several private runs (edp_tf/tuning.py)."""
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from edp_tf import accounting, tuning

DELTA = 0.1 / 9600
# the default recipe on the built-in corpus: n 9,600, q 0.16, 12 epochs of 7 steps, epsilon 8
RECORDS = accounting.plan_schedule(1.1679, 12, 7)
EVENT = tuning.run_event(RECORDS, 0.16)


@pytest.fixture(scope="module")
def run():
    return tuning.per_run([EVENT], DELTA)


def test_run_event_is_the_ledgers_event():
    merged = tuning.RdpCurve.of_event(EVENT)
    np.testing.assert_allclose(merged.epsilons, tuning.RdpCurve.of_event(
        accounting.make_dp_event(RECORDS, 0.16)).epsilons, rtol=1e-12)
    assert tuning.RdpCurve.of_event(EVENT).epsilon(DELTA) == pytest.approx(
        accounting.compute_epsilon(RECORDS, 0.16, DELTA, (), "rdp"), rel=1e-12)


def test_run_event_keeps_bandmf_epochs_charged_as_the_ledger_does():
    """BandMF epochs (ceil(steps / b) steps at b q) must not merge into DP-SGD's T at q, nor
    merge partial cycles whose ceilings would shrink."""
    for steps in (8, 7):  # whole cycles of 4, and partial ones
        records = accounting.plan_schedule(1.3, 3, steps, bands=4)
        assert tuning.RdpCurve.of_event(tuning.run_event(records, 0.04)).epsilon(
            DELTA) == pytest.approx(accounting.compute_epsilon(records, 0.04, DELTA, (), "rdp"),
                                    rel=1e-12)


def test_per_run_epsilon_is_the_accountants(run):
    assert run.epsilon == pytest.approx(accounting.compute_epsilon(RECORDS, 0.16, DELTA), rel=1e-9)
    assert run.epsilon_rdp == pytest.approx(
        accounting.compute_epsilon(RECORDS, 0.16, DELTA, (), "rdp"), rel=1e-12)


@pytest.mark.parametrize("shape", [tuning.POISSON, 0.0, 0.5, 1.0, 2.0])
def test_selection_costs_at_least_one_run(run, shape):
    for mean in (1.0, 2.0, 8.0):
        curve = tuning.selection_curve(run.curve, mean, shape)
        # (orders whose own bound is inf get one from the higher orders: Theorem 2's curve is
        # made monotone)
        assert curve.covers(run.curve.monotone())
        cost = tuning.selection_cost(run, mean, shape)
        assert cost.epsilon >= run.epsilon and cost.epsilon_rdp_delta_hat >= run.epsilon_rdp


@pytest.mark.parametrize("shape", [tuning.POISSON, 0.0, 1.0])
def test_selection_cost_grows_with_the_mean(run, shape):
    eps = [tuning.selection_cost(run, mean, shape).epsilon for mean in (1, 2, 4, 8, 16, 64)]
    assert all(a < b for a, b in zip(eps, eps[1:])), eps


def test_poisson_matches_dp_accountings_repeat_and_select(run):
    """delta_hat from the RDP curve is what dp-accounting's RepeatAndSelectDpEvent does."""
    for mu in (1.0, 3.0, 8.0):
        ours = tuning.poisson_selection(run.curve, mu)
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_event.RepeatAndSelectDpEvent(EVENT, mu, np.inf))
        np.testing.assert_allclose(ours.epsilons, acc.rdp, rtol=1e-12)
        assert ours.epsilon(DELTA) == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)


@pytest.mark.parametrize("shape", [0.0, 0.5, 1.0, 2.0])
def test_truncated_negative_binomial_matches_dp_accounting(run, shape):
    for mean in (2.0, 8.0):
        ours = tuning.truncated_negative_binomial_selection(run.curve, mean, shape)
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_event.RepeatAndSelectDpEvent(EVENT, mean, shape))
        np.testing.assert_allclose(ours.epsilons, acc.rdp, rtol=1e-8)
        assert tuning.truncated_negative_binomial_gamma(shape, mean) == pytest.approx(
            rdp_privacy_accountant._gamma_truncated_negative_binomial(shape, mean), rel=1e-8)


def test_poisson_at_one_point_by_hand():
    """Gaussian mechanism, sigma 2, order 3: eps(3) = 3 / (2 sigma^2); eps_hat = log(3/2) and
    delta_hat the Gaussian's exact delta there (Balle & Wang 2018); mu = 8."""
    sigma, mu = 2.0, 8.0
    curve = tuning.RdpCurve((2.0, 3.0), (2 / (2 * sigma ** 2), 3 / (2 * sigma ** 2)))

    def gaussian_delta(eps):
        phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))  # noqa: E731
        return phi(-eps * sigma + 0.5 / sigma) - math.exp(eps) * phi(-eps * sigma - 0.5 / sigma)

    eps_hat = math.log(1.5)
    assert tuning.selection_order_epsilon_hat(3.0) == pytest.approx(eps_hat)
    by_hand = 0.375 + mu * gaussian_delta(eps_hat) + math.log(8.0) / 2.0
    ours = tuning.poisson_selection(curve, mu, gaussian_delta)
    assert ours.epsilons[1] == pytest.approx(by_hand, rel=1e-12)
    # scipy.stats.norm: delta_hat = 0.0708813, so 0.375 + 0.5670507 + 1.0397208
    assert by_hand == pytest.approx(1.9817715, abs=1e-7)


def test_geometric_at_one_point_by_hand():
    """Theorem 2 with eta = 1 (geometric, gamma = 1/mean), orders 2 and 3 only."""
    curve = tuning.RdpCurve((2.0, 3.0), (0.25, 0.375))
    mean = 4.0
    # (1 + eta) min over lambda_hat of (1 - 1/lambda_hat) eps + log(mean) / lambda_hat
    c = 2 * min(0.5 * 0.25 + math.log(4) / 2, (2 / 3) * 0.375 + math.log(4) / 3)
    ours = tuning.truncated_negative_binomial_selection(curve, mean, 1.0)
    assert ours.epsilons[1] == pytest.approx(0.375 + c + math.log(4) / 2)
    assert ours.epsilons[0] == pytest.approx(min(0.25 + c + math.log(4), ours.epsilons[1]))


def test_poisson_with_mu_one_adds_only_delta_hat(run):
    """mu = 1: log(mu) vanishes, eps' = eps + delta_hat; a mean below one is refused."""
    one = tuning.poisson_selection(run.curve, 1.0)
    for order, eps, tuned in zip(run.curve.orders, run.curve.epsilons, one.epsilons):
        if math.isfinite(eps):
            hat = run.curve.delta(tuning.selection_order_epsilon_hat(order))
            assert tuned == pytest.approx(eps + hat, rel=1e-12)
    cost = tuning.selection_cost(run, 1.0)
    assert run.epsilon <= cost.epsilon < run.epsilon_rdp + 2.0
    with pytest.raises(ValueError, match="mean"):
        tuning.poisson_selection(run.curve, 0.5)


def test_pld_delta_hat_is_a_tighter_valid_delta_hat(run):
    for order, d in zip(run.curve.orders, run.pld_delta_hats):
        hat = tuning.selection_order_epsilon_hat(order)
        assert 0 <= d <= run.curve.delta(hat) + 1e-12
    cost = tuning.selection_cost(run, 8.0)
    assert cost.epsilon == cost.epsilon_pld_delta_hat < cost.epsilon_rdp_delta_hat


def test_fixed_runs_is_dp_accountings_composition():
    fixed = tuning.fixed_runs([EVENT], 8, DELTA)
    composed = dp_event.ComposedDpEvent([EVENT] * 8)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(composed)
    assert fixed.epsilon_rdp == pytest.approx(rdp.get_epsilon(DELTA), rel=1e-12)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(composed)
    assert fixed.epsilon == pytest.approx(pld.get_epsilon(DELTA), rel=2e-3)
    # and the ledger's own accounting of eight runs back to back
    assert fixed.epsilon == pytest.approx(accounting.compute_epsilon(
        accounting.plan_schedule(1.1679, 96, 7), 0.16, DELTA), rel=1e-9)
    assert tuning.fixed_runs([EVENT], 1, DELTA).epsilon == pytest.approx(
        accounting.compute_epsilon(RECORDS, 0.16, DELTA), rel=1e-9)


def test_a_candidate_set_is_charged_its_worst_member(run):
    cheaper = tuning.run_event(accounting.plan_schedule(2.0, 12, 7), 0.16)
    both = tuning.per_run([cheaper, EVENT], DELTA)
    assert both.curve == run.curve and both.epsilon == pytest.approx(run.epsilon)
    assert both.pld_delta_hats == run.pld_delta_hats
    alone = tuning.per_run([cheaper], DELTA)
    assert alone.epsilon < run.epsilon
    assert tuning.tuning_cost([cheaper, EVENT], DELTA, 8).fixed.epsilon == pytest.approx(
        tuning.fixed_runs([EVENT], 8, DELTA).epsilon)


def test_tuning_cost_numbers_of_the_default_recipe(run):
    """The numbers docs/privacy.md states for tuning 8 candidates of the default recipe."""
    cost = tuning.tuning_cost([EVENT], DELTA, 8).to_dict()
    assert cost["per_run_epsilon"] == pytest.approx(8.00, abs=0.01)
    assert cost["selection_epsilon"] == pytest.approx(13.18, abs=0.01)
    assert cost["selection_epsilon_rdp_delta_hat"] == pytest.approx(17.39, abs=0.01)
    assert cost["fixed_runs_epsilon"] == pytest.approx(26.44, abs=0.01)
    assert cost["distribution"] == "Poisson" and cost["fixed_runs"] == 8


@pytest.mark.parametrize("shape", [tuning.POISSON, 0.0, 1.0, 3.0])
def test_the_number_of_runs_has_the_stated_mean(shape):
    rng = np.random.default_rng(0)
    draws = [tuning.draw_number_of_runs(rng, 8.0, shape) for _ in range(4000)]
    assert np.mean(draws) == pytest.approx(8.0, rel=0.06)
    if shape != tuning.POISSON:
        assert min(draws) >= 1
    gamma = tuning.truncated_negative_binomial_gamma(2.0, 8.0)
    assert tuning.truncated_negative_binomial_mean(gamma, 2.0) == pytest.approx(8.0, rel=1e-9)


def test_bad_curves_are_refused():
    with pytest.raises(ValueError, match="as many"):
        tuning.RdpCurve((2.0, 3.0), (1.0,))
    with pytest.raises(ValueError, match="orders"):
        tuning.RdpCurve((0.5,), (1.0,))
    with pytest.raises(ValueError, match="epsilons"):
        tuning.RdpCurve((2.0,), (-1.0,))
    with pytest.raises(ValueError, match="same orders"):
        tuning.worst_case([tuning.RdpCurve((2.0,), (1.0,)), tuning.RdpCurve((3.0,), (1.0,))])
    with pytest.raises(dataclasses_frozen_error()):
        tuning.RdpCurve((2.0,), (1.0,)).orders = (3.0,)


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError
