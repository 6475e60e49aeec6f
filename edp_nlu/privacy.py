"""`python -m edp_nlu.privacy`: the privacy statement of a finished or a planned run.

    python -m edp_nlu.privacy --run_dir=runs/x                  # from runs/x/privacy.json
    python -m edp_nlu.privacy --dataset_size=3000 --batch_size=64 --epochs=10 \\
        --noise_multiplier=0.6 --replicas=4 --noise_mode=both     # a planned run
    python -m edp_nlu.privacy --dataset_size=3000 --batch_size=64 --epochs=10 \\
        --replicas=4 --target_epsilon=8                           # calibrate z0 first
    python -m edp_nlu.privacy --dataset_size=13084 --target_epsilon=8 --sampling_table
                                       # the noise each (q, passes) leaves at that epsilon

Epsilon is cumulative per epoch, from both accountants (RDP and PLD; PLD is the headline), for
add/remove-one-example adjacency with every intermediate model released.
"""
from __future__ import annotations

if __name__ == "__main__":  # before edp_tf loads TensorFlow: its native logs read the setting once
    from edp_nlu import cli

    cli.quiet_unless_verbose()

import dataclasses
import math
from typing import Optional, Sequence

from absl import app, flags, logging

from edp_nlu import cli
from edp_tf import accounting
from edp_tf.accounting import EpochRecord
from edp_tf.mechanism import Mechanism

# These import TensorFlow; `--help` and a misspelt flag answer without it.
plan = cli.on_first_use("edp_tf.plan")
report = cli.on_first_use("edp_tf.report")
ledger_lib = cli.on_first_use("edp_tf.ledger")

SHUFFLE_NOTE = ("Fixed-size shuffled batches: epsilon assumes Poisson sampling at q = B/n, "
                "which shuffling does not provide (the run would not be private).")


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4g}"


def _table(records: Sequence[EpochRecord], columns: dict) -> list:
    """Rows: epoch, steps, z_t, then (z_eff, eps RDP, eps PLD) per column set."""
    head = f"{'epoch':>5} {'steps':>6}"
    for name in columns:
        head += f" | {name + ' z_t':>16} {'z_eff':>8} {'eps RDP':>9} {'eps PLD':>9}"
    lines = [head]
    for i, r in enumerate(records):
        line = f"{r.epoch:>5} {r.steps:>6}"
        for recs, rdp, pld in columns.values():
            line += (f" | {recs[i].noise_multiplier:>16.4g}"
                     f" {recs[i].effective_noise_multiplier:>8.4g}"
                     f" {_fmt(rdp[i]):>9} {_fmt(pld[i]):>9}")
        lines.append(line)
    return lines


def _per_epoch(records, q, delta, extras) -> tuple:
    return (tuple(records), accounting.epsilon_per_epoch(records, q, delta, extras, "rdp"),
            accounting.epsilon_per_epoch(records, q, delta, extras, "pld"))


def _mechanism_line(mode: str, replicas: int, microbatch: Optional[int], sensitivity,
                    unit: str = "example", estimator: str = "fixed", local_epochs: int = 0) -> str:
    per = ("one micro-batch per replica (eDP-SGD)" if microbatch in (None, 0)
           else f"one micro-batch per sampled user (at most {microbatch} of their examples)"
           if unit == "user" else f"micro-batches of {microbatch} example(s)")
    if unit == "user":
        per += (f", each user's update after {local_epochs} local epoch(s) (DP-FedAvg)"
                if local_epochs else ", each user's gradient (DP-FedSGD)")
        per += (", the average over max(q W, users drawn) (clipped-denominator estimator)"
                if estimator == "clipped" else ", the average over q W expected users")
    return (f"Mechanism: {mode} noise, {replicas} replica(s), {per}; sensitivity S = "
            f"{sensitivity:g} C")


def statement_from_ledger(ledger: dict, delta: Optional[float] = None) -> str:
    """The statement of a finished run (a loaded privacy.json), optionally at another delta."""
    delta = ledger["delta"] if delta is None else accounting.check_delta(delta)
    q = ledger["sampling_rate"]
    records, extras = ledger_lib.charged(ledger)  # an open epoch's bound too: the headline's
    records = list(records)
    unit = ledger.get("privacy_unit", "example")
    lines = ["Privacy statement of a finished run",
             _mechanism_line(ledger["noise_mode"], ledger["replicas"], ledger["microbatch_size"],
                             ledger["sensitivity"], unit, ledger.get("user_estimator", "fixed"),
                             ledger.get("local_epochs", 0))
             + f", C = {ledger['l2_norm_clip']:g}",
             "Data: " + report.sampling_sentence(ledger)]
    z_c = ledger.get("selection_noise_multiplier")
    if z_c is not None:
        lines.append(f"Sparse embedding noise (DP-AdaFEST): noisy row counts, z_c = {z_c:g}, on "
                     "the same sample as the gradient: each step charged at the joint multiplier "
                     "(z_eff^-2 + z_c^-2)^-1/2")
    top = ledger_lib.headline(ledger, delta)
    recomputed = top["epsilon"]
    if (delta == ledger["delta"] and not ledger.get("in_progress")
            and not math.isclose(recomputed, ledger["epsilon"], rel_tol=1e-6, abs_tol=1e-9)):
        lines.append(f"WARNING: privacy.json says epsilon {_fmt(ledger['epsilon'])}, recomputed "
                     f"{_fmt(recomputed)}: the file was edited or written by another version")
    lines.append(f"Guarantee: epsilon = {_fmt(recomputed)} (PLD; RDP "
                 f"{_fmt(top['epsilon_rdp'])}) at "
                 f"delta = {delta:.3g}, add/remove-one-{unit}"
                 + (" (all of that user's data)" if unit == "user" else "")
                 + ", all checkpoints released")
    others = accounting.epsilons_at_reported_deltas(records, q, ledger["dataset_size"], extras)
    lines.append("Same run at other deltas: " + ", ".join(
        f"epsilon {_fmt(v['epsilon'])} at delta = {label} ({v['delta']:.3g})"
        for label, v in others.items()) + _inf_explained(others.values(), extras))
    if records:
        lines += ["Cumulative epsilon per epoch:"] + _table(
            records, {ledger["noise_mode"]: _per_epoch(records, q, delta, extras)})
    if ledger.get("in_progress"):
        lines.append(f"Epoch {ledger['in_progress']['epoch']} is running or was interrupted: "
                     f"its {ledger['in_progress']['steps']} step(s) (the most that can have run, "
                     "which a checkpoint inside it may hold) are charged above, as a resume "
                     "charges them.")
    label_sets = (ledger.get("artifacts") or {}).get("label_sets")
    if label_sets:  # written by the trainers: where the exported label sets come from
        lines.append(f"Label sets: {label_sets}")
    lines += [f"Assumes: {s}" for s in ledger.get("assumes", [])]
    lines += _extras_and_caveats(extras, ledger.get("not_covered", []),
                                 top["private"])
    return "\n".join(lines)


def _inf_explained(estimates, extras) -> str:
    """Why an epsilon is inf at a delta, where one is: that delta is not above what the
    releases before training spend of it (their thresholds), so no guarantee holds there."""
    spent = math.fsum(e.delta * e.steps for e in extras)
    if not spent or all(math.isfinite(v["epsilon"]) for v in estimates):
        return ""
    names = ", ".join(sorted({e.name for e in extras if e.delta}))
    return (f" (inf: at that delta nothing is left once {names} spent delta {spent:.3g}; "
            "the guarantee holds only at a larger delta)")


def _extras_and_caveats(extras, not_covered, private: bool) -> list:
    lines = []
    for e in extras:
        sampled = "no sampling" if e.sampling_rate is None else f"q = {e.sampling_rate:g}"
        lines.append(f"Extra event charged: {e.name} (Gaussian, z = {e.noise_multiplier:g}"
                     + (f" on sensitivity {e.sensitivity:g}" if e.sensitivity != 1 else "")
                     + f", {sampled}, {e.steps} time(s)"
                     + (f"; delta {e.delta:.3g} spent from the run's delta" if e.delta else "")
                     + ")")
    if not_covered:
        lines.append("Not covered by epsilon:")
        lines += [f"  - {s}" for s in not_covered]
    lines.append("Private: yes" if private else
                 "Private: NO (see above: the guarantee does not hold as stated)")
    return lines


def planned_mechanism(batch_size: float, replicas: int, microbatch_size: int,
                      noise_multiplier: float, noise_mode: str, decay: str,
                      decay_rate: float, selection_noise_multiplier: float = 0.0) -> Mechanism:
    """The mechanism of a planned run (microbatch_size 0: one micro-batch per replica;
    selection_noise_multiplier 0: dense embedding noise)."""
    return Mechanism(replicas, max(1, int(batch_size)), microbatch_size or None, 1.0,
                     noise_multiplier, noise_mode, decay, decay_rate,
                     selection_noise_multiplier=selection_noise_multiplier or None)


def plan_statement(dataset_size: int, batch_size: float, epochs: int, noise_multiplier: float,
                   delta: Optional[float] = None, decay: str = "none", decay_rate: float = 0.0,
                   noise_mode: str = "calibrated", replicas: int = 1, microbatch_size: int = 0,
                   sampling: str = "poisson", steps_per_epoch: Optional[int] = None,
                   scaling_noise_multiplier: float = 0.0,
                   selection_noise_multiplier: float = 0.0) -> str:
    """The statement of a planned run; noise_mode="both" shows calibrated and paper side by side."""
    if isinstance(dataset_size, bool) or dataset_size < 1:
        raise ValueError(f"--dataset_size must be >= 1, got {dataset_size!r}")
    if not 0 < batch_size <= dataset_size:
        raise ValueError(f"--batch_size must be in (0, dataset_size], got {batch_size!r}")
    if microbatch_size < 0:
        raise ValueError(f"--microbatch_size must be >= 0, got {microbatch_size!r}")
    delta = accounting.default_delta(dataset_size) if delta is None else delta
    q = accounting.check_sampling_rate(batch_size / dataset_size)
    steps = steps_per_epoch or math.ceil(dataset_size / batch_size - 1e-9)
    extras = ([accounting.ExtraEvent("private_layer_scales", scaling_noise_multiplier)]
              if scaling_noise_multiplier > 0 else [])
    modes = ["calibrated", "paper"] if noise_mode == "both" else [noise_mode]
    columns = {}
    for mode in modes:
        mechanism = planned_mechanism(batch_size, replicas, microbatch_size, noise_multiplier, mode,
                                      decay, decay_rate, selection_noise_multiplier)
        columns[mode] = _per_epoch(plan.schedule(mechanism, epochs, steps), q, delta, extras)
    sensitivity = mechanism.sensitivity
    first = next(iter(columns.values()))[0]
    lines = ["Privacy statement of a planned run",
             _mechanism_line(" / ".join(modes), replicas, microbatch_size, sensitivity),
             f"Data: n = {dataset_size}, {sampling} sampling, q = {q:.6g} (batch {batch_size:g}), "
             f"{steps} steps per epoch, {epochs} epochs",
             f"Schedule: z0 = {noise_multiplier:.6g}, decay {decay}"
             + (f" (tau = {decay_rate:g})" if decay != "none" else "")
             + (f"; sparse embedding noise (DP-AdaFEST), row counts at z_c = "
                f"{selection_noise_multiplier:g}, charged jointly: (z^-2 + z_c^-2)^-1/2"
                if selection_noise_multiplier else "")]
    for mode, (records, rdp, pld) in columns.items():
        if epochs:
            lines.append(f"Guarantee ({mode}): epsilon = {_fmt(pld[-1])} (PLD; RDP "
                         f"{_fmt(rdp[-1])}) at delta = {delta:.3g}")
            others = accounting.epsilons_at_reported_deltas(records, q, dataset_size, extras)
            lines.append(f"  same run at other deltas ({mode}): " + ", ".join(
                f"epsilon {_fmt(v['epsilon'])} at delta = {label} ({v['delta']:.3g})"
                for label, v in others.items()))
    if epochs:
        lines += ["Cumulative epsilon per epoch:"] + _table(first, columns)
    not_covered = [SHUFFLE_NOTE] if sampling == "shuffle" else []
    lines += _extras_and_caveats(extras, not_covered, sampling != "shuffle")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class SamplingRow:
    """One (sampling rate, passes) plan calibrated to an epsilon: per-example clipping (S = C),
    constant noise. `step_noise` is the std of one step's noise in the averaged update,
    z S / (q n), in units of C (the most one example's clipped gradient can add to the sum);
    `run_noise` = step_noise / sqrt(steps), what is left of it in the mean of all the steps'
    updates: a proxy for how much noise the trained weights keep, which only the data's size
    and epsilon move much (the table shows by how much the knobs do)."""

    sampling_rate: float
    passes: float
    steps: int
    noise_multiplier: float
    step_noise: float
    run_noise: float


def sampling_table(dataset_size: int, target_epsilon: float, delta: Optional[float] = None,
                   sampling_rates: Sequence[float] = (0.02, 0.04, 0.08, 0.16, 0.32),
                   passes: Sequence[float] = (12, 24, 48, 96)) -> list:
    """SamplingRows for every (passes, q): round(passes / q) steps at rate q, each calibrated
    (PLD) to `target_epsilon` at `delta` (default 0.1/n). Why: at a fixed epsilon the sampling
    rate and the step count trade noise per step against steps; this shows what the trade can
    buy before a run is spent on it."""
    if isinstance(dataset_size, bool) or not isinstance(dataset_size, int) or dataset_size < 1:
        raise ValueError(f"--dataset_size must be an integer >= 1, got {dataset_size!r}")
    delta = accounting.default_delta(dataset_size) if delta is None else delta
    rows = []
    for e in passes:
        if not e > 0:
            raise ValueError(f"--passes must be > 0, got {e!r}")
        for q in sampling_rates:
            accounting.check_sampling_rate(q)
            steps = max(1, round(e / q))
            z = accounting.calibrate_noise(target_epsilon, delta, q, 1, steps)
            step_noise = z / (q * dataset_size)
            rows.append(SamplingRow(q, e, steps, z, step_noise, step_noise / math.sqrt(steps)))
    return rows


def sampling_table_text(rows: Sequence[SamplingRow], dataset_size: int, target_epsilon: float,
                        delta: float) -> str:
    lines = [f"Per-example DP-SGD calibrated to epsilon {target_epsilon:g} at delta {delta:.3g} "
             f"(PLD), n = {dataset_size}, Poisson sampling, constant noise",
             "step noise = z / (q n), the std of one step's noise in the averaged update (units "
             "of C); run noise = step noise / sqrt(steps)",
             f"{'passes':>6} {'q':>6} {'batch':>8} {'steps':>6} {'z':>7} {'step noise':>11} "
             f"{'run noise':>10}"]
    for r in rows:
        lines.append(f"{r.passes:>6g} {r.sampling_rate:>6g} {r.sampling_rate * dataset_size:>8.0f} "
                     f"{r.steps:>6} {r.noise_multiplier:>7.4g} {r.step_noise:>11.3e} "
                     f"{r.run_noise:>10.3e}")
    best = min(rows, key=lambda r: r.run_noise)
    worst = max(rows, key=lambda r: r.run_noise)
    lines.append(f"run noise spans {worst.run_noise / best.run_noise:.2f}x over this table "
                 f"(lowest at q {best.sampling_rate:g}, {best.passes:g} passes)")
    return "\n".join(lines)


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
    """Flags are defined only when run as a command: edp_nlu.train defines some of the same
    names, and both modules may be imported by one test process (which gives its own
    `values`)."""
    v = dict(flag_values=values)
    flags.DEFINE_string("run_dir", None, "A run directory holding privacy.json.", **v)
    flags.DEFINE_string("report", None, "With --run_dir: also write a self-contained privacy "
                        "report for a reviewer to this file (.html, else Markdown): the "
                        "guarantee, epsilon over the epochs, the mechanism, what it assumes "
                        "and does not cover, each artifact, the audit command.", **v)
    flags.DEFINE_integer("dataset_size", None, "n, training examples (planned run).", **v)
    flags.DEFINE_float("batch_size", None, "Expected (Poisson) or fixed global batch.", **v)
    flags.DEFINE_integer("epochs", None, "Epochs (planned run).", **v)
    flags.DEFINE_integer("steps_per_epoch", None, "Default: ceil(n / batch_size).", **v)
    flags.DEFINE_float("noise_multiplier", None, "z0 (planned run).", **v)
    flags.DEFINE_float("target_epsilon", None, "Calibrate z0 to this epsilon instead.", **v)
    flags.DEFINE_float("delta", None,
                       "delta (default 0.1/n; with --run_dir, recompute at it).", **v)
    flags.DEFINE_enum("decay", "none", ["none", "linear", "exponential"], "Noise decay.", **v)
    flags.DEFINE_float("decay_rate", 0.0, "Decay rate tau.", **v)
    flags.DEFINE_enum("noise_mode", "calibrated", ["calibrated", "paper", "both"],
                      "Noise mode; 'both' prints the two side by side.", **v)
    flags.DEFINE_integer("replicas", 1, "Replicas N.", **v)
    flags.DEFINE_integer("microbatch_size", 0, "Examples per micro-batch; 0: one micro-batch "
                         "per replica (eDP-SGD).", **v)
    flags.DEFINE_enum("sampling", "poisson", ["poisson", "shuffle"], "Batch sampling.", **v)
    flags.DEFINE_float("scaling_noise_multiplier", 0.0,
                       "> 0: charge a private per-layer scale query with this z.", **v)
    flags.DEFINE_float("selection_noise_multiplier", 0.0, "> 0: sparse embedding noise "
                       "(DP-AdaFEST) with row counts at this z_c.", **v)
    flags.DEFINE_bool("sampling_table", False,
                      "Print z and the noise left per (sampling rate, passes) at "
                      "--target_epsilon for --dataset_size (per-example clipping), then exit.",
                      **v)
    flags.DEFINE_list("sampling_rates", ["0.02", "0.04", "0.08", "0.16", "0.32"],
                      "Sampling rates q of --sampling_table.", **v)
    flags.DEFINE_list("passes", ["12", "24", "48", "96"],
                      "Expected passes over the data (q x steps) of --sampling_table.", **v)


def main(argv, values: flags.FlagValues = flags.FLAGS) -> None:
    del argv
    f = values
    # dp-accounting warns for every RDP order it drops at small sigma (the bound stays valid)
    logging.set_verbosity(logging.ERROR)
    if f.run_dir:
        led = ledger_lib.read_ledger(f.run_dir)
        print(statement_from_ledger(led, f.delta))
        if f.report:
            print(f"wrote {report.write(led, f.report, f'Privacy report of {f.run_dir}')}")
        return
    if f.report:
        raise app.UsageError("--report needs --run_dir (the report of a run's ledger)")
    if f.sampling_table:
        if f.dataset_size is None or f.target_epsilon is None:
            raise app.UsageError("--sampling_table needs --dataset_size and --target_epsilon")
        try:
            rates = [float(v) for v in f.sampling_rates]
            passes = [float(v) for v in f.passes]
        except ValueError as e:
            raise app.UsageError(f"--sampling_rates / --passes must be numbers: {e}") from None
        delta = f.delta or accounting.default_delta(f.dataset_size)
        rows = sampling_table(f.dataset_size, f.target_epsilon, delta, rates, passes)
        print(sampling_table_text(rows, f.dataset_size, f.target_epsilon, delta))
        return
    missing = [name for name in ("dataset_size", "batch_size", "epochs") if f[name].value is None]
    if missing or (f.noise_multiplier is None and f.target_epsilon is None):
        raise app.UsageError(
            "give --run_dir, or a planned run: --dataset_size --batch_size --epochs and "
            "--noise_multiplier or --target_epsilon"
            + (f" (missing: {missing})" if missing else ""))
    n, batch, replicas = f.dataset_size, f.batch_size, f.replicas
    delta = f.delta or accounting.default_delta(n)
    z0 = f.noise_multiplier
    extras = ([accounting.ExtraEvent("private_layer_scales", f.scaling_noise_multiplier)]
              if f.scaling_noise_multiplier > 0 else [])
    if f.target_epsilon is not None:
        mode = "calibrated" if f.noise_mode == "both" else f.noise_mode
        steps = f.steps_per_epoch or math.ceil(n / batch - 1e-9)
        planned = planned_mechanism(batch, replicas, f.microbatch_size, 1.0, mode, f.decay,
                                    f.decay_rate, f.selection_noise_multiplier)
        z0 = plan.calibrate(planned, f.target_epsilon, delta, batch / n, f.epochs, steps,
                            extras).noise_multiplier
        print(f"Calibrated z0 = {z0:.6g} ({mode} mode) for epsilon {f.target_epsilon:g} at "
              f"delta {delta:.3g} (PLD, relative tolerance 1e-3)\n")
    print(plan_statement(n, batch, f.epochs, z0, delta, f.decay, f.decay_rate, f.noise_mode,
                         replicas, f.microbatch_size, f.sampling, f.steps_per_epoch,
                         f.scaling_noise_multiplier, f.selection_noise_multiplier))


if __name__ == "__main__":
    cli.define_flags_or_exit(define_flags)
    cli.run(main)
