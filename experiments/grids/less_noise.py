"""Less noise for the same epsilon on SNIPS and ATIS: BandMF and the noise filters.

Every cell is the corpus's private CLC recipe (edp_nlu/configs/{snips,atis}_clc.py: per-example
DP-SGD, epsilon 8 at delta 0.1/n, q 0.16, 150 steps, Adam 3e-2) with one lever changed; the
recipe's own rows and the plain rows are results/snips and results/atis (clc_dpsgd_eps8_*,
clc_sgd_*), run with the same commands.

* BandMF at the recipe's q and T (b = 3): `python -m benchmarks.bandmf_noise --n=13084 --q=0.16
  --steps=150` puts its prefix RMSE at 0.94 of DP-SGD's, the best b there (about 6% more data's
  worth), because b groups sampled at b q lose most of the amplification at q = 0.16.
* BandMF where the computation says it pays: q 0.04 for 600 steps (the same examples processed),
  b = 8, prefix RMSE 0.79 of DP-SGD's at that q and T (1.27x the data), beside DP-SGD at the same
  q and T, which the recipe beat at q 0.08 / 300 steps (results/pilot_snips_clc): the pair says
  whether BandMF's gain is more than what the smaller q costs.
* Between the two, q 0.08 for 300 steps, b = 6 (computed 0.88 of DP-SGD's error at that q and T),
  beside DP-SGD there: BandMF b = 8 at q 0.04 beat its DP-SGD twin by 23% but lost to the recipe
  (results/less_noise), so the pair asks whether a q nearer the recipe's keeps BandMF's gain.
* The noise filters (post-processing, epsilon unchanged): DiSK's Kalman filter, which learned
  faster than the default in the middle of the synthetic run (results/noise_filtering), and
  DOPPLER's low-pass filter at half the learning rate (its first epoch overshot at the default's).

* BERT behind DiSK's Kalman filter, the lever that came closest to the CLC recipe on both corpora
  (results/less_noise): the BERT recipes (edp_nlu/configs/{atis,snips}_bert.py: LoRA r 8, q 0.08,
  300 steps, Adam 5e-3) with only the filter added. It runs after every CLC cell, ATIS first (a
  third of SNIPS's training set, so about a third of its time on the 2-core CPU). BandMF is not
  run on BERT: at BERT's q 0.08 its CLC twin pairs gained nothing (SNIPS) or lost (ATIS).

Cells run in the order listed: the CLC cells SNIPS first, one run of each lever before any
second run; then the BERT cells, ATIS's two runs before SNIPS's.
"""
from experiments.grids.common import cell, grid, with_heads_before

CONFIGS = {"snips": "edp_nlu/configs/snips_clc.py", "atis": "edp_nlu/configs/atis_clc.py"}
BERT_CONFIGS = {"snips": "edp_nlu/configs/snips_bert.py", "atis": "edp_nlu/configs/atis_bert.py"}
SMALL_Q = ("private_sampling_rate=0.04", "private_steps=600")
MID_Q = ("private_sampling_rate=0.08", "private_steps=300")


def levers(corpus: str, suffix: str = "") -> list:
    config = CONFIGS[corpus]
    run = " (second run)" if suffix else ""
    return [
        cell(f"{corpus}_clc_bandmf_b3{suffix}", f"{corpus.upper()} CLC, BandMF b = 3 at the "
             f"recipe's q 0.16 and 150 steps, eps 8{run}", "bandmf", config, "bandmf_bands=3"),
        cell(f"{corpus}_clc_dpsgd_q0.04{suffix}", f"{corpus.upper()} CLC, per-example DP-SGD "
             f"at q 0.04 for 600 steps, eps 8{run}", "per-example", config, *SMALL_Q),
        cell(f"{corpus}_clc_bandmf_b8_q0.04{suffix}", f"{corpus.upper()} CLC, BandMF b = 8 at "
             f"q 0.04 for 600 steps, eps 8{run}", "bandmf", config, *SMALL_Q, "bandmf_bands=8"),
        cell(f"{corpus}_clc_dpsgd_q0.08{suffix}", f"{corpus.upper()} CLC, per-example DP-SGD "
             f"at q 0.08 for 300 steps, eps 8{run}", "per-example", config, *MID_Q),
        cell(f"{corpus}_clc_bandmf_b6_q0.08{suffix}", f"{corpus.upper()} CLC, BandMF b = 6 at "
             f"q 0.08 for 300 steps, eps 8{run}", "bandmf", config, *MID_Q, "bandmf_bands=6"),
        cell(f"{corpus}_clc_kalman{suffix}", f"{corpus.upper()} CLC, the recipe behind DiSK's "
             f"Kalman filter, eps 8{run}", "filter", config, "noise_filter=kalman"),
        cell(f"{corpus}_clc_lowpass{suffix}", f"{corpus.upper()} CLC, the recipe behind "
             f"DOPPLER's low-pass filter at Adam 1.5e-2, eps 8{run}", "filter", config,
             "noise_filter=lowpass", "private_learning_rate=0.015"),
    ]


def bert_kalman(corpus: str, suffix: str = "") -> list:
    run = " (second run)" if suffix else ""
    return [cell(f"{corpus}_bert_kalman{suffix}", f"{corpus.upper()} BERT, the recipe behind "
                 f"DiSK's Kalman filter, eps 8{run}", "filter", BERT_CONFIGS[corpus],
                 "noise_filter=kalman")]


def get_config():
    # the cells ran before the CLC configs' heads and weight averaging changed
    return with_heads_before(_grid())


def _grid():
    cells = levers("snips") + levers("atis") + levers("snips", "_run2") + levers("atis", "_run2")
    cells += (bert_kalman("atis") + bert_kalman("atis", "_run2") + bert_kalman("snips")
              + bert_kalman("snips", "_run2"))
    return grid("less_noise", cells, notes=(
        "Levers against the noise on SNIPS and ATIS with CLC, and the Kalman filter with BERT "
        "(experiments/grids/less_noise.py); the recipe's rows and the plain rows: results/snips, "
        "results/atis."))
