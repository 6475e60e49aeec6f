"""Checkpoints that a kill, a full disk or a damaged file at any point leaves usable.

TensorFlow writes a checkpoint's files one after the other. Taken alone, a kill between a
checkpoint and the run's state.json would resume the weights of one epoch with the epoch count of
another, and a truncated data file would be found only when restoring fails (or, for a file cut at
a tensor boundary, not at all). So state.json is the commit marker: a checkpoint counts once
state.json names it, with the size and SHA-256 of each of its files, and resuming takes the newest
named checkpoint whose files still match. Files that no commit names (a write cut short) are
removed after the next commit. All of this is the library's (edp_tf/checkpoint_files.py, which
make_private's checkpoint commits with latest.json); what is the application's is the commit
file, state.json, and the checkpoints inside an epoch. TensorFlow's own `checkpoint` index
follows the commit, so `tf.train.latest_checkpoint` also sees only committed checkpoints.

A checkpoint is taken at each epoch's end and, every `checkpoint_seconds`, inside an epoch
(`steps_done` of epoch `epochs_done`): a kill then loses at most that much training, which the
ledger has charged and the resumed run trains again. Without them a kill late in an epoch loses
the epoch, and a kill of the last epoch before its commit leaves no budget to train it again.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional

import tensorflow as tf

from edp_nlu.pipeline.run_files import STATE_FILE, read_json
from edp_tf import checkpoint_files

_log = logging.getLogger(__name__)

DIRECTORY = "checkpoints"
KEEP = 2  # the newest, and one to fall back on if it is damaged
_KEY = "checkpoints"  # in state.json: committed checkpoints, newest first


@dataclasses.dataclass(frozen=True)
class Committed:
    """A checkpoint as state.json names it."""

    prefix: str  # absolute path prefix, as tf.train.Checkpoint.read takes it
    epochs_done: int
    layer_scales: Optional[list]
    steps_done: int = 0  # steps of epoch `epochs_done` (a checkpoint inside that epoch)


def directory(run_dir: str) -> str:
    return os.path.join(run_dir, DIRECTORY)


def write(checkpoint: tf.train.Checkpoint, run_dir: str, state: dict, epochs_done: int,
          layer_scales: Optional[list], save_state, steps_done: int = 0) -> str:
    """Writes the checkpoint after `epochs_done` epochs and `steps_done` steps of the next,
    and commits it: `save_state(state)` writes state.json naming it (atomically); then
    TensorFlow's index follows and files that no commit names are removed. Returns the
    checkpoint's prefix."""
    entry = checkpoint_files.write_entry(checkpoint, directory(run_dir), epochs_done,
                                         steps_done, layer_scales=layer_scales)
    state[_KEY] = checkpoint_files.committed_after(entry, state.get(_KEY, []), KEEP)
    state["epochs_done"] = epochs_done
    state["steps_done"] = steps_done
    state["layer_scales"] = layer_scales
    save_state(state)  # the commit
    kept = [os.path.join(directory(run_dir), e["name"]) for e in state[_KEY]]
    tf.compat.v1.train.update_checkpoint_state(directory(run_dir), kept[0],
                                               all_model_checkpoint_paths=kept[::-1])
    checkpoint_files.remove_uncommitted(directory(run_dir), state[_KEY])
    return kept[0]


def latest(run_dir: str, state: dict) -> tuple[Optional[Committed], list]:
    """(the newest committed checkpoint whose files match, [why each newer one was skipped]).

    A run directory written before commits were recorded names none: its TensorFlow index is
    taken as it is (without a check of its files)."""
    entries = state.get(_KEY)
    if entries is None:
        prefix = tf.train.latest_checkpoint(directory(run_dir))
        found = (Committed(prefix, int(state.get("epochs_done", 0)), state.get("layer_scales"))
                 if prefix else None)
        return found, []
    entry, skipped = checkpoint_files.newest_intact(directory(run_dir), entries)
    if entry is None:
        return None, skipped
    return Committed(os.path.join(directory(run_dir), entry["name"]), int(entry["epochs_done"]),
                     entry.get("layer_scales"), int(entry.get("steps_done", 0))), skipped


def latest_prefix(run_dir: str) -> Optional[str]:
    """The prefix of a run's newest intact committed checkpoint (for scoring, warm starts)."""
    found, skipped = latest(run_dir, read_json(os.path.join(run_dir, STATE_FILE), {}))
    for why in skipped:
        _log.warning("skipping a damaged checkpoint: %s", why)
    return found.prefix if found else None
