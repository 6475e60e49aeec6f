"""Epsilon of a recorded (or planned) noise schedule: a pure function, no TensorFlow.

Why per epoch: the noise multiplier decays per epoch, so each epoch t is one self-composed
Poisson-subsampled Gaussian, `SelfComposedDpEvent(PoissonSampledDpEvent(q, Gaussian(z_eff_t)),
steps_t)`, and the run is their composition (plus extra events such as the private alpha query).

BandMF (edp_tf/bandmf.py): an epoch of a b-banded mechanism is charged as DP-SGD with
ceil(steps_t / b) steps at the group's rate b q (Choquette-Choo et al. 2023, Theorem 4;
jax-privacy's amplified BandMF accounting):
`SelfComposedDpEvent(PoissonSampledDpEvent(b q, Gaussian(z_eff_t)), ceil(steps_t / b))`. Each
record carries its b, so a ledger's epochs say how to charge them.

`z_eff` is the std of the noise on the *sum* of clipped micro-batch gradients divided by the
sensitivity S*C of that sum (docs/design.md, noise on each replica and sensitivity): `z_t` in
calibrated mode, `z_t / (sqrt(N) * S)` in paper mode. Both accountants return upper bounds
(add/remove adjacency); the PLD one is tighter and is the headline. A zero multiplier gives
epsilon = inf, never a number.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
from typing import Callable, Iterable, Mapping, Optional, Sequence

import dp_accounting
import numpy as np

from edp_tf import checks
from edp_tf.mechanism import (  # noqa: F401  (re-exported: the accountant's vocabulary)
    DECAYS,
    NOISE_MODES,
    StepNoise,
    effective_noise_multiplier,
    joint_noise_multiplier,
    noise_multiplier_at,
)
from edp_tf.mechanism import sensitivity as sensitivity_for  # noqa: F401

ACCOUNTANTS = ("pld", "rdp")
# Internal: RDP at dp-accounting's integer orders only, where its bound has a closed form (~6x
# faster than its fractional orders, whose series dominate). Fewer orders can only raise RDP's
# epsilon, so the z calibrated with it lies above RDP's and PLD's: it starts PLD's bracket.
_RDP_BRACKET = "rdp-integer-orders"
_BRACKET_ORDERS = tuple(o for o in dp_accounting.rdp.RdpAccountant().orders
                        if float(o).is_integer())


class _QuietExcludedOrders(logging.Filter):
    """dp-accounting warns for each fractional RDP order whose series does not converge and
    excludes it; excluding orders can only raise epsilon (the bound stays valid), and the warning
    floods training logs once per epoch, so it is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "_compute_log_a_frac failed to converge" not in str(record.msg)


logging.getLogger("absl").addFilter(_QuietExcludedOrders())

# PLD discretisation: the pessimistic PLD is an upper bound at any interval; 1e-3 is 7-20x faster
# than dp-accounting's 1e-4 and overstates epsilon slightly (measured: +3e-4 on 470 steps,
# +0.009 = 0.4% on 14063 steps, n=60000 / batch 256 / z=1.1 / 60 epochs).
PLD_DISCRETIZATION = 1e-3
# Beyond this RDP epsilon PLD is skipped and the RDP bound stands in for it (both are upper
# bounds): at z ~ 1e-3 the PLD grid asks for 38 GiB, and such an epsilon protects nothing anyway.
PLD_SKIP_ABOVE_RDP_EPSILON = 1000.0


def check_sampling_rate(sampling_rate) -> float:
    return checks.number("sampling_rate", sampling_rate, 0.0, True, 1.0, False)


def check_delta(delta) -> float:
    return checks.number("delta", delta, 0.0, True, 1.0, True)


def _check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


# ------------------------------------------------------------------------- the mechanism
DEFAULT_DELTA_FACTOR = 0.1
REPORTED_DELTAS = ("1/n", 1e-6)  # printed beside the run's own delta


def default_delta(dataset_size: int) -> float:
    """0.1 / n: delta must be well below 1/n, since a mechanism that releases one random record
    in full is (0, 1/n)-DP (the usual advice is delta << 1/n)."""
    return DEFAULT_DELTA_FACTOR / checks.count("dataset_size", dataset_size, 1)


def epsilons_at_reported_deltas(records, sampling_rate: float, dataset_size: int,
                                extra_events: Iterable = ()) -> dict:
    """PLD epsilon at delta = 1/n and 1e-6, keyed by the delta's label, for the statement
    (inf at a delta the extra events' own deltas already exhaust)."""
    extras = as_extra_events(extra_events)
    spent = math.fsum(e.delta * e.steps for e in extras)
    out = {}
    for label in REPORTED_DELTAS:
        delta = 1.0 / dataset_size if label == "1/n" else float(label)
        epsilon = (math.inf if delta <= spent
                   else compute_epsilon(records, sampling_rate, delta, extras, "pld"))
        out[str(label)] = {"delta": delta, "epsilon": epsilon}
    return out


@dataclasses.dataclass(frozen=True)
class EpochRecord:
    """One epoch of the schedule: `steps` steps at multiplier z_t (z_eff_t after the mode), of
    a mechanism with `bands` b (1: DP-SGD; b > 1: BandMF, charged as ceil(steps / b) steps at
    rate b q)."""

    epoch: int
    steps: int
    noise_multiplier: float
    effective_noise_multiplier: float
    bands: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epoch", checks.count("epoch", self.epoch))
        object.__setattr__(self, "steps", checks.count("steps", self.steps))
        object.__setattr__(
            self, "noise_multiplier", checks.number("noise_multiplier", self.noise_multiplier, 0.0))
        object.__setattr__(self, "effective_noise_multiplier", checks.number(
            "effective_noise_multiplier", self.effective_noise_multiplier, 0.0))
        object.__setattr__(self, "bands", checks.count("bands", self.bands, 1))

    @property
    def participations(self) -> int:
        """Steps charged: ceil(steps / b), the most steps of one group (each group is sampled
        every b-th step)."""
        return -(-self.steps // self.bands)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if self.bands == 1:  # the ledgers of DP-SGD runs keep their shape
            del d["bands"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "EpochRecord":
        missing = {f.name for f in dataclasses.fields(cls)} - set(d) - {"bands"}
        if missing:
            raise ValueError(f"epoch record {dict(d)!r} lacks {sorted(missing)}")
        return cls(d["epoch"], d["steps"], d["noise_multiplier"], d["effective_noise_multiplier"],
                   d.get("bands", 1))


@dataclasses.dataclass(frozen=True)
class ExtraEvent:
    """A query besides the steps, e.g. the `private` alpha scaling's noisy norm query.

    `noise_multiplier` is the noise std in units of `sensitivity`'s unit; sampling_rate None
    means no amplification is claimed (the examples were chosen deterministically). `delta` is
    an additive delta the query spends besides its Gaussian part (a threshold's, as in
    edp_tf/partition_selection.py), once per step: epsilon is then computed at the run's delta
    minus the extra events' deltas times their steps, since the run is
    (eps, delta_gaussian(eps) + sum of those deltas)-DP.
    """

    name: str
    noise_multiplier: float
    sampling_rate: Optional[float] = None
    steps: int = 1
    sensitivity: float = 1.0
    delta: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"extra event name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "noise_multiplier", checks.number(
            f"extra event {self.name!r} noise_multiplier", self.noise_multiplier, 0.0))
        if self.sampling_rate is not None:
            object.__setattr__(self, "sampling_rate", checks.number(
                f"extra event {self.name!r} sampling_rate", self.sampling_rate, 0.0, True, 1.0))
        object.__setattr__(self, "steps",
                           checks.count(f"extra event {self.name!r} steps", self.steps))
        object.__setattr__(self, "sensitivity", checks.number(
            f"extra event {self.name!r} sensitivity", self.sensitivity, 0.0, True))
        object.__setattr__(self, "delta", checks.number(
            f"extra event {self.name!r} delta", self.delta, 0.0, False, 1.0, True))

    @property
    def effective_noise_multiplier(self) -> float:
        return self.noise_multiplier / self.sensitivity

    @classmethod
    def from_dict(cls, d: Mapping) -> "ExtraEvent":
        """From a `PrivateModel.privacy_facts()["extra_events"]` dict (unknown keys are kept out;
        a ledger written before `delta` existed spent none)."""
        for key in ("name", "noise_multiplier"):
            if key not in d:
                raise ValueError(f"extra event {dict(d)!r} lacks {key!r}")
        return cls(d["name"], d["noise_multiplier"], d.get("sampling_rate"),
                   d.get("steps", 1), d.get("sensitivity", 1.0), d.get("delta", 0.0))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def as_extra_events(events: Iterable) -> tuple:
    """ExtraEvent objects from ExtraEvents or their dicts."""
    return tuple(e if isinstance(e, ExtraEvent) else ExtraEvent.from_dict(e) for e in events)


def gaussian_delta(delta: float, extras: Sequence[ExtraEvent]) -> float:
    """The delta left for the Gaussian parts once the extra events' own deltas are spent;
    ValueError when nothing is left (no finite epsilon holds at `delta`)."""
    spent = math.fsum(e.delta * e.steps for e in extras)
    if not spent:
        return delta
    left = delta - spent
    if left <= 0:
        names = ", ".join(f"{e.name} ({e.delta * e.steps:.3g})" for e in extras
                          if e.steps and e.delta)
        raise ValueError(f"delta={delta:.3g} is not above the delta the extra events spend "
                         f"({names}: {spent:.3g} in all): no epsilon holds at this delta")
    return left


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A run's length as the accountant charges it: `epochs` epochs of `steps_per_epoch` steps
    from the 0-based `first_epoch` on, of which `first_epoch_steps` are left of the first (a
    run resumed from a checkpoint inside it; None: a whole epoch)."""

    epochs: int
    steps_per_epoch: int
    first_epoch: int = 0
    first_epoch_steps: Optional[int] = None

    def __post_init__(self) -> None:
        checks.count("epochs", self.epochs)
        checks.count("steps_per_epoch", self.steps_per_epoch)
        checks.count("first_epoch", self.first_epoch)
        if self.first_epoch_steps is not None:
            checks.count("first_epoch_steps", self.first_epoch_steps, 1)


def schedule_records(noise: StepNoise, schedule: Schedule) -> tuple:
    """The EpochRecords of `schedule`'s epochs of steps with `noise` (formulas of
    edp_tf/mechanism.py); with sparse embedding noise each step's multiplier joins the row
    selection's z_c; bands b > 1: BandMF epochs."""
    if noise.decay not in DECAYS:
        raise ValueError(f"decay must be one of {DECAYS}, got {noise.decay!r}")
    checks.number("decay_rate", noise.decay_rate, 0.0)
    first = schedule.first_epoch
    records = []
    for t in range(first, first + schedule.epochs):
        z_t, z_eff = noise.at(t)
        steps = (schedule.first_epoch_steps if t == first and schedule.first_epoch_steps
                 is not None else schedule.steps_per_epoch)
        records.append(EpochRecord(t, steps, z_t, z_eff, noise.bands))
    return tuple(records)


def plan_schedule(
    noise_multiplier: float,
    epochs: int,
    steps_per_epoch: int,
    decay: str = "none",
    decay_rate: float = 0.0,
    noise_mode: str = "calibrated",
    replicas: int = 1,
    sensitivity: float = 1,
    first_epoch: int = 0,
    selection_noise_multiplier: Optional[float] = None,
    bands: int = 1,
    first_epoch_steps: Optional[int] = None,
) -> tuple:
    """`schedule_records` from scalars, for a caller without a `Mechanism` (a DP-SGD run
    described by its numbers, as tensorflow-privacy's functions take them)."""
    return schedule_records(
        StepNoise(noise_multiplier, decay, decay_rate, noise_mode, replicas, sensitivity,
                  selection_noise_multiplier, bands),
        Schedule(epochs, steps_per_epoch, first_epoch, first_epoch_steps))


# ------------------------------------------------------------------------- events and epsilon
def _gaussian(z: float, sampling_rate: Optional[float]) -> dp_accounting.DpEvent:
    event = dp_accounting.GaussianDpEvent(z)
    if sampling_rate is None:
        return event
    return dp_accounting.PoissonSampledDpEvent(sampling_rate, event)


def group_sampling_rate(sampling_rate: float, bands: int) -> float:
    """b q: the rate at which a BandMF step samples its group (q for DP-SGD); above 1 there are
    more bands than expected batches in the data, and no sampler can draw it."""
    rate = float(sampling_rate) * checks.count("bands", bands, 1)
    if rate > 1.0:
        raise ValueError(f"BandMF with {bands} bands at sampling rate q={sampling_rate:g} would "
                         f"sample each group at b q = {rate:g} > 1: use at most "
                         f"{int(1.0 / sampling_rate)} bands (n / expected batch)")
    return rate


def amplified_bandmf_event(noise_multiplier: float, sampling_rate: float, bands: int,
                           steps: int) -> dp_accounting.DpEvent:
    """`steps` steps of BandMF with b bands at rate q: DP-SGD's event with ceil(steps / b)
    steps at rate b q (b = 1: DP-SGD itself)."""
    return dp_accounting.SelfComposedDpEvent(
        _gaussian(noise_multiplier, group_sampling_rate(sampling_rate, bands)),
        -(-checks.count("steps", steps) // bands))


def _merged(records: Sequence[EpochRecord]) -> list:
    """(z_eff, bands, charged steps) runs: consecutive epochs with the same z_eff and b compose
    as one event (faster)."""
    runs: list = []
    for r in records:
        if r.steps == 0:
            continue
        if runs and runs[-1][:2] == [r.effective_noise_multiplier, r.bands]:
            runs[-1][2] += r.participations
        else:
            runs.append([r.effective_noise_multiplier, r.bands, r.participations])
    return runs


def make_dp_event(
    records: Sequence[EpochRecord], sampling_rate: float, extra_events: Iterable = ()
) -> dp_accounting.DpEvent:
    """The run as one dp-accounting event: extra events, then one event per epoch.

    An extra event that spends a delta of its own is refused: a DpEvent cannot carry it, so an
    epsilon computed from the event alone would be too small."""
    q = check_sampling_rate(sampling_rate)
    extras = as_extra_events(extra_events)
    spending = [e.name for e in extras if e.steps and e.delta]
    if spending:
        raise ValueError(f"extra events {spending} spend a delta of their own, which a DpEvent "
                         "cannot carry: account for this run with compute_epsilon")
    events = [dp_accounting.SelfComposedDpEvent(_gaussian(e.effective_noise_multiplier,
                                                           e.sampling_rate), e.steps)
              for e in extras if e.steps]
    events += [amplified_bandmf_event(r.effective_noise_multiplier, q, r.bands, r.steps)
               for r in records if r.steps]
    return dp_accounting.ComposedDpEvent(events)


def _is_nonprivate(records, extras) -> bool:
    return any(r.steps and r.effective_noise_multiplier == 0 for r in records) or any(
        e.steps and e.effective_noise_multiplier == 0 for e in extras)


@functools.lru_cache(maxsize=4096)
def _rdp_of_one_step(z_eff: float, sampling_rate: Optional[float],
                     orders: Optional[tuple] = None) -> np.ndarray:
    """RDP curve of one step at `orders` (default: dp-accounting's; the slow part: cached)."""
    acc = dp_accounting.rdp.RdpAccountant(list(orders) if orders else None)
    acc.compose(_gaussian(z_eff, sampling_rate))
    curve = np.array(acc.rdp, dtype=np.float64)
    curve.flags.writeable = False
    return curve


class _Rdp:
    """RDP composition is a sum of curves: same numbers as RdpAccountant, with cached steps."""

    def __init__(self, orders: Optional[tuple] = None):
        self._given_orders = orders
        self._orders = np.array(orders or dp_accounting.rdp.RdpAccountant().orders)
        self._rdp = np.zeros_like(self._orders, dtype=np.float64)

    def add(self, z_eff: float, sampling_rate: Optional[float], count: int) -> None:
        self._rdp = self._rdp + count * _rdp_of_one_step(z_eff, sampling_rate,
                                                         self._given_orders)

    def get_epsilon(self, delta: float) -> float:
        return float(dp_accounting.rdp.compute_epsilon(self._orders, self._rdp, delta)[0])


@functools.lru_cache(maxsize=64)
def _sampled_gaussian_pld(z_eff: float, sampling_rate: float, interval: float):
    """One Poisson-sampled Gaussian step's PLD, as dp-accounting's PLDAccountant builds it.

    Why cached: building it (the privacy loss grid of one step) is most of an epoch end's
    accounting, and a run asks again at every epoch end for the same few steps (one z per
    epoch); the ledger's close and its look-ahead at the next epoch compose the same ones."""
    return dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=z_eff, value_discretization_interval=interval,
        sampling_prob=sampling_rate,
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)


@functools.lru_cache(maxsize=64)
def _sampled_gaussian_pld_steps(z_eff: float, sampling_rate: float, interval: float,
                                count: int):
    """`count` such steps self-composed: a ledger's look-ahead at epoch e + 1 is the count its
    close of epoch e + 1 asks for again."""
    return _sampled_gaussian_pld(z_eff, sampling_rate, interval).self_compose(count)


class _Pld:
    """PLDAccountant's composition of (Poisson-sampled) Gaussian steps, step for step the same
    operations (so the same numbers), with each step's PLD built once (`_sampled_gaussian_pld`)."""

    def __init__(self, interval: float):
        self._interval = interval
        self._pld = dp_accounting.pld.privacy_loss_distribution.identity(
            value_discretization_interval=interval)
        self._non_private = False

    def add(self, z_eff: float, sampling_rate: Optional[float], count: int) -> None:
        if sampling_rate == 0:
            return
        if z_eff == 0:
            self._non_private = True
            return
        if sampling_rate is None:  # as PLDAccountant: count steps are one Gaussian of z / sqrt
            step = dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism(
                standard_deviation=z_eff / math.sqrt(count),
                value_discretization_interval=self._interval,
                neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        else:
            step = _sampled_gaussian_pld_steps(float(z_eff), float(sampling_rate),
                                               self._interval, int(count))
        self._pld = self._pld.compose(step)

    def get_epsilon(self, delta: float) -> float:
        if self._non_private:
            return math.inf
        return float(self._pld.get_epsilon_for_delta(delta))


def _new_accountant(accountant: str, pld_discretization: float):
    if accountant == "pld":
        return _Pld(pld_discretization)
    return _Rdp(_BRACKET_ORDERS if accountant == _RDP_BRACKET else None)


def _pld_interval(rdp_epsilon: float) -> float:
    # keeps the grid size (max privacy loss / interval) roughly bounded for large epsilons
    return PLD_DISCRETIZATION * max(1.0, rdp_epsilon / 10.0)


def _pld_or_rdp(accountant, delta: float, rdp_epsilon: float) -> float:
    """The PLD epsilon, or the RDP one where PLD fails numerically (overflow at huge losses)."""
    try:
        eps = float(accountant.get_epsilon(delta))
    except (OverflowError, FloatingPointError, MemoryError):
        return rdp_epsilon
    return eps if math.isfinite(eps) else rdp_epsilon


def epsilon_per_epoch(
    records: Sequence[EpochRecord],
    sampling_rate: float,
    delta: float,
    extra_events: Iterable = (),
    accountant: str = "pld",
) -> list:
    """Cumulative epsilon after each record (extra events are charged from the start, their
    own deltas spent from `delta`).

    With accountant="pld" an epoch whose RDP epsilon exceeds PLD_SKIP_ABOVE_RDP_EPSILON gets the
    RDP value (both are upper bounds). A zero effective multiplier gives inf from there on.
    """
    records = tuple(records)
    q, delta = check_sampling_rate(sampling_rate), check_delta(delta)
    _check_accountant(accountant)
    extras = as_extra_events(extra_events)
    if not records:
        return []
    if _is_nonprivate((), extras):
        return [math.inf] * len(records)
    delta = gaussian_delta(delta, extras)
    extras = tuple(dataclasses.replace(e, delta=0.0) for e in extras)  # spent just above
    rdp, interval = None, PLD_DISCRETIZATION
    if accountant == "pld":
        rdp = epsilon_per_epoch(records, q, delta, extras, "rdp")
        interval = _pld_interval(min(rdp[-1], PLD_SKIP_ABOVE_RDP_EPSILON))
    acc = _new_accountant(accountant, interval)
    for e in extras:
        if e.steps:
            acc.add(e.effective_noise_multiplier, e.sampling_rate, e.steps)
    out = []
    for i, r in enumerate(records):
        if out and math.isinf(out[-1]) or _is_nonprivate((r,), ()):
            out.append(math.inf)
            continue
        if rdp is not None and rdp[i] > PLD_SKIP_ABOVE_RDP_EPSILON:
            out.extend(rdp[i:])
            break
        if r.steps:
            acc.add(r.effective_noise_multiplier, group_sampling_rate(q, r.bands),
                    r.participations)
        out.append(acc.get_epsilon(delta) if rdp is None
                   else _pld_or_rdp(acc, delta, rdp[i]))
    return out


def compute_epsilon(
    records: Sequence[EpochRecord],
    sampling_rate: float,
    delta: float,
    extra_events: Iterable = (),
    accountant: str = "pld",
    pld_discretization: Optional[float] = None,
) -> float:
    """Epsilon of the whole run at `delta` (inf if any query has zero noise).

    The extra events' own deltas (`ExtraEvent.delta`) are spent first: the Gaussian parts are
    composed at what is left, and a `delta` not above them is refused (ValueError).
    accountant="pld" falls back to the RDP bound where PLD is skipped (RDP epsilon above
    PLD_SKIP_ABOVE_RDP_EPSILON) or fails numerically: both are upper bounds.
    """
    q, delta = check_sampling_rate(sampling_rate), check_delta(delta)
    return _epsilon(tuple(records), q, delta, as_extra_events(extra_events),
                    _check_accountant(accountant), pld_discretization)


def _epsilon(records: tuple, q: float, delta: float, extras: tuple, accountant: str,
             pld_discretization: Optional[float] = None) -> float:
    """`compute_epsilon` on checked arguments (any accountant, _RDP_BRACKET included)."""
    if _is_nonprivate(records, extras):
        return math.inf
    delta = gaussian_delta(delta, extras)
    extras = tuple(dataclasses.replace(e, delta=0.0) for e in extras)  # spent just above
    return _compute_epsilon(records, q, delta, extras, accountant, pld_discretization)


@functools.lru_cache(maxsize=1024)  # the ledger and its budget ask the same questions often
def _compute_epsilon(records: tuple, q: float, delta: float, extras: tuple, accountant: str,
                     pld_discretization: Optional[float]) -> float:
    if _is_nonprivate(records, extras):
        return math.inf
    if not any(r.steps for r in records) and not any(e.steps for e in extras):
        return 0.0
    if accountant == "pld":
        rdp = _compute_epsilon(records, q, delta, extras, "rdp", None)
        if rdp > PLD_SKIP_ABOVE_RDP_EPSILON:
            return rdp
        if pld_discretization is None:
            pld_discretization = _pld_interval(rdp)
        return _pld_or_rdp(_composed(records, q, extras, "pld", pld_discretization), delta, rdp)
    return float(_composed(records, q, extras, accountant, None).get_epsilon(delta))


# A ledger's refresh asks for epsilon at the run's delta and at the reported ones (1/n, 1e-6):
# one composition answers all three (a PLD's is most of an epoch end's accounting time).
# Composed PLDs hold arrays of the privacy loss grid: fewer of them are kept.
@functools.lru_cache(maxsize=32)
def _composed(records: tuple, q: float, extras: tuple, accountant: str,
              pld_discretization: Optional[float]):
    """The run's queries composed (read-only afterwards: only get_epsilon is called)."""
    acc = _new_accountant(accountant, pld_discretization or PLD_DISCRETIZATION)
    for e in extras:
        if e.steps:
            acc.add(e.effective_noise_multiplier, e.sampling_rate, e.steps)
    for z_eff, bands, steps in _merged(records):
        acc.add(z_eff, group_sampling_rate(q, bands), steps)
    return acc


@dataclasses.dataclass(frozen=True)
class PrivacyEstimate:
    """Both accountants' epsilons at `delta`; `epsilon` is the headline (PLD)."""

    epsilon_rdp: float
    epsilon_pld: float
    delta: float

    @property
    def epsilon(self) -> float:
        return self.epsilon_pld


def compute_epsilons(
    records: Sequence[EpochRecord], sampling_rate: float, delta: float, extra_events: Iterable = ()
) -> PrivacyEstimate:
    """RDP and PLD epsilon of the run."""
    return PrivacyEstimate(
        compute_epsilon(records, sampling_rate, delta, extra_events, "rdp"),
        compute_epsilon(records, sampling_rate, delta, extra_events, "pld"),
        check_delta(delta),
    )


# ------------------------------------------------------------------------- calibration
def calibrate(noise: StepNoise, schedule: Schedule, target_epsilon: float, delta: float,
              sampling_rate: float, extra_events: Iterable = (), accountant: str = "pld",
              charged: Sequence[EpochRecord] = (), tolerance: float = 1e-3) -> float:
    """The smallest z0 (within relative `tolerance`) whose `schedule` of steps with `noise`
    (its noise_multiplier is what is calibrated) has epsilon <= target.

    `charged`: epochs a ledger has charged already (a resumed run, interruptions included);
    the schedule is composed after them, so that the whole run lands at the target.

    Bisection on log z0 (epsilon decreases in z0 for every decay and mode); the answer is the
    upper end of the final bracket, so it always meets the target. For PLD, RDP's answer at
    integer orders (cheap, and above PLD's) starts the bracket.
    """
    target = checks.number("target_epsilon", target_epsilon, 0.0, True)
    delta, q = check_delta(delta), check_sampling_rate(sampling_rate)
    _check_accountant(accountant)
    tolerance = checks.number("tolerance", tolerance, 0.0, True, 1.0, True)
    extras = as_extra_events(extra_events)
    if schedule.epochs == 0 or schedule.steps_per_epoch == 0:
        raise ValueError("calibrate_noise needs epochs >= 1 and steps_per_epoch >= 1")
    charged = tuple(charged)

    def eps(z0: float, acct: str) -> float:
        records = schedule_records(dataclasses.replace(noise, noise_multiplier=z0), schedule)
        return _epsilon(charged + records, q, delta, extras, acct)

    def smallest(acct: str, hi: float, factor: float) -> float:
        """The bracket from `hi` by `factor`, then `_smallest_meeting` in it."""
        e_hi = eps(hi, acct)
        while e_hi > target:
            hi *= factor
            if hi > 1e6:
                raise ValueError(f"target_epsilon={target} needs a noise multiplier above 1e6")
            e_hi = eps(hi, acct)
        lo = hi / factor
        e_lo = eps(lo, acct)
        while e_lo <= target:
            hi, e_hi, lo = lo, e_lo, lo / factor
            if lo < 1e-6:
                return hi
            e_lo = eps(lo, acct)
        return _smallest_meeting(lambda z: eps(z, acct), target, lo, e_lo, hi, e_hi, tolerance)

    z_c, epochs, steps = noise.selection_noise_multiplier, schedule.epochs, schedule.steps_per_epoch
    _refuse_unreachable_target(target, q, delta, extras, accountant, charged, z_c, epochs, steps)
    if accountant == "rdp":
        return smallest("rdp", 1.0, 2.0)
    try:  # PLD is tighter: its answer lies a little below RDP's, which is quick to find
        _refuse_unreachable_target(target, q, delta, extras, _RDP_BRACKET, charged, z_c, epochs,
                                   steps)
        hi, factor = smallest(_RDP_BRACKET, 1.0, 2.0), 1.25
    except ValueError:  # RDP's looser bound of what is charged may spend the target alone
        hi, factor = 1.0, 2.0
    return smallest(accountant, hi, factor)


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    epochs: int,
    steps_per_epoch: int,
    decay: str = "none",
    decay_rate: float = 0.0,
    noise_mode: str = "calibrated",
    replicas: int = 1,
    sensitivity: float = 1,
    accountant: str = "pld",
    extra_events: Iterable = (),
    tolerance: float = 1e-3,
    selection_noise_multiplier: Optional[float] = None,
    charged: Sequence[EpochRecord] = (),
    first_epoch: int = 0,
    bands: int = 1,
    first_epoch_steps: Optional[int] = None,
) -> float:
    """`calibrate` from scalars, for a caller without a `Mechanism` (a DP-SGD run described
    by its numbers, as tensorflow-privacy's functions take them)."""
    return calibrate(
        StepNoise(1.0, decay, decay_rate, noise_mode, replicas, sensitivity,
                  selection_noise_multiplier, bands),
        Schedule(epochs, steps_per_epoch, first_epoch, first_epoch_steps), target_epsilon,
        delta, sampling_rate, extra_events, accountant, charged, tolerance)


def _refuse_unreachable_target(target: float, q: float, delta: float, extras: tuple,
                               accountant: str, charged: tuple,
                               selection_noise_multiplier: Optional[float], epochs: int,
                               steps_per_epoch: int) -> None:
    """Raises if what no z0 controls already spends the target, so the bisection cannot end."""
    if charged:
        spent = _epsilon(charged, q, delta, extras, accountant)
        if spent >= target:
            raise ValueError(f"the epochs charged already spend epsilon {spent:.4g} >= "
                             f"target_epsilon={target:g}: no z0 can meet it")
    alone = _epsilon((), q, delta, extras, accountant) if extras else 0.0
    if alone >= target:
        names = ", ".join(sorted({e.name for e in extras}))
        raise ValueError(
            f"target_epsilon={target:g} is too small: the releases made before training "
            f"({names}) spend epsilon {alone:.4g} on their own, before any step, so no noise "
            "can meet it. Raise target_epsilon, or avoid those releases (a label set given "
            "as a public schema instead of selected from the data costs nothing)")
    if selection_noise_multiplier is not None:  # z0 -> inf leaves the selection's z_c alone
        z_c = checks.number("selection_noise_multiplier", selection_noise_multiplier, 0.0, True)
        alone = tuple(EpochRecord(t, steps_per_epoch, z_c, z_c) for t in range(epochs))
        if _epsilon(charged + alone, q, delta, extras, accountant) >= target:
            raise ValueError(
                f"the row selection's noise alone (selection_noise_multiplier={z_c:g}) spends "
                f"epsilon >= target_epsilon={target}: raise selection_noise_multiplier")


def _smallest_meeting(eps: Callable[[float], float], target: float, lo: float, e_lo: float,
                      hi: float, e_hi: float, tolerance: float) -> float:
    """The upper end of a bracket [lo, hi], eps(lo) > target >= eps(hi), shrunk until
    hi / lo <= 1 + tolerance: so the answer always meets the target.

    Why not plain bisection: every evaluation composes a PLD (tenths of a second), and epsilon
    falls about as 1/z, so log epsilon is nearly linear in log z. The first steps interpolate
    there and aim a third of the tolerance above, then below, the interpolated root, so that
    both ends close in on it in about two evaluations instead of eight; bisection takes over if
    they have not."""
    for step in itertools.count():
        if hi / lo <= 1.0 + tolerance:
            return hi
        a, b = math.log(lo), math.log(hi)
        x = (a + b) / 2
        if step < 4 and math.isfinite(e_lo) and e_lo > target >= e_hi > 0:
            root = a + (b - a) * math.log(e_lo / target) / math.log(e_lo / e_hi)
            aim = math.log1p(tolerance) / 3
            margin = min(aim, (b - a) / 4)  # strictly inside: each step shrinks the bracket
            x = min(max(root + (aim if step % 2 == 0 else -aim), a + margin), b - margin)
        z = math.exp(x)
        e = eps(z)
        if e <= target:
            hi, e_hi = z, e
        else:
            lo, e_lo = z, e
