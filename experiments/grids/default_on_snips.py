"""The default command on a corpus it was not tuned on (the "user's own corpus" goal).

    python -m experiments.experiment --grid=experiments/grids/default_on_snips.py

Each cell is exactly what a new user types: `python -m edp_nlu.train --data_dir=<corpus>` (private,
epsilon 8) and the same with `--mechanism=sgd`, with edp_nlu/configs/default.py's automatic batch,
steps and learning rate (edp_nlu/pipeline/recipes.py). No SNIPS-specific setting is involved:
edp_nlu/configs/default.py was chosen on the synthetic corpus, except its private sampling rate and
learning rate (q 0.16, 3e-2), which were found on SNIPS (edp_nlu/configs/snips_clc.py) and confirmed
on the synthetic corpus, and its step count on a --data_dir corpus (150), chosen on these SNIPS and
ATIS rows. Only diagnostics (membership inference) are added. SNIPS has 7 intents, not the ~60 of
the goal's corpus: a proxy.
"""
from experiments.grids.common import CLC_NAME_WORD_RECIPE, cell, grid, with_heads_before

DATA = "../shared/data/snips"
SYNTHETIC_SGD = "runs/experiments/pilot_default/sgd"
NOTES = ("edp_nlu/configs/default.py as a user runs it with --config.data_dir; other overrides "
         "are the row's (the earlier rows pin the heads default.py had then).")


def cells(data_dir: str):
    common = ("diagnostics=True", f"data_dir={data_dir}")
    # CLC's dropout 0.25, which the default recipe dropped (results/pilot_default)
    before = "clc.dropout=0.25"
    # the private recipe q 0.16 replaced: q 0.0533, 190 steps, Adam 2e-2
    q053 = ("private_sampling_rate=0.0533", "private_steps=190", "private_learning_rate=0.02")
    return [
        cell("clc_sgd", "default command, --mechanism=sgd (not private)", "SGD",
             "edp_nlu/configs/default.py", *common, "mechanism=sgd"),
        cell("clc_default", "default command (per-example DP-SGD, eps 8; q 0.16, 150 steps on "
             "a --data_dir corpus)", "per-example",
             "edp_nlu/configs/default.py", *common),
        cell("clc_default_steps84", "an earlier default, before 150 steps on a --data_dir "
             "corpus (q 0.16, 84 steps), private, eps 8", "per-example (84 steps)",
             "edp_nlu/configs/default.py", *common, "private_steps=84"),
        # 100 steps at q 0.16: between the built-in corpus's 84 and a --data_dir corpus's 150
        cell("clc_default_steps100", "an earlier default, before 84 steps (q 0.16, 100 "
             "steps), private, eps 8", "per-example (100 steps)", "edp_nlu/configs/default.py",
             *common, "private_steps=100"),
        cell("clc_default_q053", "an earlier default, before q 0.16 (q 0.053, 190 steps, "
             "Adam 2e-2), private, eps 8", "per-example (q 0.053)", "edp_nlu/configs/default.py",
             *common, *q053),
        cell("clc_sgd_dropout", "the default before (dropout 0.25), --mechanism=sgd", "SGD "
             "(before)", "edp_nlu/configs/default.py", *common, "mechanism=sgd", before),
        cell("clc_default_dropout", "the default before (dropout 0.25, q 0.053), private, eps 8",
             "per-example (before)", "edp_nlu/configs/default.py", *common, before, *q053),
        # Public pretraining from the built-in synthetic corpus, which every install has: CLC's
        # backbone starts from the default command's plain training on it (results/pilot_default row
        # sgd), then the default private recipe adapts it (edp_nlu/pipeline/warm_start.py).
        # ATIS's CLC gained a little from SNIPS pretraining, SNIPS nothing from ATIS
        # (results/{atis,snips}).
        # Synthetic pretraining gave no gain on either corpus (one run each, results/default_on_*):
        # the default does not pretrain.
        cell("clc_default_from_synthetic", "default command, backbone from the synthetic "
             "corpus's SGD run (public pretraining), private, eps 8",
             "per-example (synthetic pretraining)", "edp_nlu/configs/default.py", *common,
             f"init_from={SYNTHETIC_SGD}"),
        # Every cell above ran with the backward LSTM that a Keras bug zeroed at most words
        # (docs/results.md, the backward LSTM of CLC); these two re-run the headline pair fixed.
        cell("clc_sgd_both_directions", "default command, --mechanism=sgd (not private), "
             "backward LSTM fixed", "SGD", "edp_nlu/configs/default.py", *common, "mechanism=sgd"),
        cell("clc_default_both_directions", "default command (per-example DP-SGD, eps 8), "
             "backward LSTM fixed", "per-example", "edp_nlu/configs/default.py", *common),
        # The SNIPS and ATIS CLC configs' heads and averaging (docs/results.md, the CLC recipe),
        # on the default command: whether they become default.py's too.
        cell("clc_default_name_words", "default command with the CLC configs' heads (label "
             "name words, a column per label) and weight averaging, private, eps 8",
             "per-example (name-word heads, averaged)", "edp_nlu/configs/default.py", *common,
             *CLC_NAME_WORD_RECIPE),
        cell("clc_default_name_words_run2", "the same, second run", "per-example (name-word "
             "heads, averaged)", "edp_nlu/configs/default.py", *common, *CLC_NAME_WORD_RECIPE),
        cell("clc_sgd_name_words", "default command with the CLC configs' heads, "
             "--mechanism=sgd (not private; plain runs do not average)", "SGD (name-word heads)",
             "edp_nlu/configs/default.py", *common, "mechanism=sgd", *CLC_NAME_WORD_RECIPE),
    ]


def get_config():
    # the cells ran before the CLC configs' heads and weight averaging changed
    return with_heads_before(_grid())


def _grid():
    return grid("default_on_snips", cells(DATA),
                notes=NOTES)
