"""`python -m tools.audit`: white-box audits of the private step: the one-run bound (Steinke
et al. 2023) and, with --gaussian, the Gaussian audit (edp_tf/auditing.py says what each assumes).

    python -m tools.audit --mechanism=default   # eDP, micro-batches of 2, claimed eps 2
    python -m tools.audit --mechanism=paper     # Algorithm 1 as written, whose *paper-style*
                                                   # accounting (noise at face value, S = C) says 2
    python -m tools.audit --mechanism=dpsgd --target_epsilon=8   # the default job's mechanism
    python -m tools.audit --mechanism=user      # user-level DP-FedSGD (fixed denominator)
    python -m tools.audit --mechanism=default --canaries=4000 --steps=2 --runs=10 --gaussian

What runs is `PrivateModel.train_step` itself (clipping, ghost norms, per-replica noise, the
replicas' SUM, the normalisation), on a model built so that each training example is a gradient
canary: the loss of an example with input x is <w, x>, so its gradient is x, whatever w is.
Canary i has x = 4 C k e_i (k: rows per micro-batch), so it is always clipped to C e_i; it is
included with probability 1/2. In micro-batch modes each canary shares its micro-batch with a
"partner" x = -2 C k e_i that is always present: with the canary the micro-batch clips to +C e_i,
without it to -C e_i, the 2C change that makes S = 2 for micro-batches of k >= 2 (per-example
DP-SGD has no partner: S = 1). At user level a canary is a user of 2 rows, both 4 C k e_i, who
is present or absent as a whole (S = C with the fixed denominator). Each canary's score is the
drop of w_i over the steps its micro-batch was trained on (plain SGD, learning rate 1: the drop
is the sum of the noisy updates). Every canary is in every step of its block (sampling rate 1):
the audit tests the step and its noise, not the amplification by Poisson sampling, whose
accounting dp-accounting owns; the claim is calibrated at sampling rate 1 too.

The white-box statistic: coordinate i of each step's update is (+-C + n_t) / D with
n_t ~ N(0, (z_eff S C)^2) independent over steps and coordinates (in: +C, out: -C with a partner,
0 at user level or without one), so a canary's score is N(T a_in, T s^2) or N(T a_out, T s^2),
and (mean in - mean out) / std is mu = sqrt(T) (a_in - a_out) / s = sqrt(T) / z_eff for the
worst-case change S C. --gaussian estimates that mu with confidence limits over --runs runs of m
canaries each and turns its 95% lower limit into an epsilon lower bound through mu-GDP.

It reports (i) the one-run epsilon lower bound at 95% confidence beside the claimed epsilon,
(ii) with --gaussian, the Gaussian lower bound at 95%, and (iii) the measured signal-to-noise
ratio mu = (mean score in - mean score out) / std against the mu the claim's accounting assumes
for a worst-case example (sqrt(steps) / z_eff for a 2C or C change): mu measured well above mu
claimed means the accounting under-counts the noise's job.
"""
from __future__ import annotations

if __name__ == "__main__":  # before edp_tf loads TensorFlow: its native logs read the setting once
    from edp_nlu import cli

    cli.quiet_unless_verbose()

import dataclasses
import json
import math
import os
import time
from typing import Optional

import numpy as np
from absl import flags, logging

from edp_tf import DPConfig, PrivateModel, accounting, auditing, make_strategy
from edp_tf.ledger import write_json_atomically
from edp_tf.mechanism import effective_noise_multiplier, sensitivity

MECHANISMS = {
    # name: (microbatch_size, noise_mode, claim, privacy_unit); replicas come from --replicas
    "default": (2, "calibrated", "honest", "example"),  # eDP, micro-batches of 2
    "dpsgd": (1, "calibrated", "honest", "example"),
    "paper": (None, "paper", "paper-style", "example"),
    # user-level DP-FedSGD, fixed-denominator estimator: a canary user of 2 rows, S = C
    "user": (2, "calibrated", "honest", "user"),
    # DP-AdaFEST (sparse embedding noise) on eDP micro-batches of 2: the canaries are rows of an
    # embedding table; the claim charges the joint multiplier of gradient and row counts
    "adafest": (2, "calibrated", "honest", "example"),
    "adafest_all_rows": (2, "calibrated", "honest", "example"),
    # BandMF (b = BANDMF_BANDS): per-example canaries present at steps 0, b, 2b, ... (their
    # group's), scored through C (see bandmf_scores)
    "bandmf": (1, "calibrated", "honest", "example"),
}
BANDMF_BANDS = 2
# AdaFEST's selection: count noise z_c (DPConfig's default) and threshold in count-noise stds:
# the default 3, or one so low that every row is selected (the gradient release in full)
SELECTION_NOISE_MULTIPLIER = 5.0
SELECTION_THRESHOLDS = {"adafest": 3.0, "adafest_all_rows": -1e9}


@dataclasses.dataclass(frozen=True)
class AuditPlan:
    mechanism: str
    canaries: int
    steps: int
    replicas: int
    target_epsilon: float
    delta: float
    l2_norm_clip: float = 1.0
    beta: float = 0.05
    seed: Optional[int] = None
    runs: int = 1  # independent training runs (fresh noise and inclusion) pooled by --gaussian

    @property
    def microbatch_size(self) -> Optional[int]:
        return MECHANISMS[self.mechanism][0]

    @property
    def noise_mode(self) -> str:
        return MECHANISMS[self.mechanism][1]

    @property
    def claim(self) -> str:
        return MECHANISMS[self.mechanism][2]

    @property
    def privacy_unit(self) -> str:
        return MECHANISMS[self.mechanism][3]

    @property
    def selection_noise_multiplier(self) -> Optional[float]:
        """z_c of AdaFEST's row counts (None: dense noise)."""
        return SELECTION_NOISE_MULTIPLIER if self.mechanism in SELECTION_THRESHOLDS else None

    @property
    def bands(self) -> int:
        return BANDMF_BANDS if self.mechanism == "bandmf" else 1

    @property
    def participations(self) -> int:
        """Steps a canary takes part in: all, or its group's every b-th with BandMF."""
        return -(-self.steps // self.bands)

    @property
    def rows_per_microbatch(self) -> int:
        return 1 if self.microbatch_size == 1 else 2  # canary (+ its partner, or its 2nd row)

    @property
    def sensitivity(self) -> int:
        if self.privacy_unit == "user":
            return 1  # a user is one clipped micro-batch (fixed denominator)
        return sensitivity(self.rows_per_microbatch)

    @property
    def canaries_per_block(self) -> int:
        """Canaries trained together: all of them, except one per replica in paper mode (where a
        replica's whole share is one micro-batch, so two canaries there would share a clip)."""
        return self.replicas if self.microbatch_size is None else self.canaries

    def check(self) -> "AuditPlan":
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"--mechanism must be one of {sorted(MECHANISMS)}, "
                             f"got {self.mechanism!r}")
        for name in ("canaries", "steps", "replicas", "runs"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.canaries % self.replicas:
            raise ValueError(f"--canaries={self.canaries} must be a multiple of "
                             f"--replicas={self.replicas} (every replica gets whole micro-batches)")
        if self.steps % self.bands:
            raise ValueError(f"--steps={self.steps} must be a multiple of the BandMF bands "
                             f"{self.bands}")
        if self.canaries < 20:
            raise ValueError(f"--canaries={self.canaries}: an audit needs at least 20")
        if not self.target_epsilon > 0 or not 0 < self.delta < 1:
            raise ValueError("--target_epsilon must be > 0 and --delta in (0, 1)")
        return self


# ------------------------------------------------------------------------------ accounting
def claimed_records(plan: AuditPlan, z: float, claim: str):
    """The epoch records a claim accounts: `honest` is the ledger's (the noise mode's effective
    multiplier and the mechanism's S); `paper-style` takes z at face value with S = C."""
    if claim == "paper-style":
        return accounting.plan_schedule(z, 1, plan.steps)
    return accounting.plan_schedule(z, 1, plan.steps, noise_mode=plan.noise_mode,
                                    replicas=plan.replicas, sensitivity=plan.sensitivity,
                                    selection_noise_multiplier=plan.selection_noise_multiplier,
                                    bands=plan.bands)


def claimed_epsilon(plan: AuditPlan, z: float, claim: str) -> float:
    # a canary is in every step of its group: rate b q = 1 for BandMF's b groups
    return accounting.compute_epsilon(claimed_records(plan, z, claim), 1.0 / plan.bands,
                                      plan.delta)


def calibrated_z(plan: AuditPlan) -> float:
    """z whose claim (plan.claim) is exactly the target epsilon at sampling rate 1."""
    if plan.claim == "paper-style":
        return accounting.calibrate_noise(plan.target_epsilon, plan.delta, 1.0, 1, plan.steps)
    return accounting.calibrate_noise(
        plan.target_epsilon, plan.delta, 1.0 / plan.bands, 1, plan.steps,
        noise_mode=plan.noise_mode, replicas=plan.replicas, sensitivity=plan.sensitivity,
        selection_noise_multiplier=plan.selection_noise_multiplier, bands=plan.bands)


def claimed_mu(plan: AuditPlan, z: float, claim: str) -> float:
    """Signal-to-noise ratio the claim assumes for a worst-case example over the plan's steps."""
    z_eff = claimed_records(plan, z, claim)[0].effective_noise_multiplier
    return math.inf if z_eff == 0 else math.sqrt(plan.participations) / z_eff


# ------------------------------------------------------------------------------ the run
def canary_batches(plan: AuditPlan, included: np.ndarray):
    """(x, y, w) per block: the rows of every step of that block (each block trains T steps)."""
    m, k = plan.canaries, plan.rows_per_microbatch
    scale = 4.0 * plan.l2_norm_clip * k
    per_block = plan.canaries_per_block
    blocks = []
    for start in range(0, m, per_block):
        ids = np.arange(start, start + per_block)
        x = np.zeros((per_block * k, m), np.float32)
        w = np.zeros((per_block * k,), np.float32)
        x[np.arange(per_block) * k, ids] = scale
        w[np.arange(per_block) * k] = included[ids]  # absent canary = a zero-weight row
        if k == 2 and plan.privacy_unit == "user":  # the canary user's 2nd row: same direction
            x[np.arange(per_block) * k + 1, ids] = scale
            w[np.arange(per_block) * k + 1] = included[ids]
        elif k == 2:
            x[np.arange(per_block) * k + 1, ids] = -0.5 * scale
            w[np.arange(per_block) * k + 1] = 1.0
        blocks.append((ids, x, w))
    return blocks


def run_audit(plan: AuditPlan, noise_multiplier: float, strategy, included: np.ndarray,
              seed: Optional[int] = None) -> dict:
    """Trains the canary model with the plan's mechanism (noise seed `seed`: None draws from
    OS entropy); returns per-canary scores."""
    import keras
    import tensorflow as tf

    plan.check()
    m = plan.canaries
    blocks = canary_batches(plan, included)
    rows = blocks[0][1].shape[0]
    x = np.concatenate([np.repeat(b[1][None], plan.steps, 0) for b in blocks]).reshape(-1, m)
    present = (np.arange(plan.steps) % plan.bands == 0).astype(np.float32)[:, None]
    w = np.concatenate([np.repeat(b[2][None], plan.steps, 0) * present
                        for b in blocks]).reshape(-1)
    y = np.zeros((len(w),), np.float32)
    sparse = plan.selection_noise_multiplier is not None
    if sparse:  # the canary's row of the table, and its gradient <x, e_row> carried by y
        row = np.argmax(np.abs(x), axis=1)
        x, y = row.astype(np.int32)[:, None], x[np.arange(len(row)), row]
    data = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(rows)

    snapshots = []

    class Snapshot(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            snapshots.append(np.array(kernel.numpy()[:, 0], np.float64))

        def on_train_batch_end(self, batch, logs=None):
            if (batch + 1) % plan.steps == 0 or plan.bands > 1:  # BandMF: every step
                snapshots.append(np.array(kernel.numpy()[:, 0], np.float64))

    with strategy.scope():
        if sparse:  # loss y <E, e_row>: its gradient is y at the row, 0 elsewhere
            inputs = keras.Input((1,), dtype="int32")
            table = keras.layers.Embedding(m, 1, embeddings_initializer="zeros", name="canary")
            model = keras.Model(inputs, keras.layers.Flatten()(table(inputs)))
            kernel = table.embeddings
            loss = lambda y_true, y_pred: y_true * y_pred[:, 0]  # noqa: E731
        else:
            inputs = keras.Input((m,))
            dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros",
                                       name="canary")
            model = keras.Model(inputs, dense(inputs))
            kernel = dense.kernel
            loss = lambda y_true, y_pred: y_pred[:, 0]  # noqa: E731
        user = plan.privacy_unit == "user"  # normalised by the expected users, q W: here half
        selection = dict(sparse_embeddings=True,
                         selection_noise_multiplier=plan.selection_noise_multiplier,
                         selection_threshold=SELECTION_THRESHOLDS[plan.mechanism]) if sparse else {}
        config = DPConfig(l2_norm_clip=plan.l2_norm_clip, noise_multiplier=noise_multiplier,
                          microbatch_size=plan.microbatch_size, noise_mode=plan.noise_mode,
                          seed=seed, privacy_unit=plan.privacy_unit,
                          expected_batch_size=(0.5 * plan.canaries_per_block if user else
                                               float(plan.canaries_per_block) if plan.bands > 1
                                               else None),
                          bandmf_bands=plan.bands, **selection)
        private = PrivateModel(model, config)
        private.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0), loss=loss)
    private.fit(data, epochs=1, verbose=0, callbacks=[Snapshot()])
    if plan.bands > 1:  # one block (per-example canaries), a snapshot after every step
        scores = bandmf_scores(np.array(snapshots), private.mechanism.strategy_coefficients,
                               plan.bands)
        return {"scores": scores, "facts": private.privacy_facts()}
    if len(snapshots) != len(blocks) + 1:
        raise RuntimeError(f"expected {len(blocks) + 1} kernel snapshots, got {len(snapshots)}")
    scores = np.zeros(m)
    for b, (ids, _, _) in enumerate(blocks):
        scores[ids] = (snapshots[b] - snapshots[b + 1])[ids]
    return {"scores": scores, "facts": private.privacy_facts()}


def bandmf_scores(snapshots: np.ndarray, coefficients, bands: int) -> np.ndarray:
    """Each canary's score under BandMF: the steps' drops u_t (x_t + y_t over D, y = C^{-1} z)
    mapped back through C, C u = C x + z: the released noise made white again, then summed
    over the rows of C x the canary's participations (steps 0, b, 2b, ...) touch, weighted by
    C's column, sum_s sum_k c_k (C u)_{s+k}: the likelihood-ratio direction, whose in - out
    shift is S C / D per participation (||c|| = 1) over noise z S C / D each."""
    u = snapshots[:-1] - snapshots[1:]  # [T, m]
    steps = len(u)
    white = np.array([sum(coefficients[j] * u[t - j] for j in range(bands) if t - j >= 0)
                      for t in range(steps)])
    return sum(coefficients[k] * white[s + k] for s in range(0, steps, bands)
               for k in range(bands) if s + k < steps)


def measured_mu(scores: np.ndarray, included: np.ndarray) -> float:
    """(mean in - mean out) / pooled std: the audit's signal-to-noise ratio."""
    a, b = scores[included], scores[~included]
    pooled = math.sqrt((a.var(ddof=1) * (len(a) - 1) + b.var(ddof=1) * (len(b) - 1))
                       / (len(a) + len(b) - 2))
    return math.inf if pooled == 0 else float((a.mean() - b.mean()) / pooled)


def expected_score_moments(plan: AuditPlan, z: float) -> tuple:
    """(mean in - mean out, std) of a canary's score if the step is what the ledger says: T steps
    of learning rate 1, each moving w_i by S C / D between in and out, with noise of std
    z_eff S C / D; D the expected micro-batches of a step (one per canary of the block, or half
    the block's users: the expected_batch_size the user-level run is given). z_eff is the
    gradient's own multiplier: AdaFEST's row counts are not in the weights."""
    d = plan.canaries_per_block * (0.5 if plan.privacy_unit == "user" else 1.0)
    z_eff = effective_noise_multiplier(z, plan.noise_mode, plan.replicas, plan.sensitivity)
    step = plan.sensitivity * plan.l2_norm_clip / d
    return plan.participations * step, math.sqrt(plan.participations) * z_eff * step


def signal_and_noise(scores: np.ndarray, included: np.ndarray, plan: AuditPlan,
                     z: float) -> dict:
    """mu's two halves against the ledger's: the shift (in - out) and the std of the scores,
    each as measured / expected with its standard error (a wrong sensitivity or normalisation
    moves the first, a wrong noise scale the second)."""
    shift, std = expected_score_moments(plan, z)
    a, b = scores[included], scores[~included]
    df = len(a) + len(b) - 2
    pooled = math.sqrt((a.var(ddof=1) * (len(a) - 1) + b.var(ddof=1) * (len(b) - 1)) / df)
    out = {"shift_expected": shift, "std_expected": std,
           "std_measured_over_expected": pooled / std if std else math.inf,
           "std_ratio_se": 1.0 / math.sqrt(2.0 * df)}
    out["shift_measured_over_expected"] = float(a.mean() - b.mean()) / shift
    out["shift_ratio_se"] = pooled * math.sqrt(1 / len(a) + 1 / len(b)) / shift
    return out


def run_seed(plan: AuditPlan, run: int) -> Optional[int]:
    """Run r's seed (noise and inclusion): plan.seed + r, or None (OS entropy) without one."""
    return None if plan.seed is None else plan.seed + run


def one_run(plan: AuditPlan, z: float, strategy, run: int,
            cache_dir: Optional[str] = None) -> dict:
    """Run r of the plan: draws the inclusions, trains, scores. With cache_dir its scores are kept
    in run<r>.npz and reused by a later call with the same plan (whatever its run count) and z,
    so an interrupted audit resumes and more runs can be added."""
    key = json.dumps({"plan": dataclasses.asdict(plan) | {"runs": None}, "z": z, "run": run},
                     sort_keys=True)
    path = os.path.join(cache_dir, f"run{run}.npz") if cache_dir else None
    if path and os.path.exists(path):
        with np.load(path) as cached:
            if str(cached["key"]) == key:
                return {"scores": cached["scores"], "included": cached["included"],
                        "facts": json.loads(str(cached["facts"])),
                        "seconds": float(cached["seconds"])}
    rng = np.random.default_rng(run_seed(plan, run))
    included = rng.random(plan.canaries) < 0.5
    started = time.time()
    out = run_audit(plan, z, strategy, included, run_seed(plan, run))
    facts = {name: out["facts"][name] for name in ("replicas", "sensitivity")}
    result = {"scores": out["scores"], "included": included, "facts": facts,
              "seconds": time.time() - started}
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        partial = path + ".partial.npz"
        np.savez(partial, key=key, scores=result["scores"], included=included,
                 facts=json.dumps(facts), seconds=result["seconds"])
        os.replace(partial, path)
    return result


def command_line(plan: AuditPlan, gaussian: bool) -> str:
    """The command that reproduces an audit with this plan."""
    parts = ["python -m tools.audit", f"--mechanism={plan.mechanism}",
             f"--target_epsilon={plan.target_epsilon:g}", f"--canaries={plan.canaries}",
             f"--steps={plan.steps}", f"--replicas={plan.replicas}", f"--delta={plan.delta:g}"]
    if plan.seed is not None:
        parts.append(f"--seed={plan.seed}")
    if gaussian:
        parts += [f"--runs={plan.runs}", "--gaussian"]
    return " ".join(parts)


def audit_mechanism(plan: AuditPlan, strategy, noise_multiplier: Optional[float] = None,
                    gaussian: bool = False, cache_dir: Optional[str] = None) -> dict:
    """One audit: calibrate z to the plan's claim (unless given), train plan.runs times, score,
    bound. The one-run bound uses the first run only (it is a one-run audit); the Gaussian audit
    (gaussian=True) pools the canaries of every run."""
    plan.check()
    z = calibrated_z(plan) if noise_multiplier is None else float(noise_multiplier)
    runs = [one_run(plan, z, strategy, r, cache_dir) for r in range(plan.runs)]
    first = runs[0]
    scores, included = first["scores"], first["included"]
    result = auditing.audit(scores, included, plan.delta, plan.beta)
    honest = claimed_epsilon(plan, z, "honest")
    claimed = claimed_epsilon(plan, z, plan.claim)
    mu_claimed = claimed_mu(plan, z, plan.claim)
    report = {
        "mechanism": plan.mechanism, "claim": plan.claim,
        "plan": dataclasses.asdict(plan), "noise_multiplier": z,
        "claimed_epsilon": claimed,
        "ledger_epsilon": honest,
        "epsilon_lower_bound": result.epsilon_lower_bound,
        "lower_bound_exceeds_claim": result.epsilon_lower_bound > claimed,
        "guesses": result.guesses, "correct": result.correct, "k": result.k,
        "mu_measured": measured_mu(scores, included),
        "mu_claimed": mu_claimed,
        "mu_ledger": claimed_mu(plan, z, "honest"),
        "replicas_run": first["facts"]["replicas"],
        "sensitivity_run": first["facts"]["sensitivity"],
        "seconds": round(sum(r["seconds"] for r in runs), 1),
        "command": command_line(plan, gaussian),
    }
    if gaussian:
        pooled = np.concatenate([r["scores"] for r in runs])
        pooled_in = np.concatenate([r["included"] for r in runs])
        g = auditing.gaussian_audit(pooled, pooled_in, plan.delta, 1.0 - plan.beta)
        report["gaussian"] = g.to_dict() | {
            "runs": plan.runs, "canaries": len(pooled),
            "refutes_claim": g.epsilon_lower_bound > claimed,
            # the claim's epsilon read as mu-GDP: it equals claimed_epsilon when the claim is
            # the Gaussian mechanism composed over the canary's steps (no sampling), as here
            "claimed_epsilon_of_mu_claimed": auditing.gdp_epsilon(mu_claimed, plan.delta),
            "epsilon_of_mu_ledger": auditing.gdp_epsilon(report["mu_ledger"], plan.delta),
            "mu_per_run": [measured_mu(r["scores"], r["included"]) for r in runs],
        } | signal_and_noise(pooled, pooled_in, plan, z)
    return report


# ------------------------------------------------------------------------------ command
def define_flags() -> None:
    """Defined only when run as a command: other trainers use the same flag names and tests
    import several of them into one process."""
    flags.DEFINE_enum("mechanism", "default", sorted(MECHANISMS), "Mechanism to audit.")
    flags.DEFINE_float("target_epsilon", 2.0, "Calibrate z so the mechanism's claim says this.")
    flags.DEFINE_integer("canaries", 1000, "Canaries m (each included w.p. 1/2).")
    flags.DEFINE_integer("steps", 4, "Steps each canary's block trains.")
    flags.DEFINE_integer("replicas", 2, "Replicas (the default job's: 2).")
    flags.DEFINE_float("delta", 1e-5, "Delta of the claim and of the bound.")
    flags.DEFINE_integer("seed", None, "Fix the noise and canary seeds (reproducible audit).")
    flags.DEFINE_string("out", "results/audit",
                        "Directory for <mechanism>_eps<target>.json and table.md.")
    flags.DEFINE_bool("gaussian", False, "Also run the white-box Gaussian audit: mu of the "
                      "canaries' scores over --runs runs, and the epsilon lower bound of mu-GDP.")
    flags.DEFINE_integer("runs", 1, "Independent training runs pooled by --gaussian (the "
                         "one-run bound uses the first).")
    flags.DEFINE_string("cache_dir", None, "Keep each run's scores here and reuse them "
                        "(resumable); default <out>/scores/<mechanism>_eps<target>.")


def _number(value, digits: int = 3) -> str:
    return "inf" if value is not None and math.isinf(value) else f"{value:.{digits}g}"


def write_table(out_dir: str) -> str:
    rows = []
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".json"):
            with open(os.path.join(out_dir, name)) as f:
                rows.append(json.load(f))
    lines = [
        "# White-box audits of the private step", "",
        "Generated by `python -m tools.audit` (the command of each row is in its last column). "
        "Gradient canaries, sampling rate 1 (every canary in "
        "every step of its block: the mechanism *without* amplification by subsampling, and the "
        "claim recomputed for that inclusion pattern), constant noise, delta 1e-5, 95% "
        "confidence. docs/privacy.md (Auditing) says what each bound assumes.", "",
        "* **one-run bound**: Steinke, Nasr, Jagielski (2023) on the first run's canaries; "
        "distribution-free, loose.",
        "* **Gaussian bound**: gdp_epsilon(mu_low, delta), with mu_low the 95% lower confidence "
        "limit of the canaries' signal-to-noise ratio mu over every run (exact noncentral-t "
        "limits); assumes Gaussian scores of equal variance (normality / equal-variance p-values "
        "in the checks column). A bound above the claimed epsilon refutes the claim.",
        "* **mu claimed**: sqrt(steps) / z_eff of the claim's accounting for a worst-case example; "
        "**mu measured**: (mean score in - out) / pooled std, with its one-sided 95% limits.",
        "* **std, shift / expected**: the scores' pooled std and their in - out shift over what "
        "the step should give (noise z_eff S C / D and signal S C / D per step, z_eff the "
        "gradient's own multiplier), +- one standard error: a wrong noise scale moves the first, "
        "a wrong sensitivity or normalisation the second.", "",
        "| mechanism | claim | z | claimed eps | ledger eps | one-run bound | Gaussian bound "
        "(95%) | Gaussian estimate | mu claimed | mu measured [low, high] | runs x canaries "
        "| checks p (normal, equal var) | std, shift / expected | s | command |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["plan"]
        g = r.get("gaussian")
        if g:
            gauss = (f"**{_number(g['epsilon_lower_bound'])}**", _number(g["epsilon_estimate"]),
                     f"{_number(g['mu_hat'])} [{_number(g['mu_low'])}, "
                     f"{_number(g['mu_high'])}]",
                     f"{g['runs']} x {p['canaries']}",
                     f"{g['normality_p']:.2g}, {g['equal_variance_p']:.2g}",
                     f"{g['std_measured_over_expected']:.3f} +- {g['std_ratio_se']:.3f}, "
                     f"{g['shift_measured_over_expected']:.3f} +- {g['shift_ratio_se']:.3f}"
                     if "std_ratio_se" in g else "")
        else:
            gauss = ("not run", "", f"{_number(r['mu_measured'])} (one run)",
                     f"1 x {p['canaries']}", "", "")
        command = r.get("command") or command_line(AuditPlan(**p), False)
        lines.append(
            f"| {r['mechanism']} | {r['claim']} | {r['noise_multiplier']:.4g} | "
            f"{_number(r['claimed_epsilon'])} | {_number(r['ledger_epsilon'])} | "
            f"{_number(r['epsilon_lower_bound'])} | {gauss[0]} | {gauss[1]} | "
            f"{_number(r['mu_claimed'])} | {gauss[2]} | {gauss[3]} | {gauss[4]} | {gauss[5]} | "
            f"{r['seconds']} | `{command}` |")
    if any(r["mechanism"] in SELECTION_THRESHOLDS for r in rows):
        lines += ["", "AdaFEST rows: the canaries are rows of an embedding table (micro-batches "
                  "of 2 with a partner on the same row). The claim charges the joint multiplier "
                  "of the gradient and the noisy row counts, (z^-2 + z_c^-2)^-1/2 with z_c = "
                  f"{SELECTION_NOISE_MULTIPLIER:g}; the weights show only the selected rows' noisy "
                  "gradient, never the counts. `adafest` (threshold 3 count-noise stds, the "
                  "default) selects a canary's row in well under 1% of steps, so its scores are "
                  "almost all exactly 0 (normality rejected): not auditable from the weights. "
                  "`adafest_all_rows` selects every row, so the gradient release is seen in full; "
                  "its mu can reach only sqrt(steps) / z, below the claimed joint mu."]
    if any(r["mechanism"] == "bandmf" for r in rows):
        lines += ["", f"BandMF rows: b = {BANDMF_BANDS} bands, the canaries present at their "
                  "group's steps 0, b, 2b, ... (sampling rate 1 within the group, rate b q = 1 in "
                  "the claim, which composes ceil(steps / b) Gaussians: mu claimed is "
                  "sqrt(ceil(steps / b)) / z). Each score maps the steps' updates back through "
                  "C (C u = C x + z: the released noise made white again) and sums the rows the "
                  "canary's participations touch, weighted by C's column; a step whose noise "
                  "ignored its history, or was drawn on every replica, would show std / expected "
                  "of 1.3 or 1.4 (tests/audit_test.py)."]
    path = os.path.join(out_dir, "table.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # strategy and all-reduce chatter

    f = flags.FLAGS
    plan = AuditPlan(f.mechanism, f.canaries, f.steps, f.replicas, f.target_epsilon, f.delta,
                     seed=f.seed, runs=f.runs).check()
    if plan.runs > 1 and not f.gaussian:
        raise ValueError("--runs > 1 needs --gaussian (the one-run bound uses one run)")
    strategy = make_strategy(plan.replicas)
    name = f"{plan.mechanism}_eps{plan.target_epsilon:g}"
    cache = f.cache_dir or (os.path.join(f.out, "scores", name) if f.gaussian else None)
    result = audit_mechanism(plan, strategy, gaussian=f.gaussian, cache_dir=cache)
    os.makedirs(f.out, exist_ok=True)
    write_json_atomically(os.path.join(f.out, name + ".json"), result, True)
    table = write_table(f.out)
    gaussian = ""
    if f.gaussian:
        g = result["gaussian"]
        gaussian = (f"; Gaussian lower bound {_number(g['epsilon_lower_bound'])} (95%, mu "
                    f"{_number(g['mu_hat'])} in [{_number(g['mu_low'])}, "
                    f"{_number(g['mu_high'])}], {plan.runs} x {plan.canaries} canaries)")
    print(f"{plan.mechanism}: claimed epsilon {result['claimed_epsilon']:.3g} ({plan.claim}), "
          f"ledger {result['ledger_epsilon']:.3g}; one-run lower bound "
          f"{result['epsilon_lower_bound']:.3g} (95%){gaussian}; mu claimed "
          f"{result['mu_claimed']:.3g}. Table: {table}", flush=True)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
