"""What every `python -m edp_nlu.<command>` shares: quiet logs and one-line errors.

Why: a user reads the commands' output. TensorFlow's native start-up lines (oneDNN, CPU
instructions, `cuInit` failing on a machine without a GPU), Keras' `shuffle=True ... ignored`
warning and the strategy's per-call chatter bury the epoch lines; a bad flag, config value or
data line should print one line naming it, not a traceback. `--verbose` brings both back.

Call `quiet_unless_verbose()` before TensorFlow is imported (module top of the command), then
`run(main)` instead of `absl.app.run(main)`.
"""
from __future__ import annotations

import logging as std_logging
import os
import re
import sys
import warnings

from absl import app, flags, logging

# Errors a user can fix from the message alone (flags, config values, data files, budgets, a
# run directory that cannot be written: each names its path).
USER_ERRORS = (ValueError, FileNotFoundError, PermissionError, NotADirectoryError,
               IsADirectoryError, app.UsageError)


def _verbose(argv) -> bool:
    return any(a in ("--verbose", "--verbose=true", "--verbose=True", "--verbose=1")
               for a in argv)


def use_bfc_cpu_allocator() -> None:
    """TensorFlow's CPU tensors come from malloc by default, and glibc serves every block above
    32 MB with a fresh mmap, so each step of a large batch (a private run's ~1,000 rows) pays
    page faults for its activations again: half the CPU time went to the kernel. TensorFlow's
    BFC allocator keeps and reuses that memory: it about halves a per-example private step of MiniLM
    at batch 128 (docs/benchmarks.md). A value the user set is kept. Must run before TensorFlow
    initialises its runtime."""
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


def quiet_unless_verbose(argv=None) -> bool:
    """Silences native TensorFlow logs and known-harmless warnings unless --verbose is given;
    returns whether it is verbose. Must run before `import tensorflow` to affect native logs.
    Every command calls it first, so it also picks the CPU allocator (use_bfc_cpu_allocator)."""
    use_bfc_cpu_allocator()
    argv = sys.argv if argv is None else argv
    verbose = _verbose(argv)
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        warnings.filterwarnings("ignore", message=r".*`shuffle=True` was passed.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        if not asks_for_help(argv):  # help needs no TensorFlow (about 5 s to import)
            _import_tensorflow_silently()
    return verbose


class _OnFirstUse:
    """A module imported when one of its names is first read."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        import importlib

        return getattr(importlib.import_module(self._name), attribute)


def on_first_use(name: str) -> _OnFirstUse:
    """The module `name`, imported when first used. Why: a command's machinery imports
    TensorFlow (about 5 s), which `--help` and a misspelt flag do not need."""
    return _OnFirstUse(name)


HELP_FLAGS = ("-h", "--help", "-?", "--helpfull", "--helpshort", "--helpxml")


def asks_for_help(argv) -> bool:
    """Whether the command line asks absl for its help (printed before anything runs)."""
    return any(arg in HELP_FLAGS for arg in argv[1:])


def _import_tensorflow_silently() -> None:
    """TensorFlow 2.21's native start-up lines go through absl's C++ logging before it is
    initialised, which ignores TF_CPP_MIN_LOG_LEVEL: import it (and probe the devices, where
    `cuInit` fails without a GPU) with file descriptor 2 pointed at /dev/null. A Python error
    in the import is still raised, after stderr is back."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            import tensorflow as tf

            tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _quiet_python_loggers() -> None:
    # per-call strategy / saver chatter at INFO; our own modules keep INFO
    for name in ("tensorflow", "absl", "h5py", "matplotlib"):
        std_logging.getLogger(name).setLevel(std_logging.WARNING)
    for module in ("mirrored_strategy", "cross_device_ops", "functional_saver",
                   "collective_all_reduce_strategy"):
        std_logging.getLogger(f"tensorflow.{module}").setLevel(std_logging.WARNING)


class _DropChatter(std_logging.Filter):
    """absl routes TensorFlow's Python INFO lines through its own handler: drop those."""

    _NOISY = ("mirrored_strategy.py", "cross_device_ops.py", "functional_saver.py",
              "collective_all_reduce_strategy.py", "signature_serialization.py",
              "save.py", "builder_impl.py", "fingerprinting_utils.py")

    def filter(self, record: std_logging.LogRecord) -> bool:
        return not (record.levelno < std_logging.WARNING
                    and os.path.basename(record.pathname) in self._NOISY)


flags.DEFINE_bool("verbose", False, "Show TensorFlow's native logs and full tracebacks.")


def run(main) -> None:
    """`absl.app.run(main)` with user errors printed as one line (exit code 2)."""

    def wrapped(argv):
        verbose = flags.FLAGS.verbose
        logging.set_verbosity(logging.INFO)
        if not verbose:
            _quiet_python_loggers()
            logging.get_absl_handler().addFilter(_DropChatter())
        try:
            return main(argv)
        except USER_ERRORS as error:
            if verbose:
                raise
            print(f"error: {error}", file=sys.stderr, flush=True)
            sys.exit(2)

    app.run(wrapped, flags_parser=_parse_flags)


def _parse_flags(argv):
    """absl's parser, with a bad flag as one `error:` line and exit code 2 (absl's own prints
    "FATAL Flags parsing error" and exits 1); its suggestions ("Did you mean ...?") are kept.
    Asking for help is no error: exit code 0 (absl's help flags exit 1)."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr, flush=True)
        sys.exit(2)
    except SystemExit as done:
        if any(a in HELP_FLAGS for a in argv[1:]):
            sys.exit(0)
        raise done


def define_flags_or_exit(define) -> None:
    """`define()`, a command's flag definitions, with a misspelt `--config.<field>` (which
    ml_collections reads while the config flag is defined, as an AttributeError carrying its
    "Did you mean" line) as one `error:` line and exit code 2."""
    try:
        define()
    except (AttributeError, KeyError) as error:
        if _verbose(sys.argv):
            raise
        text = str(error)
        missing = re.search(r'instead of "(\w+)"', text) or re.search(r"'(\w+)", text)
        suggestion = re.search(r'Did you mean "(\w+)"', text)
        given = [a.split("=")[0] for a in sys.argv[1:] if a.startswith("--config.")]
        field = next((g for g in given if missing and missing.group(1) in g.split(".")), None)
        print(f"error: {field or 'a --config.<field> flag'}: no such config field"
              + (f" (did you mean --config.{suggestion.group(1)}?)" if suggestion else ""),
              file=sys.stderr, flush=True)
        sys.exit(2)
