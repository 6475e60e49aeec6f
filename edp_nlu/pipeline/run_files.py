"""The run directory: its files, written atomically, and which of them epsilon covers.

    config.json     the resolved config, n, the data source and delta (written once)
    state.json      epochs done, z0, steps per epoch, the committed checkpoints with their
                    per-layer scales (edp_nlu.pipeline.checkpoints), "finished" after the export
    metrics.json    dev metrics per epoch, test metrics, unseen labels (diagnostics when asked)
    privacy.json    the ledger (edp_tf.ledger), written *before* the checkpoint of an epoch
    checkpoints/, saved_model/ (replaced whole), preprocessor.json, label_schema.json,
    tensorboard/
"""
from __future__ import annotations

import json
import os
import re
import time

import ml_collections

from edp_nlu.data.schema import origin_sentence
from edp_nlu.pipeline import run_spec
from edp_tf import ledger as ledger_lib

CONFIG_FILE = "config.json"
STATE_FILE = "state.json"
METRICS_FILE = "metrics.json"


def default_run_dir(config) -> str:
    return os.path.join(
        "runs", f"{config.name}-{config.mechanism}-{time.strftime('%Y%m%d-%H%M%S')}")


def load_run_config(run_dir: str, flag: str = "--run_dir") -> ml_collections.ConfigDict:
    """The run's resolved config; `flag` names the command's flag that gave `run_dir`."""
    path = os.path.join(run_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        what = "does not exist" if not os.path.isdir(run_dir) else f"holds no {CONFIG_FILE}"
        raise ValueError(f"{flag}={run_dir}: the directory {what}, so it is not a run directory "
                         "(edp-train writes one)")
    return ml_collections.ConfigDict(
        run_spec.upgrade_saved_config(read_run_file(run_dir, CONFIG_FILE)["config"]))


def load_run_spec(run_dir: str, flag: str = "--run_dir") -> run_spec.RunSpec:
    """The run's resolved spec (its config.json, checked when the run started: a check now
    could refuse what was valid then)."""
    return run_spec.RunSpec.of_checked(load_run_config(run_dir, flag))


# "auto" values a run resolves from its data (recipes.py): a config file's auto value is no
# request to change the resolved one
_AUTO = (0, 0.0, "", -1, -1.0)
# the exit code of a run the privacy budget stopped before its last epoch, or refused to resume
BUDGET_EXIT = 3
# what a resume may change: the epochs (more extend a run, fewer finish it with what is trained)
# and a raised budget (the ledger keeps charging every step: the way out of a spent budget)
EXTENDABLE = ("epochs", "target_epsilon")
# how the run is carried out, not what it computes: a resume may set them anew
RESUME_SETTINGS = ("checkpoint_seconds", "resume_noise_limit", "bert.cut_padding")


def get_field(config: dict, field: str):
    """`config`'s value of a dotted field ("bert.cut_padding"), None when it has none."""
    for key in field.split("."):
        if not isinstance(config, dict) or key not in config:
            return None
        config = config[key]
    return config


def set_field(config, field: str, value) -> None:
    """Sets a dotted field of a nested `config` (a dict or a ConfigDict)."""
    *sections, key = field.split(".")
    for section in sections:
        if section not in config:
            config[section] = {}
        config = config[section]
    config[key] = value


def _extends(field: str, old, value) -> bool:
    if field in RESUME_SETTINGS:
        return True
    if field == "epochs":
        return isinstance(value, int) and value >= 1
    return field in EXTENDABLE and bool(old) and value > old


def _flat(config, prefix: str = "") -> dict:
    items = config.items() if hasattr(config, "items") else ()
    out = {}
    for key, value in items:
        if hasattr(value, "items"):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resume_differences(saved, requested: dict, file_config=None) -> list:
    """[(field, saved value, requested value)] where a resume's command asks for another run:
    `requested` holds the fields given on the command line ({"target_epsilon": 3.0,
    "bert.dropout": 0.2}); `file_config`, a --config file given again, counts where it is not
    an auto value. Other epochs and a higher target epsilon (EXTENDABLE) are no difference."""
    saved_flat = _flat(saved)
    asked = {k: v for k, v in _flat(file_config or {}).items() if v not in _AUTO}
    asked.update(requested)
    diffs = []
    for field, value in sorted(asked.items()):
        old = saved_flat.get(field)
        if old == value or _extends(field, old, value):
            continue
        diffs.append((field, old, value))
    return diffs


def read_run_file(run_dir: str, name: str) -> dict:
    """A run file as JSON; a damaged one is named with the way out instead of a parser error."""
    path = os.path.join(run_dir, name)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path} is missing: {run_dir} is not a complete run directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is damaged ({error}): restore it from a backup, or start a new "
                         "--run_dir (this run cannot be resumed without it)") from None


def write_json(path: str, payload) -> None:
    """Atomic: a reader (or a crash) never sees half a file."""
    ledger_lib.write_json_atomically(path, payload, sort_keys=True)


def write_directory_atomically(path: str, write) -> None:
    """`write(directory)` fills a new directory that then replaces `path`: a kill or a full disk
    while writing leaves the previous `path` (or none), never a partial one."""
    import shutil

    partial, previous = path + ".partial", path + ".previous"
    for stale in (partial, previous):
        shutil.rmtree(stale, ignore_errors=True)
    write(partial)
    if os.path.exists(path):
        os.replace(path, previous)
    os.replace(partial, path)
    shutil.rmtree(previous, ignore_errors=True)


def disk_full(error: BaseException) -> str:
    """What failed for lack of disk space ("" if `error` is something else): Python's ENOSPC or
    EDQUOT, or TensorFlow's error of a write that ran out of space (a checkpoint, the export)."""
    import errno

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"{error.strerror}: {error.filename}" if error.filename else error.strerror
        text = str(error)
        for reason in ("No space left on device", "Disk quota exceeded"):
            if reason in text:  # TensorFlow's text: "{{node ...}} /path/file; No space left ..."
                path = re.search(r"(/[^\s;:]+)[;:]?\s*" + reason, text)
                return f"{reason}: {path.group(1)}" if path else reason
        error = error.__cause__ or error.__context__
    return ""


def read_json(path: str, default=None):
    if not os.path.isfile(path):
        return default
    return read_run_file(os.path.dirname(path), os.path.basename(path))


def finished_summary(run_dir: str) -> dict | None:
    """The summary of a run that has trained all its epochs, from its files (no model is built),
    or None if epochs are left."""
    spec = load_run_spec(run_dir)
    state = read_json(os.path.join(run_dir, STATE_FILE), {})
    metrics = read_json(os.path.join(run_dir, METRICS_FILE), {})
    # "finished" is written after the export (runs from before it: the test metrics)
    if (int(state.get("epochs_done", 0)) < int(spec.sampling.epochs)
            or not state.get("finished", "test" in metrics)):
        return None
    private = spec.privacy.private
    ledger = read_json(os.path.join(run_dir, ledger_lib.FILENAME), {}) if private else {}
    ledger = ledger | (ledger_lib.headline(ledger) if ledger else {})  # the one headline
    return {"run_dir": run_dir, "mechanism": spec.privacy.mechanism, "model": spec.model.model,
            "epochs": len(metrics.get("epochs", [])), "seconds": 0.0, "test": metrics["test"],
            "decoding": metrics.get("decoding", "viterbi"),
            "membership_inference": metrics.get("membership_inference"),
            "epsilon": ledger.get("epsilon", float("inf")) if private else float("inf"),
            "delta": ledger.get("delta", spec.privacy.delta),
            "private": bool(ledger.get("private", False)), "stopped": state.get("stopped")}


def artifacts(diagnostics: bool, labels, vocabulary_from_training: bool = False,
              weights_outside_epsilon: str = "", user_level: bool = False) -> dict:
    """Which run-directory files epsilon covers, and which are diagnostics of the private data.

    A label set or vocabulary derived from the training split is written verbatim into
    preprocessor.json and the SavedModel: those releases are outside the proof, so
    `release_covered` is False and the ledger reports the run as not private.
    `weights_outside_epsilon` says why the weights themselves depend on the training data
    outside epsilon (a warm-start source that used it): then no weight-derived file is covered.
    At user level the test split loses every training user's utterances, so its metrics depend
    on who trains."""
    covered = ["checkpoints/ (weights and optimizer state)", "saved_model/ (serving export)",
               "metrics.json: test metrics (computed on data that is not training data)",
               "config.json", "state.json", "privacy.json", "label_schema.json",
               "preprocessor.json"]
    not_covered = []
    if user_level:
        covered.remove("metrics.json: test metrics (computed on data that is not training data)")
        not_covered.append("metrics.json: test metrics (user level: the test split is filtered "
                           "by who trains, so they depend on the training users; not a "
                           "differentially private release)")
    from_training = []
    if labels.from_training_data:
        from_training.append("the label sets")
        covered.remove("label_schema.json")
        not_covered.append("label_schema.json: the label sets come from the training split")
    if vocabulary_from_training:
        from_training.append("the vocabulary")
    if from_training:
        what = " and ".join(from_training)
        covered.remove("saved_model/ (serving export)")
        covered.remove("preprocessor.json")
        not_covered += [f"preprocessor.json: {what}, from the training split",
                        f"saved_model/ (serving export): it holds {what}, from the training "
                        "split; the weights alone are covered (checkpoints/)"]
    if weights_outside_epsilon:
        for name in ("checkpoints/ (weights and optimizer state)", "saved_model/ (serving export)",
                     "metrics.json: test metrics (computed on data that is not training data)"):
            if name in covered:
                covered.remove(name)
        not_covered.append("checkpoints/, saved_model/ and metrics.json (every file computed from "
                           f"the weights): {weights_outside_epsilon}")
    # dev metrics each epoch are exact functions of the dev split: no training row enters them,
    # but they are not noised, so they are released as they are
    not_covered.append("metrics.json: epochs[].dev (exact metrics of the dev split, which is "
                       "not training data; not a differentially private release)")
    if diagnostics:
        not_covered += [
            "metrics.json: epochs[].train (training loss, preclip_norm, clipped_fraction, "
            "nonfinite_microbatches), train_encoding, membership_inference and "
            "membership_inference_dev (training losses)",
            "tensorboard/ (the same training statistics)"]

    return {"covered": covered, "not_covered": not_covered, "diagnostics_released": diagnostics,
            "release_covered": not from_training and not weights_outside_epsilon,
            "label_sets": origin_sentence(labels)}
