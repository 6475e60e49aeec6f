"""One ml_collections file per experiment. A `--config` value is a file's path or, from anywhere
(an installed package has no configs/ beside the user's files), the name of one of these:
`--config=snips_clc` is edp_nlu/configs/snips_clc.py."""
import os

DIRECTORY = os.path.dirname(os.path.abspath(__file__))


def config_file(value: str) -> str:
    """The file a `--config` value names: `name` or `name:argument` (no `/`, no `.py`) is the
    packaged config of that name when it exists; anything else is a path, returned as given."""
    name, colon, argument = value.partition(":")
    packaged = os.path.join(DIRECTORY, f"{name}.py")
    if name and "/" not in name and os.sep not in name and not name.endswith(".py") and (
            os.path.isfile(packaged)):
        return packaged + colon + argument
    return value


def accept_names(holder, flag_values=None):
    """Lets a flag of ml_collections' `config_flags.DEFINE_config_file` also take a packaged
    config's name: its parser reads the file `config_file` gives. Returns the flag's holder."""
    from absl import flags

    parser = (flag_values or flags.FLAGS)[holder.name].parser
    parse_file = parser.parse
    parser.parse = lambda value: parse_file(config_file(value))
    return holder
