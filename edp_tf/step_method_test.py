import logging

from edp_tf import step_method
from edp_tf.mechanism import Mechanism


def test_edp_with_one_large_microbatch_per_replica_is_warned_about_once(caplog):
    said = set()
    with caplog.at_level(logging.WARNING, logger="edp_tf.step_method"):
        step_method.warn_if_few_clipped_vectors(Mechanism(1, 64), said)
        step_method.warn_if_few_clipped_vectors(Mechanism(1, 64), said)
        step_method.warn_if_few_clipped_vectors(Mechanism(1, 64, microbatch_size=1), set())
        step_method.warn_if_few_clipped_vectors(Mechanism(4, 16), set())  # 4 rows a replica
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1
    assert "64 rows are clipped as one vector" in warned[0] and "sums about 64" in warned[0]
