"""The commands' shared behaviour (edp_nlu/cli.py): quiet output, one-line errors, --verbose."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags

from edp_nlu import cli, privacy, train
from edp_nlu.configs import DIRECTORY, accept_names, config_file
from edp_nlu.pipeline import run_files

REPO = Path(__file__).resolve().parents[1]
PLANNED = ["--dataset_size=3000", "--epochs=2", "--noise_multiplier=1.0"]
NATIVE_NOISE = ("oneDNN", "cuInit", "cpu_feature_guard", "absl::InitializeLog")


def _privacy(*args):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-m", "edp_nlu.privacy", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _privacy_in_process(monkeypatch, *args: str) -> int:
    """The exit code of edp-privacy's flag parsing in this process, on flags of its own (absl's
    app.run stood in for, so that the process-wide flags are untouched; absl's app defines the
    help flag); main must not run."""
    values = flags.FlagValues()
    privacy.define_flags(values)
    flags.DEFINE_flag(cli.app.HelpFlag(), flag_values=values)
    monkeypatch.setattr(flags, "FLAGS", values)
    monkeypatch.setattr(cli.app, "run", lambda main, flags_parser: main(flags_parser(
        ["edp-privacy", *args])))
    with pytest.raises(SystemExit) as exited:
        cli.run(lambda argv: pytest.fail(f"main ran with {argv}"))
    return exited.value.code


def test_a_bad_flag_value_is_one_line_naming_it_and_exit_2():
    proc = _privacy("--batch_size=-4", *PLANNED)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --batch_size must be in (0, dataset_size], got -4.0"]


def test_a_misspelled_flag_is_one_error_line_with_the_suggestion_and_exit_2(monkeypatch, capsys):
    """absl's own parser prints "FATAL Flags parsing error" and exits 1. In this process, on
    edp-privacy's flags: the parser is cli.run's own (absl's app.run stood in for, so that the
    process-wide flags are untouched); a command's process ending in exit 2 with its one
    line and nothing else is test_a_bad_flag_value_is_one_line_naming_it_and_exit_2's."""
    assert _privacy_in_process(monkeypatch, "--dataset_sise=3000") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: Unknown command line flag 'dataset_sise'")
    assert "Did you mean: dataset_size" in line


def test_a_run_directory_that_is_not_one_names_the_commands_flag(tmp_path):
    with pytest.raises(ValueError, match=r"^--run_dir=.*missing: the directory does not exist"):
        run_files.load_run_config(str(tmp_path / "missing"))


def test_verbose_shows_everything():
    """Quiet by default is the successful command's (edp_nlu/privacy_test.py) and the failing
    one's (the tests above and below); with --verbose nothing is hidden."""
    verbose = _privacy("--batch_size=-4", "--verbose", *PLANNED)
    assert verbose.returncode != 0
    assert "Traceback" in verbose.stderr
    # That command fails before it needs TensorFlow; a verbose command that imports it shows
    # TensorFlow's native lines too.
    native = subprocess.run(
        [sys.executable, "-c", "from edp_nlu import cli; cli.quiet_unless_verbose(['edp', "
         "'--verbose']); import tensorflow as tf; tf.config.list_physical_devices()"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert any(n in native.stderr for n in NATIVE_NOISE), native.stderr[-2000:]


def test_train_is_quiet_too(tmp_path):
    """train imports ml_collections, which imports TensorFlow: the quieting must come first."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "edp_nlu.train", f"--run_dir={tmp_path}",
                           "--resume"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --resume: --run_dir={tmp_path}: the directory holds no config.json, so it is "
        "not a run directory (edp-train writes one)"]


def test_resume_of_a_run_still_in_its_public_plain_run_says_how_to_continue(tmp_path):
    """Killed during --config.public_pretraining's plain run, a run directory holds only that
    run: --resume says to run the same command again, not that nothing is there."""
    (tmp_path / "public_pretraining").mkdir()
    (tmp_path / "public_pretraining" / "state.json").write_text("{}")
    with pytest.raises(ValueError, match="only its plain run on the public corpus.*without "
                                         "--resume"):
        train._resumed_config(None, str(tmp_path), None)


def _allocator_probe(env):
    """A fresh process that starts like a command, then asks TensorFlow for CPU memory stats.

    With oneDNN off only the BFC allocator keeps stats (malloc raises); with oneDNN on (TensorFlow
    turns it on by itself on AVX-512 CPUs) stats exist under either allocator, so the probe turns
    oneDNN off: the signal then identifies the allocator on every x86 machine."""
    code = ("from edp_nlu import cli; cli.quiet_unless_verbose([]); import os, tensorflow as tf\n"
            "try:\n    tf.config.experimental.get_memory_info('CPU:0'); bfc = True\n"
            "except Exception:\n    bfc = False\n"
            "print(os.environ['TF_CPU_ALLOCATOR_USE_BFC'], bfc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                         env=dict(env, TF_ENABLE_ONEDNN_OPTS="0"), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()[-2:]


def test_commands_set_the_bfc_cpu_allocator_and_keep_the_users_choice(monkeypatch):
    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC", raising=False)
    cli.use_bfc_cpu_allocator()
    assert os.environ["TF_CPU_ALLOCATOR_USE_BFC"] == "true"
    for users in ("false", "0"):
        monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", users)
        cli.use_bfc_cpu_allocator()
        assert os.environ["TF_CPU_ALLOCATOR_USE_BFC"] == users


def test_commands_run_on_the_bfc_cpu_allocator_unless_the_user_chose():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    env["PYTHONPATH"] = str(REPO)
    assert _allocator_probe(env) == ["true", "True"]
    assert _allocator_probe(dict(env, TF_CPU_ALLOCATOR_USE_BFC="false")) == ["false", "False"]


def test_a_config_is_a_path_or_a_packaged_configs_name(tmp_path):
    """`--config=snips_clc` is edp_nlu/configs/snips_clc.py from any directory (an installed
    package has no configs/ beside the user's files); a path stays a path."""
    from absl import flags
    from ml_collections import config_flags

    assert config_file("snips_clc") == os.path.join(DIRECTORY, "snips_clc.py")
    assert config_file("snips_clc:x") == os.path.join(DIRECTORY, "snips_clc.py") + ":x"
    for as_given in ("edp_nlu/configs/snips_clc.py", "snips_clc.py", "no_such_config", ""):
        assert config_file(as_given) == as_given
    values = flags.FlagValues()
    argv = ["cmd", "--config=atis_clc", "--config.mechanism=sgd"]
    holder = accept_names(config_flags.DEFINE_config_file(
        "config", config_file("default"), "", flag_values=values, sys_argv=argv), values)
    values(argv)
    assert holder.value.data_dir.endswith("atis") and holder.value.mechanism == "sgd"


def test_help_is_no_error(monkeypatch, capsys):
    """absl's --help exits 1; asking for help exits 0 (in this process, as the test above)."""
    assert _privacy_in_process(monkeypatch, "--help") == 0
    assert "--helpfull" in capsys.readouterr().out  # absl printed its help


def test_a_misspelt_config_field_is_one_line_with_the_suggestion_and_exit_2(monkeypatch, capsys):
    """ml_collections reads --config.<field> while the flag is defined, and raised a 55-line
    AttributeError there, outside cli.run."""
    argv = ["edp-train", "--config.batchsize=3"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        cli.define_flags_or_exit(lambda: train.define_flags(flags.FlagValues(), argv))
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --config.batchsize: no such config field (did you mean --config.batch_size?)"]
    values = flags.FlagValues()
    train.define_flags(values, ["edp-train"])
    with pytest.raises(flags.IllegalFlagValueError, match="epochs"):
        values(["edp-train", "--epochs=0"])  # 0 would mean "automatic": not from this flag


@pytest.mark.parametrize("command", ["train", "evaluate", "privacy"])
def test_help_answers_without_importing_tensorflow(command):
    """--help in about a second: nothing a command's help prints needs TensorFlow (about 5 s to
    import on the CI machine), so it must not be imported. A fresh process: this one has it."""
    script = ("import runpy, sys\n"
              f"sys.argv = ['edp_nlu.{command}', '--help']\n"
              "try:\n"
              f"    runpy.run_module('edp_nlu.{command}', run_name='__main__')\n"
              "except SystemExit as done:\n"
              "    code = done.code\n"
              "print('exit', code, 'tensorflow', 'tensorflow' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert result.stdout.strip().endswith("exit 0 tensorflow False"), result.stderr[-2000:]
