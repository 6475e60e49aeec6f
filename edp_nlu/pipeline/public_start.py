"""`--config.public_pretraining=CORPUS`: a plain run on a public corpus, then the private run
starting from it, in one command.

Why: public in-domain data is the lever that moves a private run most for free (docs/results.md,
"Public pretraining"), and doing it by hand takes two commands whose configs must agree (the
same model, vocabularies and heads). Here the plain run is this run's own config with
`mechanism="sgd"` on the public corpus, in `RUN_DIR/public_pretraining`; the private run then
starts from it exactly as `--config.init_from` would (edp_nlu/pipeline/warm_start.py: the public
corpus's utterances are compared with the training split, privacy.json names it, and a corpus
that shares utterances with it makes the run not private).

A command interrupted during the plain run continues it when run again (the same command); a
finished plain run is not trained again.
"""
from __future__ import annotations

import os

import ml_collections

from edp_nlu.pipeline import run_files

SUBDIR = "public_pretraining"

# What the plain run does not take from the private run's config: the private corpus, its labels
# and everything only a private run reads.
_PLAIN = {"mechanism": "sgd", "init_from": "", "public_pretraining": "", "label_schema": "",
          "public_subspace": "", "probe_epochs": 0}


def source_dir(run_dir: str) -> str:
    """Where a run's plain run on its public corpus lives."""
    return os.path.join(run_dir, SUBDIR)


def plain_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` as the plain run on its `public_pretraining` corpus."""
    plain = ml_collections.ConfigDict(config.to_dict())
    with plain.unlocked():
        plain.update(_PLAIN)
        plain.data_dir = config.public_pretraining
    return plain


def pretrain(config: ml_collections.ConfigDict, run_dir: str, train, strategy) -> str:
    """Trains (or continues, or keeps) the plain run on `config.public_pretraining` with
    `train` (training.train); returns its directory, for warm_start."""
    source = source_dir(run_dir)
    started = os.path.exists(os.path.join(source, run_files.STATE_FILE))
    if started and run_files.finished_summary(source) is not None:
        return source
    plain = run_files.load_run_config(source) if started else plain_config(config)
    train(plain, source, resume=started, strategy=strategy, export=False)
    return source
