"""ATIS grid: the same rows as configs/grids/snips.py.

    python -m trainers.experiment --grid=configs/grids/atis.py
"""
from configs.grids.common import EDP_BERT_LEFT_OUT, bert_private, cell, grid
from configs.grids.snips import rows


ATIS = "configs/atis_bert.py"


def dp8(name: str, label: str, *overrides: str):
    """A per-example cell at epsilon 8, pinned (bert_private) against atis_bert's recipe."""
    return cell(name, label, "per-example", ATIS, "diagnostics=True", "mechanism=dpsgd",
                "target_epsilon=8.0", *bert_private(*overrides))


def get_config():
    # SNIPS's BERT went from test SER 0.300 to 0.218 with 300 private steps instead of ~150;
    # this cell asks the same of ATIS before its config's default changes.
    steps300 = dp8("bert_dpsgd_eps8_steps300", "per-example DP-SGD, eps 8, 300 steps",
                   "private_steps=300", "slot_loss=sum")
    # ATIS's private intent accuracy stayed near its majority class (0.74 vs 0.71): every example
    # is clipped, and the summed slot loss (one CRF term per word) outweighs the intent's in each
    # clipped vector. The same 150 steps with the slot loss per word:
    slotmean = dp8("bert_dpsgd_eps8_slotmean", "per-example DP-SGD, eps 8, 150 steps, slot loss "
                   "per word", "private_steps=150", "slot_loss=mean")
    # all-MiniLM-L6-v2 was trained through mean pooling and ships an untrained pooler: the same
    # 150 steps (slot loss per word) with the intent head on the mean of the pieces' states.
    meanpool = dp8("bert_dpsgd_eps8_meanpool", "per-example DP-SGD, eps 8, 150 steps, slot loss "
                   "per word, mean pooling", "private_steps=150", "slot_loss=mean",
                   "bert.pooling=mean")
    # SNIPS's BERT: LoRA r 8 at Adam 5e-3 over 300 steps gave 0.189 against 0.218 with every
    # kernel trained, and no dropout 0.221 against 0.300 (150 steps). All of it on ATIS, with
    # the slot loss per word (the intent accuracy is what ATIS's private rows lose):
    lora = dp8("bert_dpsgd_eps8_lora_nodropout", "per-example DP-SGD, eps 8, LoRA r 8 (per-head "
               "layout), no dropout, 300 steps, slot loss per word", "private_steps=300",
               "bert.finetune=lora", "learning_rate=0.005", "bert.dropout=0.0", "slot_loss=mean")
    # SNIPS: LoRA in the matrix layout (one rank-8 pair per kernel, 0.55M trained weights) gave
    # 0.156 against the per-head layout's 0.170 (results/pilot_snips_bert, one run each); the
    # same on ATIS, everything else as atis_bert's private default, before the layout default moves
    # (atis_bert's private recipe since; the cells below that build on it pin it)
    def matrix_at(learning_rate: str) -> tuple:
        return ("bert.finetune=lora", f"learning_rate={learning_rate}", "bert.dropout=0.0",
                "slot_loss=mean", "bert.lora_layout=matrix")
    matrix = matrix_at("0.005")
    lora_matrix = dp8("bert_dpsgd_eps8_lora_matrix", "per-example DP-SGD, eps 8, LoRA r 8 "
                      "(matrix layout), no dropout, 300 steps, slot loss per word",
                      "private_steps=300", *matrix)
    # Run as bert_dpsgd_eps8 when atis_bert's default was ~150 steps (before commit eb1013d).
    steps150 = dp8("bert_dpsgd_eps8_steps150", "per-example DP-SGD, eps 8, 150 steps",
                   "private_steps=150", "slot_loss=sum")
    bert = rows("bert", ATIS)
    # plain fine-tuning ran with the summed slot loss, atis_bert's default before 2026-11-25
    bert[0] = cell("bert_sgd", "SGD (not private), summed slot loss", "sgd", ATIS,
                   "diagnostics=True", "mechanism=sgd", "slot_loss=sum")
    # CLC's SGD row (3,080 steps) missed the paper's 6.3% (6.8%) with its dev SER still falling
    # at the last epoch (0.058, 0.058, 0.053 over the last three): twice the steps.
    clc_sgd_long = cell("clc_sgd_steps6000", "SGD (not private), 88 epochs (6,072 steps)", "sgd",
                        "configs/atis_clc.py", "diagnostics=True", "mechanism=sgd", "epochs=88")
    # Public pretraining (trainers/warm_start.py): the backbone starts from the SNIPS grid's CLC
    # SGD run (run that cell first); SNIPS is public, and not ATIS
    from_snips = cell("clc_dpsgd_eps8_from_snips", "per-example DP-SGD, eps 8, backbone from "
                      "SNIPS SGD (public pretraining)", "per-example, public pretraining",
                      "configs/atis_clc.py", "diagnostics=True", "mechanism=dpsgd",
                      "target_epsilon=8.0", "init_from=runs/experiments/snips/clc_sgd")
    # Every example is clipped, so the loss weights set how each example's clipped norm is
    # shared between the intent and the slots (the per-word slot loss moved BERT's intent
    # accuracy 0.739 -> 0.854 at 150 steps): twice the intent loss, against the private CLC's
    # intent accuracy of 0.853 (SGD: 0.952). Ran 2026-11-27 (1,435 s, shared): test SER 0.195
    # (intent 0.848, slot F1 0.840) against the default's 0.186 and 0.195 (intent 0.853): the
    # intent did not move. Nor could it buy much: SER counts an utterance's wrong intent as one
    # error among its reference slots + 1 (3,730 on ATIS's test split), so the private CLC's
    # 0.167 of wrong intents are 0.040 of its 0.186-0.195, and the slots hold the rest.
    clc_intent2 = cell("clc_dpsgd_eps8_intent2", "per-example DP-SGD, eps 8, intent loss weight 2",
                       "per-example", "configs/atis_clc.py", "diagnostics=True",
                       "mechanism=dpsgd", "target_epsilon=8.0", "intent_loss_weight=2.0")
    # The same for BERT: the encoder starts from the SNIPS grid's plain fine-tuning (its bert_sgd
    # run: every kernel trained on SNIPS), then LoRA as in lora_matrix; the heads start fresh.
    bert_from_snips = cell("bert_dpsgd_eps8_from_snips", "per-example DP-SGD, eps 8, LoRA r 8 "
                           "(matrix layout), encoder from SNIPS SGD (public pretraining)",
                           "per-example, public pretraining", ATIS, "diagnostics=True",
                           "mechanism=dpsgd", "target_epsilon=8.0",
                           *bert_private("private_steps=300", *matrix,
                                         "init_from=runs/experiments/snips/bert_sgd"))
    # SNIPS (per-head layout): twice the sampling rate for half the steps, the same 24 epochs,
    # gave 0.163 against 0.170. ATIS has a third of SNIPS's utterances, so at q 0.08 its
    # expected batch (358) carries a third of the signal against the same noise: q 0.16 on ATIS
    q16 = dp8("bert_dpsgd_eps8_q16", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), no "
              "dropout, q 0.16, 150 steps, slot loss per word", "sampling_rate=0.16",
              "private_steps=150", *matrix)
    # Ran 2026-11-25: test SER 0.175 against lora_matrix's 0.153, behind on dev at every epoch
    # (0.147 against 0.124 at the end): too few steps for ATIS.
    # ... and the other way: half the sampling rate for twice the steps, the same 24 epochs.
    # Stopped after 16 epochs (2026-11-25; resumable): ahead at first (dev SER 0.218 after 5
    # epochs against 0.242), then level above lora_matrix (0.178 against 0.132 after 16).
    q04 = dp8("bert_dpsgd_eps8_q04", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), no "
              "dropout, q 0.04, 600 steps, slot loss per word", "sampling_rate=0.04",
              "private_steps=600", *matrix)
    # Fewer factors, less noise (the BERT gap is the noise: sigma = 0 matched SGD): LoRA on the
    # query and value kernels only (Hu et al.; Yu et al. under DP), 74k factor entries against
    # 0.33M; the other kernels stay frozen, their biases train. Stopped after 12 of 24 epochs
    # (2026-11-25; resumable): dev SER 0.190 at epoch 11 against lora_matrix's 0.146, slot F1
    # 0.833 against 0.872 (intent 0.902 against 0.920), behind at every epoch: the feed-forward
    # factors carry the slots, so matrix LoRA on every kernel stays the default.
    lora_qv = dp8("bert_dpsgd_eps8_lora_qv", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout) "
                  "on query and value only, no dropout, 300 steps, slot loss per word",
                  "private_steps=300", *matrix, "bert.lora_targets=query_value")
    # Adam 5e-3 was chosen on SNIPS for every kernel at 150 steps (pilot_snips_bert) and kept
    # for LoRA without a sweep: LoRA's factors start at zero (B = 0), so their useful step may
    # differ. Twice and half of it, everything else as lora_matrix. 1e-2 was stopped after 8 of
    # 24 epochs (2026-11-25; resumable): ahead for three epochs (dev SER 0.417 against 0.642
    # after 2), then it rose at the peak rate while lora_matrix kept falling (0.276 against
    # 0.181 after 8; slot F1 0.764 against 0.837): Adam moves the weights along the noise in
    # proportion to the rate, and at 1e-2 that random walk outweighs the signal. 2.5e-3 was
    # stopped after 12 of 24 epochs (2026-11-25; resumable): behind at every epoch, closing
    # slowly (dev SER 0.245 against 0.181 after 8, 0.202 against 0.146 after 12; slot F1 0.819
    # against 0.872). 5e-3 sits between them and stays the default.
    lr1e2 = dp8("bert_dpsgd_eps8_lr1e-2", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), "
                "no dropout, Adam 1e-2, 300 steps, slot loss per word", "private_steps=300",
                *matrix_at("0.01"))
    lr25e4 = dp8("bert_dpsgd_eps8_lr2.5e-3", "per-example DP-SGD, eps 8, LoRA r 8 (matrix layout), "
                 "no dropout, Adam 2.5e-3, 300 steps, slot loss per word", "private_steps=300",
                 *matrix_at("0.0025"))
    # The intent is what ATIS's private BERT loses most (0.909 against SGD's 0.971). The pooler
    # that feeds the intent head is 148k of the 0.55M weights the LoRA recipe trains, every one
    # noised, and all-MiniLM-L6-v2 was trained through mean pooling (its pooler was not): the
    # LoRA recipe with the intent head on the mean of the pieces' states (pooler frozen, unused).
    # Tried before only with every kernel trained at 150 steps (meanpool: 0.265 against 0.256).
    # Stopped after 13 of 24 epochs (2026-11-26; resumable) for the C = 0.1 run below. After 12
    # epochs: dev SER 0.162 against lora_matrix's 0.146, intent accuracy 0.926 against 0.920,
    # slot F1 0.853 against 0.872 (after 13: 0.159; lora_matrix after 16: 0.132). The intent
    # gained a little, the slots lost more. Resumed the same day (23 of 24 epochs: the ledger
    # charged the interrupted epoch again): test SER 0.165 (intent 0.904, slot F1 0.855) against
    # 0.153; dev SER 0.141 at the end against 0.124. The pooler stays.
    meanpool_lora = dp8("bert_dpsgd_eps8_lora_meanpool", "per-example DP-SGD, eps 8, LoRA r 8 "
                        "(matrix layout), no dropout, 300 steps, slot loss per word, mean pooling",
                        "private_steps=300", *matrix, "bert.pooling=mean")
    # Every example is clipped to C = 1, but an example whose gradient norm falls below C as the
    # model fits adds less than C of signal against the same noise z C. Adam divides out the
    # scale of C (its epsilon is far below the noise per weight, z C / (q n) ~ 3e-4 at C = 0.1), so
    # C = 0.1 amounts to clipping every example to one norm throughout (normalised per-example
    # gradients; Bu et al. 2022, De et al. 2022 with small C), everything else as lora_matrix.
    # Ran 2026-11-26 (4,416 s, quiet CPU most of the run): test SER 0.165 (intent 0.907, slot F1
    # 0.856) against 0.153; dev SER behind at most epochs (0.159 against 0.146 after 12, 0.131
    # at the end against 0.124 after 22). C stays 1. Even at C = 0.1 the share of real examples
    # clipped fell from 1.0 (epochs 1-3) to 0.65 after 10 epochs: many examples are fit early.
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
    # Stopped after 12 of 24 epochs (2026-11-26): dev SER 0.257 against lora_matrix's 0.146, and
    # rising since epoch 6 (0.234) with the training loss (0.67 -> 0.84) and the mean pre-clip
    # gradient norm (16 -> 44): the noise-only weights' larger steps walk the model off. The
    # floor is what lets them; see pilot_snips_clc round 11 for floor 1.
    # LoRA's rank was never varied (8 since the start). Rank 4 halves the factors (0.33M ->
    # 0.17M: 41,472 r over MiniLM-L6's 36 kernels; the pooler, heads, biases and layer norms,
    # 0.22M, stay), so each trained weight's share of the clipped signal grows against the same
    # per-weight noise; lora_alpha stays 16 (the update is scaled by alpha / r, Hu et al.),
    # everything else as lora_matrix. Ran 2026-11-26 (3,627 s, partly shared): test SER 0.183
    # (intent 0.898, slot F1 0.838) against 0.153; dev SER behind at every epoch compared
    # (0.187 against 0.146 after 12, 0.157 at the end against 0.124). Rank 8 stays.
    rank4 = dp8("bert_dpsgd_eps8_lora_r4", "per-example DP-SGD, eps 8, LoRA r 4 (matrix layout), "
                "no dropout, 300 steps, slot loss per word", "private_steps=300", *matrix,
                "bert.lora_rank=4")
    # bert_from_snips gave 0.142 against lora_matrix's 0.153, one run each; on SNIPS's CLC two
    # runs of one recipe differ by up to 0.034 (pilot_snips_clc round 11). The same recipe again,
    # with fresh noise, from a fresh run of the SNIPS grid's bert_sgd command (its init_from).
    # Ran 2026-11-26 (3,500 s, shared): test SER 0.143 (intent 0.914, slot F1 0.868); dev 0.123
    # at the end (the first run 0.125, lora_matrix 0.124).
    bert_from_snips2 = cell("bert_dpsgd_eps8_from_snips_run2", "per-example DP-SGD, eps 8, LoRA "
                            "r 8 (matrix layout), encoder from SNIPS SGD (public pretraining), "
                            "second run", "per-example, public pretraining", ATIS,
                            "diagnostics=True", "mechanism=dpsgd", "target_epsilon=8.0",
                            *bert_private("private_steps=300", *matrix,
                                          "init_from=runs/experiments/snips/bert_sgd"))
    # FFA-LoRA (Sun et al. 2024; models/bert/finetuning.py): every A frozen at its random start,
    # only B trains. B starts at 0, so A's gradient starts at 0 and A gets mostly noise while it
    # shares each example's clipped norm with B; frozen, the noise is drawn for B alone (0.17M
    # of the 0.33M factor entries) at the same rank 8 (rank 4 halves both factors and lost:
    # 0.183). Everything else as lora_matrix. Ran 2026-11-26 (3,460 s, shared): test SER 0.149
    # (intent 0.932, slot F1 0.863) against 0.153; dev behind in the middle (0.174 against 0.146
    # after 12 epochs), 0.127 against 0.124 at the end: the same within one run each.
    frozen_a = dp8("bert_dpsgd_eps8_lora_frozen_a", "per-example DP-SGD, eps 8, LoRA r 8 "
                   "(matrix layout), A frozen (FFA-LoRA), no dropout, 300 steps, slot loss per "
                   "word", "private_steps=300", *matrix, "bert.lora_freeze_a=True")
    # DP linear probing then fine-tuning (Ke et al. 2024; edp_tf freeze_until): the fresh intent
    # and slot heads train alone for the first 3 epochs (~37 of the 300 steps), the encoder
    # (LoRA factors, biases, layer norms) frozen, so early LoRA updates follow trained heads
    # instead of random ones. Same z0 and epsilon: every step is the same Gaussian mechanism over
    # what trains. Everything else as lora_matrix (bert_dpsgd_eps8: 0.153). Ran 2026-11-26
    # (4,330 s, shared): test SER 0.164 (intent 0.904, slot F1 0.861); the heads alone reached
    # dev SER 0.61 after their 3 epochs (frozen_a 0.43 at that point), it caught up by epoch
    # 10 (0.180 against frozen_a's 0.181) and ended at dev 0.135 against 0.124: no gain, the
    # default keeps training everything from the first step.
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
    return grid("atis", bert + [steps150, steps300, slotmean, meanpool, lora, lora_matrix,
                                bert_from_snips, q16, q04, lora_qv, lr1e2, lr25e4,
                                meanpool_lora, clip01, adam_bc, rank4, bert_from_snips2, frozen_a,
                                probe, run2, sgd2]
                + rows("clc", "configs/atis_clc.py") + [clc_sgd_long, from_snips, clc_intent2],
                schedule_reference="bert_dpsgd_eps8",
                notes="BERT cells other than rows() are pinned (configs/grids/common.py "
                      "bert_private): what they leave open is what atis_bert gave private runs "
                      "when they ran. bert_dpsgd_eps8 is the run of bert_dpsgd_eps8_lora_matrix (its "
                      "command: the same config as atis_bert's default since its LoRA layout "
                      "became matrix, 2026-11-25); bert_dpsgd_eps8_lora_nodropout was the "
                      "default before. bert_dpsgd_eps8_lora_matrix ran 22 of its 24 epochs: it "
                      "was interrupted twice (the OOM killer, a session's end) and resumed, and "
                      "the ledger charged each interrupted epoch again, so the budget ran out "
                      "two epochs early. The from_snips cells need the SNIPS grid's clc_sgd and "
                      "bert_sgd runs (their init_from). " + EDP_BERT_LEFT_OUT)
