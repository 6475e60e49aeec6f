"""The serving SavedModel reloads in a fresh process that imports only TensorFlow (+
tensorflow_text)."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.models import export, testing
from edp_nlu.models.bert.bert_joint import BertJoint
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor
from edp_nlu.models.bert.finetuning import set_finetuning
from edp_nlu.models.clc.clc_joint import CLCJoint
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor
from edp_nlu.models.export import export_serving_model, serving_function

UTTERANCES = [
    "call mum at 0123",
    "",
    "Refill my ASPIRIN please ☃ \u200b",
    " ".join(["play jazz"] * 10),  # 20 words: longer than the models' limit
    "text\u00a0anna  hello",
]

# One fresh process reloads every export of this file (each process costs seconds of CPU just to
# import TensorFlow): the TensorFlow-only exports first, before tensorflow_text is imported, then
# those that need its word-piece ops.
RELOAD = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    results = {}
    for path, needs_text in json.loads(sys.argv[1]):
        if needs_text:
            import tensorflow_text  # noqa: F401  (word-piece ops)
        text_loaded = "tensorflow_text" in sys.modules
        loaded = tf.saved_model.load(path)
        serve = loaded.signatures["serving_default"]
        out = serve(utterances=tf.constant(json.loads(sys.argv[2])))
        imported = sorted(m for m in ("keras_hub", "edp_nlu", "edp_tf") if m in sys.modules)
        written = [name for name, _ in tf.train.list_variables(path + "/variables/variables")
                   if name != "_CHECKPOINTABLE_OBJECT_GRAPH"]
        results[path] = {"imported": imported, "variables": len(written),
                         "text_loaded": text_loaded,
                         **{k: v.numpy().tolist() for k, v in out.items()}}
    print(json.dumps(results, default=lambda b: b.decode()))
    """
)


def _randomise(model):
    """Random weights with some scale, so that intents and tags vary (untrained heads say 'O')."""
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()])


def _reload_in_fresh_process(exports):
    """[(path, needs_text)] -> {path: what the fresh process read and served}."""
    env = dict(os.environ, PYTHONPATH="")  # the project must not be importable
    result = subprocess.run(
        [sys.executable, "-c", RELOAD, json.dumps(exports), json.dumps(UTTERANCES)],
        capture_output=True, text=True, env=env, cwd="/", timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _clc():
    pre = CLCPreprocessor.from_training_data(
        testing.TOKENS, testing.TAGS, testing.INTENTS, max_words=6, max_word_length=5
    )
    model = CLCJoint.from_preprocessor(pre, **testing.TINY_CLC)
    _randomise(model)
    return pre, model, False


def _bert(lora):
    """With LoRA the export serves the kernel plus its low-rank update (B randomised too, so
    an export that dropped the update would predict differently)."""
    pre = BertPreprocessor.from_training_data(
        testing.TOKENS, testing.TAGS, testing.INTENTS, vocabulary_size=200, sequence_length=32
    )
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    if lora:
        set_finetuning(model, "lora", lora_rank=2)
    _randomise(model)
    return pre, model, True


def _export(tmp_path, model, pre):
    """Exports with optimizer state beside the model (it must not be exported); returns the path
    and the very tf.function that was exported, for the in-memory comparison."""
    model.compile(optimizer=keras.optimizers.Adam())
    model.optimizer.build(model.trainable_variables)
    served = []

    def recording(*args):
        served.append(serving_function(*args))
        return served[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export, "serving_function", recording)
        path = export_serving_model(model, pre, str(tmp_path))
    assert len(served) == 1
    return path, served[0]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (model, preprocessor, in-memory serving function, what the fresh process read):
    every export reloaded by one process, the TensorFlow-only ones first."""
    built = {"clc": _clc(), "bert": _bert(False), "bert_lora": _bert(True)}
    paths, serves = {}, {}
    for name, (pre, model, _) in built.items():
        paths[name], serves[name] = _export(tmp_path_factory.mktemp(name), model, pre)
    order = sorted(built, key=lambda name: built[name][2])  # no tensorflow_text first
    reloaded = _reload_in_fresh_process([(paths[n], built[n][2]) for n in order])
    return {n: (built[n][1], built[n][0], serves[n], reloaded[paths[n]]) for n in built}


def _check_export(exported, name, needs_text):
    model, pre, serve, reloaded = exported[name]
    assert reloaded["text_loaded"] == needs_text
    assert reloaded["imported"] == []
    # the model's weights, each once: no optimizer slots, no dropout layers' seed states
    assert reloaded["variables"] == len(model.weights)

    in_memory = serve(tf.constant(UTTERANCES))
    assert reloaded["intent"] == [s.decode() for s in in_memory["intent"].numpy()]
    np.testing.assert_allclose(
        reloaded["intent_probability"], in_memory["intent_probability"], atol=1e-6
    )
    assert reloaded["slot_tags"] == [
        [s.decode() for s in row] for row in in_memory["slot_tags"].numpy()
    ]
    assert reloaded["num_words"] == [len(u.split()) for u in UTTERANCES]
    assert reloaded["truncated"] == [False, False, False, True, False]

    # The signature agrees with the Python path (preprocessor.encode + predict_labels).
    x, _, _ = pre.encode([u.split() for u in UTTERANCES])
    predicted = model.predict_labels(x)
    intents = [pre.intent_vocabulary.labels[i] for i in predicted["intent_ids"].numpy()]
    assert reloaded["intent"] == intents
    kept = predicted["tag_mask"].numpy().sum(axis=1)
    for b, utterance in enumerate(UTTERANCES):
        tags = reloaded["slot_tags"][b]
        words = len(utterance.split())
        expected = [
            pre.tag_vocabulary.labels[i] for i in predicted["tag_ids"].numpy()[b, : kept[b]]
        ]
        assert tags[: kept[b]] == expected
        assert tags[kept[b] : words] == ["O"] * (words - kept[b])  # past the model's limit
        assert tags[words:] == [""] * (len(tags) - words)
    assert len(set(t for row in reloaded["slot_tags"] for t in row) - {"", "O"}) > 0
    return reloaded


def test_clc_export_reloads_with_tensorflow_only(exported):
    _check_export(exported, "clc", needs_text=False)


@pytest.mark.parametrize("lora", [False, True])
def test_bert_export_reloads_with_tensorflow_text(exported, lora):
    _check_export(exported, "bert_lora" if lora else "bert", needs_text=True)


def test_export_rejects_a_non_joint_model(tmp_path):
    pre = CLCPreprocessor.from_training_data(testing.TOKENS, testing.TAGS, testing.INTENTS)
    with pytest.raises(ValueError, match="wrapped_model"):
        export_serving_model(keras.Sequential([keras.layers.Dense(1)]), pre, str(tmp_path / "x"))
