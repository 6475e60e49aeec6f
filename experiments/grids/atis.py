"""ATIS grid: the same rows as experiments/grids/snips.py.

    python -m experiments.experiment --grid=experiments/grids/atis.py
"""
from experiments.grids.common import EDP_BERT_LEFT_OUT, bert_private, cell, grid, with_heads_before
from experiments.grids.snips import rows

ATIS = "edp_nlu/configs/atis_bert.py"


def dp8(name: str, label: str, *overrides: str):
    """A per-example cell at epsilon 8, pinned (bert_private) against atis_bert's recipe."""
    return cell(name, label, "per-example", ATIS, "diagnostics=True", "mechanism=dpsgd",
                "target_epsilon=8.0", *bert_private(*overrides))


def get_config():
    # the cells ran before the CLC configs' heads and weight averaging changed
    return with_heads_before(_grid())


def _grid():
    # SNIPS's BERT did better with 300 private steps than with ~150 (results/pilot_snips_bert); this
    # cell asks the same of ATIS.
    steps300 = dp8("bert_dpsgd_eps8_steps300", "per-example DP-SGD, eps 8, 300 steps",
                   "private_steps=300", "slot_loss=sum")
    # With the summed slot loss ATIS's private intent accuracy stays near its majority class: every
    # example is clipped, and the summed slot loss (one CRF term per word) outweighs the intent's in
    # each clipped vector. The same 150 steps with the slot loss per word:
    slotmean = dp8("bert_dpsgd_eps8_slotmean", "per-example DP-SGD, eps 8, 150 steps, slot loss "
                   "per word", "private_steps=150", "slot_loss=mean")
    # all-MiniLM-L6-v2 was trained through mean pooling and ships an untrained pooler: the same
    # 150 steps (slot loss per word) with the intent head on the mean of the pieces' states.
    meanpool = dp8("bert_dpsgd_eps8_meanpool", "per-example DP-SGD, eps 8, 150 steps, slot loss "
                   "per word, mean pooling", "private_steps=150", "slot_loss=mean",
                   "bert.pooling=mean")
    # On SNIPS's BERT, LoRA r 8 at Adam 5e-3 over 300 steps beat every kernel trained, and no
    # dropout beat dropout 0.1 (results/pilot_snips_bert). All of it on ATIS, with the slot loss per
    # word (the intent accuracy is what ATIS's private rows lose):
    lora = dp8("bert_dpsgd_eps8_lora_nodropout", "per-example DP-SGD, eps 8, LoRA r 8 (per-head "
               "layout), no dropout, 300 steps, slot loss per word", "private_steps=300",
               "bert.finetune=lora", "learning_rate=0.005", "bert.dropout=0.0", "slot_loss=mean")
    # On SNIPS, LoRA in the matrix layout (one rank-8 pair per kernel, 0.55M trained weights) beat
    # the per-head layout (results/pilot_snips_bert, one run each); the same on ATIS, everything
    # else as atis_bert's private recipe (which uses this layout; the cells below that build on it
    # pin it)
    def matrix_at(learning_rate: str) -> tuple:
        return ("bert.finetune=lora", f"learning_rate={learning_rate}", "bert.dropout=0.0",
                "slot_loss=mean", "bert.lora_layout=matrix")
    matrix = matrix_at("0.005")
    lora_matrix = dp8("bert_dpsgd_eps8_lora_matrix", "per-example DP-SGD, eps 8, LoRA r 8 "
                      "(matrix layout), no dropout, 300 steps, slot loss per word",
                      "private_steps=300", *matrix)
    # atis_bert's earlier recipe: ~150 private steps, summed slot loss
    steps150 = dp8("bert_dpsgd_eps8_steps150", "per-example DP-SGD, eps 8, 150 steps",
                   "private_steps=150", "slot_loss=sum")
    bert = rows("bert", ATIS)
    # plain fine-tuning is measured with the summed slot loss (atis_bert's private recipe takes it
    # per word)
    bert[0] = cell("bert_sgd", "SGD (not private), summed slot loss", "sgd", ATIS,
                   "diagnostics=True", "mechanism=sgd", "slot_loss=sum")
    # CLC's SGD row (3,080 steps) missed the paper's 6.3% (6.8%) with its dev SER still falling at
    # the last epoch: twice the steps.
    clc_sgd_long = cell("clc_sgd_steps6000", "SGD (not private), 88 epochs (6,072 steps)", "sgd",
                        "edp_nlu/configs/atis_clc.py", "diagnostics=True", "mechanism=sgd",
                        "epochs=88")
    # Public pretraining (edp_nlu/pipeline/warm_start.py): the backbone starts from the SNIPS
    # grid's CLC SGD run (run that cell first); SNIPS is public, and not ATIS
    from_snips = cell("clc_dpsgd_eps8_from_snips", "per-example DP-SGD, eps 8, backbone from "
                      "SNIPS SGD (public pretraining)", "per-example, public pretraining",
                      "edp_nlu/configs/atis_clc.py", "diagnostics=True", "mechanism=dpsgd",
                      "target_epsilon=8.0", "init_from=runs/experiments/snips/clc_sgd")
    # Every example is clipped, so the loss weights set how each example's clipped norm is shared
    # between the intent and the slots (the per-word slot loss raised BERT's private intent accuracy
    # at 150 steps): twice the intent loss, against the private CLC's intent gap to SGD. The intent
    # did not move (results/atis). Nor could it buy much: SER counts an utterance's wrong intent as
    # one error among its reference slots + 1, so the private CLC's wrong intents are a small part
    # of its SER, and the slots hold the rest.
    clc_intent2 = cell("clc_dpsgd_eps8_intent2", "per-example DP-SGD, eps 8, intent loss weight 2",
                       "per-example", "edp_nlu/configs/atis_clc.py", "diagnostics=True",
                       "mechanism=dpsgd", "target_epsilon=8.0", "intent_loss_weight=2.0")
    # The same for BERT: the encoder starts from the SNIPS grid's plain fine-tuning (its bert_sgd
    # run: every kernel trained on SNIPS), then LoRA as in lora_matrix; the heads start fresh.
    bert_from_snips = cell("bert_dpsgd_eps8_from_snips", "per-example DP-SGD, eps 8, LoRA r 8 "
                           "(matrix layout), encoder from SNIPS SGD (public pretraining)",
                           "per-example, public pretraining", ATIS, "diagnostics=True",
                           "mechanism=dpsgd", "target_epsilon=8.0",
                           *bert_private("private_steps=300", *matrix,
                                         "init_from=runs/experiments/snips/bert_sgd"))
    # On SNIPS (per-head layout) twice the sampling rate for half the steps, the same 24 epochs,
    # could not be told apart from q 0.08 in one run each. ATIS has a third of SNIPS's utterances,
    # so at q 0.08 its expected batch (358) carries a third of the signal against the same noise:
    # q 0.16 on ATIS
    q16 = dp8("bert_dpsgd_eps8_q16", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), no "
              "dropout, q 0.16, 150 steps, slot loss per word", "sampling_rate=0.16",
              "private_steps=150", *matrix)
    # q 0.16 did worse than lora_matrix, behind on dev at every epoch (results/atis): too few steps
    # for ATIS.
    # ... and the other way: half the sampling rate for twice the steps, the same 24 epochs (not run
    # to the end: ahead of lora_matrix on dev at first, then level above it).
    q04 = dp8("bert_dpsgd_eps8_q04", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), no "
              "dropout, q 0.04, 600 steps, slot loss per word", "sampling_rate=0.04",
              "private_steps=600", *matrix)
    # Fewer factors, less noise (the BERT gap is the noise: sigma = 0 matched SGD): LoRA on the
    # query and value kernels only (Hu et al.; Yu et al. under DP), 74k factor entries against
    # 0.33M; the other kernels stay frozen, their biases train. Not run to the end: behind
    # lora_matrix on dev at every epoch, the slots most: the feed-forward factors carry the slots,
    # so matrix LoRA on every kernel stays the default.
    lora_qv = dp8("bert_dpsgd_eps8_lora_qv", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout) "
                  "on query and value only, no dropout, 300 steps, slot loss per word",
                  "private_steps=300", *matrix, "bert.lora_targets=query_value")
    # Adam 5e-3 was chosen on SNIPS for every kernel at 150 steps (pilot_snips_bert) and kept for
    # LoRA without a sweep: LoRA's factors start at zero (B = 0), so their useful step may differ.
    # Twice and half of it, everything else as lora_matrix (neither run to the end). 1e-2 was ahead
    # for the first epochs, then its dev SER rose at the peak rate while lora_matrix's kept falling:
    # Adam moves the weights along the noise in proportion to the rate, and at 1e-2 that random walk
    # outweighs the signal. 2.5e-3 was behind at every epoch, closing slowly. 5e-3 sits between them
    # and stays the default.
    lr1e2 = dp8("bert_dpsgd_eps8_lr1e-2", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), "
                "no dropout, Adam 1e-2, 300 steps, slot loss per word", "private_steps=300",
                *matrix_at("0.01"))
    lr25e4 = dp8("bert_dpsgd_eps8_lr2.5e-3", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), "
                 "no dropout, Adam 2.5e-3, 300 steps, slot loss per word", "private_steps=300",
                 *matrix_at("0.0025"))
    # The intent is what ATIS's private BERT loses most against SGD. The pooler that feeds the
    # intent head is 148k of the 0.55M weights the LoRA recipe trains, every one noised, and
    # all-MiniLM-L6-v2 was trained through mean pooling (its pooler was not): the LoRA recipe with
    # the intent head on the mean of the pieces' states (pooler frozen, unused); meanpool above asks
    # the same with every kernel trained at 150 steps. The intent gained a little, the slots lost
    # more, and its test SER was worse than lora_matrix's (results/atis): the pooler stays.
    meanpool_lora = dp8("bert_dpsgd_eps8_lora_meanpool", "per-example DP-SGD, eps 8, LoRA r 8 "
                        "(matrix layout), no dropout, 300 steps, slot loss per word, mean pooling",
                        "private_steps=300", *matrix, "bert.pooling=mean")
    # Every example is clipped to C = 1, but an example whose gradient norm falls below C as the
    # model fits adds less than C of signal against the same noise z C. Adam divides out the
    # scale of C (its epsilon is far below the noise per weight, z C / (q n) ~ 3e-4 at C = 0.1), so
    # C = 0.1 amounts to clipping every example to one norm throughout (normalised per-example
    # gradients; Bu et al. 2022, De et al. 2022 with small C), everything else as lora_matrix.
    # It did worse than lora_matrix on test and on dev at most epochs (results/atis): C stays 1.
    # Even at C = 0.1 the share of real examples clipped falls well below 1 within 10 epochs: many
    # examples are fit early.
    clip01 = dp8("bert_dpsgd_eps8_clip0.1", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), "
                 "no dropout, 300 steps, slot loss per word, C 0.1", "private_steps=300", *matrix,
                 "l2_norm_clip=0.1")
    # DP-AdamBC (Tang et al. 2023; edp_tf/bias_corrected_adam.py): the noise variance per
    # weight, (z S C / D)^2 ~ (2.5e-3)^2 here, dominates Adam's second moment for nearly every
    # weight, so DP-Adam steps like SGD; taking it out restores Adam's per-weight step sizes.
    # Weights with no measurable signal step up to 1 / sqrt(floor 0.05) = 4.5x further than under
    # DP-Adam, so the learning rate is halved (2.5e-3): their steps then match DP-Adam's at 1.1e-2,
    # inside the flat 2.5e-3..1e-2 range lr1e2 / lr25e4 measured; everything else as lora_matrix.
    adam_bc = dp8("bert_dpsgd_eps8_adam_bc", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), "
                  "no dropout, DP-AdamBC 2.5e-3 (floor 0.05), 300 steps, slot loss per word",
                  "private_steps=300", *matrix_at("0.0025"), "optimizer=adam_bc",
                  "adam_bc_floor=0.05")
    # Not run to the end: behind lora_matrix on dev, and getting worse after the first epochs along
    # with its training loss and mean pre-clip gradient norm: the noise-only weights' larger steps
    # walk the model off. The floor is what lets them; see pilot_snips_clc's dpsgd_adam_bc_floor1
    # for floor 1.
    # LoRA's rank is 8 everywhere else. Rank 4 halves the factors (0.33M -> 0.17M: 41,472 r over
    # MiniLM-L6's 36 kernels; the pooler, heads, biases and layer norms, 0.22M, stay), so each
    # trained weight's share of the clipped signal grows against the same per-weight noise;
    # lora_alpha stays 16 (the update is scaled by alpha / r, Hu et al.), everything else as
    # lora_matrix. It did worse than lora_matrix on test and on dev at every epoch compared
    # (results/atis): rank 8 stays.
    rank4 = dp8("bert_dpsgd_eps8_lora_r4", "per-example DP-SGD, eps 8, LoRA r 4 (matrix layout), "
                "no dropout, 300 steps, slot loss per word", "private_steps=300", *matrix,
                "bert.lora_rank=4")
    # bert_from_snips came out a little ahead of lora_matrix, one run each, by less than two runs of
    # one recipe can differ (pilot_snips_clc's repeated runs). The same recipe again, with fresh
    # noise, from a fresh run of the SNIPS grid's bert_sgd command (its init_from); it repeated the
    # first run's result (results/atis).
    bert_from_snips2 = cell("bert_dpsgd_eps8_from_snips_run2", "per-example DP-SGD, eps 8, LoRA "
                            "r 8 (matrix layout), encoder from SNIPS SGD (public pretraining), "
                            "second run", "per-example, public pretraining", ATIS,
                            "diagnostics=True", "mechanism=dpsgd", "target_epsilon=8.0",
                            *bert_private("private_steps=300", *matrix,
                                          "init_from=runs/experiments/snips/bert_sgd"))
    # FFA-LoRA (Sun et al. 2024; edp_nlu/models/bert/finetuning.py): every A frozen at its random
    # start, only B trains. B starts at 0, so A's gradient starts at 0 and A gets mostly noise while
    # it shares each example's clipped norm with B; frozen, the noise is drawn for B alone (0.17M of
    # the 0.33M factor entries) at the same rank 8 (rank 4 halves both factors and lost). Everything
    # else as lora_matrix. It was level with lora_matrix, one run each (results/atis).
    frozen_a = dp8("bert_dpsgd_eps8_lora_frozen_a", "per-example DP-SGD, eps 8, LoRA r 8 "
                   "(matrix layout), A frozen (FFA-LoRA), no dropout, 300 steps, slot loss per "
                   "word", "private_steps=300", *matrix, "bert.lora_freeze_a=True")
    # DP linear probing then fine-tuning (Ke et al. 2024; edp_tf freeze_until): the fresh intent and
    # slot heads train alone for the first 3 epochs (~37 of the 300 steps), the encoder (LoRA
    # factors, biases, layer norms) frozen, so early LoRA updates follow trained heads instead of
    # random ones. Same z0 and epsilon: every step is the same Gaussian mechanism over what trains.
    # Everything else as lora_matrix. The heads alone fell far behind, the whole model caught up
    # later and ended behind lora_matrix (results/atis): no gain, the default keeps training
    # everything from the first step.
    probe = dp8("bert_dpsgd_eps8_probe3", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), "
                "heads alone for the first 3 epochs, no dropout, 300 steps, slot loss per word",
                "private_steps=300", *matrix, "probe_epochs=3")
    # atis_bert's private default once more (bert_dpsgd_eps8's run was interrupted twice and
    # ran 22 of its 24 epochs, and that run's directory is gone, so it cannot be rescored): a
    # second sample of the default, uninterrupted, scored with both CRF decodings. Its command
    # is bert_dpsgd_eps8's but for --run_dir.
    run2 = cell("bert_dpsgd_eps8_run2", "per-example DP-SGD, eps 8 (atis_bert's default, second "
                "run)", "per-example", ATIS, "diagnostics=True", "mechanism=dpsgd",
                "target_epsilon=8.0")
    # bert_sgd's command again (its run directory is gone): the SGD side of the BIO decoding's
    # ratio on ATIS
    sgd2 = cell("bert_sgd_run2", "SGD (not private), summed slot loss (second run)", "sgd", ATIS,
                "diagnostics=True", "mechanism=sgd", "slot_loss=sum")
    # atis_clc's SGD and private default once the backward LSTM reads every word: the other CLC
    # rows ran a backward direction that gave zeros at most words (keras-team/keras#17596)
    clc_both = [
        cell("clc_sgd_both_directions", "SGD (not private), backward LSTM fixed", "sgd",
             "edp_nlu/configs/atis_clc.py", "diagnostics=True", "mechanism=sgd"),
        cell("clc_dpsgd_eps8_both_directions", "per-example DP-SGD, eps 8, backward LSTM fixed",
             "per-example", "edp_nlu/configs/atis_clc.py", "diagnostics=True", "mechanism=dpsgd",
             "target_epsilon=8.0"),
        cell("clc_dpsgd_eps8_both_directions_run2", "per-example DP-SGD, eps 8, backward LSTM "
             "fixed (second run)", "per-example", "edp_nlu/configs/atis_clc.py", "diagnostics=True",
             "mechanism=dpsgd", "target_epsilon=8.0"),
        cell("clc_dpsgd_sigma0_both_directions", "per-example, sigma = 0 (clipping only), Adam "
             "1e-2, backward LSTM fixed", "diagnostic", "edp_nlu/configs/atis_clc.py",
             "diagnostics=True", "mechanism=dpsgd", "target_epsilon=0.0", "noise_multiplier=0.0",
             "learning_rate=0.01"),
        # augmentation multiplicity (experiments/grids/augmentation.py): ATIS's city, date, day and
        # time slots have public fillers, so its copies vary slots as well as masked words
        cell("clc_dpsgd_eps8_k4", "per-example DP-SGD, eps 8, K = 4 augmented copies in one "
             "clip, backward LSTM fixed", "per-example", "edp_nlu/configs/atis_clc.py",
             "diagnostics=True", "mechanism=dpsgd", "target_epsilon=8.0",
             "physical_batch_size=512", "augment_copies=4"),
        cell("clc_dpsgd_eps8_k8", "per-example DP-SGD, eps 8, K = 8 augmented copies in one "
             "clip, backward LSTM fixed", "per-example", "edp_nlu/configs/atis_clc.py",
             "diagnostics=True", "mechanism=dpsgd", "target_epsilon=8.0",
             "physical_batch_size=512", "augment_copies=8"),
    ]
    return grid("atis", bert + [steps150, steps300, slotmean, meanpool, lora, lora_matrix,
                                bert_from_snips, q16, q04, lora_qv, lr1e2, lr25e4,
                                meanpool_lora, clip01, adam_bc, rank4, bert_from_snips2, frozen_a,
                                probe, run2, sgd2]
                + rows("clc", "edp_nlu/configs/atis_clc.py")
                + [clc_sgd_long, from_snips, clc_intent2]
                + clc_both,
                schedule_reference="bert_dpsgd_eps8",
                notes="Every CLC cell but the *_both_directions ones ran with a backward LSTM "
                      "that a Keras bug zeroed at most words (docs/results.md, the backward LSTM "
                      "of CLC). "
                      "BERT cells other than rows() are pinned (experiments/grids/common.py "
                      "bert_private): what they leave open is what atis_bert gave private runs "
                      "when they ran. bert_dpsgd_eps8 is the run of bert_dpsgd_eps8_lora_matrix "
                      "(its "
                      "command: the same config as atis_bert's default since its LoRA layout "
                      "became matrix); bert_dpsgd_eps8_lora_nodropout was the "
                      "default before. bert_dpsgd_eps8_lora_matrix ran 22 of its 24 epochs: it "
                      "was interrupted twice (the OOM killer, a session's end) and resumed, and "
                      "the ledger charged each interrupted epoch again, so the budget ran out "
                      "two epochs early. The from_snips cells need the SNIPS grid's clc_sgd and "
                      "bert_sgd runs (their init_from). " + EDP_BERT_LEFT_OUT)
