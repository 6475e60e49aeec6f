"""Corpora and label schemas, pure Python (no TensorFlow): `loading.load_data` loads every corpus
(the joint format, NLU-Evaluation-Data CSV in `nlu_csv`, the built-in `synthetic` one) into the
`corpus` types; `schema` says where the label sets come from. (The sharded corpora of the
streaming benchmark are benchmarks/streaming_benchmark.py's, outside the application.)"""
