"""The README's library example runs as written and gives what it promises."""
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_library_example_runs(tmp_path, monkeypatch, capsys):
    """Run in this process, in a namespace of its own (its imports are its own), from an empty
    directory: a user's interpreter adds only TensorFlow's start, which other tests pay."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme[readme.index("## The library in a few lines"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 10  # one edp_tf call
    assert set(re.findall(r"edp_tf\.(\w+)", code)) == {"make_private"}
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    assert privacy["private"] is True and 7.0 < privacy["epsilon"] <= 8.0
    assert len(privacy["epochs"]) == 5 and privacy["microbatch_size"] == 1
    assert os.path.isfile(tmp_path / "run" / "saved_model" / "saved_model.pb")
    assert re.search(r"epsilon [0-9.]+ private True", printed)
    assert "run/saved_model" in " ".join(privacy["artifacts"]["covered"])
    # the same script again: refused in one line before a step, naming the two ways on
    try:
        exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
    except ValueError as error:
        assert "already holds a run" in str(error) and "resume=True" in str(error)
        assert "\n" not in str(error)
    else:
        raise AssertionError("a second run into the same run_dir trained")
    assert json.load(open(tmp_path / "run" / "privacy.json")) == privacy
