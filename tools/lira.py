"""`python -m tools.lira`: offline LiRA (Carlini et al. 2022) against CLC on a SNIPS subset.

    python -m tools.lira --mechanism=sgd        # 17 models, plain training
    python -m tools.lira --mechanism=dpsgd      # the same, per-example DP-SGD at epsilon 8
    python -m tools.lira --report               # table of what has finished

A pool of `--pool` SNIPS training utterances (a fixed random subset) and `--models` models, each
trained (edp_nlu/configs/snips_clc.py's recipe for its data size) on an independent half of the
pool: every utterance is in about half of the models. Each model in turn is the target and the
others are the attacker's shadow models; offline LiRA scores utterance i against target j by how far
its log-likelihood under j lies above the Gaussian fitted to its log-likelihoods under the shadows
that did NOT train on it: (phi_j(i) - mean_out(i)) / std_out(i). The ROC over all (utterance,
target) pairs gives the TPR at 0.1% and 1% FPR. Resumable: each finished model's losses are saved
(as numbers, in `--work_dir`, never text) and skipped next time. The label schema comes from the
full SNIPS training split (a public benchmark), so every model has the same output layers.
"""
from __future__ import annotations

if __name__ == "__main__":  # before edp_tf loads TensorFlow: its native logs read the setting once
    from edp_nlu import cli

    cli.quiet_unless_verbose()

import json
import os
import time

import numpy as np
from absl import app, flags, logging

from edp_nlu.configs import config_file
from edp_nlu.data import encoding
from edp_nlu.data import schema as schema_lib
from edp_nlu.pipeline import builders, training
from edp_nlu.pipeline.run_spec import RunSpec
from edp_nlu.scoring import predictions
from edp_tf import attacks, make_strategy
from edp_tf.ledger import write_json_atomically


def define_flags() -> None:
    """Defined only when run as a command (other trainers use the same flag names)."""
    flags.DEFINE_enum("mechanism", "sgd", ["sgd", "dpsgd"], "Training of every model.")
    flags.DEFINE_integer("models", 17, "Models (each the target once; >= 17: 16 shadows).")
    flags.DEFINE_integer("pool", 2000, "SNIPS training utterances in the pool.")
    flags.DEFINE_float("target_epsilon", 8.0, "Epsilon of the dpsgd models.")
    flags.DEFINE_string("config", "edp_nlu/configs/snips_clc.py",
                        "Config of every model (a file, or a packaged config's name).")
    flags.DEFINE_string("work_dir", "runs/lira", "Per-model losses and run directories.")
    flags.DEFINE_string("out", "results/lira", "Where table.md and <mechanism>.json go.")
    flags.DEFINE_bool("report", False, "Only rewrite the report from finished models.")
    flags.DEFINE_list("set", [], "Config overrides field=value for every model, e.g. "
                      "--set=epochs=40,batch_size=32 (recorded in the report).")


POOL_SEED, MASK_SEED = 20261123, 7


def membership_masks(models: int, pool: int) -> np.ndarray:
    """[models, pool] booleans: model j trains on utterance i. Fixed (public) seed: the masks are
    the experiment's design, not secret."""
    return np.random.default_rng(MASK_SEED).random((models, pool)) < 0.5


def lira_scores(log_likelihoods: np.ndarray, masks: np.ndarray, min_out: int = 4):
    """Offline LiRA: per (target j, utterance i), the z-score of phi_j(i) against the shadows
    (every model but j) that did not train on i. Returns (scores, is_member), pairs with fewer
    than `min_out` such shadows dropped."""
    models, pool = log_likelihoods.shape
    scores, members = [], []
    for j in range(models):
        shadows = np.ones(models, bool)
        shadows[j] = False
        for i in range(pool):
            out = log_likelihoods[shadows & ~masks[:, i], i]
            if len(out) < min_out:
                continue
            std = max(float(out.std(ddof=1)), 1e-6)
            scores.append((log_likelihoods[j, i] - out.mean()) / std)
            members.append(bool(masks[j, i]))
    return np.asarray(scores), np.asarray(members)


def summarise(log_likelihoods: np.ndarray, masks: np.ndarray) -> dict:
    scores, members = lira_scores(log_likelihoods, masks)
    summary = attacks.attack_summary(scores[members], scores[~members])
    summary["roc"] = attacks.roc_points(scores[members], scores[~members])
    summary["pairs"] = int(len(scores))
    return summary


def _pool(config):
    splits = builders.load_splits(RunSpec.parse(config).data)
    if flags.FLAGS.pool > len(splits.train):
        raise ValueError(f"--pool={flags.FLAGS.pool} exceeds the {len(splits.train)} training "
                         f"utterances of {config.data_dir}")
    order = np.random.default_rng(POOL_SEED).permutation(len(splits.train))
    index = np.sort(order[:flags.FLAGS.pool])
    return splits, [splits.train[i] for i in index]


def _train_one(j: int, config, splits, pool, masks, strategy) -> dict:
    import dataclasses

    member_split = dataclasses.replace(
        splits, train=tuple(u for u, m in zip(pool, masks[j]) if m),
        source=f"{splits.source}, LiRA pool subset (model {j})")

    def pool_losses(model, preprocessor):
        enc = encoding.encode(preprocessor, pool, "lira pool")
        return predictions.per_example_losses(model, enc.x, enc.y)

    run_dir = os.path.join(flags.FLAGS.work_dir, flags.FLAGS.mechanism, f"model_{j:02d}")
    if os.path.exists(os.path.join(run_dir, "config.json")):  # an interrupted model: start over
        import shutil

        shutil.rmtree(run_dir)
    summary = training.train(config, run_dir, strategy=strategy, splits=member_split,
                             after_training=pool_losses, export=False)
    return summary


def _losses_path(j: int) -> str:
    return os.path.join(flags.FLAGS.work_dir, flags.FLAGS.mechanism, f"losses_{j:02d}.json")


def _finished(models: int) -> dict:
    done = {}
    for j in range(models):
        path = _losses_path(j)
        if os.path.isfile(path):
            with open(path) as f:
                done[j] = json.load(f)
    return done


def write_report(out_dir: str) -> str:
    rows = []
    for name in ("sgd", "dpsgd"):
        path = os.path.join(out_dir, f"{name}.json")
        if os.path.isfile(path):
            with open(path) as f:
                rows.append(json.load(f))
    lines = ["# Offline LiRA against CLC on a SNIPS subset", "",
             "Overrides per mechanism: " + "; ".join(
                 f"{r['mechanism']}: {' '.join(r.get('overrides') or []) or 'none'}" for r in rows),
             "",
             "Generated by `python -m tools.lira --mechanism=<sgd|dpsgd>`. Each model is the "
             "target once; the others are its shadows. Scores: z-score of the target's "
             "log-likelihood against the shadows that did not train on the utterance.", "",
             "| mechanism | models | pool | pairs | AUC | TPR at 0.1% FPR | TPR at 1% FPR | "
             "epsilon (delta) | mean test SER | s per model |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        eps = "not private" if r["mechanism"] == "sgd" else f"{r['epsilon']:.3g} ({r['delta']:.2g})"
        a = r["attack"]
        lines.append(f"| {r['mechanism']} | {r['models']} | {r['pool']} | {a['pairs']} | "
                     f"{a['auc']:.3f} | {a['tpr_at_0.1pct_fpr']:.4f} | "
                     f"{a['tpr_at_1pct_fpr']:.4f} | "
                     f"{eps} | {r['mean_test_ser']:.3f} | {r['seconds_per_model']:.0f} |")
    path = os.path.join(out_dir, "table.md")
    os.makedirs(out_dir, exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main(argv):
    del argv
    from ml_collections import config_flags  # noqa: F401  (configs import it)

    if flags.FLAGS.models < 17:
        raise app.UsageError(f"--models={flags.FLAGS.models}: LiRA needs >= 17 (16 shadows each)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("lira_config", config_file(flags.FLAGS.config))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    os.makedirs(os.path.join(flags.FLAGS.work_dir, flags.FLAGS.mechanism), exist_ok=True)
    splits, pool = _pool(config)
    schema_path = os.path.join(flags.FLAGS.work_dir, "label_schema.json")
    schema_lib.write_schema(schema_path, schema_lib.schema_from_training_data(splits.train))
    with config.unlocked():
        config.mechanism = flags.FLAGS.mechanism
        config.target_epsilon = (flags.FLAGS.target_epsilon if flags.FLAGS.mechanism != "sgd"
                                 else 0.0)
        config.label_schema = schema_path
        config.diagnostics = False
        for item in flags.FLAGS.set:
            field, _, value = item.partition("=")
            if field not in config:
                raise app.UsageError(f"--set: {field!r} is not a field of {flags.FLAGS.config}")
            config[field] = type(config[field])(value)
    masks = membership_masks(flags.FLAGS.models, len(pool))
    done = _finished(flags.FLAGS.models)
    if not flags.FLAGS.report:
        strategy = make_strategy(int(config.replicas))
        for j in range(flags.FLAGS.models):
            if j in done:
                continue
            started = time.time()
            summary = _train_one(j, config, splits, pool, masks, strategy)
            done[j] = {"loss": [float(v) for v in summary["after_training"]],
                       "test": summary["test"], "decoding": summary["decoding"],
                       "epsilon": summary["epsilon"],
                       "delta": summary["delta"], "seconds": round(time.time() - started, 1)}
            write_json_atomically(_losses_path(j), done[j])
            print(f"[{len(done)}/{flags.FLAGS.models}] model {j}: test SER "
                  f"{summary['test'].get('ser', float('nan')):.3f}, {done[j]['seconds']} s",
                  flush=True)
    if len(done) < flags.FLAGS.models:
        print(f"{len(done)} of {flags.FLAGS.models} models finished: no report yet")
        return
    log_likelihoods = -np.asarray([done[j]["loss"] for j in range(flags.FLAGS.models)])
    attack = summarise(log_likelihoods, masks)
    result = {
        "mechanism": flags.FLAGS.mechanism, "models": flags.FLAGS.models, "pool": len(pool),
        "config": flags.FLAGS.config, "overrides": list(flags.FLAGS.set), "attack": attack,
        "epsilon": max((d["epsilon"] or 0.0) for d in done.values()),
        "delta": max(d["delta"] for d in done.values()),
        "mean_test_ser": float(np.mean([d["test"]["ser"] for d in done.values()])),
        # a model's run may have decoded without the BIO constraint
        "decodings": sorted({d.get("decoding", "viterbi") for d in done.values()}),
        "seconds_per_model": float(np.mean([d["seconds"] for d in done.values()])),
    }
    write_json_atomically(os.path.join(flags.FLAGS.out, f"{flags.FLAGS.mechanism}.json"), result)
    print(f"{flags.FLAGS.mechanism}: LiRA AUC {attack['auc']:.3f}, "
          f"TPR {attack['tpr_at_0.1pct_fpr']:.4f} at 0.1% FPR; "
          f"table {write_report(flags.FLAGS.out)}", flush=True)
    logging.info("done")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
