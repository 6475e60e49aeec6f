"""The default run: CLC with eDP-SGD on the built-in synthetic corpus; minutes on a 2-core CPU."""
from configs.base import base_config


def get_config():
    return base_config()
