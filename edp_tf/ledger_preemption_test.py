"""A real training process SIGKILLed while tracing and at random moments: the ledger charges
every step that ran, at most the flush interval more, and nothing for a kill before any step."""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

FLUSH = 3  # flush_steps of the child's ledger: the most a kill may over-charge
CHILD = textwrap.dedent("""
    import json, os, signal, sys
    import numpy as np, keras
    import edp_tf
    from edp_tf import DPConfig, PrivateModel, ledger, sampling

    run_dir, log_path, kill_in_trace = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    log = open(log_path, "a")

    def say(line):
        log.write(line + "\\n")
        log.flush()  # a SIGKILL keeps what is in the page cache

    x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    sampler = sampling.PoissonSampler(64, 0.25)
    cfg = DPConfig(l2_norm_clip=1.0, noise_multiplier=2.0,
                   expected_batch_size=sampler.expected_batch_size)
    model = PrivateModel(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]), cfg)
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=lambda a, b: keras.ops.mean(keras.ops.square(a - b), axis=-1))
    if kill_in_trace:  # the step's Python body runs only while Keras traces it
        def killed(data):
            os.kill(os.getpid(), signal.SIGKILL)
        model.train_step = killed

    class Log(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            say("fit")
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            say(f"begin {epoch}")
        def on_train_batch_end(self, batch, logs=None):
            say(f"step {self.epoch}")
        def on_epoch_end(self, epoch, logs=None):
            say(f"end {epoch}")

    done = 0
    if os.path.exists(log_path):
        done = sum(1 for line in open(log_path) if line.startswith("end"))
    led = ledger.PrivacyLedger.for_sampler(run_dir, sampler, 1 / 64, flush_steps=%d)
    model.fit(sampler.dataset(x, x[:, :1]), epochs=done + 400, initial_epoch=done, verbose=0,
              callbacks=[led, Log()])
""" % FLUSH)


def _attempt(tmp_path, log_path, kill_in_trace, delay):
    """Runs the child; SIGKILLs it `delay` s after its first step (it kills itself while
    tracing with `kill_in_trace`); returns the lines it logged."""
    before = open(log_path).read().splitlines() if os.path.exists(log_path) else []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "run"),
                              log_path, "1" if kill_in_trace else "0"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not kill_in_trace and child.poll() is None and time.time() < deadline:
        new_lines = open(log_path).read().splitlines()[len(before):]
        if any(line.startswith("step") for line in new_lines):
            time.sleep(delay)
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    child.wait(timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    return open(log_path).read().splitlines()[len(before):]


def _ledger(tmp_path):
    path = tmp_path / "run" / "privacy.json"
    return json.loads(path.read_text()) if path.exists() else {"epochs": [], "in_progress": None}


def test_sigkilled_process_is_charged_what_ran_and_at_most_the_flush_interval_more(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    log_path = str(tmp_path / "steps.log")
    # a kill while the first step is traced: no step read the data, nothing is charged
    lines = _attempt(tmp_path, log_path, True, 0.0)
    assert "fit" in lines and not any(line.startswith("step") for line in lines)
    led = _ledger(tmp_path)
    assert led["epochs"] == [] and led["in_progress"] is None
    rng = random.Random()  # random moments; a failure prints them
    charged_before = 0
    for delay in (rng.uniform(0.0, 1.5),):  # more kills: python -m tools.faults --kinds=storm
        lines = _attempt(tmp_path, log_path, False, delay)
        led = _ledger(tmp_path)
        # the previous kill's epoch was charged by this attempt's resume, as it was on disk
        assert len(led["epochs"]) >= charged_before
        ran = {}
        for line in lines:
            what, epoch = line.split()[0], line.split()[-1]
            if what == "step":
                ran[int(epoch)] = ran.get(int(epoch), 0) + 1
        ended = {int(line.split()[1]) for line in lines if line.startswith("end")}
        charged = {e["epoch"]: e["steps"] for e in led["epochs"][charged_before:]}
        cut = sorted(set(ran) - ended)
        for epoch in ended:  # finished epochs: their steps, exactly
            assert charged[epoch] == ran[epoch], (delay, epoch)
        if led["in_progress"] is not None:  # what a resume charges for the killed epoch
            epoch, bound = led["in_progress"]["epoch"], led["in_progress"]["steps"]
            steps = ran.get(epoch, 0)
            assert steps <= bound <= steps + FLUSH, (delay, epoch, steps, bound)
            assert cut in ([], [epoch])
        else:
            assert cut == [], (delay, cut)  # an epoch that ran is never uncharged
        charged_before = len(led["epochs"]) + (led["in_progress"] is not None)
