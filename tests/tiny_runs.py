"""Tiny training runs for the trainer's tests: a config shrunk to seconds, the process-wide
strategy, the synthetic corpus of a config, that corpus as a joint-format directory, and
NLU-Evaluation-Data CSV rows."""
import json
import os
import pathlib

from absl import flags

import edp_tf
from edp_nlu import evaluate, train
from edp_nlu.configs.base import base_config
from edp_nlu.data import schema as schema_lib
from edp_nlu.data import synthetic

SIZE, BATCH = 240, 32  # 192 training utterances (80 %), q = 1/6, 6 steps per epoch


# The per-example method of the tiny runs: the while_loop over micro-batches traces its body once
# (a tiny private CLC run 6 instead of 9 CPU-s), where the default ghost method converts the
# step for tf.vectorized_map. The method is an execution choice (edp_tf.DPConfig: the same
# clipped sum, S, noise and epsilon) and these runs assert files, ledgers and resumes, not the
# clipping; the ghost method's exactness is the library's tests' (edp_tf/microbatch_test.py,
# edp_tf/ghost/), and the default method runs end to end in trainer_test's per-example run and
# command, and in edp_nlu/models/private_models_test.py.
TINY_RUN_METHOD = "loop"

# A small per-example CLC on 2,400 synthetic utterances, as command-line flags: ~60 steps, a second
# or two an epoch after tracing, long enough to stop a run (or kill a worker) between steps.
SMALL_CLC_FLAGS = (
    "--config.synthetic_size=2400", "--config.batch_size=32", "--config.max_words=4",
    "--config.clc.word_vectors=glove-6b-50d", "--config.clc.vocabulary_size=2000",
    "--config.clc.lstm_units=8", "--config.clc.num_lstm_layers=1",
    "--config.clc.char_embedding_dim=8", "--config.clc.char_filters=8",
    "--config.learning_rate=0.01", "--config.target_epsilon=0", "--noise_multiplier=1.0",
    "--mechanism=dpsgd", f"--config.per_example_method={TINY_RUN_METHOD}")


def tiny_config(model="clc", mechanism="edp", replicas=2, epochs=1, **overrides):
    """The base config shrunk to a few seconds of training (tracing dominates: the CLC step is
    unrolled over max_words, so 4 words instead of 8 take a per-example run from 24 to 19 CPU-s;
    most utterances are then truncated, which the truncation checks need anyway)."""
    c = base_config()
    c.update(dict(model=model, mechanism=mechanism, replicas=replicas, epochs=epochs,
                  synthetic_size=SIZE, batch_size=BATCH, max_words=4, learning_rate=1e-2,
                  per_example_method=TINY_RUN_METHOD))
    # GloVe's public vocabulary (2000 words load in ~0.3 s): a vocabulary from the training
    # text would be exported with the model and make every private run "not private"
    c.clc.update(dict(word_vectors="glove-6b-50d", vocabulary_size=2000, lstm_units=8,
                      num_lstm_layers=1, char_embedding_dim=8, char_filters=8))
    c.bert.update(dict(checkpoint="", vocabulary="train", num_layers=1, hidden_dim=24,
                       num_heads=2, intermediate_dim=32, sequence_length=24))
    c.update(overrides)
    return c


def strategy(replicas):
    """The process-wide strategy for this many replicas (edp_tf keeps one per device set, with
    collective keys of its own, so strategies of different test modules never collide)."""
    return edp_tf.make_strategy(replicas)


def corpus(config):
    return synthetic.synthetic_corpus(
        seed=config.data_seed, size=config.synthetic_size, canaries=config.synthetic_canaries,
        canary_repeats=config.synthetic_canary_repeats)


def read(run_dir, name):
    with open(os.path.join(run_dir, name)) as f:
        return json.load(f)


def write_joint_dir(path, splits, schema: bool = False) -> str:
    """`splits` as a joint-format directory at `path` (seq.in, seq.out, label per split); with
    `schema`, the synthetic generator's public label schema beside them (schema.json), so that
    the labels are not derived from the training split."""
    if schema:
        os.makedirs(path, exist_ok=True)
        schema_lib.write_schema(os.path.join(path, schema_lib.SCHEMA_FILE),
                                synthetic.label_schema())
    for name in ("train", "dev", "test"):
        os.makedirs(path / name)
        utterances = getattr(splits, name)
        for filename, lines in (("seq.in", [" ".join(u.tokens) for u in utterances]),
                                ("seq.out", [" ".join(u.tags) for u in utterances]),
                                ("label", [u.intent for u in utterances])):
            (path / name / filename).write_text("\n".join(lines) + "\n")
    return str(path)


# NLU-Evaluation-Data CSV files (edp_nlu/data/nlu_csv.py): the header of its per-scenario files.
CSV_HEADER = "answerid;scenario;intent;answer_annotation;answer_from_anno;answer_from_user\n"


def csv_row(answer_id, scenario, intent, annotation):
    return f'{answer_id};{scenario};{intent};"{annotation}";"x";"x"\n'


def write_csv(path: pathlib.Path, rows, header=CSV_HEADER) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "".join(rows), encoding="utf-8")
    return path


def many_csv_rows(scenario, intent, count, start=0):
    """`count` rows of one intent, each with a time and a date slot."""
    return [csv_row(start + i, scenario, intent, f"wake me at [time : {i} am] [date : today]")
            for i in range(count)]


def _command_in_process(capsys, define, main, argv) -> str:
    """A command's main on flag values of its own (other modules of the test process define
    some of the same names), in this process: a fresh interpreter costs ~7 CPU-s of imports.
    Returns its stdout; a user error propagates (`cli.run` prints it as one `error:` line and
    exits 2: edp_nlu/cli_test.py)."""
    values = flags.FlagValues()
    define(values)
    values(argv)
    capsys.readouterr()
    main([], values)
    return capsys.readouterr().out


def evaluate_command(capsys, *args: str) -> str:
    """`python -m edp_nlu.evaluate *args` in this process; the command as a process is
    tests/per_class_test.py's report test."""
    return _command_in_process(capsys, evaluate.define_flags, evaluate.main,
                               ["edp-evaluate", *args])


def train_command(capsys, *args: str) -> str:
    """`python -m edp_nlu.train *args` in this process, for the commands that train nothing
    here (a finished run's resume, a refused one, a `--workers` launcher); the command as a
    process is trainer_test's cli_run."""
    argv = ["edp-train", *args]
    return _command_in_process(capsys, lambda values: train.define_flags(values, argv),
                               train.main, argv)


def epochs_done(run_dir) -> int:
    """The epochs a run directory's state.json says are done (0 before it is written)."""
    try:
        with open(os.path.join(run_dir, "state.json")) as f:
            return int(json.load(f).get("epochs_done", 0))
    except (OSError, ValueError):
        return 0  # not written yet (or being replaced)
