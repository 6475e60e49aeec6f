"""Smoke test of `python -m trainers.benchmark` on the tiny stand-in model (a few seconds)."""
import json

import pytest
from absl import flags
from absl.testing import flagsaver

from trainers import benchmark


@pytest.fixture(scope="module")
def parsed_flags():
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def test_benchmark_command_writes_the_table_and_json(parsed_flags, tmp_path, capsys):
    out = tmp_path / "bench.json"
    with flagsaver.flagsaver(model="tiny", replicas=1, batch_size=8, steps=2, warmup=0,
                             modes=["edp", "dpsgd", "edp_k2"], profile_steps=1,
                             profile_dir=str(tmp_path / "profile"), output=str(out)):
        benchmark.main([])
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["model"] == "tiny" and results["replicas"] == 1 and results["batch_size"] == 8
    assert results["device"].startswith(("CPU", "1 x GPU"))
    assert list(results["modes"]) == ["sgd", "edp", "dpsgd", "edp_k2"]  # sgd always runs
    for name, mode in results["modes"].items():
        assert mode["steps"] == 2 and mode["median_step_s"] > 0, name
        assert mode["examples_per_s"] == pytest.approx(8 / mode["median_step_s"])
        assert mode["ratio_to_sgd"] == pytest.approx(
            mode["median_step_s"] / results["modes"]["sgd"]["median_step_s"])
        assert name in printed
    assert results["modes"]["sgd"]["ratio_to_sgd"] == 1.0
    # the profile names real TensorFlow ops (e.g. the noise draw of the private modes)
    edp_ops = [op for op, _, _ in results["profile"]["edp"]]
    assert edp_ops and all(":" not in op and not op.startswith("__") for op in edp_ops)
    assert any("Random" in op for op in edp_ops)


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown mode 'dp'"):
        benchmark.microbatch_of("dp")
    assert benchmark.microbatch_of("edp_k8") == 8 and benchmark.microbatch_of("edp") is None
