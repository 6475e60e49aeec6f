"""Checkpoints that a kill, a full disk or a damaged file at any point leaves usable.

TensorFlow writes a checkpoint's files one after the other. Taken alone, a kill between a
checkpoint and the run's state.json would resume the weights of one epoch with the epoch count of
another, and a truncated data file would be found only when restoring fails (or, for a file cut at
a tensor boundary, not at all). So state.json is the commit marker: a checkpoint counts once
state.json names it, with the size and SHA-256 of each of its files, and resuming takes the newest
named checkpoint whose files still match (edp_tf/checkpoint_files.py, as the library's own
checkpoint commits). Files that no commit names (a write cut short) are
removed after the next commit. TensorFlow's own `checkpoint` index follows the commit, so
`tf.train.latest_checkpoint` also sees only committed checkpoints.

A checkpoint is taken at each epoch's end and, every `checkpoint_seconds`, inside an epoch
(`steps_done` of epoch `epochs_done`): a kill then loses at most that much training, which the
ledger has charged and the resumed run trains again. Without them a kill late in an epoch loses
the epoch, and a kill of the last epoch before its commit leaves no budget to train it again.
"""
from __future__ import annotations

import dataclasses
import glob
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


def _position(entry: dict) -> tuple:
    return int(entry["epochs_done"]), int(entry.get("steps_done", 0))


def write(checkpoint: tf.train.Checkpoint, run_dir: str, state: dict, epochs_done: int,
          layer_scales: Optional[list], save_state, steps_done: int = 0) -> str:
    """Writes the checkpoint after `epochs_done` epochs and `steps_done` steps of the next,
    and commits it: `save_state(state)` writes state.json naming it (atomically); then
    TensorFlow's index follows and files that no commit names are removed. Returns the
    checkpoint's prefix."""
    name = f"ckpt-{epochs_done}" + (f"-{steps_done}" if steps_done else "")
    prefix = checkpoint.write(os.path.join(directory(run_dir), name))
    entry = {"name": name, "epochs_done": epochs_done, "steps_done": steps_done,
             "files": checkpoint_files.fingerprint(prefix), "layer_scales": layer_scales}
    older = [e for e in state.get(_KEY, []) if _position(e) < (epochs_done, steps_done)]
    state[_KEY] = [entry] + older[:KEEP - 1]
    state["epochs_done"] = epochs_done
    state["steps_done"] = steps_done
    state["layer_scales"] = layer_scales
    save_state(state)  # the commit
    kept = [os.path.join(directory(run_dir), e["name"]) for e in state[_KEY]]
    tf.compat.v1.train.update_checkpoint_state(directory(run_dir), kept[0],
                                               all_model_checkpoint_paths=kept[::-1])
    _remove_uncommitted(run_dir, {e["name"] for e in state[_KEY]})
    return prefix


def _remove_uncommitted(run_dir: str, names: set) -> None:
    """Files (and TensorFlow's *_temp directories) of checkpoints that no commit names."""
    for path in glob.glob(os.path.join(glob.escape(directory(run_dir)), "ckpt-*")):
        if os.path.basename(path).split(".", 1)[0] in names:
            continue
        try:
            if os.path.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                os.remove(path)
        except (OSError, tf.errors.OpError):  # removed meanwhile: nothing to do
            pass


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
    skipped = []
    for entry in entries:
        why = checkpoint_files.damage(directory(run_dir), entry["name"], entry.get("files"))
        if why is None:
            return Committed(os.path.join(directory(run_dir), entry["name"]),
                             int(entry["epochs_done"]), entry.get("layer_scales"),
                             int(entry.get("steps_done", 0))), skipped
        skipped.append(why)
    return None, skipped


def latest_prefix(run_dir: str) -> Optional[str]:
    """The prefix of a run's newest intact committed checkpoint (for scoring, warm starts)."""
    found, skipped = latest(run_dir, read_json(os.path.join(run_dir, STATE_FILE), {}))
    for why in skipped:
        _log.warning("skipping a damaged checkpoint: %s", why)
    return found.prefix if found else None
