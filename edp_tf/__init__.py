"""edp-tf: efficient DP-SGD for Keras models, with honest privacy accounting."""
from edp_tf.config import DPConfig
from edp_tf.private_model import PrivateModel
from edp_tf.strategy import make_strategy

__all__ = ["DPConfig", "PrivateModel", "make_strategy"]
