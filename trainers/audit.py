"""`python -m trainers.audit`: a one-run white-box audit of the private step (Steinke et al. 2023).

    python -m trainers.audit --mechanism=default   # eDP, micro-batches of 2, claimed eps 2
    python -m trainers.audit --mechanism=paper     # Algorithm 1 as written, whose *paper-style*
                                                   # accounting (noise at face value, S = C) says 2
    python -m trainers.audit --mechanism=dpsgd --target_epsilon=8   # the default job's mechanism

What runs is `PrivateModel.train_step` itself (clipping, ghost norms, per-replica noise, the
replicas' SUM, the normalisation), on a model built so that each training example is a gradient
canary: the loss of an example with input x is <w, x>, so its gradient is x, whatever w is.
Canary i has x = 4 C k e_i (k: rows per micro-batch), so it is always clipped to C e_i; it is
included with probability 1/2. In micro-batch modes each canary shares its micro-batch with a
"partner" x = -2 C k e_i that is always present: with the canary the micro-batch clips to +C e_i,
without it to -C e_i, the 2C change that makes S = 2 for micro-batches of k >= 2 (per-example
DP-SGD has no partner: S = 1). Each canary's score is the drop of w_i over the steps its
micro-batch was trained on (plain SGD, learning rate 1: the drop is the sum of the noisy
updates). Every canary is in every step of its block (sampling rate 1): the audit tests the step
and its noise, not the amplification by Poisson sampling, whose accounting dp-accounting owns.

It reports (i) the epsilon lower bound at 95% confidence beside the claimed epsilon, and (ii) the
measured signal-to-noise ratio mu = (mean score in - mean score out) / std against the mu the
claim's accounting assumes for a worst-case example (sqrt(steps) / z_eff for a 2C or C change):
mu measured well above mu claimed means the accounting under-counts the noise's job.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Optional

import numpy as np
from absl import app, flags, logging

MECHANISMS = {
    # name: (microbatch_size, noise_mode, claim); replicas come from --replicas
    "default": (2, "calibrated", "honest"),  # eDP, micro-batches of 2
    "dpsgd": (1, "calibrated", "honest"),
    "paper": (None, "paper", "paper-style"),
}


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
    def rows_per_microbatch(self) -> int:
        return 1 if self.microbatch_size == 1 else 2  # canary (+ its partner)

    @property
    def sensitivity(self) -> int:
        from edp_tf.mechanism import sensitivity

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
        for name in ("canaries", "steps", "replicas"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.canaries % self.replicas:
            raise ValueError(f"--canaries={self.canaries} must be a multiple of "
                             f"--replicas={self.replicas} (every replica gets whole micro-batches)")
        if self.canaries < 20:
            raise ValueError(f"--canaries={self.canaries}: an audit needs at least 20")
        if not self.target_epsilon > 0 or not 0 < self.delta < 1:
            raise ValueError("--target_epsilon must be > 0 and --delta in (0, 1)")
        return self


# ------------------------------------------------------------------------------ accounting
def claimed_records(plan: AuditPlan, z: float, claim: str):
    """The epoch records a claim accounts: `honest` is the ledger's (the noise mode's effective
    multiplier and the mechanism's S); `paper-style` takes z at face value with S = C."""
    from edp_tf import accounting

    if claim == "paper-style":
        return accounting.plan_schedule(z, 1, plan.steps)
    return accounting.plan_schedule(z, 1, plan.steps, noise_mode=plan.noise_mode,
                                    replicas=plan.replicas, sensitivity=plan.sensitivity)


def claimed_epsilon(plan: AuditPlan, z: float, claim: str) -> float:
    from edp_tf import accounting

    return accounting.compute_epsilon(claimed_records(plan, z, claim), 1.0, plan.delta)


def calibrated_z(plan: AuditPlan) -> float:
    """z whose claim (plan.claim) is exactly the target epsilon at sampling rate 1."""
    from edp_tf import accounting

    if plan.claim == "paper-style":
        return accounting.calibrate_noise(plan.target_epsilon, plan.delta, 1.0, 1, plan.steps)
    return accounting.calibrate_noise(
        plan.target_epsilon, plan.delta, 1.0, 1, plan.steps, noise_mode=plan.noise_mode,
        replicas=plan.replicas, sensitivity=plan.sensitivity)


def claimed_mu(plan: AuditPlan, z: float, claim: str) -> float:
    """Signal-to-noise ratio the claim assumes for a worst-case example over the plan's steps."""
    z_eff = claimed_records(plan, z, claim)[0].effective_noise_multiplier
    return math.inf if z_eff == 0 else math.sqrt(plan.steps) / z_eff


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
        if k == 2:
            x[np.arange(per_block) * k + 1, ids] = -0.5 * scale
            w[np.arange(per_block) * k + 1] = 1.0
        blocks.append((ids, x, w))
    return blocks


def run_audit(plan: AuditPlan, noise_multiplier: float, strategy, included: np.ndarray) -> dict:
    """Trains the canary model with the plan's mechanism; returns per-canary scores."""
    import keras
    import tensorflow as tf

    from edp_tf import DPConfig, PrivateModel

    plan.check()
    m = plan.canaries
    blocks = canary_batches(plan, included)
    rows = blocks[0][1].shape[0]
    x = np.concatenate([np.repeat(b[1][None], plan.steps, 0) for b in blocks]).reshape(-1, m)
    w = np.concatenate([np.repeat(b[2][None], plan.steps, 0) for b in blocks]).reshape(-1)
    y = np.zeros((len(w),), np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(rows)

    snapshots = []

    class Snapshot(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            snapshots.append(np.array(kernel.numpy()[:, 0], np.float64))

        def on_train_batch_end(self, batch, logs=None):
            if (batch + 1) % plan.steps == 0:
                snapshots.append(np.array(kernel.numpy()[:, 0], np.float64))

    with strategy.scope():
        inputs = keras.Input((m,))
        dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="canary")
        model = keras.Model(inputs, dense(inputs))
        kernel = dense.kernel
        config = DPConfig(l2_norm_clip=plan.l2_norm_clip, noise_multiplier=noise_multiplier,
                          microbatch_size=plan.microbatch_size, noise_mode=plan.noise_mode,
                          seed=plan.seed)
        private = PrivateModel(model, config)
        private.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0),
                        loss=lambda y_true, y_pred: y_pred[:, 0])
    private.fit(data, epochs=1, verbose=0, callbacks=[Snapshot()])
    if len(snapshots) != len(blocks) + 1:
        raise RuntimeError(f"expected {len(blocks) + 1} kernel snapshots, got {len(snapshots)}")
    scores = np.zeros(m)
    for b, (ids, _, _) in enumerate(blocks):
        scores[ids] = (snapshots[b] - snapshots[b + 1])[ids]
    return {"scores": scores, "facts": private.privacy_facts()}


def measured_mu(scores: np.ndarray, included: np.ndarray) -> float:
    """(mean in - mean out) / pooled std: the audit's signal-to-noise ratio."""
    a, b = scores[included], scores[~included]
    pooled = math.sqrt((a.var(ddof=1) * (len(a) - 1) + b.var(ddof=1) * (len(b) - 1))
                       / (len(a) + len(b) - 2))
    return math.inf if pooled == 0 else float((a.mean() - b.mean()) / pooled)


def audit_mechanism(plan: AuditPlan, strategy, noise_multiplier: Optional[float] = None) -> dict:
    """One audit: calibrate z to the plan's claim (unless given), train, score, bound."""
    from edp_tf import auditing

    plan.check()
    z = calibrated_z(plan) if noise_multiplier is None else float(noise_multiplier)
    rng = np.random.default_rng(plan.seed)
    included = rng.random(plan.canaries) < 0.5
    started = time.time()
    out = run_audit(plan, z, strategy, included)
    result = auditing.audit(out["scores"], included, plan.delta, plan.beta)
    honest = claimed_epsilon(plan, z, "honest")
    return {
        "mechanism": plan.mechanism, "claim": plan.claim,
        "plan": dataclasses.asdict(plan), "noise_multiplier": z,
        "claimed_epsilon": claimed_epsilon(plan, z, plan.claim),
        "ledger_epsilon": honest,
        "epsilon_lower_bound": result.epsilon_lower_bound,
        "lower_bound_exceeds_claim": result.epsilon_lower_bound > claimed_epsilon(
            plan, z, plan.claim),
        "guesses": result.guesses, "correct": result.correct, "k": result.k,
        "mu_measured": measured_mu(out["scores"], included),
        "mu_claimed": claimed_mu(plan, z, plan.claim),
        "mu_ledger": claimed_mu(plan, z, "honest"),
        "replicas_run": out["facts"]["replicas"],
        "sensitivity_run": out["facts"]["sensitivity"],
        "seconds": round(time.time() - started, 1),
    }


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


def write_table(out_dir: str) -> str:
    rows = []
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".json"):
            with open(os.path.join(out_dir, name)) as f:
                rows.append(json.load(f))
    lines = [
        "# One-run audit of the private step (Steinke, Nasr, Jagielski 2023)", "",
        "Generated by `python -m trainers.audit --mechanism=<name>`; one run per row, sampling "
        "rate 1 (every canary in every step of its block), constant noise, 95% confidence.", "",
        "| mechanism | claim | z | claimed eps | ledger eps | eps lower bound | guesses (correct) "
        "| mu measured | mu claimed | mu ledger | canaries | steps | replicas | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["plan"]
        lines.append(
            f"| {r['mechanism']} | {r['claim']} | {r['noise_multiplier']:.4g} | "
            f"{r['claimed_epsilon']:.3g} | {r['ledger_epsilon']:.3g} | "
            f"**{r['epsilon_lower_bound']:.3g}** | {r['guesses']} ({r['correct']}) | "
            f"{r['mu_measured']:.3g} | {r['mu_claimed']:.3g} | {r['mu_ledger']:.3g} | "
            f"{p['canaries']} | {p['steps']} | {p['replicas']} | {r['seconds']} |")
    lines += ["", "mu: (mean score of included - excluded canaries) / std. The claim's accounting "
              "assumes mu = sqrt(steps) / z_eff for a worst-case example; a measured mu above it "
              "means the claim counts more noise than protects that example."]
    path = os.path.join(out_dir, "table.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # strategy and all-reduce chatter
    from edp_tf import make_strategy
    from edp_tf.ledger import write_json_atomically

    f = flags.FLAGS
    plan = AuditPlan(f.mechanism, f.canaries, f.steps, f.replicas, f.target_epsilon, f.delta,
                     seed=f.seed).check()
    strategy = make_strategy(plan.replicas)
    result = audit_mechanism(plan, strategy)
    os.makedirs(f.out, exist_ok=True)
    name = f"{plan.mechanism}_eps{plan.target_epsilon:g}.json"
    write_json_atomically(os.path.join(f.out, name), result, True)
    table = write_table(f.out)
    print(f"{plan.mechanism}: claimed epsilon {result['claimed_epsilon']:.3g} ({plan.claim}), "
          f"ledger {result['ledger_epsilon']:.3g}; audit lower bound "
          f"{result['epsilon_lower_bound']:.3g} (95%); mu measured {result['mu_measured']:.3g} "
          f"vs claimed {result['mu_claimed']:.3g}. Table: {table}", flush=True)


if __name__ == "__main__":
    from trainers import cli

    cli.quiet_unless_verbose()
    define_flags()
    cli.run(main)
