"""`PrivacyPlan`: a run's privacy statement, decided once before training and handed down.

The calibrated `Mechanism`, the schedule the accountant will charge, and what the statement does
not cover are fixed in one immutable object before the first step. The trainer builds it;
`PrivateModel(..., plan=plan)` runs its mechanism (refusing a batch geometry the plan was not made
for); the ledger charges the epochs that run and reports the plan's sentences through the model's
`privacy_facts()`. Facts flow one way, plan -> model -> ledger, and `Mechanism` (the step's
formulas) no longer needs the accountant: `schedule` and `calibrate` live here, above both.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Tuple

from edp_tf import accounting, bandmf, checks
from edp_tf.mechanism import Mechanism


def schedule(mechanism: Mechanism, epochs: int, steps_per_epoch: int,
             first_epoch: int = 0, first_epoch_steps: Optional[int] = None) -> tuple:
    """The accountant's EpochRecords of `epochs` epochs of `steps_per_epoch` steps of
    `mechanism`, from the 0-based `first_epoch` on (of which `first_epoch_steps` are left)."""
    return accounting.schedule_records(mechanism.step_noise, accounting.Schedule(
        epochs, steps_per_epoch, first_epoch, first_epoch_steps))


def calibrate(mechanism: Mechanism, target_epsilon: float, delta: float, sampling_rate: float,
              epochs: int, steps_per_epoch: int, extra_events: Iterable = (),
              accountant: str = "pld", charged: tuple = (), first_epoch: int = 0,
              first_epoch_steps: Optional[int] = None) -> Mechanism:
    """`mechanism` with the smallest z0 whose schedule (plus `extra_events`, after the epochs
    `charged` already; `epochs` from `first_epoch` on, `first_epoch_steps` left of the first)
    meets (target_epsilon, delta)."""
    z0 = accounting.calibrate(
        mechanism.step_noise, accounting.Schedule(epochs, steps_per_epoch, first_epoch,
                                                  first_epoch_steps),
        target_epsilon, delta, sampling_rate, extra_events, accountant, charged)
    return dataclasses.replace(mechanism, noise_multiplier=z0)


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """The mechanism of every step, the sampling it is amplified by, and the run's length.

    Attributes:
      mechanism: the step (z0, decay, S, replicas, micro-batches), calibrated or given.
      dataset_size: n, taken as public (q n normalises every update).
      sampling_rate: q of the Poisson sampling.
      delta: the delta epsilon is stated at.
      epochs, steps_per_epoch: the planned run.
      extra_events: other releases on the same data charged to the same ledger (e.g. the
        private layer-scale query), as `accounting.ExtraEvent`s: queries the model makes itself
        and reports in `privacy_facts()`.
      releases: queries already answered on the training data before the first step, e.g.
        label sets chosen by DP partition selection (edp_tf.partition_selection): the model
        reports them in `privacy_facts()`, so the ledger charges them once with the steps.
        Leave out one a resumed run's ledger has charged already.
      not_covered: sentences on what the statement does not cover (a vocabulary or label set
        from the training split, a public pretraining corpus), reported in privacy.json.
    """

    mechanism: Mechanism
    dataset_size: int
    sampling_rate: float
    delta: float
    epochs: int
    steps_per_epoch: int
    extra_events: Tuple[accounting.ExtraEvent, ...] = ()
    not_covered: Tuple[str, ...] = ()
    releases: Tuple[accounting.ExtraEvent, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, Mechanism):
            raise ValueError(f"PrivacyPlan.mechanism must be an edp_tf.Mechanism, "
                             f"got {type(self.mechanism).__name__}")
        checks.count("PrivacyPlan.dataset_size", self.dataset_size, 1)
        accounting.check_sampling_rate(self.sampling_rate)
        accounting.check_delta(self.delta)
        checks.count("PrivacyPlan.epochs", self.epochs, 1)
        checks.count("PrivacyPlan.steps_per_epoch", self.steps_per_epoch, 1)
        object.__setattr__(self, "extra_events", accounting.as_extra_events(self.extra_events))
        object.__setattr__(self, "releases", accounting.as_extra_events(self.releases))
        object.__setattr__(self, "not_covered", tuple(str(s) for s in self.not_covered))
        accounting.gaussian_delta(self.delta, self.charged_events)  # some delta must be left
        self._fix_bandmf_strategy()

    def _fix_bandmf_strategy(self) -> None:
        """BandMF: epochs of whole group cycles, a rate b q <= 1, and the strategy optimised for
        the planned T = epochs x steps_per_epoch (kept if the mechanism already has one)."""
        m = self.mechanism
        if m.bands == 1:
            return
        if self.steps_per_epoch % m.bands:
            raise ValueError(f"PrivacyPlan.steps_per_epoch={self.steps_per_epoch} must be a "
                             f"multiple of the BandMF bands={m.bands} (BandMFSampler's passes "
                             "are whole cycles of the groups)")
        accounting.group_sampling_rate(self.sampling_rate, m.bands)
        if m.strategy is None:
            coefficients = bandmf.optimal_coefficients(self.epochs * self.steps_per_epoch,
                                                       m.bands)
            object.__setattr__(self, "mechanism",
                               dataclasses.replace(m, strategy=coefficients))

    @property
    def charged_events(self) -> tuple:
        """Every extra event the run's epsilon composes: the model's queries and the releases."""
        return self.extra_events + self.releases

    def schedule(self, first_epoch: int = 0, first_epoch_steps: Optional[int] = None) -> tuple:
        """The EpochRecords of the planned epochs from `first_epoch` on (`first_epoch_steps`:
        the steps left of the first, for a run resumed inside it)."""
        return schedule(self.mechanism, self.epochs - first_epoch, self.steps_per_epoch,
                        first_epoch, first_epoch_steps)

    def epsilon(self, accountant: str = "pld") -> float:
        """Epsilon of the whole planned run at `delta` (what the ledger reaches if it runs)."""
        return accounting.compute_epsilon(self.schedule(), self.sampling_rate, self.delta,
                                          self.charged_events, accountant)

    def calibrated(self, target_epsilon: float, accountant: str = "pld", charged: tuple = (),
                   first_epoch: int = 0, charged_events: tuple = (),
                   first_epoch_steps: Optional[int] = None) -> "PrivacyPlan":
        """This plan with the smallest z0 whose whole run meets (target_epsilon, delta).

        A resumed run passes what its ledger (public) has charged: the epoch records
        (`charged`, interruptions included) and extra events (`charged_events`); z0 is then that
        of the epochs from `first_epoch` on, so that the ledger's epochs plus these land at the
        target (`first_epoch_steps`: the steps left of that epoch when it resumes inside it)."""
        mechanism = calibrate(self.mechanism, target_epsilon, self.delta, self.sampling_rate,
                              self.epochs - first_epoch, self.steps_per_epoch,
                              tuple(charged_events) + self.charged_events, accountant,
                              tuple(charged), first_epoch, first_epoch_steps)
        return dataclasses.replace(self, mechanism=mechanism)

    def epsilon_after(self, charged: tuple = (), first_epoch: int = 0,
                      charged_events: tuple = (), accountant: str = "pld",
                      first_epoch_steps: Optional[int] = None) -> float:
        """Epsilon of the epochs `charged` (and `charged_events`) followed by this plan's
        epochs from `first_epoch` on (`first_epoch_steps` left of the first)."""
        return accounting.compute_epsilon(tuple(charged)
                                          + self.schedule(first_epoch, first_epoch_steps),
                                          self.sampling_rate, self.delta,
                                          tuple(charged_events) + self.charged_events, accountant)

    def step_mechanism(self, mechanism: Mechanism) -> Mechanism:
        """The plan's mechanism, if it is the one the step's config and batch give (`mechanism`):
        else the ledger would charge a step that does not run."""
        planned = self.mechanism
        if mechanism.strategy is None:  # BandMF: the plan's strategy, optimised for its run
            mechanism = dataclasses.replace(mechanism, strategy=planned.strategy)
        if planned != mechanism:
            fields = [f.name for f in dataclasses.fields(Mechanism)
                      if getattr(planned, f.name) != getattr(mechanism, f.name)]
            raise ValueError(
                "the PrivacyPlan was made for another step: "
                + ", ".join(f"{f} {getattr(planned, f)!r} planned vs {getattr(mechanism, f)!r} "
                            "here" for f in fields)
                + " (same DPConfig, replicas and global batch size as the plan's)")
        return planned

    def with_not_covered(self, *sentences: str) -> "PrivacyPlan":
        """This plan with more sentences on what it does not cover (each once)."""
        merged = list(self.not_covered)
        merged += [s for s in sentences if s not in merged]
        return dataclasses.replace(self, not_covered=tuple(merged))
