"""The post-hoc tools' results files (experiments/posthoc.py): a JSON per run, and a table over
every run there that names each row's command."""
import json

from experiments import posthoc


def test_each_run_is_kept_and_the_table_names_every_rows_command(tmp_path):
    def table(results):
        return "| run |\n|---|\n" + "".join(f"| {r['name']} |\n" for r in results)

    for name in ("b", "a"):
        posthoc.write_results(str(tmp_path), {"name": name, "command": f"python -m x --run={name}",
                                              "rows": [1]}, table)
    assert json.loads((tmp_path / "a.json").read_text())["rows"] == [1]
    text = (tmp_path / "table.md").read_text()
    assert text.index("| a |") < text.index("| b |")  # every run's JSON, in name order
    assert "- a: `python -m x --run=a`" in text and "- b: `python -m x --run=b`" in text
