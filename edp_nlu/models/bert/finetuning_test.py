import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_nlu.models import testing
from edp_nlu.models.bert import finetuning
from edp_nlu.models.bert.bert_joint import BertJoint
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor
from edp_nlu.models.bert.finetuning import (
    FINETUNE,
    LORA_LAYOUTS,
    LORA_TARGETS,
    _transformer_projections,
    set_finetuning,
)
from edp_tf import microbatch


@pytest.fixture(scope="module")
def data():
    pre = BertPreprocessor.from_training_data(
        testing.TOKENS, testing.TAGS, testing.INTENTS, vocabulary_size=80, sequence_length=12)
    x, y, _ = pre.encode(testing.TOKENS, testing.TAGS, testing.INTENTS)
    return pre, x, y


def trainable_names(model):
    return {v.path for v in model.trainable_variables}


@pytest.mark.parametrize("policy", FINETUNE)
def test_policy_trains_what_it_says(data, policy):
    pre = data[0]
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    everything = trainable_names(model)
    set_finetuning(model, policy)
    names = trainable_names(model)
    tables = {n for n in everything if "embedding" in n and "layer_norm" not in n}
    assert tables, "the backbone's embedding tables must be found"
    heads = {n for n in everything if n.split("/")[0] in ("intent_logits", "tag_potentials", "crf")
             or "intent_logits" in n or "tag_potentials" in n or "crf" in n}
    norms = {n for n in everything if "norm" in n}
    assert heads and norms and heads <= names and norms <= names  # always trained
    if policy == "all":
        assert names == everything
    else:
        assert not names & tables
    kernels = {n for n in everything if "transformer_layer" in n and n.endswith("kernel")}
    assert kernels
    if policy == "lora":
        factors = {n for n in names if "lora_kernel" in n}
        assert len(factors) == 2 * len(kernels)  # A and B beside every projection kernel
        assert not names & kernels and all(
            n.endswith(("bias", "gamma", "beta")) or "lora_kernel" in n
            for n in names if "transformer_layer" in n)
    elif policy == "bias":
        assert not names & kernels
        assert {n for n in names if "transformer_layer" in n} and all(
            n.endswith(("bias", "gamma", "beta")) for n in names if "transformer_layer" in n)
    else:
        assert kernels <= names


@pytest.mark.parametrize("policy", FINETUNE)
def test_frozen_layers_freeze_the_embeddings_and_the_lowest_layers_whole(data, policy):
    """With any policy, frozen_layers=1 of 2 leaves nothing of the embeddings or of layer 0 to
    train (no LoRA factor there either), and layer 1 trains as the policy says."""
    model = BertJoint.from_preprocessor(data[0], **dict(testing.TINY_BERT, num_layers=2))
    set_finetuning(model, policy, frozen_layers=1)
    names = trainable_names(model)
    lower, upper = (model.backbone.transformer_layers[i] for i in (0, 1))
    assert not any(v.trainable for v in lower.weights)  # includes LoRA factors, had any been made
    assert not {n for n in names if "embedding" in n}  # the tables and their layer norm
    assert not any("lora" in v.path for v in lower.weights)
    upper_trained = {v.path for v in upper.trainable_weights}
    assert upper_trained and upper_trained <= names
    assert ("lora" in policy) == any("lora_kernel" in n for n in upper_trained)


def test_frozen_layers_leave_at_least_one_layer_and_name_the_field(data):
    model = BertJoint.from_preprocessor(data[0], **dict(testing.TINY_BERT, num_layers=2))
    for frozen in (2, -1, True, 1.0):  # refused before anything is frozen: one model serves
        with pytest.raises(ValueError, match=r"--config\.bert\.frozen_layers=.*from 0 to 1"):
            set_finetuning(model, "lora", frozen_layers=frozen)
    assert all(v.trainable for v in model.backbone.weights)


def test_unknown_policy_names_the_field(data):
    model = BertJoint.from_preprocessor(data[0], **testing.TINY_BERT)
    with pytest.raises(ValueError, match=r"--config\.bert\.finetune='prefix'"):
        set_finetuning(model, "prefix")


@pytest.mark.parametrize("policy, freeze_a", [("no_embeddings", False), ("bias", False),
                                              ("lora", False), ("lora", True)])
def test_frozen_weights_stay_exactly_unchanged_under_dp_training(data, policy, freeze_a):
    """Per-example DP-SGD (ghost norms) touches only what trains: noise is drawn for nothing else
    (with lora_freeze_a, every A stays exactly as drawn while every B moves). The lora_freeze_a
    case also freezes the lower of two layers whole (frozen_layers=1)."""
    pre, x, y = data
    frozen_layers = 1 if freeze_a else 0
    model = BertJoint.from_preprocessor(pre, **dict(testing.TINY_BERT,
                                                    num_layers=1 + frozen_layers))
    set_finetuning(model, policy, lora_freeze_a=freeze_a, frozen_layers=frozen_layers)
    frozen = {v.path: v.numpy().copy() for v in model.variables
              if not any(v is t for t in model.trainable_variables)}
    trained = {v.path: v.numpy().copy() for v in model.trainable_variables}
    private = edp_tf.PrivateModel(model, edp_tf.DPConfig(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                         microbatch_size=1))
    import keras

    private.compile(optimizer=keras.optimizers.SGD(0.1), loss=model.per_example_loss)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4, drop_remainder=True)
    private.fit(ds, epochs=1, verbose=0)
    for v in model.variables:
        if v.path in frozen:
            np.testing.assert_array_equal(v.numpy(), frozen[v.path], err_msg=v.path)
    moved = [p for p in trained if not np.array_equal(
        [v for v in model.trainable_variables if v.path == p][0].numpy(), trained[p])]
    assert len(moved) == len(trained)  # noise reaches every trained weight


def lora_fallbacks(model, x, y) -> dict:
    """LoRA factors that fall back from ghost norms to exact per-example gradients, with why."""
    variables = model.trainable_variables
    reasons = {}

    @tf.function(autograph=False)
    def plan():
        p = microbatch.ghost_pass(model, model.per_example_loss, variables, x, y,
                                  tf.ones([len(testing.TOKENS)]), 1, 1.0)
        reasons.update({variables[i].path: r for i, r in p.plan.reasons.items()})
        return 0

    plan()
    return {path: r for path, r in reasons.items() if "lora" in path}


@pytest.mark.parametrize("layout", LORA_LAYOUTS)
def test_lora_factors_use_ghost_norms_and_survive_a_checkpoint(data, tmp_path, layout):
    """Every LoRA factor takes the ghost path (no exact per-example fallback), and a
    tf.train.Checkpoint (what `--resume` restores) keeps the factors themselves: Keras'
    own weight files would merge them into the kernel and zero them, stalling training."""
    pre, x, y = data
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    set_finetuning(model, "lora", lora_rank=2, lora_layout=layout)
    assert not lora_fallbacks(model, x, y)
    factors = [v for v in model.trainable_variables if "lora_kernel_b" in v.path]
    for v in factors:
        v.assign(tf.fill(v.shape, 0.25))
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    clone = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    set_finetuning(clone, "lora", lora_rank=2, lora_layout=layout)
    tf.train.Checkpoint(model=clone).restore(path).assert_existing_objects_matched()
    restored = {v.path: v.numpy() for v in clone.trainable_variables if "lora_kernel" in v.path}
    assert restored and all(np.all(restored[v.path] == 0.25) for v in factors)


@pytest.mark.parametrize("layout", LORA_LAYOUTS)
def test_frozen_a_trains_only_b_and_a_checkpoint_keeps_a(data, tmp_path, layout):
    """lora_freeze_a: every A is frozen (its training is checked with the other frozen weights
    above), every B trains on the ghost path, and a checkpoint restores the random A (a fresh
    model draws another one, which would not fit the trained B)."""
    pre, x, y = data
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    set_finetuning(model, "lora", lora_rank=2, lora_layout=layout, lora_freeze_a=True)
    names = trainable_names(model)
    kernels = _transformer_projections(model.backbone)
    a = {layer.lora_kernel_a.path: layer.lora_kernel_a.numpy().copy() for layer in kernels}
    b = {layer.lora_kernel_b.path: layer.lora_kernel_b.numpy().copy() for layer in kernels}
    assert len(a) == len(b) == len(kernels) == 6 * testing.TINY_BERT["num_layers"]
    assert not names & set(a) and set(b) <= names
    assert all(np.std(v) > 0 for v in a.values())  # A random (B starts at 0)
    assert not lora_fallbacks(model, x, y)
    for layer in kernels:
        layer.lora_kernel_b.assign(tf.fill(layer.lora_kernel_b.shape, 0.25))
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    clone = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    set_finetuning(clone, "lora", lora_rank=2, lora_layout=layout, lora_freeze_a=True)
    clone_kernels = _transformer_projections(clone.backbone)
    assert not np.array_equal(clone_kernels[0].lora_kernel_a.numpy(),
                              kernels[0].lora_kernel_a.numpy())
    tf.train.Checkpoint(model=clone).restore(path).assert_existing_objects_matched()
    for mine, theirs in zip(kernels, clone_kernels):
        np.testing.assert_array_equal(theirs.lora_kernel_a.numpy(), mine.lora_kernel_a.numpy())
        np.testing.assert_array_equal(theirs.lora_kernel_b.numpy(), mine.lora_kernel_b.numpy())


def test_lora_freeze_a_is_checked(data):
    model = BertJoint.from_preprocessor(data[0], **testing.TINY_BERT)
    with pytest.raises(ValueError, match=r"--config\.bert\.lora_freeze_a='yes'"):
        set_finetuning(model, "lora", lora_freeze_a="yes")


def test_lora_rank_is_checked(data):
    model = BertJoint.from_preprocessor(data[0], **testing.TINY_BERT)
    with pytest.raises(ValueError, match="lora_rank=0"):
        set_finetuning(model, "lora", lora_rank=0)


@pytest.mark.parametrize("layout", LORA_LAYOUTS)
def test_lora_layouts_split_the_kernel_as_documented(data, layout):
    """matrix: A [contracted axes, r] and B [r, output axes] for every kernel (r (Din + Dout)
    entries); per_head (Keras): the query/key/value A also holds the heads axis."""
    model = BertJoint.from_preprocessor(data[0], **testing.TINY_BERT)
    set_finetuning(model, "lora", lora_rank=3, lora_layout=layout)
    layers = [layer for layer in model.backbone._flatten_layers(include_self=False)
              if getattr(layer, "lora_enabled", False)]
    assert layers
    qkv = 0
    for layer in layers:
        kernel = tuple(layer._kernel.shape)
        a, b = tuple(layer.lora_kernel_a.shape), tuple(layer.lora_kernel_b.shape)
        assert a[:-1] + b[1:] == kernel and a[-1] == b[0] == 3
        if layer.name in ("query", "key", "value"):  # kernel [hidden, heads, head size]
            qkv += 1
            assert len(kernel) == 3 and len(a) == (2 if layout == "matrix" else 3), layer.name
        else:  # Dense [Din, Dout], attention output [heads, head size, hidden]: B [r, Dout]
            assert len(b) == 2, layer.name
    assert qkv == 3 * testing.TINY_BERT["num_layers"]


def test_matrix_lora_merges_its_update_into_the_kernel(data):
    """The forward pass uses W + (alpha / r) A B (a tensordot over r), and starts at W (B = 0)."""
    pre, x, _ = data
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    before = model(x, training=False)["intent_logits"].numpy()
    set_finetuning(model, "lora", lora_rank=2, lora_alpha=5.0, lora_layout="matrix")
    np.testing.assert_allclose(model(x, training=False)["intent_logits"].numpy(), before,
                               rtol=1e-6, atol=1e-6)
    query = [layer for layer in model.backbone._flatten_layers(include_self=False)
             if layer.name == "query"][0]
    rng = np.random.default_rng(0)
    query.lora_kernel_b.assign(rng.normal(size=query.lora_kernel_b.shape).astype("float32"))
    a, b, w = (v.numpy() for v in (query.lora_kernel_a, query.lora_kernel_b, query._kernel))
    np.testing.assert_allclose(query.kernel.numpy(), w + 2.5 * np.tensordot(a, b, axes=1),
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(model(x, training=False)["intent_logits"].numpy(), before)


def test_lora_layout_is_checked(data):
    model = BertJoint.from_preprocessor(data[0], **testing.TINY_BERT)
    with pytest.raises(ValueError, match=r"--config\.bert\.lora_layout='diagonal'"):
        set_finetuning(model, "lora", lora_layout="diagonal")


@pytest.mark.parametrize("targets", ["attention", "query_value"])
def test_lora_targets_adapt_only_the_named_kernels_and_freeze_the_rest(data, targets):
    """Factors beside the named kernels only; every other projection kernel frozen without
    factors, its bias still trained."""
    model = BertJoint.from_preprocessor(data[0], **testing.TINY_BERT)
    set_finetuning(model, "lora", lora_rank=2, lora_layout="matrix", lora_targets=targets)
    projections = _transformer_projections(model.backbone)
    assert len(projections) == 6 * testing.TINY_BERT["num_layers"]
    adapted = {layer.name for layer in projections if getattr(layer, "lora_enabled", False)}
    assert adapted == set(LORA_TARGETS[targets])
    names = trainable_names(model)
    for layer in projections:
        assert layer._kernel.path not in names, layer._kernel.path
        assert layer.bias.path in names, layer.bias.path
        factors = {v.path for v in layer.trainable_variables if "lora_kernel" in v.path}
        assert len(factors) == (2 if layer.name in adapted else 0), layer.name


def test_lora_targets_are_checked(data):
    model = BertJoint.from_preprocessor(data[0], **testing.TINY_BERT)
    with pytest.raises(ValueError, match=r"--config\.bert\.lora_targets='mlp'"):
        set_finetuning(model, "lora", lora_targets="mlp")


def test_lora_targets_missing_from_the_backbone_are_refused(data, monkeypatch):
    """A backbone whose layers are named otherwise must fail, not silently adapt fewer kernels."""
    monkeypatch.setitem(finetuning.LORA_TARGETS, "query_value", frozenset({"query", "val"}))
    model = BertJoint.from_preprocessor(data[0], **testing.TINY_BERT)
    with pytest.raises(ValueError, match=r"no layer named \['val'\]"):
        set_finetuning(model, "lora", lora_targets="query_value")
