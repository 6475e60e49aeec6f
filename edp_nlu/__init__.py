"""The NLU application over edp_tf: joint intent + slot models (`edp_nlu.models`), their configs
(`edp_nlu.configs`) and the commands `python -m edp_nlu.train`, `evaluate`, `privacy` (installed
as edp-train, edp-evaluate, edp-privacy) over `pipeline`, `data` and `scoring`."""
