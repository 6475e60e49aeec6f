"""SNIPS grid: SGD, the paper's eDP, eDP with micro-batches of 2, per-example DP-SGD (and its
sigma = 0 diagnostic) x CLC, BERT; the full epsilon grid (1, 3, 8) for per-example DP-SGD, the
best mechanism of both models, and epsilon 8 for the others.

    python -m experiments.experiment --grid=experiments/grids/snips.py
"""
from experiments.grids.common import (
    EDP_BERT_LEFT_OUT,
    LORA_LAYOUT_BEFORE,
    bert_private,
    cell,
    grid,
    with_heads_before,
)

# Every cell releases its diagnostics (the membership inference needs training losses): these are
# experiments on public benchmarks, not shareable runs.
DIAG = "diagnostics=True"


def rows(m: str, config: str) -> list:
    """The grid's rows for model `m` with its dataset config."""
    def row(suffix, label, family, *overrides):
        return cell(f"{m}_{suffix}", label, family, config, DIAG, *overrides)

    return [
        row("sgd", "SGD (not private)", "sgd", "mechanism=sgd"),
        row("dpsgd_eps8", "per-example DP-SGD, eps 8", "per-example", "mechanism=dpsgd",
            "target_epsilon=8.0"),
    ] + ([
        # snips_clc's earlier recipes (two BiLSTM layers; also a summed slot loss), beside its
        # one-layer, per-word recipe
        row("sgd_2lstm", "SGD, two BiLSTM layers (the default before)", "sgd",
            "mechanism=sgd", "clc.num_lstm_layers=2", "clc.dropout=0.25", "slot_loss=sum"),
        row("dpsgd_eps8_2lstm", "per-example DP-SGD, eps 8, two BiLSTM layers (the default "
            "before)", "per-example", "mechanism=dpsgd", "target_epsilon=8.0",
            "clc.num_lstm_layers=2", "clc.dropout=0.25"),
        row("dpsgd_eps8_slotsum", "per-example DP-SGD, eps 8, two BiLSTM layers, summed slot "
            "loss", "per-example", "mechanism=dpsgd", "target_epsilon=8.0", "slot_loss=sum",
            "clc.num_lstm_layers=2", "clc.dropout=0.25"),
    ] if m == "clc" else []) + [
        # CLC's private Adam 3e-2 is far too large without noise (Adam divides by the noise's
        # scale): its sigma = 0 row takes 1e-2, between that and plain training's 2e-3
        # BERT's sigma = 0 rows pin the LoRA layout they were measured with (LORA_LAYOUT_BEFORE)
        row("dpsgd_sigma0", "per-example, sigma = 0 (clipping only)" +
            (", Adam 1e-2" if m == "clc" else ", LoRA per-head layout"), "diagnostic",
            "mechanism=dpsgd", "target_epsilon=0.0", "noise_multiplier=0.0",
            *(("learning_rate=0.01",) if m == "clc" else
              (f"bert.lora_layout={LORA_LAYOUT_BEFORE}",))),
        row("edp_k2_eps8", "eDP, micro-batches of 2, eps 8", "eDP k=2", "mechanism=edp",
            "microbatch_size=2", "target_epsilon=8.0"),
        row("edp_paper_eps8", "eDP as in the paper (1 micro-batch/replica, 2 replicas), eps 8",
            "eDP paper", "mechanism=edp", "microbatch_size=0", "replicas=2", "target_epsilon=8.0"),
        row("dpsgd_eps3", "per-example DP-SGD, eps 3", "per-example", "mechanism=dpsgd",
            "target_epsilon=3.0"),
        row("dpsgd_eps1", "per-example DP-SGD, eps 1", "per-example", "mechanism=dpsgd",
            "target_epsilon=1.0"),
    ]


def get_config():
    # the cells ran before the CLC configs' heads and weight averaging changed
    return with_heads_before(_grid())


def _grid():
    # snips_bert's earlier 150-step recipe, beside its 300-step default.
    steps150 = cell("bert_dpsgd_eps8_steps150",
                    "per-example DP-SGD, eps 8, 150 steps (the default before)", "per-example",
                    "edp_nlu/configs/snips_bert.py", DIAG, "mechanism=dpsgd", "target_epsilon=8.0",
                    *bert_private("private_steps=150"))
    # The 300-step default before LoRA: every kernel but the embedding tables, dropout 0.1, 2e-3
    full = cell("bert_dpsgd_eps8_full", "per-example DP-SGD, eps 8, every kernel trained, "
                "dropout 0.1 (the default before)", "per-example", "edp_nlu/configs/snips_bert.py",
                DIAG,
                "mechanism=dpsgd", "target_epsilon=8.0", *bert_private())
    bert = rows("bert", "edp_nlu/configs/snips_bert.py")
    # The sigma = 0 and eDP k = 2 rows of CLC with snips_clc's earlier recipe (two BiLSTM layers,
    # dropout 0.25, summed slot loss); clc_dpsgd_sigma0 / clc_edp_k2_eps8 run snips_clc's recipe, so
    # that the diagnostic compares with clc_dpsgd_eps8
    old_clc = ("slot_loss=sum", "clc.num_lstm_layers=2", "clc.dropout=0.25")
    # sigma = 0 at the pilot's clipping-only rate, 3e-3, beside clc_dpsgd_sigma0's 1e-2: 150 steps
    # at 3e-3 are too small (dev SER still falling fast at the end; results/snips).
    clc_sigma0_3e3 = cell("clc_dpsgd_sigma0_lr3e-3", "per-example, sigma = 0 (clipping only), "
                          "Adam 3e-3", "diagnostic", "edp_nlu/configs/snips_clc.py", DIAG,
                          "mechanism=dpsgd", "target_epsilon=0.0", "noise_multiplier=0.0",
                          "learning_rate=0.003")
    # Public pretraining (edp_nlu/pipeline/warm_start.py): the backbone starts from the ATIS
    # grid's CLC SGD run (run that cell first); ATIS is public, and not SNIPS
    from_atis = cell("clc_dpsgd_eps8_from_atis", "per-example DP-SGD, eps 8, backbone from ATIS "
                     "SGD (public pretraining)", "per-example, public pretraining",
                     "edp_nlu/configs/snips_clc.py", DIAG, "mechanism=dpsgd", "target_epsilon=8.0",
                     "init_from=runs/experiments/atis/clc_sgd_steps6000")
    clc_old = [
        cell("clc_dpsgd_sigma0_2lstm", "per-example, sigma = 0, two BiLSTM layers, summed slot "
             "loss (the recipe before)", "diagnostic", "edp_nlu/configs/snips_clc.py", DIAG,
             "mechanism=dpsgd", "target_epsilon=0.0", "noise_multiplier=0.0", *old_clc),
        cell("clc_edp_k2_eps8_2lstm", "eDP, micro-batches of 2, eps 8, two BiLSTM layers, "
             "summed slot loss (the recipe before)", "eDP k=2", "edp_nlu/configs/snips_clc.py",
             DIAG,
             "mechanism=edp", "microbatch_size=2", "target_epsilon=8.0", *old_clc),
    ]
    # snips_bert's private recipe in LoRA's per-head layout, beside the "matrix" layout it uses
    per_head = cell("bert_dpsgd_eps8_lora_per_head", "per-example DP-SGD, eps 8, LoRA per-head "
                    "layout (the default before)", "per-example", "edp_nlu/configs/snips_bert.py",
                    DIAG,
                    "mechanism=dpsgd", "target_epsilon=8.0",
                    *bert_private("bert.finetune=lora", "steps=300", "learning_rate=0.005",
                                  "bert.dropout=0.0"))
    # snips_bert's private default once more, uninterrupted (bert_dpsgd_eps8's run directory is
    # gone, so it cannot be rescored): a second sample of the headline row, scored with both CRF
    # decodings, and so the default's run-to-run spread (results/snips). Its command is
    # bert_dpsgd_eps8's but for --run_dir.
    run2 = cell("bert_dpsgd_eps8_run2", "per-example DP-SGD, eps 8 (snips_bert's default, second "
                "run)", "per-example", "edp_nlu/configs/snips_bert.py", DIAG, "mechanism=dpsgd",
                "target_epsilon=8.0")
    # Public pretraining for BERT: the encoder starts from the ATIS grid's plain fine-tuning (its
    # bert_sgd run: every kernel but the tables trained on ATIS, which is public and not SNIPS;
    # run that cell first), then snips_bert's private default (LoRA on top); the heads start
    # fresh. ATIS's mirror image (encoder from SNIPS SGD) took ATIS BERT from 0.153 / 0.162 to
    # 0.142 / 0.143 (results/atis).
    bert_from_atis = cell("bert_dpsgd_eps8_from_atis", "per-example DP-SGD, eps 8 (snips_bert's "
                          "default), encoder from ATIS SGD (public pretraining)",
                          "per-example, public pretraining", "edp_nlu/configs/snips_bert.py", DIAG,
                          "mechanism=dpsgd", "target_epsilon=8.0",
                          "init_from=runs/experiments/atis/bert_sgd")
    # snips_clc's SGD and private default once the backward LSTM reads every word: the other CLC
    # rows ran a backward direction that gave zeros at most words (keras-team/keras#17596)
    clc_both = [
        cell("clc_sgd_both_directions", "SGD (not private), backward LSTM fixed", "sgd",
             "edp_nlu/configs/snips_clc.py", DIAG, "mechanism=sgd"),
        cell("clc_dpsgd_eps8_both_directions", "per-example DP-SGD, eps 8, backward LSTM fixed",
             "per-example", "edp_nlu/configs/snips_clc.py", DIAG, "mechanism=dpsgd",
             "target_epsilon=8.0"),
        cell("clc_dpsgd_eps8_both_directions_run2", "per-example DP-SGD, eps 8, backward LSTM "
             "fixed (second run)", "per-example", "edp_nlu/configs/snips_clc.py", DIAG,
             "mechanism=dpsgd", "target_epsilon=8.0"),
        cell("clc_dpsgd_sigma0_both_directions", "per-example, sigma = 0 (clipping only), Adam "
             "1e-2, backward LSTM fixed", "diagnostic", "edp_nlu/configs/snips_clc.py", DIAG,
             "mechanism=dpsgd", "target_epsilon=0.0", "noise_multiplier=0.0",
             "learning_rate=0.01"),
        cell("clc_edp_k2_eps8_both_directions", "eDP, micro-batches of 2, eps 8, backward LSTM "
             "fixed", "eDP k=2", "edp_nlu/configs/snips_clc.py", DIAG, "mechanism=edp",
             "microbatch_size=2", "target_epsilon=8.0"),
    ] + [cell(f"clc_dpsgd_eps{eps}_both_directions", f"per-example DP-SGD, eps {eps}, backward "
              "LSTM fixed", "per-example", "edp_nlu/configs/snips_clc.py", DIAG, "mechanism=dpsgd",
              f"target_epsilon={eps}.0") for eps in (3, 1)]
    # The noisy update projected onto 128 directions of 512 ATIS utterances' gradients (labels
    # drawn from SNIPS's), refreshed every 5 steps: at epochs 1 and 3 of the private default such
    # a subspace held 44-56% of the clipped sum's energy and 128 / 98,072 of the noise's
    # (docs/results.md, public-subspace projection)
    clc_both.append(cell(
        "clc_dpsgd_eps8_public_subspace_atis", "per-example DP-SGD, eps 8, update projected on "
        "128 directions of ATIS gradients", "per-example, public subspace",
        "edp_nlu/configs/snips_clc.py", DIAG, "mechanism=dpsgd", "target_epsilon=8.0",
        "public_subspace=../shared/data/atis", "public_subspace_rank=128",
        "public_subspace_examples=512", "public_subspace_every=5"))
    # The same with an in-domain public set labelled in SNIPS's schema (its dev split, a stand-in
    # for a few hundred utterances a developer writes): 72-88% of the clipped sum's energy in
    # 128 directions at epochs 1-3, against 44-56% for ATIS with drawn labels
    clc_both.append(cell(
        "clc_dpsgd_eps8_public_subspace_dev", "per-example DP-SGD, eps 8, update projected on "
        "128 directions of SNIPS dev gradients (own labels)", "per-example, public subspace",
        "edp_nlu/configs/snips_clc.py", DIAG, "mechanism=dpsgd", "target_epsilon=8.0",
        "public_subspace=../shared/data/snips/dev", "public_subspace_labels=own",
        "public_subspace_rank=128", "public_subspace_examples=512", "public_subspace_every=5"))
    return grid("snips", bert[:2] + [per_head, full, steps150] + bert[2:] + [run2, bert_from_atis]
                + rows("clc", "edp_nlu/configs/snips_clc.py") + [clc_sigma0_3e3, from_atis]
                + clc_old
                + clc_both,
                schedule_reference="bert_dpsgd_eps8",
                notes=("Every CLC cell but the *_both_directions ones ran with a backward LSTM "
                       "that a Keras bug zeroed at most words (docs/results.md, the backward LSTM "
                       "of CLC). "
                       "Cells run in the order listed; BERT first (the issue's headline goal). "
                       "bert_dpsgd_eps8 is the run of results/pilot_snips_bert (lora_matrix, its "
                       "command: it resolves to the same config as snips_bert's default since "
                       "its LoRA layout became matrix). bert_dpsgd_eps8_lora_per_head, "
                       "the default before, is that pilot's dpsgd_lora_nodropout, and "
                       "bert_dpsgd_eps8_full, the default before that, its dpsgd_steps300. "
                       "bert_dpsgd_eps8_steps150 ran "
                       "as bert_dpsgd_eps8 when the default was ~150 steps; its command is the "
                       "one that reproduces it today. CLC rows run before snips_clc's slot loss "
                       "became per-word carry --config.slot_loss=sum in their "
                       "commands, which reproduces them today. Likewise CLC rows run before "
                       "snips_clc "
                       "went to one BiLSTM layer without dropout carry "
                       "--config.clc.num_lstm_layers=2 --config.clc.dropout=0.25 "
                       "(clc_sgd_2lstm and clc_dpsgd_eps8_2lstm ran as clc_sgd and "
                       "clc_dpsgd_eps8). clc_dpsgd_eps8 is the run of results/pilot_snips_clc "
                       "(dpsgd_q16_1lstm_nodropout, with diagnostics): its command sets what "
                       "snips_clc's defaults now are. clc_dpsgd_eps8_from_atis needs the ATIS "
                       "grid's "
                       "clc_sgd_steps6000 run (its init_from). bert_sgd's run directory holds a "
                       "second run of its command (test SER 0.068; the ATIS grid's "
                       "BERT init_from), now replaced by a third (test SER 0.0735): the row is "
                       "the first run's. " + EDP_BERT_LEFT_OUT))
