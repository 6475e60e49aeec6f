"""Defaults that adapt to the training set: config fields left at 0 ("auto") are filled in here.

Why: a fixed batch of 512 for 10 epochs suits a 10k corpus under DP and nothing else (170 steps of
non-private training on a 64-intent corpus did not learn). DP-SGD wants a large *sampling rate*
(q = 0.05-0.25 in Li et al. 2022 / Yu et al. 2022) and a few hundred steps; plain training wants
small batches and thousands of steps. So the knobs are the sampling rate and the step count, and
the defaults depend on the mechanism and the model. The resolved values are written into the run's
config.json, so a run says exactly what it used.

These defaults were chosen on the built-in synthetic corpus and on the public SNIPS/ATIS
benchmarks (see results/), never on a user's private data: choosing them there would be outside
epsilon.
"""
from __future__ import annotations

import dataclasses
import math

import ml_collections

from edp_nlu.pipeline.spec_parts import ModelSpec, OptimizerSpec, PrivacySpec, flat_fields, parts_of

# Private mechanisms: expected batch as a fraction of n, and steps in all (see module docstring).
# CLC: q 0.16 at Adam 3e-2, for 84 steps on the built-in corpus and 150 on a user's. q 0.16 / 3e-2
# came from SNIPS (edp_nlu/configs/snips_clc.py, results/pilot_snips_clc): a larger expected batch
# at the same epsilon lowers a step's noise per example, z / (q n).
# The built-in corpus is easy and its default job has a time goal (180 s on a 2-core machine):
# 84 steps fit it where 100 do not (docs/benchmarks.md), at nearly the same test SER
# (results/pilot_default). A user's corpus has no such goal and wants the steps: on SNIPS and
# ATIS the default command did better with 150 than with 84 (results/default_on_snips and
# results/default_on_atis).
# BERT: Li et al. 2022's regime (q ~0.08, ~150 steps); the BERT configs give 300 steps.
PRIVATE_SAMPLING_RATE = {"clc": 0.16, "bert": 0.08}
PRIVATE_STEPS = {  # (model, data source) -> steps in all
    ("clc", "synthetic"): 84, ("clc", "data_dir"): 150,
    ("bert", "synthetic"): 150, ("bert", "data_dir"): 150,
}
# User-level privacy samples users (n/12 of them on the synthetic corpus), so it wants a larger
# rate: CLC at epsilon 8 per user did clearly better at q 0.1 / 200 steps than at q 0.053 / 190
# (results/user_level).
USER_SAMPLING_RATE, USER_STEPS = 0.1, 200
# Plain training: a fixed batch and enough epochs to converge on a 10k corpus.
SGD_BATCH = {"clc": 64, "bert": 32}
SGD_EPOCHS = {"clc": 15, "bert": 3}
# ...and at least this many steps, so that a small corpus is not undertrained: on 1,000 SNIPS
# utterances 15 epochs of 64 (235 steps) left CLC with nearly every utterance wrong, and on 1,000
# synthetic ones (--config.synthetic_size=1250) 15 epochs stayed far behind the 67 epochs (1,000
# steps) of this rule.
# SNIPS's own counts (3,060 / 1,224 steps): ATIS's 15 epochs (1,035 CLC steps) left its CLC barely
# above the majority intent, still improving; a corpus of 4-10k utterances needs as many steps as
# SNIPS, not as many epochs.
SGD_MIN_STEPS = {"clc": 3000, "bert": 1200}
# Words per utterance (the padded length; longer utterances are cut and counted). A public
# constant, never the data's longest utterance: the synthetic generator's templates and fillers
# give at most 18 words (12,000 utterances measured), other data gets the common 32. Shorter
# padding is time: CLC unrolls its two BiLSTMs over every position.
MAX_WORDS = {"synthetic": 20, "data_dir": 32}
# Memory: per-example clipping holds every row's activations at once, so a private step's memory
# grows with its batch. A private run that leaves physical_batch_size at 0 ("auto") clips a
# replica's batch in chunks of whole micro-batches, one after the other, when the batch is
# larger than the bound below: the same clipped sum, so the same mechanism and epsilon
# (edp_tf/microbatch.py). CLC's memory follows rows x padded words (results/memory, the default
# command, one epoch, peak resident): SNIPS (2,348 rows of 32 words, 75k row-words) 10.1 GB
# unchunked, 5.7 GB in chunks of 512 rows, 3.5 GB in chunks of 256 (8,192 row-words); the
# built-in job (1,755 rows of 20 words, 35k) 3.9-4.1 GB unchunked. Chunks cost no step time (a
# SNIPS step 6.2 s in chunks, 6.8 s whole) but about 15 s of tracing (the first chunk and the
# loop are traced apart), so a batch up to UNCHUNKED is left whole: the built-in job keeps its
# time goal. BERT: chunks of 256 rows (edp_nlu/configs/snips_bert.py).
UNCHUNKED = {"clc": 36_000, "bert": 256}  # row-words (CLC) or rows (BERT) clipped at once
CHUNK = {"clc": 8_192, "bert": 256}  # the chunk's row-words or rows

LEARNING_RATE = {  # (model, private) -> peak learning rate of the config's optimizer
    ("clc", False): 2e-3, ("clc", True): 3e-2,  # private: with q 0.16 (see above)
    ("bert", False): 1e-4, ("bert", True): 2e-3,  # private: 2e-3 beat 1e-3 on SNIPS at epsilon 8
}


def steps_per_epoch(n: int, batch: float, private: bool, sampling: str, bands: int = 1) -> int:
    """Steps of one epoch: ceil(1/q) with Poisson sampling (PoissonSampler), b ceil(1/(b q))
    with BandMF's b groups (BandMFSampler: whole cycles), else floor(n/B)."""
    if private and sampling == "poisson":
        return bands * int(math.ceil(n / (bands * batch) - 1e-9))
    return max(1, n // int(batch))


def data_source(data) -> str:
    """"data_dir" for a user's corpus, "synthetic" for the built-in one: the keys of the
    constants above that differ between them (`data`: a DataSpec or a config)."""
    return "data_dir" if data.data_dir else "synthetic"


def resolve_parts(parts: dict, n: int) -> dict:
    """{part: part} of a run spec (RunSpec's fields) with batch_size, epochs, learning_rate
    (and max_words) fixed for n training examples (privacy units), each changed part a
    `dataclasses.replace` of the given one.

    Explicit values win; `sampling_rate > 0` sets the batch (q n), `steps > 0` the epochs
    (ceil(steps / steps per epoch): the ledger accounts whole epochs). A dataset config can give
    its own automatic values for private runs only (`private_sampling_rate`, `private_steps`,
    `private_learning_rate`), so that one config serves `--mechanism=sgd` too. Likewise
    `bert.private_finetune` and `bert.private_dropout` (when set) replace `bert.finetune` and
    `bert.dropout` in private runs, `private_head_dropout` replaces `head_dropout` and
    `private_ema_fraction` replaces `ema_fraction`: LoRA without dropout is the best private
    recipe measured on SNIPS, while plain fine-tuning wants every kernel and dropout, and
    averaging the weights helped CLC's noisy iterates where plain training was not measured with
    it. To change what a private run
    of such a config trains, set the private_ field; config.json records what ran.
    """
    data, model, optimizer = parts["data"], parts["model"], parts["optimizer"]
    sampling, privacy, run = parts["sampling"], parts["privacy"], parts["run"]
    private = privacy.private
    if sampling.sampling_rate < 0 or sampling.sampling_rate > 1:
        raise ValueError(f"--config.sampling_rate={sampling.sampling_rate!r} is invalid: "
                         "expected in [0, 1] (0 = use batch_size)")
    if sampling.steps < 0:
        raise ValueError(f"--config.steps={sampling.steps!r} is invalid: expected >= 0 (0 = use "
                         "epochs)")
    per_unit = privacy.mechanism == "dpsgd" or (privacy.privacy_unit == "user" and private)
    multiple = int(run.replicas) * (1 if per_unit else max(1, int(privacy.microbatch_size)))
    if sampling.batch_size > 0 and sampling.sampling_rate == 0:
        batch = int(sampling.batch_size)  # explicit: kept as given (too large is an error later)
    else:  # round(q n) to a multiple of the micro-batches a step needs
        by_user = private and privacy.privacy_unit == "user"
        batch = (sampling.sampling_rate * n if sampling.sampling_rate > 0 else
                 USER_SAMPLING_RATE * n if by_user else
                 (sampling.private_sampling_rate or PRIVATE_SAMPLING_RATE[model.model]) * n
                 if private else SGD_BATCH[model.model])
        batch = int(min(n // multiple * multiple,
                        max(multiple, round(batch / multiple) * multiple)))
    bands = int(privacy.knob("bandmf_bands"))  # BandMF: epochs of whole cycles of b steps
    per_epoch = steps_per_epoch(n, batch, private, sampling.sampling, bands)
    if sampling.steps > 0:
        epochs = math.ceil(sampling.steps / per_epoch)
    elif sampling.epochs > 0:
        epochs = int(sampling.epochs)
    elif private:
        steps = (USER_STEPS if privacy.privacy_unit == "user" else
                 sampling.private_steps or PRIVATE_STEPS[(model.model, data_source(data))])
        epochs = math.ceil(steps / per_epoch)
    else:
        epochs = max(SGD_EPOCHS[model.model], math.ceil(SGD_MIN_STEPS[model.model] / per_epoch))
    learning_rate = optimizer.learning_rate
    if learning_rate <= 0:
        learning_rate = ((private and optimizer.private_learning_rate) or
                         LEARNING_RATE[(model.model, private)])
    model = dataclasses.replace(
        model, max_words=model.max_words if model.max_words > 0 else MAX_WORDS[data_source(data)])
    return dict(parts, model=private_model_fields(model, private),
                sampling=dataclasses.replace(sampling, batch_size=batch,
                                             epochs=max(1, int(epochs))),
                optimizer=dataclasses.replace(private_optimizer_fields(optimizer, private),
                                              learning_rate=learning_rate))


def private_optimizer_fields(optimizer: OptimizerSpec, private: bool) -> OptimizerSpec:
    """`optimizer` with `private_ema_fraction` in `ema_fraction`'s place, if `private` and set."""
    if not private or optimizer.private_ema_fraction < 0:
        return optimizer
    return dataclasses.replace(optimizer, ema_fraction=optimizer.private_ema_fraction)


def private_model_fields(model: ModelSpec, private: bool) -> ModelSpec:
    """`model` with its private_ fields in the places they stand for, if `private` (what a
    private run trains, see `resolve_parts`)."""
    if not private:
        return model
    bert = model.bert
    if bert.private_finetune:
        bert = dataclasses.replace(bert, finetune=bert.private_finetune)
    if bert.private_dropout >= 0:
        bert = dataclasses.replace(bert, dropout=bert.private_dropout)
    head_dropout = (model.private_head_dropout if model.private_head_dropout >= 0
                    else model.head_dropout)
    return dataclasses.replace(model, bert=bert, head_dropout=head_dropout)


def resolve(config, n: int) -> ml_collections.ConfigDict:
    """`resolve_parts` for an experiment config (a ConfigDict or its dict): a resolved copy."""
    return _config_of(resolve_parts(parts_of(_flat(config)), n))


def with_private_fields(config, private: bool) -> ml_collections.ConfigDict:
    """A copy of `config` whose private_ fields replace the fields they stand for, if `private`:
    how a resumed run's config file is compared with the config.json that recorded what ran."""
    parts = parts_of(_flat(config))
    return _config_of(dict(parts, model=private_model_fields(parts["model"], private),
                           optimizer=private_optimizer_fields(parts["optimizer"], private)))


def _flat(config) -> dict:
    return config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)


def _config_of(parts: dict) -> ml_collections.ConfigDict:
    out = {}
    for part in parts.values():
        out.update(flat_fields(part))
    return ml_collections.ConfigDict(out)


def total_steps(config: ml_collections.ConfigDict, n: int) -> int:
    private = config.mechanism != "sgd"
    return int(config.epochs) * steps_per_epoch(n, config.batch_size, private, config.sampling,
                                                int(config.bandmf_bands))


def chunk_rows(model: ModelSpec, privacy: PrivacySpec, microbatch_rows: int,
               replica_rows: int) -> int:
    """The physical_batch_size of a run that leaves it at 0: 0 (no chunks) for plain training
    and for a replica batch within UNCHUNKED, else the largest multiple of a micro-batch's rows
    (`microbatch_rows`) within CHUNK, and never less than one micro-batch. The run records it
    in its spec (`RunSpec.with_knobs`), so config.json holds it and a resumed run reads it
    back."""
    given = int(privacy.knob("physical_batch_size"))
    if not privacy.private or given:
        return given
    words = int(model.max_words) if model.model == "clc" else 1
    if replica_rows * words <= UNCHUNKED[model.model]:
        return 0
    limit = CHUNK[model.model] // words
    return max(microbatch_rows, limit // microbatch_rows * microbatch_rows)
