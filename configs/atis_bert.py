"""ATIS (../shared/data/atis) with BERT (MiniLM-L6 weights); private by default (epsilon 8).

Same recipe as configs/snips_bert.py (see there); ATIS has 4,478 training utterances, so q = 0.08
is an expected batch of ~360 and the ~150 steps are ~12 epochs.
"""
from configs.snips_bert import get_config as snips_bert


def get_config():
    c = snips_bert()
    c.name = "atis_bert"
    c.data_dir = "../shared/data/atis"
    c.max_words = 46
    c.bert.sequence_length = 48  # 99% of ATIS train utterances take <= 29 pieces, the longest 52
    return c
