"""Two worker processes (MultiWorkerMirroredStrategy over 127.0.0.1) run the private step.

The workers are subprocesses that import this module and call `worker_main` (one CPU replica
each: TensorFlow's MultiWorkerMirroredStrategy does not use logical CPU devices); the reference
is this process with 2 replicas of MirroredStrategy (conftest.py makes the logical devices).
"""
import json
import os
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

import edp_tf
from edp_tf import multi_worker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, Q, WIDTH = 256, 0.125, 64


def free_ports(count: int) -> list:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def train_job(strategy, noise_multiplier: float, sampler_seed=None, epochs: int = 2,
              zero_loss: bool = False) -> dict:
    """A small per-example DP-SGD run; returns initial and final weights (name -> array).

    `zero_loss`: the loss has no gradient, so the update is the noise alone."""
    x = np.random.RandomState(0).normal(size=(N, WIDTH)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    replicas = strategy.num_replicas_in_sync
    key = None if sampler_seed is not None else multi_worker.shared_key(strategy)
    sampler = edp_tf.PoissonSampler(dataset_size=N, sampling_rate=Q, replicas=replicas,
                                    seed=sampler_seed, key=key)
    init = keras.initializers.GlorotUniform
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((WIDTH,)),
            keras.layers.Dense(WIDTH, activation="tanh", kernel_initializer=init(seed=1),
                               name="a"),
            keras.layers.Dense(WIDTH, activation="tanh", kernel_initializer=init(seed=2),
                               name="b"),
            keras.layers.Dense(2, kernel_initializer=init(seed=3), name="head")])
        private = edp_tf.PrivateModel(model, edp_tf.DPConfig(
            l2_norm_clip=1.0, noise_multiplier=noise_multiplier, microbatch_size=1,
            expected_batch_size=sampler.expected_batch_size))
        xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        loss = (lambda t, p: 0.0 * xent(t, p)) if zero_loss else xent
        private.compile(optimizer=keras.optimizers.SGD(1.0 if zero_loss else 0.5), loss=loss)
    def weights():  # "a/kernel", ...: the model's own name differs between processes
        return {"/".join(v.path.split("/")[-2:]): v.numpy() for v in model.weights}

    before = weights()
    private.fit(sampler.dataset(x, y), epochs=epochs, verbose=0)
    return {"before": before, "after": weights(),
            "expected_batch": sampler.expected_batch_size, "replicas": replicas}


# The two jobs each worker process runs, one after the other on its one strategy: (name,
# noise multiplier, fixed sampler seed or None for the shared key, zero loss). Two jobs in one
# pair of processes save a pair's TensorFlow start; the z = 0 job runs first, as it ran alone.
JOBS = (("z0", 0.0, 7, False), ("noise", 1.0, None, True))


def _save(out: str, result: dict) -> None:
    np.savez(out, **{f"{k}/{name}": v for k in ("before", "after")
                     for name, v in result[k].items()},
             expected_batch=result["expected_batch"], replicas=result["replicas"])


class _WeightsAtStart(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.weights = [w.copy() for w in self.model.wrapped_model.get_weights()]


def resume_job(strategy, run_dir: str) -> dict:
    """make_private with a run_dir on both workers: one epoch, then a resumed run from other
    initial weights; returns the weights after the first and at the start of the second."""
    x = np.random.RandomState(1).normal(size=(N, WIDTH)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    found = {}
    for attempt, seed in (("first", 1), ("resumed", 2)):
        with strategy.scope():
            model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(
                2, kernel_initializer=keras.initializers.GlorotUniform(seed=seed))])
            private = edp_tf.make_private(model, target_epsilon=8.0, epochs=2,
                                          batch_size=32, run_dir=run_dir, strategy=strategy,
                                          resume=attempt == "resumed")
            private.compile(keras.optimizers.SGD(0.5), keras.losses.SparseCategoricalCrossentropy(
                from_logits=True))
        seen = _WeightsAtStart()
        private.fit(x, y, epochs=1, verbose=0, callbacks=[seen])
        found[f"{attempt}/start"] = seen.weights[0]
        found[f"{attempt}/after"] = model.get_weights()[0]
    return found


def worker_main(index: int, ports: str, out_dir: str) -> None:
    os.environ["TF_CONFIG"] = multi_worker.tf_config(
        [f"127.0.0.1:{p}" for p in ports.split(",")], index)
    strategy = multi_worker.make_multi_worker_strategy(timeout_seconds=120)
    for name, noise_multiplier, sampler_seed, zero_loss in JOBS:
        _save(os.path.join(out_dir, f"{name}{index}.npz"),
              train_job(strategy, noise_multiplier, sampler_seed, zero_loss=zero_loss))
    np.savez(os.path.join(out_dir, f"resume{index}.npz"),
             **resume_job(strategy, os.path.join(out_dir, "run")))


def reference_job() -> dict:
    """One process, 2 replicas (MirroredStrategy over the logical CPUs conftest.py makes), z = 0.
    tf.data's seeded random stream also depends on TensorFlow's global seed, which other tests
    in this process may set: unset, as in a fresh process (and restored after)."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    kept = context.global_seed()
    tf.random.set_seed(None)
    try:
        return train_job(edp_tf.make_strategy(2), 0.0, sampler_seed=7)
    finally:
        tf.random.set_seed(kept)


@pytest.fixture(scope="module")
def workers(tmp_path_factory) -> dict:
    """Both JOBS run by one pair of worker processes: {job name: [worker 0's, worker 1's]}."""
    out_dir = str(tmp_path_factory.mktemp("workers"))
    ports = ",".join(map(str, free_ports(2)))
    procs = []
    for index in range(2):
        code = (f"import edp_tf.multi_worker_test as t; t.worker_main({index}, {ports!r}, "
                f"{out_dir!r})")
        env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for proc in procs:
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, log.decode()[-3000:]
    return {name: [dict(np.load(os.path.join(out_dir, f"{name}{i}.npz"))) for i in range(2)]
            for name in [job[0] for job in JOBS] + ["resume"]} | {"out_dir": out_dir}


def test_two_workers_at_z0_match_one_process_with_two_replicas(workers):
    workers = workers["z0"]
    reference = reference_job()
    assert int(workers[0]["replicas"]) == 2
    for name, after in reference["after"].items():
        np.testing.assert_allclose(workers[0][f"before/{name}"], reference["before"][name])
        assert not np.allclose(after, reference["before"][name])  # training moved it
        for worker in workers:  # both workers hold the weights one process computes
            np.testing.assert_allclose(worker[f"after/{name}"], after, rtol=1e-5, atol=1e-6)


def test_noise_of_two_workers_is_independent_with_the_single_process_law(workers):
    z = 1.0
    w0, w1 = workers["noise"]
    for name in ("a/kernel", "b/kernel"):
        np.testing.assert_array_equal(w0[f"after/{name}"], w1[f"after/{name}"])  # in sync
    # SGD at rate 1 on a loss without gradient: each of the 2 epochs x 8 steps adds noise of std
    # z C / B per entry (B the expected batch, C = 1), so the change / B has std z sqrt(16).
    steps = 2 * int(np.ceil(1 / Q))
    noise = {name: (w0[f"after/{name}"] - w0[f"before/{name}"]) * float(w0["expected_batch"])
             / np.sqrt(steps) for name in ("a/kernel", "b/kernel")}
    for name, values in noise.items():
        # 4,096 entries: the sample std's relative standard error is 1/sqrt(2 x 4096) = 1.1%;
        # 6% is over 5 standard errors. A noise drawn by no replica gives 0, by both sqrt(2) z.
        assert abs(values.std() / z - 1.0) < 0.06, (name, values.std())
    # The two kernels' noise is drawn by different workers (one owner per variable, replicas
    # 0 and 1): identical generator streams on the two workers would make them equal. |corr|
    # of independent 4,096-vectors has std 1/64; 0.08 is 5 of them.
    corr = np.corrcoef(noise["a/kernel"].ravel(), noise["b/kernel"].ravel())[0, 1]
    assert abs(corr) < 0.08, corr


def test_each_worker_checkpoints_and_a_resume_restores_the_chiefs_checkpoint(workers):
    """make_private(run_dir=...) under two workers: the chief's checkpoint in run_dir, worker
    1's beside its ledger copy; resumed from other initial weights, both workers start where
    the chief's first run ended (and in sync), so the resumed run continues the charged one."""
    chief, other = workers["resume"]
    run_dir = os.path.join(workers["out_dir"], "run")
    for directory in (run_dir, os.path.join(run_dir, "workers", "1")):
        assert os.path.exists(os.path.join(directory, "checkpoint", "latest.json")), directory
    assert not np.array_equal(chief["first/start"], chief["first/after"])  # it trained
    for worker in (chief, other):
        np.testing.assert_array_equal(worker["resumed/start"], chief["first/after"])
    with open(os.path.join(run_dir, "privacy.json")) as handle:
        assert len(json.load(handle)["epochs"]) == 2  # the first run's epoch, then the resumed


def test_shared_key_of_one_process_is_fresh_entropy():
    strategy = edp_tf.make_strategy(2)
    keys = {multi_worker.shared_key(strategy) for _ in range(4)}
    assert len(keys) == 4 and all(0 <= k < 2 ** 63 for k in keys)


def test_tf_config_names_the_chief_and_refuses_a_bad_index():
    config = json.loads(multi_worker.tf_config(["127.0.0.1:1", "127.0.0.1:2"], 1))
    assert config["task"] == {"type": "worker", "index": 1}
    with pytest.raises(ValueError, match="outside"):
        multi_worker.tf_config(["127.0.0.1:1"], 1)


def test_sampler_key_gives_the_same_batches_and_is_not_a_fixed_seed():
    x = np.arange(40, dtype="float32")[:, None]
    a, b = (edp_tf.PoissonSampler(dataset_size=40, sampling_rate=0.3, key=123) for _ in range(2))
    batches = [[m.numpy() for _, _, m in s.dataset(x, x, steps=3)] for s in (a, b)]
    np.testing.assert_array_equal(batches[0], batches[1])
    assert not a.seed_fixed
    with pytest.raises(ValueError, match="not both"):
        edp_tf.PoissonSampler(dataset_size=40, sampling_rate=0.3, key=1, seed=1)
    with pytest.raises(ValueError, match="key"):
        edp_tf.PoissonSampler(dataset_size=40, sampling_rate=0.3, key=-1)


def test_a_cluster_managers_tf_config_gives_the_chief_first_and_refuses_what_cannot_run():
    def config(cluster, kind, index):
        return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})

    workers = {"worker": ["a:1", "b:1", "c:1"]}
    assert multi_worker.cluster_position(config(workers, "worker", 0)) == (0, 3)
    assert multi_worker.cluster_position(config(workers, "worker", 2)) == (2, 3)
    with_chief = {"chief": ["c:1"], "worker": ["a:1", "b:1"]}  # Kubeflow's TFJob with a chief
    assert multi_worker.cluster_position(config(with_chief, "chief", 0)) == (0, 3)
    assert multi_worker.cluster_position(config(with_chief, "worker", 1)) == (2, 3)
    for bad, why in [(config(workers, "worker", 3), "not in its cluster"),
                     (config({**workers, "ps": ["p:1"]}, "worker", 0), "ps"),
                     (config({"chief": ["a:1", "b:1"]}, "chief", 0), "2 chiefs"),
                     (config(workers, "evaluator", 0), "neither chief nor worker"),
                     ("{not json", "not a cluster")]:
        with pytest.raises(ValueError, match=why):
            multi_worker.cluster_position(bad)
