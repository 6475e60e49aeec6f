"""The installed edp-tf's version, for statements that say which library wrote them."""
from importlib import metadata as _metadata

try:
    VERSION = _metadata.version("edp-tf")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    VERSION = "0+unknown"
