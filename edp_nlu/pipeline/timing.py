"""Where a run's wall time goes: start-up, data, building, tracing, steps, dev evaluation,
checkpoints, test metrics, export. The summary prints it, so that a slow run says whether it is
slow at training or at everything around it."""
from __future__ import annotations

import contextlib
import os
import statistics
import time
from typing import Optional

import keras


def process_age() -> Optional[float]:
    """Seconds since this process started (Linux /proc; None elsewhere): the start-up phase
    (interpreter, TensorFlow's import) happens before any code of the run can time it."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class Phases:
    """Seconds per phase of one run."""

    def __init__(self):
        self.seconds = {}
        self._started = time.perf_counter()
        self._age = process_age()

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def time_methods(self, obj, names, phase: str) -> None:
        """Counts the time `obj`'s methods `names` take (a callback's hooks) into `phase`."""
        for name in names:
            method = getattr(obj, name)

            def timed(*args, _method=method, **kwargs):
                with self.phase(phase):
                    return _method(*args, **kwargs)

            setattr(obj, name, timed)

    def breakdown(self) -> dict:
        """{phase: seconds} with "total" (from the process start where known) and "other"."""
        out = {k: round(v, 1) for k, v in self.seconds.items()}
        inside = time.perf_counter() - self._started
        if self._age is not None:
            out["start-up"] = round(self._age, 1)
        total = inside + (self._age or 0.0)
        out["other"] = round(max(0.0, total - sum(v for k, v in out.items())), 1)
        out["total"] = round(total, 1)
        return out


def breakdown_line(breakdown: dict) -> str:
    """"time: 170 s (71% in training steps): steps 121.0, tracing 14.0, ..." (every phase that
    ran, largest first: a short phase is still named, so a reader sees it was timed)."""
    total = breakdown.get("total") or 0.0
    parts = sorted(((v, k) for k, v in breakdown.items() if k != "total"), reverse=True)
    steps = breakdown.get("steps", 0.0)
    share = f" ({100 * steps / total:.0f}% in training steps)" if total else ""
    return (f"time: {total:.0f} s{share}: "
            + ", ".join(f"{k} {v:.1f}" for v, k in parts))


class StepTimes(keras.callbacks.Callback):
    """Times each training step (batch begin to batch end) into `phases`: the first step of a
    fit, which traces the step function, goes to "tracing" beyond a typical step's time, and so
    does fit's set-up before it (the input pipeline's iterator, the distributed dataset)."""

    def __init__(self, phases: Phases):
        super().__init__()
        self.phases = phases
        self._begin = None
        self._first = None
        self._times = []
        self._fit_started = None

    def on_train_begin(self, logs=None):
        self._fit_started = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = time.perf_counter()
        if self._fit_started is not None:
            self.phases.add("tracing", self._begin - self._fit_started)
            self._fit_started = None

    def on_train_batch_end(self, batch, logs=None):
        if self._begin is None:
            return
        seconds = time.perf_counter() - self._begin
        if self._first is None:
            self._first = seconds
        else:
            self._times.append(seconds)

    def on_train_end(self, logs=None):
        if self._first is None:
            return
        typical = statistics.median(self._times) if self._times else 0.0
        self.phases.add("tracing", max(0.0, self._first - typical))
        self.phases.add("steps", sum(self._times) + min(self._first, typical))
        self._first, self._times = None, []
