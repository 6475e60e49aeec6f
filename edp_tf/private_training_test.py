"""make_private: one call, Poisson batches drawn by the library, the budget kept across fits."""
import json
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_tf import input_pipelines, ledger, sampling

N_EX, BATCH, EPOCHS, TARGET = 128, 32, 2, 3.0


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N_EX, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


def _private(run_dir=None, strategy=None, **kwargs):
    with (strategy or tf.distribute.get_strategy()).scope():
        model = keras.Sequential([keras.Input((4,), name="features"), keras.layers.Dense(2)])
    private = edp_tf.make_private(model, target_epsilon=TARGET, epochs=EPOCHS,
                                  batch_size=BATCH, run_dir=run_dir, strategy=strategy, **kwargs)
    private.compile(optimizer=keras.optimizers.SGD(0.1),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"])  # hidden, but Keras reads every metric at epoch end
    return model, private


def test_arrays_train_on_poisson_batches_to_the_budget_and_no_further(tmp_path):
    x, y = _data()
    model, private = _private(str(tmp_path), strategy=edp_tf.make_strategy(2))
    before = model.get_weights()
    history = private.fit(x, y, epochs=1, verbose=0)  # one of the two planned epochs
    # no unnoised training statistic; epsilon per epoch, a function of the ledger
    assert set(history.history) == {"noise_multiplier", "epsilon"}
    sampler = private.sampler
    assert (sampler.dataset_size, sampler.sampling_rate) == (N_EX, BATCH / N_EX)
    assert private.batch_source.kind == "sampler"  # the library drew the batches itself
    first = private.epsilon
    assert 0 < first < TARGET and history.history["epsilon"] == [first]
    # at a larger delta the same run has a smaller epsilon; at its own delta the headline
    assert private.epsilon_at(0.1 / N_EX) == pytest.approx(first)
    assert private.epsilon_at(0.5 / N_EX) < first
    private.fit(x, y, verbose=0)  # the rest of the plan, continuing the ledger
    statement = private.privacy_statement()
    assert [e["epoch"] for e in statement["epochs"]] == [0, 1]
    assert statement["private"] is True and statement["sampling"] == "poisson"
    assert statement["delta"] == pytest.approx(0.1 / N_EX)
    # calibrated: the two epochs spend the budget (the bisection's tolerance is 1e-3 in z)
    assert TARGET * 0.97 <= private.epsilon <= TARGET
    with open(tmp_path / "privacy.json") as f:
        assert json.load(f)["epsilon"] == private.epsilon
    assert any(not np.allclose(a, b) for a, b in zip(before, model.get_weights()))
    with pytest.raises(ledger.BudgetExhaustedError, match="would bring epsilon"):
        private.fit(x, y, epochs=1, verbose=0)  # a third epoch would pass the budget
    assert private.privacy_statement()["epochs"] == statement["epochs"]


def test_dicts_of_arrays_and_the_samplers_dataset_are_taken_others_refused():
    x, y = _data()
    _, private = _private()
    private.fit({"features": x}, y, epochs=1, verbose=0)
    assert private.privacy_ledger.path is None  # in memory without run_dir
    assert private.privacy_statement()["private"] is True
    with pytest.raises(ValueError, match="rows but the run's first had"):
        private.fit(x[:64], y[:64], epochs=1, verbose=0)
    # the run's own sampler's dataset is accepted
    private.fit(private.sampler.dataset({"features": x}, y), epochs=1, verbose=0)
    _, fresh = _private()
    with pytest.raises(ValueError, match="batch_size=16"):
        fresh.fit(x, y, batch_size=16, verbose=0)
    with pytest.raises(ValueError, match="sample_weight"):
        fresh.fit(x, y, sample_weight=np.ones(N_EX), verbose=0)
    other = sampling.PoissonSampler(N_EX, 0.5)
    _, third = _private()
    third.fit(other.dataset(x, y), epochs=1, verbose=0)  # a sampler's own q is accounted
    assert third.privacy_statement()["sampling_rate"] == 0.5


def test_make_private_refuses_what_it_decides_itself_and_foreign_variables():
    with pytest.raises(ValueError, match="decides noise_multiplier itself"):
        _private(noise_multiplier=1.0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])  # default strategy
    with pytest.raises(ValueError, match="strategy.scope"):
        edp_tf.make_private(model, target_epsilon=1.0, epochs=1, batch_size=8,
                            strategy=edp_tf.make_strategy(2))
    with pytest.raises(ValueError, match="target_epsilon"):
        edp_tf.make_private(model, target_epsilon=0.0, epochs=1, batch_size=8)
    assert edp_tf.__version__ and "sampl" in edp_tf.make_private.__doc__


def test_one_object_saves_checkpoints_and_loads_into_the_users_model(tmp_path):
    x, y = _data()
    model, private = _private(str(tmp_path / "run"))
    checkpoints = [keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras")),
                   keras.callbacks.ModelCheckpoint(str(tmp_path / "w.weights.h5"),
                                                   save_weights_only=True)]
    private.fit(x, y, epochs=1, verbose=0, callbacks=checkpoints)  # ModelCheckpoint works
    private.save(str(tmp_path / "m.keras"))
    with zipfile.ZipFile(tmp_path / "m.keras") as saved:  # the user's architecture, alone
        config = saved.read("config.json").decode()
    assert "edp_tf" not in config and "PrivateModel" not in config
    loaded = keras.models.load_model(str(tmp_path / "best.keras"))
    fresh = keras.Sequential([keras.Input((4,), name="features"), keras.layers.Dense(2)])
    fresh.load_weights(str(tmp_path / "w.weights.h5"))  # weights-only loads into the user's
    for a, b, c in zip(model.get_weights(), loaded.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    covered = private.privacy_statement()["artifacts"]["covered"]
    assert any(str(tmp_path / "best.keras") in c for c in covered)
    assert any(str(tmp_path / "m.keras") in c for c in covered)
    with pytest.raises(ValueError, match="no config of its own"):
        private.get_config()


class _StopAt(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.step:
            raise KeyboardInterrupt


def test_an_interrupted_fit_is_charged_what_ran_and_the_next_fit_follows_it():
    """Ctrl-C after 3 steps of epoch 0: the ledger charges the 3 steps that were allowed to
    start (the 4th call had not passed the ledger's hook), epsilon is no longer 0, and the next
    fit trains epoch 1."""
    x, y = _data()
    _, private = _private()
    with pytest.raises(KeyboardInterrupt):
        private.fit(x, y, epochs=1, verbose=0, callbacks=[_StopAt(2)])
    statement = private.privacy_statement()
    assert [(e["epoch"], e["steps"]) for e in statement["epochs"]] == [(0, 3)]
    assert statement["in_progress"] is None and private.epsilon > 0
    private.fit(x, y, epochs=1, verbose=0)
    assert [e["epoch"] for e in private.privacy_statement()["epochs"]] == [0, 1]


def test_an_infinite_stream_needs_steps_per_epoch_under_a_budget_and_delta_below_1_over_n():
    x, y = _data()
    _, private = _private()
    stream = edp_tf.PoissonSampler(N_EX, BATCH / N_EX).dataset(x, y, repeat=True)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        private.fit(stream, epochs=1, verbose=0)
    _, loose = _private(delta=1.0 / N_EX)
    with pytest.raises(ValueError, match="well below 1/n"):
        loose.fit(x, y, epochs=1, verbose=0)


def test_the_wrappers_checkpoint_holds_no_noise_state_and_hidden_statistics_stay_unkept(
        tmp_path):
    """A checkpoint of the wrapper would otherwise carry the Philox state (the next draws, and
    the past ones); with statistics hidden, no metric variable holds the training loss."""
    x, y = _data()
    _, private = _private()
    private.fit(x, y, epochs=1, verbose=0)
    path = tf.train.Checkpoint(model=private).write(str(tmp_path / "ckpt"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert names and not [n for n in names if "generator" in n.lower() or "state" in n.lower()]
    kept = {k: float(v) for k, v in private.get_metrics_result().items()}
    assert set(kept) >= {"loss", "noise_multiplier"} and kept["loss"] == 0.0


def test_a_used_run_dir_is_refused_before_a_step_and_resume_continues_it(tmp_path):
    x, y = _data()
    _, first = _private(str(tmp_path))
    first.fit(x, y, epochs=1, verbose=0)
    spent = first.epsilon
    model, again = _private(str(tmp_path))  # the same script run a second time
    before = model.get_weights()
    with pytest.raises(ValueError, match=f"already holds a run: epsilon {spent:.4g} spent over "
                                         r"1 epoch\(s\).*resume=True.*new run_dir"):
        again.fit(x, y, verbose=0)
    assert again.step_count.value == 0
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    _, resumed = _private(str(tmp_path), resume=True)
    resumed.fit(x, y, verbose=0)  # the one epoch left of the two, at the budget
    statement = resumed.privacy_statement()
    assert [e["epoch"] for e in statement["epochs"]] == [0, 1]
    assert spent < statement["epsilon"] <= TARGET
    with pytest.raises(ValueError, match="give run_dir"):
        _private(None, resume=True)


def test_mixed_float16_is_refused_before_training():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with pytest.raises(ValueError, match="mixed_float16 needs loss scaling"):
            _private()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:  # bfloat16 needs no loss scaling: it trains, and the update is not scaled away
        x, y = _data()
        model, private = _private()
        before = model.get_weights()
        private.fit(x, y, epochs=1, verbose=0)
        moved = max(float(np.max(np.abs(a - b))) for a, b in zip(before, model.get_weights()))
        assert moved > 1e-3  # SGD(0.1) on a noised mean gradient of norm ~ 1: far above 1e-5
    finally:
        keras.mixed_precision.set_global_policy("float32")


class _Batches(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // 16

    def __getitem__(self, i):
        return self.x[16 * i:16 * (i + 1)], self.y[16 * i:16 * (i + 1)]


@pytest.mark.parametrize("pipeline", ["unbatched", "batched_shuffled", "pydataset",
                                      "generator"])
def test_any_finite_pipeline_trains_on_the_librarys_own_poisson_batches(pipeline):
    """One pass gives the set of examples; the batches fit trains on are the sampler's, never
    the pipeline's (their grouping and order do not enter the accounting)."""
    x, y = _data()
    slices = tf.data.Dataset.from_tensor_slices((x, y))
    given = {"unbatched": slices,
             "batched_shuffled": slices.shuffle(N_EX).batch(BATCH),
             "pydataset": _Batches(x, y),
             "generator": ((x[i:i + 16], y[i:i + 16]) for i in range(0, N_EX, 16))}[pipeline]
    _, private = _private()
    private.fit(given, epochs=1, verbose=0)
    assert private.batch_source.kind == "sampler"  # the library's Poisson batches
    assert private.sampler.dataset_size == N_EX
    assert private.privacy_statement()["private"] is True


def test_a_pipeline_without_end_or_with_weights_is_refused_in_one_line():
    x, y = _data()
    slices = tf.data.Dataset.from_tensor_slices((x, y))
    _, private = _private()
    with pytest.raises(ValueError, match=r"endless tf.data.Dataset \(.repeat\(\)\?\)"):
        private.fit(slices.repeat(), epochs=1, verbose=0)
    weighted = tf.data.Dataset.from_tensor_slices((x, y, np.ones(N_EX, "float32")))
    with pytest.raises(ValueError, match="sample weights"):
        private.fit(weighted, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="StreamingPoissonSampler"):
        input_pipelines.to_arrays(slices, max_bytes=1000)
    assert private.step_count.value == 0


def test_an_optimizer_made_outside_the_strategy_scope_trains_on_its_replicas():
    """`compile(keras.optimizers.Adam(...))` as Keras users write it: the optimizer's step
    counter is created outside the strategy's scope, which plain Keras refuses at the first fit
    ("Mixing different tf.distribute.Strategy objects"); make_private makes it again inside."""
    x, y = _data()
    strategy = edp_tf.make_strategy(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,), name="features"), keras.layers.Dense(2)])
    private = edp_tf.make_private(model, target_epsilon=TARGET, epochs=EPOCHS, batch_size=BATCH,
                                  strategy=strategy)
    adam = keras.optimizers.Adam(0.05)  # outside the scope
    private.compile(adam, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.get_weights()
    private.fit(x, y, epochs=1, verbose=0)
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert private.optimizer is not adam and private.optimizer.learning_rate == adam.learning_rate
