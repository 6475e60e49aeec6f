"""edp-tf: efficient DP-SGD for Keras models, with honest privacy accounting.

One call: `edp_tf.make_private(model, target_epsilon=..., epochs=..., batch_size=...)`, then
`compile` and `fit` as usual. The lower layer (`PoissonSampler`, `DPConfig`, `PrivateModel`,
`PrivacyLedger`, `calibrate_noise`) stays for what the one call does not cover.
"""
from edp_tf import accounting, batch_source, ledger, multi_worker, plan, report, sampling
from edp_tf.accounting import calibrate_noise, compute_epsilon, compute_epsilons
from edp_tf.bias_corrected_adam import BiasCorrectedAdam
from edp_tf.config import DPConfig
from edp_tf.filtering import KalmanFilter, LowPassFilter
from edp_tf.ledger import BudgetExhaustedError, PrivacyLedger
from edp_tf.mechanism import Mechanism
from edp_tf.multi_worker import make_multi_worker_strategy
from edp_tf.plan import PrivacyPlan
from edp_tf.private_adapt import PrivateNormalization, PrivateVocabulary
from edp_tf.private_model import PrivateModel
from edp_tf.private_training import AutoPrivateModel, make_private
from edp_tf.sampling import (
    AugmentedPoissonSampler,
    BandMFSampler,
    PoissonSampler,
    UserPoissonSampler,
)
from edp_tf.sampling_unit import SamplingUnit
from edp_tf.strategy import make_strategy
from edp_tf.streaming import StreamingPoissonSampler
from edp_tf.version import VERSION

__version__ = VERSION

__all__ = [
    "make_private", "AutoPrivateModel", "__version__", "batch_source", "report",
    "DPConfig", "Mechanism", "PrivacyPlan", "PrivateModel", "BiasCorrectedAdam", "LowPassFilter",
    "KalmanFilter", "make_strategy", "make_multi_worker_strategy", "PoissonSampler",
    "UserPoissonSampler", "AugmentedPoissonSampler", "BandMFSampler", "StreamingPoissonSampler",
    "SamplingUnit",
    "PrivacyLedger", "PrivateNormalization", "PrivateVocabulary",
    "BudgetExhaustedError", "calibrate_noise", "compute_epsilon", "compute_epsilons",
    "accounting", "ledger", "multi_worker", "plan", "sampling",
]
