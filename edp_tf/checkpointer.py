"""The run's own checkpoint, paired with its ledger: what `make_private(resume=True)` continues.

Why: Opacus saves and loads the accountant with the checkpoint; here the ledger is the
accountant, durable before every step (edp_tf/step_guard.py), and the checkpoint follows it:

* written at each epoch's end *after* the ledger has closed that epoch (its callback comes after
  the ledger's), so a checkpoint never holds weights of an epoch the ledger has not charged;
* committed by one small file, `latest.json`, replaced atomically after the checkpoint's own
  files are written: a kill mid-write leaves the previous checkpoint the one named. It names
  the two newest, each with its files' sizes and SHA-256 (edp_tf/checkpoint_files.py, which the
  trainers' checkpoints use too), and a resume takes the newest whose files still match: a
  truncated or damaged file falls back to the checkpoint before it (an epoch the ledger charged
  and the resume does not train again: epsilon over-counts, never under-counts);
* restored by `make_private(..., resume=True)` before its first step (the model's weights and
  the optimizer's state, so the user restores nothing), and refused if it is ahead of the
  ledger, which this ordering rules out unless the files were mixed up by hand.

What it holds is covered by epsilon (weights and optimizer moments are functions of the noisy
updates); the noise generator's state is not in it (edp_tf/untracked.py): a resumed run draws
fresh noise from OS entropy. A kill after the ledger closed an epoch and before the checkpoint
committed resumes from the epoch before: that epoch is charged and not trained again (the
budget's `epochs` then train one fewer), never the other way round.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Optional

import keras
import tensorflow as tf

from edp_tf import checkpoint_files
from edp_tf.ledger import write_json_atomically

_log = logging.getLogger(__name__)

DIRECTORY = "checkpoint"
LATEST = "latest.json"


def _state(private_model) -> tf.train.Checkpoint:
    """The wrapped model's variables and the optimizer's (its moments and step count)."""
    return tf.train.Checkpoint(model=private_model.wrapped_model,
                               optimizer=private_model.optimizer)


def _committed(directory: str) -> list:
    """The commit's entries, newest first (edp_tf/checkpoint_files.py). A commit written before
    entries were recorded names one checkpoint as {"epoch", "prefix"}."""
    path = os.path.join(directory, LATEST)
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        commit = json.load(handle)
    if "checkpoints" in commit:
        return list(commit["checkpoints"])
    return [{"name": commit["prefix"], "epochs_done": int(commit["epoch"]) + 1, "steps_done": 0}]


def latest(directory: str) -> Optional[dict]:
    """The entry of the newest committed checkpoint in `directory` whose files still match their
    commit ({"name", "epochs_done", ...}), or None; each newer one skipped is logged with why."""
    entry, skipped = checkpoint_files.newest_intact(directory, _committed(directory))
    for why in skipped:
        _log.warning("skipping a damaged checkpoint: %s", why)
    return entry


def save(directory: str, private_model, epoch: int) -> str:
    """Writes the checkpoint of the state after `epoch`, then commits it; returns its name."""
    os.makedirs(directory, exist_ok=True)
    entry = checkpoint_files.write_entry(_state(private_model), directory, epoch + 1)
    entries = checkpoint_files.committed_after(entry, _committed(directory))
    write_json_atomically(os.path.join(directory, LATEST), {"checkpoints": entries},
                          durable=True)
    checkpoint_files.remove_uncommitted(directory, entries)
    return entry["name"]


def restore(directory: str, private_model, epochs_charged: int) -> Optional[int]:
    """Restores the committed checkpoint into `private_model` (built, compiled) and returns the
    epoch it holds, or None when there is none. Refuses one ahead of the ledger's
    `epochs_charged`: its weights would hold steps no epsilon counts."""
    committed = latest(directory)
    if committed is None:
        return None
    epoch = int(committed["epochs_done"]) - 1
    if epoch >= epochs_charged:
        raise ValueError(
            f"the checkpoint in {directory} holds epoch {epoch}, but the ledger has charged "
            f"{epochs_charged} epoch(s): it is not this run's (remove it, or give the run "
            "directory it came from)")
    with private_model.distribute_strategy.scope():
        private_model.optimizer.build(private_model.wrapped_model.trainable_variables)
        status = _state(private_model).read(os.path.join(directory, committed["name"]))
    status.assert_existing_objects_matched()
    return epoch


class Checkpointer(keras.callbacks.Callback):
    """Saves the run's checkpoint after each epoch the ledger has closed (`ledger`); put it
    after the ledger among the callbacks. `make_private` does, when given a run_dir."""

    def __init__(self, directory: str, ledger):
        super().__init__()
        self.directory = directory
        self._ledger = ledger

    def on_epoch_end(self, epoch, logs=None):
        if not any(record.epoch == epoch for record in self._ledger.records):
            return  # not charged as a whole epoch: nothing of it is kept
        save(self.directory, self.model, epoch)
        self.model._note_saved(self.directory)  # the ledger lists it among what it covers
