"""Building blocks of the experiment grids (`python -m trainers.experiment --grid=...`)."""
import ml_collections


def cell(name: str, label: str, family: str, config: str, *overrides: str):
    """One run of a grid: `config` plus `--config.<override>` flags ("field=value" strings).

    `family` groups cells into one line of the privacy-utility frontier plot."""
    return ml_collections.ConfigDict(dict(name=name, label=label, family=family, config=config,
                                          overrides=tuple(overrides)))


def grid(dataset: str, cells: list, notes: str = "", schedule_reference: str = ""):
    g = ml_collections.ConfigDict()
    g.dataset = dataset
    g.results_dir = f"results/{dataset}"
    g.runs_dir = f"runs/experiments/{dataset}"
    g.cells = cells
    g.notes = notes
    g.schedule_reference = schedule_reference
    g.grid_file = ""
    return g
