"""Smoke test of `python -m benchmarks.benchmark` on the tiny stand-in model (a few seconds)."""
import json
import os
import types

import pytest
from absl import flags
from absl.testing import flagsaver

from benchmarks import benchmark, streaming_benchmark
from edp_nlu.configs import default as default_config
from edp_nlu.configs import snips_bert
from edp_nlu.models.label_aware_head import LabelAwareHead


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


def test_bert_modes_can_name_what_trains(parsed_flags, tmp_path):
    """`+<what trains>` times the trainers' BERT recipes: the plain mode with a suffix is the
    baseline, and each mode reports its own trained weights (LoRA's matrix layout has fewer
    factor entries than Keras' per-head one, and both far fewer than the kernels)."""
    out = tmp_path / "bench.json"
    with flagsaver.flagsaver(model="bert", bert_size="tiny", replicas=1, batch_size=4, steps=1,
                             warmup=0, sequence_length=8, max_words=6, profile_steps=0,
                             output=str(out),
                             modes=["sgd+no_embeddings", "dpsgd+lora_matrix", "dpsgd+lora"]):
        benchmark.main([])
    modes = json.loads(out.read_text())["modes"]
    assert list(modes) == ["sgd+no_embeddings", "dpsgd+lora_matrix", "dpsgd+lora"]  # no extra sgd
    assert modes["sgd+no_embeddings"]["ratio_to_sgd"] == 1.0
    trained = {name: m["trainable_parameters"] for name, m in modes.items()}
    assert trained["dpsgd+lora_matrix"] < trained["dpsgd+lora"] < trained["sgd+no_embeddings"]
    assert "lora_layout=matrix" in modes["dpsgd+lora_matrix"]["what"]


def test_label_head_dim_times_the_label_aware_heads(parsed_flags):
    """The shipped recipes score labels through label-aware heads: --label_head_dim reaches the
    model every mode is built from (flag -> sizes -> model, as run_benchmark builds them), and
    the recipes set what their configs ship. Built, not timed: a timed run adds nothing here."""
    models = {}
    for dim in (0, 16):
        with flagsaver.flagsaver(bert_size="tiny", sequence_length=8, max_words=6, num_tags=7,
                                 label_head_dim=dim):
            models[dim], _ = benchmark.build_model("bert", benchmark.model_sizes("bert"))
    assert not isinstance(models[0].tag_head, LabelAwareHead)
    head = models[16].tag_head
    assert isinstance(head, LabelAwareHead) and isinstance(models[16].intent_head, LabelAwareHead)
    assert head.embedding_dim == 16 and head.correction is not None  # the configs' correction
    assert head.span_head is not None and len(head.spans) == 7  # the synthetic BIO tags
    # the recipes time the heads their configs ship
    for recipe, config in (("clc_default", default_config), ("bert_lora", snips_bert)):
        assert benchmark.RECIPES[recipe][-1] == config.get_config().label_head_dim, recipe


def test_finetuning_suffix_is_checked(parsed_flags):
    with pytest.raises(ValueError, match="unknown fine-tuning 'lora_diag'"):
        benchmark.split_finetuning("dpsgd+lora_diag")
    with pytest.raises(ValueError, match="needs --model=bert"):
        benchmark.run_benchmark("tiny", 1, 4, 1, 0, ["dpsgd+lora"])
    assert benchmark.split_finetuning("dpsgd+lora_matrix") == ("dpsgd", ("lora", "matrix"))


class _ThisProcess:
    """multiprocessing's spawn context, run in this process: for a call whose fresh process is
    not what is checked (each one imports TensorFlow again)."""

    def Pool(self, processes):  # noqa: N802 (multiprocessing's name)
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def apply(self, function, args):
        return function(*args)


def test_scale_writes_corpora_once_and_measures_an_epoch_each(tmp_path, monkeypatch):
    """--scale's work: sharded text, one epoch of streaming sampling per size in a fresh process
    (n / batch steps, about n rows sampled: 5 sd of Binomial(n, q) is < 60 here)."""
    results = streaming_benchmark.run_scale([500, 2000], str(tmp_path), expected_batch=100,
                                            block_records=150)
    for r, n in zip(results, (500, 2000)):
        assert r["utterances"] == n and r["steps"] == n // 100
        assert abs(r["rows_sampled"] - n) < 5 * (n * (1 - 100 / n)) ** 0.5
        assert r["write_seconds"] is not None and r["peak_rss_mb"] > 0 and r["seconds"] > 0
    lines = [line for path in sorted((tmp_path / "corpus_500").glob("*.txt"))
             for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 500 and all(line.count("\t") == 2 for line in lines)
    assert len(lines[0].split("\t")[0].split()) == len(lines[0].split("\t")[1].split())
    # the corpus on disk is reused (measured in this process: only the reuse is checked here;
    # the settings a spawned measurement makes for its own process are undone after the test)
    for name, default in (("TF_CPP_MIN_LOG_LEVEL", "0"), ("TF_CPU_ALLOCATOR_USE_BFC", "false")):
        monkeypatch.setenv(name, os.environ.get(name, default))
    monkeypatch.setattr(streaming_benchmark, "multiprocessing",
                        types.SimpleNamespace(get_context=lambda method: _ThisProcess()))
    again = streaming_benchmark.run_scale([500], str(tmp_path), expected_batch=100)
    assert again[0]["write_seconds"] is None and again[0]["utterances"] == 500
    assert "| 2,000 |" in streaming_benchmark.table(results)


def test_release_benchmark_times_both_pipelines(parsed_flags, tmp_path, capsys):
    """--release_after on iterators that live half a second: both pipelines run in their own
    processes and land in the table and the JSON."""
    out = tmp_path / "release.json"
    with flagsaver.flagsaver(release_after=0.5, release_runs=1, replicas=2, output=str(out)):
        benchmark.main([])
    printed = capsys.readouterr().out
    assert "| edp_tf | 1 |" in printed and "| tf_default | 1 |" in printed
    runs = json.loads(out.read_text())["runs"]
    assert sorted(r["variant"] for r in runs) == ["edp_tf", "tf_default"]
    assert all(r["batches"] > 0 and r["release_s"] >= 0 for r in runs)


def test_noise_draw_times_every_sampler(parsed_flags):
    result = benchmark.noise_draw_benchmark("tiny", steps=1)
    assert set(result["median_ms"]) == {"per_variable", "fused", "xla", "box_muller_ops",
                                        "numpy_ziggurat", "bits_only"}
    assert all(ms > 0 for ms in result["median_ms"].values())
