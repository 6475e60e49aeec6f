"""Scoring trained models: `predictions` (decoding, per-example losses, the membership attack)
and `metrics` (SER, intent accuracy, slot F1 against references)."""
