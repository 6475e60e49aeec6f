"""edp-tf: efficient DP-SGD for Keras models, with honest privacy accounting.

One call: `edp_tf.make_private(model, target_epsilon=..., epochs=..., batch_size=...)`, then
`compile` and `fit` as usual. The lower layer (`PoissonSampler`, `DPConfig`, `PrivateModel`,
`PrivacyLedger`, `calibrate_noise`) stays for what the one call does not cover.

The names resolve on first use, all at once (and with them the Keras classes edp_tf registers
for loading saved objects): `import edp_tf.config` alone, which a command's flag definitions
need, does not import TensorFlow, so `edp-train --help` answers in about a second.
"""
import importlib

from edp_tf.version import VERSION

__version__ = VERSION

_EXPORTS = {
    "calibrate_noise": "edp_tf.accounting",
    "compute_epsilon": "edp_tf.accounting",
    "compute_epsilons": "edp_tf.accounting",
    "BiasCorrectedAdam": "edp_tf.bias_corrected_adam",
    "DPConfig": "edp_tf.config",
    "KalmanFilter": "edp_tf.filtering",
    "LowPassFilter": "edp_tf.filtering",
    "BudgetExhaustedError": "edp_tf.ledger",
    "PrivacyLedger": "edp_tf.ledger",
    "Mechanism": "edp_tf.mechanism",
    "make_multi_worker_strategy": "edp_tf.multi_worker",
    "PrivacyPlan": "edp_tf.plan",
    "PrivateNormalization": "edp_tf.private_adapt",
    "PrivateVocabulary": "edp_tf.private_adapt",
    "PrivateModel": "edp_tf.private_model",
    "AutoPrivateModel": "edp_tf.private_training",
    "make_private": "edp_tf.private_training",
    "AugmentedPoissonSampler": "edp_tf.sampling",
    "BandMFSampler": "edp_tf.sampling",
    "PoissonSampler": "edp_tf.sampling",
    "UserPoissonSampler": "edp_tf.sampling",
    "SamplingUnit": "edp_tf.sampling_unit",
    "make_strategy": "edp_tf.strategy",
    "StreamingPoissonSampler": "edp_tf.streaming",
}
_SUBMODULES = ("accounting", "batch_source", "ledger", "multi_worker", "plan", "report",
               "sampling")

__all__ = sorted(["__version__", *_EXPORTS, *_SUBMODULES])


def __getattr__(name: str):
    if name in _SUBMODULES:  # `from edp_tf import accounting`: that module alone
        return importlib.import_module(f"edp_tf.{name}")
    if name in _EXPORTS:
        _load_all()
        return globals()[name]
    raise AttributeError(f"module 'edp_tf' has no attribute {name!r}")


def _load_all() -> None:
    for sub in _SUBMODULES:
        globals()[sub] = importlib.import_module(f"edp_tf.{sub}")
    for name, module in _EXPORTS.items():
        globals()[name] = getattr(importlib.import_module(module), name)


def __dir__():
    return __all__
