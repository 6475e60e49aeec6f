"""The run directory: its files, written atomically, and which of them epsilon covers.

    config.json     the resolved config, n, the data source and delta (written once)
    state.json      epochs done, z0, steps per epoch, the per-layer scales (after every epoch)
    metrics.json    dev metrics per epoch, test metrics, unseen labels (diagnostics when asked)
    privacy.json    the ledger (edp_tf.ledger), written *before* the checkpoint of an epoch
    checkpoints/, saved_model/, preprocessor.json, label_schema.json, tensorboard/
"""
from __future__ import annotations

import json
import os
import time

import ml_collections

from edp_tf import ledger as ledger_lib

CONFIG_FILE = "config.json"
STATE_FILE = "state.json"
METRICS_FILE = "metrics.json"


def default_run_dir(config) -> str:
    return os.path.join("runs", f"{config.name}-{config.mechanism}-{time.strftime('%Y%m%d-%H%M%S')}")


def load_run_config(run_dir: str) -> ml_collections.ConfigDict:
    path = os.path.join(run_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"--resume: no {CONFIG_FILE} in run directory {run_dir}")
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f)["config"])


def write_json(path: str, payload) -> None:
    """Atomic: a reader (or a crash) never sees half a file."""
    ledger_lib.write_json_atomically(path, payload, sort_keys=True)


def read_json(path: str, default=None):
    if not os.path.isfile(path):
        return default
    with open(path) as f:
        return json.load(f)


def artifacts(diagnostics: bool, labels) -> dict:
    """Which run-directory files epsilon covers, and which are diagnostics of the private data."""
    covered = ["checkpoints/ (weights and optimizer state)", "saved_model/ (serving export)",
               "metrics.json: dev and test metrics (computed on data that is not training data)",
               "config.json", "state.json", "privacy.json", "label_schema.json"]
    not_covered = []
    if labels.from_training_data:
        covered.remove("label_schema.json")
        not_covered.append("label_schema.json, preprocessor.json and the label names in "
                           "saved_model/: the label sets come from the training split")
    if diagnostics:
        not_covered += [
            "metrics.json: epochs[].train (training loss, preclip_norm, clipped_fraction, "
            "nonfinite_microbatches), train_encoding, membership_inference and "
            "membership_inference_dev (training losses)",
            "tensorboard/ (the same training statistics)"]
    return {"covered": covered, "not_covered": not_covered, "diagnostics_released": diagnostics}
