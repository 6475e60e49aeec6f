"""Committed checkpoints: state.json names a checkpoint with its files' sizes and hashes, resuming
takes the newest one whose files still match, and a write cut short is never taken."""
import errno
import json
import os

import pytest
import tensorflow as tf

from edp_nlu.pipeline import checkpoints, run_files
from edp_tf import ledger as ledger_lib


def _state_writer(run_dir):
    path = os.path.join(run_dir, run_files.STATE_FILE)
    return lambda state: run_files.write_json(path, state)


def _commit(ckpt, run_dir, state, epochs_done, value):
    ckpt.v.assign(value)
    return checkpoints.write(ckpt, run_dir, state, epochs_done, [float(value)],
                             _state_writer(run_dir))


def _restored_value(prefix):
    probe = tf.train.Checkpoint(v=tf.Variable(0.0))
    probe.read(prefix).assert_existing_objects_matched()
    return float(probe.v.numpy())


def _data_file(run_dir, name):
    (path,) = [os.path.join(checkpoints.directory(run_dir), f)
               for f in os.listdir(checkpoints.directory(run_dir))
               if f.startswith(name + ".data-")]
    return path


def test_resume_takes_the_newest_intact_commit_and_names_what_it_skips(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir, state = "run", {}  # relative, as users give --run_dir
    ckpt = tf.train.Checkpoint(v=tf.Variable(0.0))
    for epoch in (1, 2, 3):
        _commit(ckpt, run_dir, state, epoch, 10.0 * epoch)
    on_disk = json.loads((tmp_path / "run" / "state.json").read_text())
    assert [e["epochs_done"] for e in on_disk["checkpoints"]] == [3, 2]  # KEEP = 2
    assert not any(f.startswith("ckpt-1.") for f in os.listdir(checkpoints.directory(run_dir)))
    # TensorFlow's own index follows the commits
    latest = tf.train.latest_checkpoint(checkpoints.directory(run_dir))
    assert latest == os.path.join("run", "checkpoints", "ckpt-3")

    found, skipped = checkpoints.latest(run_dir, on_disk)
    assert (found.epochs_done, found.layer_scales, skipped) == (3, [30.0], [])
    assert _restored_value(found.prefix) == 30.0

    newest = _data_file(run_dir, "ckpt-3")
    with open(newest, "r+b") as f:  # a torn write, or a disk that lost the file's tail
        f.truncate(os.path.getsize(newest) // 2)
    found, skipped = checkpoints.latest(run_dir, on_disk)
    assert found.epochs_done == 2 and _restored_value(found.prefix) == 20.0
    assert len(skipped) == 1 and newest in skipped[0] and "bytes" in skipped[0]

    older = _data_file(run_dir, "ckpt-2")
    with open(older, "r+b") as f:  # same size, other bytes: only the hash sees it
        f.seek(0)
        f.write(bytes(255 - b for b in f.read(4)) if os.path.getsize(older) >= 4 else b"x")
    found, skipped = checkpoints.latest(run_dir, on_disk)
    assert found is None and len(skipped) == 2 and "SHA-256" in skipped[1]


def test_files_written_but_not_committed_are_never_taken_and_are_cleared(tmp_path):
    run_dir, state = str(tmp_path), {}
    ckpt = tf.train.Checkpoint(v=tf.Variable(0.0))
    _commit(ckpt, run_dir, state, 1, 1.0)
    ckpt.v.assign(99.0)  # a kill after these files, before state.json names them
    ckpt.write(os.path.join(checkpoints.directory(run_dir), "ckpt-2"))
    saved = json.loads((tmp_path / "state.json").read_text())
    found, _ = checkpoints.latest(run_dir, saved)
    assert found.epochs_done == 1 and _restored_value(found.prefix) == 1.0
    assert checkpoints.latest_prefix(run_dir).endswith("ckpt-1")
    _commit(ckpt, run_dir, state, 2, 2.0)  # the epoch trained again, committed this time
    found, _ = checkpoints.latest(run_dir, json.loads((tmp_path / "state.json").read_text()))
    assert _restored_value(found.prefix) == 2.0


def test_a_run_that_committed_nothing_resumes_from_the_start(tmp_path):
    found, skipped = checkpoints.latest(str(tmp_path), {"epochs_done": 0, "checkpoints": []})
    assert found is None and skipped == []


def test_a_directory_is_replaced_whole_or_not_at_all(tmp_path):
    target = str(tmp_path / "saved_model")

    def write(content):
        def fill(path):
            os.makedirs(path)
            with open(os.path.join(path, "a"), "w") as f:
                f.write(content)
            if content == "fails":
                raise OSError(errno.ENOSPC, "No space left on device")
        return fill

    run_files.write_directory_atomically(target, write("one"))
    with pytest.raises(OSError):
        run_files.write_directory_atomically(target, write("fails"))
    assert (tmp_path / "saved_model" / "a").read_text() == "one"
    run_files.write_directory_atomically(target, write("two"))
    assert (tmp_path / "saved_model" / "a").read_text() == "two"
    assert sorted(os.listdir(tmp_path)) == ["saved_model"]


def test_a_full_disk_is_recognised_and_the_json_file_named(tmp_path, monkeypatch):
    path = str(tmp_path / "privacy.json")
    ledger_lib.write_json_atomically(path, {"epochs": [1]})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ledger_lib.json, "dump", full)
    with pytest.raises(OSError) as raised:
        ledger_lib.write_json_atomically(path, {"epochs": [1, 2]})
    monkeypatch.undo()
    assert raised.value.filename == path
    assert run_files.disk_full(raised.value) == f"No space left on device: {path}"
    assert json.loads(open(path).read()) == {"epochs": [1]}  # the previous version stands
    assert os.listdir(tmp_path) == ["privacy.json"]  # no temporary file left
    tf_error = tf.errors.UnknownError(None, None, "ckpt-2_temp/part-0; No space left on device")
    try:
        raise RuntimeError("export failed") from tf_error
    except RuntimeError as chained:
        assert "No space left on device" in run_files.disk_full(chained)
    assert run_files.disk_full(ValueError("bad flag")) == ""
    assert run_files.disk_full(OSError(errno.EACCES, "Permission denied")) == ""


def test_checkpoints_inside_an_epoch_are_ordered_by_epoch_then_step(tmp_path):
    """A checkpoint 4 steps into epoch 2 follows the end of epoch 2 and precedes epoch 3's
    end; resuming takes the newest with its step, and an older one after a newer is dropped."""
    run_dir, state = str(tmp_path), {}
    ckpt = tf.train.Checkpoint(v=tf.Variable(0.0))
    write = _state_writer(run_dir)
    _commit(ckpt, run_dir, state, 2, 20.0)
    ckpt.v.assign(24.0)
    prefix = checkpoints.write(ckpt, run_dir, state, 2, [24.0], write, steps_done=4)
    assert os.path.basename(prefix) == "ckpt-2-4"
    found, _ = checkpoints.latest(run_dir, state)
    assert (found.epochs_done, found.steps_done, _restored_value(found.prefix)) == (2, 4, 24.0)
    assert (state["epochs_done"], state["steps_done"]) == (2, 4)
    _commit(ckpt, run_dir, state, 3, 30.0)
    found, _ = checkpoints.latest(run_dir, state)
    assert (found.epochs_done, found.steps_done, state["steps_done"]) == (3, 0, 0)
    assert [e["name"] for e in state["checkpoints"]] == ["ckpt-3", "ckpt-2-4"]
