"""Committed checkpoints: written, named by a commit with their files' sizes and SHA-256, kept
two deep, and read back only while their files still match.

Why: TensorFlow writes a checkpoint's files one after the other and checks nothing when it
reads them back: a data file truncated by a full disk or a kill is found only when restoring
fails, and one cut at a tensor boundary not at all. A checkpoint counts once a commit (one small
file replaced atomically, written by the caller) names it with each file's size and digest; a
resume takes the newest committed checkpoint whose files still match, and falls back to the one
before it otherwise; files no commit names (a write cut short) are removed after the next
commit. The library's checkpoint (edp_tf/checkpointer.py, committed by latest.json) and the
trainers' (edp_nlu/pipeline/checkpoints.py, committed by the run's state.json, also inside an
epoch) are both this, with their own commit file.

An entry of a commit: {"name", "epochs_done", "steps_done", "files", ...}: the checkpoint holds
the state after `epochs_done` epochs and `steps_done` steps of the next.
"""
from __future__ import annotations

import glob
import hashlib
import os
from typing import Mapping, Optional, Sequence

import tensorflow as tf

KEEP = 2  # the newest, and one to fall back on if it is damaged


def files(prefix: str) -> list:
    """The files TensorFlow wrote for the checkpoint `prefix` (its index and data shards)."""
    return sorted(glob.glob(glob.escape(prefix) + ".*"))


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(prefix: str) -> dict:
    """{file name: {"bytes", "sha256"}} of a checkpoint's files."""
    return {os.path.basename(p): {"bytes": os.path.getsize(p), "sha256": sha256(p)}
            for p in files(prefix)}


def damage(directory: str, name: str, recorded: Optional[Mapping]) -> Optional[str]:
    """Why the checkpoint `name` in `directory` no longer matches the files its commit
    `recorded` (`fingerprint`), or None if it does."""
    if not recorded:
        return f"{directory}/{name}: no files recorded"
    for file_name, expected in sorted(recorded.items()):
        path = os.path.join(directory, file_name)
        if not os.path.isfile(path):
            return f"{path} is missing"
        size = os.path.getsize(path)
        if size != expected["bytes"]:
            return f"{path} has {size:,} bytes, {expected['bytes']:,} when committed"
        if sha256(path) != expected["sha256"]:
            return f"{path} differs from its commit (SHA-256)"
    return None


def entry_name(epochs_done: int, steps_done: int = 0) -> str:
    return f"ckpt-{epochs_done}" + (f"-{steps_done}" if steps_done else "")


def write_entry(checkpoint: tf.train.Checkpoint, directory: str, epochs_done: int,
                steps_done: int = 0, **extra) -> dict:
    """Writes `checkpoint` after `epochs_done` epochs and `steps_done` steps of the next, and
    returns its commit entry (with `extra` fields): not a checkpoint until a commit names it."""
    name = entry_name(epochs_done, steps_done)
    prefix = checkpoint.write(os.path.join(directory, name))
    return {"name": name, "epochs_done": int(epochs_done), "steps_done": int(steps_done),
            "files": fingerprint(prefix), **extra}


def _position(entry: Mapping) -> tuple:
    return int(entry["epochs_done"]), int(entry.get("steps_done", 0))


def committed_after(entry: dict, committed: Sequence[Mapping], keep: int = KEEP) -> list:
    """The next commit's entries, newest first: `entry`, then those of `committed` before its
    position (an earlier attempt's later ones are stale), `keep` in all."""
    older = [e for e in committed if _position(e) < _position(entry)]
    return [entry] + older[:keep - 1]


def remove_uncommitted(directory: str, entries: Sequence[Mapping]) -> None:
    """Files (and TensorFlow's *_temp directories) of checkpoints that no entry names."""
    names = {e["name"] for e in entries}
    for path in glob.glob(os.path.join(glob.escape(directory), "ckpt-*")):
        if os.path.basename(path).split(".", 1)[0] in names:
            continue
        try:
            if os.path.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                os.remove(path)
        except (OSError, tf.errors.OpError):  # removed meanwhile: nothing to do
            pass


def newest_intact(directory: str, entries: Sequence[Mapping]) -> tuple:
    """(the newest entry whose files match their commit or None, [why each newer one was
    skipped]); entries without recorded files (a commit from before they were recorded) are
    taken as they are."""
    skipped = []
    for entry in entries:
        why = damage(directory, entry["name"], entry["files"]) if "files" in entry else None
        if why is None:
            return entry, skipped
        skipped.append(why)
    return None, skipped
