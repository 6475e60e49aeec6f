"""Pilot: the default job's private recipe on the synthetic corpus (public; chooses
edp_nlu/configs/default.py).

The recipe this pilot starts from (per-example, 95 steps of the expected batch 512) leaves time
to spare under the default job's 180 s goal on a 2-core machine, its test SER varies widely from
run to run (the intent is what fails), and its dev SER is still falling fast at the last epoch.
Candidates: the per-word slot loss (on SNIPS it raised private intent accuracy), one BiLSTM layer
(half the trained weights, so more signal per noisy coordinate, and a faster step), and more steps
at the same epsilon. Each recipe runs three times (r1..r3), since one run is not enough at this
variance.
"""
from experiments.grids.common import CLC_NAME_WORD_RECIPE, cell, grid, with_heads_before

DEFAULT = "edp_nlu/configs/default.py"
# Every recipe states its knobs, so its command reproduces it whatever edp_nlu/configs/default.py
# says (edp_nlu/configs/default.py is q16_steps84). Recipes that leave the sampling rate and the
# learning rate open were measured at q 0.0533, Adam 2e-2: get_config pins them.
BEFORE_Q16 = ("private_sampling_rate=0.0533", "private_learning_rate=0.02")
D = "clc.dropout=0.25"
OLD = ("slot_loss=sum", "clc.num_lstm_layers=2", "private_steps=95", D)
RECIPES = {
    "default": ("the default before (summed slot loss, 2 BiLSTM layers, 95 steps)", OLD),
    "slotmean": ("slot loss per word", ("slot_loss=mean", "clc.num_lstm_layers=2",
                                        "private_steps=95", D)),
    "slotmean_1lstm": ("slot loss per word, one BiLSTM layer",
                       ("slot_loss=mean", "clc.num_lstm_layers=1", "private_steps=95", D)),
    "1lstm": ("one BiLSTM layer (summed slot loss)",
              ("slot_loss=sum", "clc.num_lstm_layers=1", "private_steps=95", D)),
    "slotmean_steps190": ("slot loss per word, 190 steps",
                          ("slot_loss=mean", "clc.num_lstm_layers=2", "private_steps=190", D)),
    "slotmean_1lstm_steps190": ("slot loss per word, one BiLSTM layer, 190 steps (an earlier "
                                "default, before no dropout)",
                                ("slot_loss=mean", "clc.num_lstm_layers=1", "private_steps=190",
                                 D)),
    # no dropout helped SNIPS CLC (results/pilot_snips_clc); the same here
    "slotmean_1lstm_steps190_nodropout": (
        "slot loss per word, one BiLSTM layer, 190 steps, no dropout (an earlier default, "
        "before q 0.16)", ("slot_loss=mean", "clc.num_lstm_layers=1", "private_steps=190",
                        "clc.dropout=0.0")),
    # snips_clc's sampling rate, steps and learning rate (on SNIPS and ATIS at eps 8 better than q
    # 0.053 / 190 steps): does the synthetic corpus keep its utility, and what does the 2.4x compute
    # cost against the 180 s goal?
    "q16_steps150": (
        "q 0.16, 150 steps, Adam 3e-2 (snips_clc's rate, steps and learning rate)",
        ("slot_loss=mean", "clc.num_lstm_layers=1", "clc.dropout=0.0",
         "private_sampling_rate=0.16", "private_steps=150", "private_learning_rate=0.03")),
    # q 0.16 for 150 steps runs past the default job's 180 s goal: q 0.1 for the same 150 steps is
    # 37% less compute
    "q10_steps150": (
        "the default with q 0.1, 150 steps, Adam 3e-2",
        ("slot_loss=mean", "clc.num_lstm_layers=1", "clc.dropout=0.0",
         "private_sampling_rate=0.1", "private_steps=150", "private_learning_rate=0.03")),
    # q 0.16 for 150 steps is about twice the compute of q 0.053 / 190 steps (22 epochs of the
    # synthetic corpus against 10): 100 steps (15 epochs) at the same rate
    "q16_steps100": (
        "q 0.16, 100 steps, Adam 3e-2 (1.4x the compute of q 0.053 / 190 steps; an earlier "
        "default, before 84 steps)",
        ("slot_loss=mean", "clc.num_lstm_layers=1", "clc.dropout=0.0",
         "private_sampling_rate=0.16", "private_steps=100", "private_learning_rate=0.03")),
    # q16_steps100 runs past the 180 s goal on a slower 2-core machine (docs/benchmarks.md): two
    # recipes of 12 epochs, about 0.8x its compute
    "q16_steps84": (
        "q 0.16, 84 steps (12 epochs), Adam 3e-2 (edp_nlu/configs/default.py's recipe)",
        ("slot_loss=mean", "clc.num_lstm_layers=1", "clc.dropout=0.0",
         "private_sampling_rate=0.16", "private_steps=84", "private_learning_rate=0.03")),
    "q16_steps84_name_words": (
        "the default with the CLC configs' heads (label name words, a column per label) and "
        "weight averaging", ("slot_loss=mean", "clc.num_lstm_layers=1", "clc.dropout=0.0",
                             "private_sampling_rate=0.16", "private_steps=84",
                             "private_learning_rate=0.03", *CLC_NAME_WORD_RECIPE)),
    "q12_steps100": (
        "q 0.12, 100 steps (12 epochs), Adam 3e-2",
        ("slot_loss=mean", "clc.num_lstm_layers=1", "clc.dropout=0.0",
         "private_sampling_rate=0.12", "private_steps=100", "private_learning_rate=0.03")),
    # "no dropout" above keeps the heads' dropout of 0.1 (head_dropout): without it too
    "headdrop0": (
        "the default (190 steps) without dropout before the heads either",
        ("slot_loss=mean", "clc.num_lstm_layers=1", "clc.dropout=0.0", "private_steps=190",
         "private_head_dropout=0.0")),
}


def get_config():
    cells = []
    for name, (label, overrides) in RECIPES.items():
        given = {o.partition("=")[0] for o in overrides}
        overrides += tuple(p for p in BEFORE_Q16 if p.partition("=")[0] not in given)
        for r in (1, 2, 3):
            cells.append(cell(f"{name}_r{r}", f"{label}, run {r}", name, DEFAULT, *overrides))
    # Plain training on the synthetic corpus: the public source whose backbone starts the
    # default_on_* grids' synthetic-pretraining rows (--config.init_from)
    cells.append(cell("sgd", "the default command, --mechanism=sgd (not private)", "sgd", DEFAULT,
                      "diagnostics=True", "mechanism=sgd"))
    # the cells ran before default.py's heads and weight averaging changed
    return with_heads_before(grid("pilot_default", cells,
                                  notes="Chosen on the synthetic corpus (public)."))
