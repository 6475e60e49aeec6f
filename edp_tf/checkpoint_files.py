"""A checkpoint's files as committed: their sizes and SHA-256, and why they no longer match.

Why: TensorFlow writes a checkpoint's files one after the other and checks nothing when it
reads them back: a data file truncated by a full disk or a kill is found only when restoring
fails, and one cut at a tensor boundary not at all. A commit that records each file's size and
digest lets a resume take the newest checkpoint whose files still match, and fall back to the
one before it otherwise. The library's checkpoint (edp_tf/checkpointer.py) and the trainers'
(edp_nlu/pipeline/checkpoints.py) commit the same way.
"""
from __future__ import annotations

import glob
import hashlib
import os
from typing import Mapping, Optional


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
