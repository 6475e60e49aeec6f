"""Scoring trained models: `predictions` (decoding, per-example losses, the membership attack),
`metrics` (SER, intent accuracy, slot F1 against references) and `per_class` (scores per intent
and slot type against training frequency, one model beside another)."""
