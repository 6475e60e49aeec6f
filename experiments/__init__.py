"""Research tooling, outside the wheel: `python -m experiments.experiment` runs a grid of training
runs (grids/) into the tables and plots of results/. Run it from a checkout."""
