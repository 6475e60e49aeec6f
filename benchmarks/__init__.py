"""Research tooling, outside the wheel: `python -m benchmarks.benchmark` times the private step
against plain training (docs/benchmarks.md). Run it from a checkout."""
