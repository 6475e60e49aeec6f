"""The privacy cost of tuning: releasing the best of several private runs on the same data.

Why: each run's epsilon is its own; picking the best of K runs by a score looks at all K, so the
released model spends more than one run. Two ways to charge it:

* Fixed K, composed: the K runs are released together (the best is post-processing), so the
  cost is the K-fold composition of one run (PLD and RDP here). It grows roughly like sqrt(K).
* A random number of runs (Papernot & Steinke, "Hyperparameter Tuning with Renyi Differential
  Privacy", ICLR 2022): K is drawn from a known distribution, kept secret, each run's candidate
  is drawn at random (independently of the data), and only the best run is released, by a score
  that is itself private or computed without the training data. If one run is
  (lambda, eps(lambda))-RDP, the released best is (lambda, eps'(lambda))-RDP with
    Poisson K (their Theorem 6):  eps' = eps(lambda) + mu * delta_hat + log(mu) / (lambda - 1),
      where one run is (eps_hat, delta_hat)-DP at eps_hat = log(1 + 1/(lambda - 1));
    truncated negative binomial K, shape eta >= 0, E[K] = mean (their Theorem 2):
      eps' = eps(lambda) + (1 + eta) * min over lambda_hat of
             [(1 - 1/lambda_hat) eps(lambda_hat) + log(1/gamma) / lambda_hat]
             + log(mean) / (lambda - 1),
      eta = 0 the logarithmic distribution, eta = 1 the geometric one.
  The cost grows like log(mean), not like K.

The functions are pure (no TensorFlow, no training): they take a run's dp-accounting DpEvent,
or its RDP curve, and return frozen dataclasses. dp-accounting's RdpAccountant implements the
same two theorems (`RepeatAndSelectDpEvent`); the tests check these against it. The Poisson
theorem holds for any valid delta_hat, so besides the RDP one (what dp-accounting uses) this
module also takes delta_hat from the run's PLD, which is tighter.

A candidate set of several configurations (each run draws one uniformly) is charged its worst
member: the RDP curve is the pointwise maximum over the candidates (Renyi divergence is jointly
quasi-convex, so a data-independent mixture is no worse than its worst component) and delta_hat
the maximum (the hockey-stick divergence is jointly convex).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from edp_tf import accounting, checks

POISSON = math.inf  # the `shape` of a Poisson number of runs (dp-accounting's convention)
LOGARITHMIC = 0.0
GEOMETRIC = 1.0


def _orders() -> tuple:
    return tuple(float(a) for a in dp_accounting.rdp.RdpAccountant().orders)


# ------------------------------------------------------------------------- RDP curves
@dataclasses.dataclass(frozen=True)
class RdpCurve:
    """(lambda, eps(lambda))-RDP at each order: what the selection theorems take and give.

    An order whose epsilon is inf holds no bound (dp-accounting leaves such orders out)."""

    orders: tuple
    epsilons: tuple

    def __post_init__(self) -> None:
        orders = tuple(float(a) for a in self.orders)
        epsilons = tuple(float(e) for e in self.epsilons)
        if len(orders) != len(epsilons) or not orders:
            raise ValueError(f"an RdpCurve needs as many epsilons as orders (>= 1), got "
                             f"{len(orders)} orders and {len(epsilons)} epsilons")
        if any(not a >= 1 or math.isinf(a) for a in orders):
            raise ValueError(f"RDP orders must be finite and >= 1, got {orders}")
        if any(math.isnan(e) or e < 0 for e in epsilons):
            raise ValueError(f"RDP epsilons must be >= 0 (inf allowed), got {epsilons}")
        object.__setattr__(self, "orders", orders)
        object.__setattr__(self, "epsilons", epsilons)

    @classmethod
    def of_event(cls, event: dp_accounting.DpEvent,
                 orders: Optional[Sequence[float]] = None) -> "RdpCurve":
        """dp-accounting's RdpAccountant on `event` (its default orders unless given)."""
        acc = dp_accounting.rdp.RdpAccountant(list(orders) if orders is not None else None)
        acc.compose(event)
        return cls(tuple(acc.orders), tuple(acc.rdp))

    def composed(self, times: int) -> "RdpCurve":
        """`times` runs composed: RDP adds up."""
        checks.count("times", times)
        return RdpCurve(self.orders, tuple(times * e if times else 0.0 for e in self.epsilons))

    def monotone(self) -> "RdpCurve":
        """Each order's epsilon lowered to the least one at any higher order: still a bound,
        since Renyi divergence does not decrease with the order."""
        out, best = [], math.inf
        for a, e in sorted(zip(self.orders, self.epsilons), reverse=True):
            best = min(best, e)
            out.append((a, best))
        by_order = dict(out)
        return RdpCurve(self.orders, tuple(by_order[a] for a in self.orders))

    def epsilon(self, delta: float) -> float:
        """(epsilon, delta)-DP from the curve (dp-accounting's conversion)."""
        delta = accounting.check_delta(delta)
        return float(dp_accounting.rdp.compute_epsilon(self.orders, self.epsilons, delta)[0])

    def delta(self, epsilon: float) -> float:
        """(epsilon, delta)-DP from the curve: the smallest delta at `epsilon`."""
        epsilon = checks.number("epsilon", epsilon, 0.0)
        return float(rdp_privacy_accountant.compute_delta(self.orders, self.epsilons,
                                                          epsilon)[0])

    def covers(self, other: "RdpCurve", rel_tol: float = 1e-9) -> bool:
        """True if this curve is at least `other` at every order (same orders)."""
        if self.orders != other.orders:
            raise ValueError("curves at different orders cannot be compared")
        return all(a >= b or math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12)
                   for a, b in zip(self.epsilons, other.epsilons))


def worst_case(curves: Sequence[RdpCurve]) -> RdpCurve:
    """The pointwise maximum: a bound for a data-independent random choice among them."""
    curves = list(curves)
    if not curves:
        raise ValueError("worst_case needs at least one curve")
    if any(c.orders != curves[0].orders for c in curves):
        raise ValueError("worst_case needs curves at the same orders")
    return RdpCurve(curves[0].orders, tuple(max(es) for es in zip(*(c.epsilons for c in curves))))


# ------------------------------------------------------------------------- the theorems
def selection_order_epsilon_hat(order: float) -> float:
    """eps_hat = log(1 + 1/(lambda - 1)): the largest eps_hat Theorem 6 allows at `order`."""
    return math.log1p(1.0 / (order - 1.0))


def _check_mean(mean) -> float:
    return checks.number("mean", mean, 1.0)


def poisson_selection(curve: RdpCurve, mu: float,
                      delta_hat: Optional[Callable[[float], float]] = None) -> RdpCurve:
    """RDP of the best of K ~ Poisson(mu) runs (Papernot & Steinke 2022, Theorem 6).

    eps'(lambda) = eps(lambda) + mu * delta_hat + log(mu) / (lambda - 1), where each run is
    (eps_hat, delta_hat)-DP at eps_hat = log(1 + 1/(lambda - 1)); `delta_hat(eps_hat)` gives
    it (default: from `curve` itself, as dp-accounting does; a PLD one is tighter). Orders <= 1
    get inf (the theorem needs lambda > 1). mu >= 1, as dp-accounting asks.
    """
    mu = _check_mean(mu)
    delta_of = delta_hat or curve.delta
    out = []
    for order, eps in zip(curve.orders, curve.epsilons):
        if order <= 1 or math.isinf(eps):
            out.append(math.inf)
            continue
        d_hat = delta_of(selection_order_epsilon_hat(order))
        if not 0 <= d_hat <= 1:
            raise ValueError(f"delta_hat must be in [0, 1], got {d_hat!r} at order {order}")
        out.append(eps + mu * d_hat + math.log(mu) / (order - 1.0))
    return RdpCurve(curve.orders, tuple(out))


def truncated_negative_binomial_mean(gamma: float, shape: float) -> float:
    """E[K] of the truncated negative binomial D_{eta, gamma} (shape = eta >= 0; eta = 0 is the
    logarithmic distribution, eta = 1 the geometric)."""
    gamma = checks.number("gamma", gamma, 0.0, True, 1.0)
    shape = checks.number("shape", shape, 0.0)
    if gamma == 1.0:
        return 1.0
    if shape == 0:
        return (1.0 - gamma) / (gamma * -math.log(gamma))
    # eta (1 - gamma) / (gamma (1 - gamma^eta)), with expm1 for eta near 0
    return shape * (1.0 - gamma) / (gamma * -math.expm1(shape * math.log(gamma)))


def truncated_negative_binomial_gamma(shape: float, mean: float) -> float:
    """The gamma whose D_{shape, gamma} has E[K] = mean (bisection; the mean falls as gamma
    rises). Returns the lower end of the final bracket: a mean at least the one asked for."""
    shape, mean = checks.number("shape", shape, 0.0), _check_mean(mean)
    if mean == 1.0:
        return 1.0
    if shape == 1.0:
        return 1.0 / mean
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        if truncated_negative_binomial_mean(mid, shape) < mean:
            hi = mid
        else:
            lo = mid
    return lo


def truncated_negative_binomial_selection(curve: RdpCurve, mean: float,
                                          shape: float) -> RdpCurve:
    """RDP of the best of K ~ D_{shape, gamma} runs with E[K] = mean (Papernot & Steinke 2022,
    Theorem 2), then made monotone in the order (as dp-accounting does).

    eps'(lambda) = eps(lambda) + (1 + eta) min_lambda_hat [(1 - 1/lambda_hat) eps(lambda_hat)
    + log(1/gamma) / lambda_hat] + log(mean) / (lambda - 1), for lambda > 1."""
    mean, shape = _check_mean(mean), checks.number("shape", shape, 0.0)
    gamma = truncated_negative_binomial_gamma(shape, mean)
    log_inv_gamma = -math.log(gamma) if gamma < 1 else 0.0
    c = (1.0 + shape) * min((1.0 - 1.0 / a) * e + log_inv_gamma / a
                            for a, e in zip(curve.orders, curve.epsilons))
    out = tuple(e + c + math.log(mean) / (a - 1.0) if a > 1 else math.inf
                for a, e in zip(curve.orders, curve.epsilons))
    return RdpCurve(curve.orders, out).monotone()


def selection_curve(curve: RdpCurve, mean: float, shape: float = POISSON,
                    delta_hat: Optional[Callable[[float], float]] = None) -> RdpCurve:
    """Theorem 6 (shape = POISSON, mean = mu) or Theorem 2 (0 <= shape < inf)."""
    if shape == POISSON:
        return poisson_selection(curve, mean, delta_hat)
    return truncated_negative_binomial_selection(curve, mean, shape)


def draw_number_of_runs(rng: np.random.Generator, mean: float, shape: float = POISSON) -> int:
    """K from the distribution the theorems assume (K may be 0 for Poisson: nothing released).

    `rng` must be seeded from OS entropy for the bound to hold: K has to stay secret."""
    mean = _check_mean(mean)
    if shape == POISSON:
        return int(rng.poisson(mean))
    shape = checks.number("shape", shape, 0.0)
    gamma = truncated_negative_binomial_gamma(shape, mean)
    if gamma >= 1.0:
        return 1
    if shape == 0:
        return int(rng.logseries(1.0 - gamma))
    while True:  # the negative binomial (failures before `shape` successes) given K >= 1
        k = int(rng.negative_binomial(shape, gamma))
        if k >= 1:
            return k


# ------------------------------------------------------------------------- one run, K runs
def run_event(records: Sequence[accounting.EpochRecord], sampling_rate: float,
              extra_events=()) -> dp_accounting.DpEvent:
    """A run's event as the ledger accounts it (edp_tf.accounting.make_dp_event), with
    consecutive epochs at one multiplier merged (the same event, faster to account)."""
    merged: list = []
    for r in records:
        last = merged[-1] if merged else None
        # BandMF epochs (bands b) merge only as whole cycles: ceil(steps / b) must not shrink
        if last is not None and (last.effective_noise_multiplier, last.bands) == (
                r.effective_noise_multiplier, r.bands) and not (
                last.steps % r.bands or r.steps % r.bands):
            merged[-1] = accounting.EpochRecord(last.epoch, last.steps + r.steps,
                                                last.noise_multiplier,
                                                last.effective_noise_multiplier, last.bands)
        else:
            merged.append(r)
    return accounting.make_dp_event(merged, sampling_rate, extra_events)


def _pld(event: dp_accounting.DpEvent, rdp_epsilon: float, times: int = 1):
    """A PLD accountant of `times` x event, or None where accounting.py skips PLD."""
    if not math.isfinite(rdp_epsilon) or rdp_epsilon > accounting.PLD_SKIP_ABOVE_RDP_EPSILON:
        return None
    interval = accounting.PLD_DISCRETIZATION * max(1.0, rdp_epsilon / 10.0)
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
    try:
        acc.compose(event, times)
    except (OverflowError, FloatingPointError, MemoryError):
        return None
    return acc


@dataclasses.dataclass(frozen=True)
class PerRun:
    """One candidate run's privacy, the worst over the candidate set.

    `curve`: RDP at dp-accounting's orders; `pld_delta_hats`: delta_hat at each order's
    eps_hat from the runs' PLDs (inf where PLD was skipped); `epsilon`/`epsilon_rdp`: a single
    run's (epsilon, delta)-DP, PLD (the headline, as for every run) and from the RDP curve."""

    curve: RdpCurve
    pld_delta_hats: tuple
    delta: float
    epsilon: float
    epsilon_rdp: float

    def pld_delta_hat(self, epsilon_hat: float) -> float:
        """delta_hat at one of the orders' eps_hat (the only ones Theorem 6 asks for)."""
        for order, d in zip(self.curve.orders, self.pld_delta_hats):
            if order > 1 and math.isclose(selection_order_epsilon_hat(order), epsilon_hat,
                                          rel_tol=1e-12):
                return d
        raise KeyError(f"no order has eps_hat {epsilon_hat!r}")


def per_run(events: Sequence[dp_accounting.DpEvent], delta: float) -> PerRun:
    """PerRun of a candidate set: each run draws one of `events` (its configuration) at random,
    independently of the data; the bound is the worst of them (module docstring)."""
    events = list(events)
    if not events:
        raise ValueError("per_run needs at least one candidate event")
    delta = accounting.check_delta(delta)
    curves = [RdpCurve.of_event(e) for e in events]
    curve = worst_case(curves)
    hats = [math.inf if a <= 1 else selection_order_epsilon_hat(a) for a in curve.orders]
    deltas, eps_pld = [0.0] * len(hats), 0.0
    for event, c in zip(events, curves):
        rdp_eps = c.epsilon(delta)
        pld = _pld(event, rdp_eps)
        eps_pld = max(eps_pld, rdp_eps if pld is None else min(rdp_eps, pld.get_epsilon(delta)))
        for i, h in enumerate(hats):
            d = math.inf if pld is None or math.isinf(h) else min(1.0, pld.get_delta(h))
            deltas[i] = max(deltas[i], d)
    return PerRun(curve, tuple(deltas), delta, eps_pld, curve.epsilon(delta))


@dataclasses.dataclass(frozen=True)
class FixedRuns:
    """K runs composed (each of the costliest candidate): the release of all K, so of the best."""

    runs: int
    delta: float
    epsilon: float  # PLD (the RDP one where PLD is skipped)
    epsilon_rdp: float


def fixed_runs(events: Sequence[dp_accounting.DpEvent], runs: int, delta: float) -> FixedRuns:
    """`runs` runs composed. With several candidate events the RDP bound composes the worst
    curve (valid for any mix of candidates) and the PLD one is the costliest candidate's own
    `runs`-fold composition (exact when every run has that candidate's schedule)."""
    runs, delta = checks.count("runs", runs, 1), accounting.check_delta(delta)
    events = list(events)
    if not events:
        raise ValueError("fixed_runs needs at least one candidate event")
    curves = [RdpCurve.of_event(e) for e in events]
    rdp_eps = worst_case(curves).composed(runs).epsilon(delta)
    eps_pld = 0.0
    for event, c in zip(events, curves):
        own = c.composed(runs).epsilon(delta)
        pld = _pld(event, own, runs)
        eps_pld = max(eps_pld, own if pld is None else min(own, pld.get_epsilon(delta)))
    return FixedRuns(runs, delta, eps_pld, rdp_eps)


@dataclasses.dataclass(frozen=True)
class SelectionCost:
    """The released best run's epsilon at `delta` for K drawn with `mean` and `shape`.

    `epsilon` is the headline: the smaller of the two valid bounds; `epsilon_rdp_delta_hat`
    takes delta_hat from the RDP curve (dp-accounting's RepeatAndSelectDpEvent), and
    `epsilon_pld_delta_hat` from the runs' PLDs (Poisson only; None otherwise)."""

    mean: float
    shape: float
    delta: float
    epsilon: float
    epsilon_rdp_delta_hat: float
    epsilon_pld_delta_hat: Optional[float]

    @property
    def distribution(self) -> str:
        return distribution_name(self.shape)


def distribution_name(shape: float) -> str:
    if shape == POISSON:
        return "Poisson"
    if shape == LOGARITHMIC:
        return "logarithmic"
    if shape == GEOMETRIC:
        return "geometric"
    return f"truncated negative binomial (eta {shape:g})"


def selection_cost(run: PerRun, mean: float, shape: float = POISSON) -> SelectionCost:
    """The epsilon of releasing the best of K runs, K drawn with `mean` and `shape`."""
    rdp_hat = selection_curve(run.curve, mean, shape).epsilon(run.delta)
    pld_hat = None
    if shape == POISSON and all(math.isfinite(d) for a, d in
                                zip(run.curve.orders, run.pld_delta_hats) if a > 1):
        pld_hat = selection_curve(run.curve, mean, shape, run.pld_delta_hat).epsilon(run.delta)
    best = rdp_hat if pld_hat is None else min(rdp_hat, pld_hat)
    return SelectionCost(float(mean), float(shape), run.delta, best, rdp_hat, pld_hat)


@dataclasses.dataclass(frozen=True)
class TuningCost:
    """One run's epsilon, the selected run's (random K) and K runs composed, at one delta."""

    per_run: PerRun
    selection: SelectionCost
    fixed: FixedRuns

    def to_dict(self) -> dict:
        """The numbers (not the curves) for a results file."""
        return {
            "delta": self.per_run.delta,
            "per_run_epsilon": self.per_run.epsilon,
            "per_run_epsilon_rdp": self.per_run.epsilon_rdp,
            "distribution": self.selection.distribution,
            "mean_runs": self.selection.mean,
            "shape": None if self.selection.shape == POISSON else self.selection.shape,
            "selection_epsilon": self.selection.epsilon,
            "selection_epsilon_rdp_delta_hat": self.selection.epsilon_rdp_delta_hat,
            "selection_epsilon_pld_delta_hat": self.selection.epsilon_pld_delta_hat,
            "fixed_runs": self.fixed.runs,
            "fixed_runs_epsilon": self.fixed.epsilon,
            "fixed_runs_epsilon_rdp": self.fixed.epsilon_rdp,
        }


def tuning_cost(events: Sequence[dp_accounting.DpEvent], delta: float, mean: float,
                shape: float = POISSON, runs: Optional[int] = None) -> TuningCost:
    """TuningCost of a candidate set: K with `mean` and `shape` against `runs` (default:
    round(mean)) fixed runs composed."""
    run = per_run(events, delta)
    return TuningCost(run, selection_cost(run, mean, shape),
                      fixed_runs(events, runs or max(1, round(mean)), delta))
