"""edp_nlu.scoring.predictions.per_example_losses: every row scored once, in order, with a
single trace."""
import numpy as np
import tensorflow as tf

from edp_nlu.scoring import predictions


class _SumModel:
    """Stands in for a joint model: loss of a row = sum(x) * y; counts traces of the call."""

    def __init__(self):
        self.traces = 0

    def __call__(self, x, training=False):
        self.traces += 1  # Python side effect: runs once per trace, not per call
        return tf.reduce_sum(x["x"], axis=1)

    def infer(self, x):  # JointTagger.infer: the call in inference mode
        return self(x, training=False)

    def per_example_loss(self, y, y_pred):
        return y_pred * y["y"]


def test_losses_cover_every_row_in_order_with_one_trace():
    rng = np.random.default_rng(0)
    x = {"x": rng.normal(size=(7, 3)).astype("float32")}
    y = {"y": rng.uniform(1, 2, size=7).astype("float32")}
    model = _SumModel()
    step = predictions.loss_step(model)
    # 3 + 3 + 1 (padded)
    got = predictions.per_example_losses(model, x, y, batch_size=3, step=step)
    np.testing.assert_allclose(got, x["x"].sum(1) * y["y"], rtol=1e-6)
    again = predictions.per_example_losses(model, {"x": x["x"][:2]}, {"y": y["y"][:2]},
                                           batch_size=3, step=step)
    np.testing.assert_allclose(again, got[:2], rtol=1e-6)
    assert model.traces == 1
