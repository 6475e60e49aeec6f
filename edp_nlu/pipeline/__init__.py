"""The training run behind `python -m edp_nlu.train`: `training.train` is the sequence (data ->
model -> private fit -> metrics, ledger, checkpoints, export) over `builders` (the run's pieces
from a config), `optimizers`, `recipes` (automatic batch, steps, learning rate), `callbacks`,
`warm_start` (a backbone from another run), `run_files` (the run directory's files) and
`worker_processes` (`--workers=N` processes on one machine)."""
