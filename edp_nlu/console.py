"""The installed commands (`edp-train`, `edp-privacy`, ...): each is `python -m edp_nlu.<name>`.

A console script imports its target before calling it, so the targets live here, in a module that
imports no TensorFlow: each quiets TensorFlow's native start-up lines first (they are read once,
at import), then imports its command, defines its flags and runs it (edp_nlu/cli.py).
"""
from __future__ import annotations

import importlib
import sys
from typing import Callable

from absl import flags

from edp_nlu import cli

COMMANDS = ("train", "evaluate", "privacy")


def _command(name: str) -> Callable[[], None]:
    def run() -> None:
        cli.quiet_unless_verbose()
        try:
            module = importlib.import_module(f"edp_nlu.{name}")
        except ModuleNotFoundError as error:  # `pip install edp-tf`: the library alone
            if (error.name or "").split(".")[0] in ("edp_tf", "edp_nlu"):
                raise
            sys.exit(f"error: edp-{name} is the NLU application, which needs its extra "
                     f"dependencies ({error.name} is missing): pip install 'edp-tf[nlu]'")
        if hasattr(module, "define_flags"):
            cli.define_flags_or_exit(module.define_flags)
        _help_as_the_module(module)
        cli.run(module.main)

    run.__name__ = name
    run.__doc__ = f"`edp-{name}`: the same as `python -m edp_nlu.{name}`."
    return run


train, evaluate, privacy = (_command(c) for c in COMMANDS)


def _help_as_the_module(module) -> None:
    """absl's --help shows __main__'s docstring and the flags keyed to sys.argv[0]: here the
    script, so the command's own docstring and flags are given to it."""
    sys.modules["__main__"].__doc__ = module.__doc__
    for flag in flags.FLAGS.flags_by_module_dict().get(module.__name__, []):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
