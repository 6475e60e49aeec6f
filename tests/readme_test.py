"""The README's library example runs as written and gives what it promises."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_library_example_runs(tmp_path):
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme[readme.index("## The library in a few lines"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 10  # one edp_tf call
    assert set(re.findall(r"edp_tf\.(\w+)", code)) == {"make_private"}
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    assert privacy["private"] is True and 7.0 < privacy["epsilon"] <= 8.0
    assert len(privacy["epochs"]) == 5 and privacy["microbatch_size"] == 1
    assert os.path.isfile(tmp_path / "run" / "saved_model" / "saved_model.pb")
    assert re.search(r"epsilon [0-9.]+ private True", out.stdout)
