"""A private run faulted from the inside at steps a seed picks (tools/faults.py): a graceful
SIGTERM, a SIGKILL between a checkpoint's files and its commit, a damaged newest checkpoint and
an exception in the input pipeline; resumed after each, it finishes with an export that serves
and a ledger that charges every step that ran (the soak with every fault kind is the command
`python -m tools.faults`, docs/faults.md).

The runs are subprocesses, as a user runs them (a fault kills or stops the process); the finished
export is loaded here, not in a fresh interpreter of its own."""
import json
import os
import random

from tests.tiny_runs import TINY_RUN_METHOD
from tools import faults

EPOCHS = 2
# 480 synthetic utterances, 384 to train on at batch 32: q = 1/12, 12 steps an epoch. Each
# attempt is a process that pays TensorFlow's start and the step's tracing: the chain's faults
# need a few steps and an epoch's end to land on, not the soak's 30-step epochs.
SYNTHETIC_SIZE, STEPS_PER_EPOCH = 480, 12
MAX_WORDS = 4  # the step's trace is unrolled over the words: half the soak's 8, a cheaper trace


def test_faults_inside_a_run_lose_no_step_and_leave_a_model_that_serves(tmp_path, monkeypatch):
    smaller = {"--config.synthetic_size=": f"--config.synthetic_size={SYNTHETIC_SIZE}",
               "--config.max_words=": f"--config.max_words={MAX_WORDS}"}
    monkeypatch.setattr(faults, "RUN_FLAGS", tuple(
        next((v for k, v in smaller.items() if flag.startswith(k)), flag)
        for flag in faults.RUN_FLAGS) + (f"--config.per_example_method={TINY_RUN_METHOD}",))
    monkeypatch.setattr(faults, "PROBE_IN_PROCESS", True)  # TensorFlow is loaded here already
    reference = faults.planned_reference(STEPS_PER_EPOCH, EPOCHS)
    chain = ["sigterm", "kill_in_checkpoint", "truncated_checkpoint", "input_error"]
    log = []
    outcomes = faults.run_chain("run", chain, random.Random(3), str(tmp_path), reference, None,
                                log.append)
    assert [o.kind for o in outcomes] == chain, log
    assert all(o.survived for o in outcomes), [o.why for o in outcomes] + log
    assert sum(o.lost_steps for o in outcomes) == 0
    # the SIGTERM attempt said how to continue, in one line
    assert any("sigterm" in line and "--resume" in line for line in log), log


def test_the_witness_and_the_table_count_what_they_should(tmp_path):
    witness = str(tmp_path / "w")
    for line in ("begin 0", "step 0", "step 0", "begin 0", "step 0", "begin 1"):
        faults._witness(witness, line)
    assert faults.witnessed(witness) == [(0, 2), (0, 1), (1, 0)]
    outcomes = [faults.Outcome("sigkill", True, 0, 12), faults.Outcome("sigkill", False, 3, 0,
                                                                      "x")]
    text = faults.table(outcomes, {"enospc_export": "no small filesystem"})
    assert "| sigkill |" in text and "| 2 | 1 |" in text
    assert "lost from the ledger (ran, not charged): **3**" in text and "over-charged" in text
    assert "enospc_export" in text and "not run: no small filesystem" in text
    assert faults.plan_chain(random.Random(0), ["sigkill", "kill_in_export"], 3)[-1] == \
        "kill_in_export"


def test_a_truncated_checkpoint_is_the_newest_committed_one(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    data = run_dir / "checkpoints" / "ckpt-2.data-00000-of-00001"
    data.write_bytes(b"x" * 100)
    (run_dir / "state.json").write_text(json.dumps({"checkpoints": [{"name": "ckpt-2", "files": {
        "ckpt-2.index": {}, "ckpt-2.data-00000-of-00001": {}}}]}))
    assert faults.truncate_newest_checkpoint(str(run_dir)) == str(data)
    assert os.path.getsize(data) == 50
