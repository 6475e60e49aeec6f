"""Which BERT weights train: all, all but the embedding tables, biases (BitFit), or LoRA.

Why: under DP the noise is drawn for every trained weight, so its norm grows with sqrt(d) while the
clipped signal does not; freezing what fine-tuning barely needs (the 11.7M-entry token table is
half of MiniLM's weights) or training only the biases (Bu et al., DP-BiTFiT) keeps most of the
signal and drops most of the noise. The task heads, the pooler and every LayerNormalization always
train.

LoRA (Hu et al. 2021; under DP, Yu et al. 2022): every attention and feed-forward kernel is
frozen and learns a rank-r update s A B (Keras' `enable_lora`, s = alpha / r); the factors, the
biases, the heads, the pooler and the layer norms train, the embedding tables do not. Per-example
norms of the factors are ghost norms (edp_tf/ghost/dense.py), so the step stays as fast as
"no_embeddings". B starts at 0 (the model starts as the pretrained one).

Two layouts of the factors (`lora_layout`):
* "matrix": the rank-r update of each kernel's matrix view [Din, Dout] (Hu et al.): r (Din +
  Dout) entries per kernel. MiniLM-L6 at r 8: 0.33M factor entries.
* "per_head": Keras' own `enable_lora`, whose A takes every kernel axis but the last. For the
  query, key and value kernels [384, 12 heads, 32] that is one A [384, r] per head with one
  B [r, 32] shared by the heads (12 r 384 + 32 r entries, 4.6x the matrix layout's at r 8); the
  attention output and feed-forward kernels get the matrix layout. MiniLM-L6 at r 8: 0.89M.
Which kernels get factors (`lora_targets`): "all" (the attention's query, key, value and output
and both feed-forward kernels), "attention" (the four attention kernels) or "query_value" (Hu et
al.'s choice, which Yu et al. kept under DP). Kernels without factors stay frozen, their biases
train. Fewer factors, less noise: MiniLM-L6 at r 8 in the matrix layout trains 0.33M, 0.15M or
74k factor entries.

Frozen A (`lora_freeze_a`; FFA-LoRA, Sun et al. 2024): A keeps its random initialisation and
only B trains, so the update s A B is linear in what trains. Why under DP: B starts at 0, so A's
gradient (a^T s dz B^T) is 0 at first and stays small while B is small: A's factor entries get
mostly noise, and share each example's clipped norm C with B. Frozen, they get neither: the
noise is drawn for B alone (half the matrix layout's factor entries at r 8) and the whole clipped
norm goes to B, the biases and the heads, at the same rank. A is a weight of the model like the
frozen kernel (checkpoints and the serving export keep it); its draw is the model's
initialisation (OS entropy unless a run fixes its seed), public like the pretrained kernel.
On ATIS at epsilon 8 it did about as well as a trained A, one run each (results/atis), so it is
an option, not a default.

Frozen lower layers (`frozen_layers` = N > 0, with any policy): the embeddings (tables and
their layer norm) and the lowest N transformer layers are frozen whole, their layer norms and
biases too, and get no LoRA factors. Why under DP: the lower layers of a pretrained encoder carry
general features that fine-tuning barely moves, while each of their trained weights still gets
noise; frozen, they get none, the clipped norm goes to the upper layers and the heads, and
nothing below layer N needs a gradient. Freezing every layer is not offered: that is the heads
alone, which `probe_epochs` trains.

"per_head" stays the base config's default so that the grids' per_head commands reproduce;
edp_nlu/configs/snips_bert.py and atis_bert.py use "matrix", which did better at epsilon 8 on SNIPS
(results/snips).
"""
from __future__ import annotations

import keras
from keras import ops

FINETUNE = ("all", "no_embeddings", "bias", "lora")
LORA_LAYOUTS = ("per_head", "matrix")
# the keras-hub TransformerEncoder layer names each target adapts (None: every projection)
LORA_TARGETS = {
    "all": None,
    "attention": frozenset({"query", "key", "value", "attention_output"}),
    "query_value": frozenset({"query", "value"}),
}


@keras.saving.register_keras_serializable(package="edp_models")
class MatrixLoRAEinsumDense(keras.layers.EinsumDense):
    """An EinsumDense whose LoRA factors split the kernel into its contracted (input) axes and
    its output axes: A [*in axes, r], B [r, *out axes], update s A B (a tensordot). The forward
    pass (`call`) is EinsumDense's, so the ghost rule for EinsumDense covers it."""

    @property
    def kernel(self):
        if not self.lora_enabled:
            return super().kernel
        update = ops.tensordot(self.lora_kernel_a, self.lora_kernel_b, axes=1)
        return ops.cast(ops.add(self._kernel, (self.lora_alpha / self.lora_rank) * update),
                        self.compute_dtype)

    def enable_lora(self, rank, lora_alpha=None, a_initializer="he_uniform",
                    b_initializer="zeros"):
        """Keras' signature (from_config calls it too), with the matrix layout's factors."""
        if not self.built or self.lora_enabled:
            raise ValueError(f"{self.name}: LoRA needs a built layer without LoRA")
        if self.quantization_mode or self.kernel_constraint:
            raise ValueError(f"{self.name}: matrix LoRA needs a plain kernel")
        inputs, kernel_axes = self.equation.split("->")[0].split(",")
        m = 0  # the kernel's leading axes that the input contracts
        while m < len(kernel_axes) and kernel_axes[m] in inputs:
            m += 1
        if "." in kernel_axes or m == 0 or any(c in inputs for c in kernel_axes[m:]):
            raise ValueError(f"{self.name}: matrix LoRA needs the kernel's contracted axes first, "
                             f"got equation {self.equation!r}")
        shape = tuple(int(d) for d in self._kernel.shape)
        self._tracker.unlock()
        self.lora_kernel_a = self.add_weight(name="lora_kernel_a", shape=shape[:m] + (rank,),
                                             initializer=a_initializer, dtype="float32")
        self.lora_kernel_b = self.add_weight(name="lora_kernel_b", shape=(rank,) + shape[m:],
                                             initializer=b_initializer, dtype="float32")
        self._kernel.trainable = False
        self._tracker.lock()
        self.lora_enabled, self.lora_rank = True, rank
        self.lora_alpha = rank if lora_alpha is None else lora_alpha


def enable_matrix_lora(layer: keras.layers.EinsumDense, rank: int, lora_alpha: float) -> None:
    """Matrix-layout LoRA on a built keras-hub EinsumDense (its class becomes
    MatrixLoRAEinsumDense, whose forward pass is EinsumDense's)."""
    if type(layer) is not keras.layers.EinsumDense:
        raise ValueError(f"matrix LoRA needs an EinsumDense, got {type(layer).__name__}")
    layer.__class__ = MatrixLoRAEinsumDense
    try:
        layer.enable_lora(rank, lora_alpha=lora_alpha)
    except ValueError:
        layer.__class__ = keras.layers.EinsumDense
        raise


def _transformer_projections(backbone, skip: int = 0) -> list:
    """Dense / EinsumDense layers inside the transformer layers (attention and feed-forward),
    the lowest `skip` layers left out."""
    found = []
    for block in backbone.transformer_layers[skip:]:
        for layer in block._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
                found.append(layer)
    return found


def set_finetuning(joint, policy: str, lora_rank: int = 8, lora_alpha: float = 16.0,
                   lora_layout: str = "per_head", lora_targets: str = "all",
                   lora_freeze_a: bool = False, frozen_layers: int = 0) -> None:
    """Freezes the part of `joint.backbone` that `policy` does not train, or adds LoRA factors
    (before compiling); `lora_freeze_a` trains only their B (like the other lora_* options,
    unused by the other policies, so that a private LoRA recipe's plain run needs no edit);
    `frozen_layers` > 0 freezes the embeddings and that many lowest transformer layers whole."""
    _check_options(policy, lora_layout, lora_targets, lora_freeze_a)
    backbone = joint.backbone
    _freeze_lower_layers(backbone, frozen_layers)
    if policy == "all":
        return
    for table in (backbone.token_embedding, backbone.position_embedding,
                  backbone.segment_embedding):
        table.trainable = False
    if policy == "no_embeddings":
        return
    if policy == "lora":
        _add_lora(backbone, lora_rank, lora_alpha, lora_layout, lora_targets, lora_freeze_a,
                  frozen_layers)
        return
    for layer in _transformer_projections(backbone):  # "bias": every projection kernel frozen
        layer._kernel.trainable = False


def _freeze_lower_layers(backbone, frozen_layers: int) -> None:
    """The embeddings and the lowest `frozen_layers` transformer layers, frozen whole; at least
    one transformer layer is left to train (freezing them all is `probe_epochs`' heads alone)."""
    layers = len(backbone.transformer_layers)
    if isinstance(frozen_layers, bool) or not isinstance(frozen_layers, int) \
            or not 0 <= frozen_layers < layers:
        raise ValueError(f"--config.bert.frozen_layers={frozen_layers!r} is invalid: expected an "
                         f"integer from 0 to {layers - 1} (this encoder has {layers} transformer "
                         "layers, and at least one trains)")
    if frozen_layers == 0:
        return
    for layer in (backbone.token_embedding, backbone.position_embedding,
                  backbone.segment_embedding, backbone.embeddings_layer_norm,
                  *backbone.transformer_layers[:frozen_layers]):
        layer.trainable = False


def _check_options(policy: str, lora_layout: str, lora_targets: str,
                   lora_freeze_a: bool) -> None:
    """Every policy checks the lora_* options too: a typo in a plain run's config is an error
    there as well, not only once the recipe is switched to LoRA."""
    if policy not in FINETUNE:
        raise ValueError(
            f"--config.bert.finetune={policy!r} is invalid: expected one of {FINETUNE}"
        )
    if lora_layout not in LORA_LAYOUTS:
        raise ValueError(f"--config.bert.lora_layout={lora_layout!r} is invalid: expected one of "
                         f"{LORA_LAYOUTS}")
    if lora_targets not in LORA_TARGETS:
        raise ValueError(f"--config.bert.lora_targets={lora_targets!r} is invalid: expected one "
                         f"of {tuple(LORA_TARGETS)}")
    if not isinstance(lora_freeze_a, bool):
        raise ValueError(f"--config.bert.lora_freeze_a={lora_freeze_a!r} must be True or False")


def _add_lora(backbone, lora_rank: int, lora_alpha: float, lora_layout: str, lora_targets: str,
              lora_freeze_a: bool, frozen_layers: int = 0) -> None:
    """LoRA factors on the targeted projections above the `frozen_layers` lowest layers; the
    other projections' kernels are frozen."""
    if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 1:
        raise ValueError(f"--config.bert.lora_rank={lora_rank!r} must be an integer >= 1")
    targets = LORA_TARGETS[lora_targets]
    projections = _transformer_projections(backbone, frozen_layers)
    missing = set(targets or ()) - {layer.name for layer in projections}
    if missing:  # a keras-hub whose layers are named otherwise: refuse, never adapt less
        raise ValueError(f"--config.bert.lora_targets={lora_targets!r}: the backbone has no "
                         f"layer named {sorted(missing)}")
    for layer in projections:  # enable_lora freezes the kernel itself
        if targets is not None and layer.name not in targets:
            layer._kernel.trainable = False  # no factors: frozen, its bias trains
        elif lora_layout == "matrix" and type(layer) is keras.layers.EinsumDense:
            enable_matrix_lora(layer, lora_rank, lora_alpha)
        else:  # Dense: Keras' layout is the matrix one
            layer.enable_lora(lora_rank, lora_alpha=lora_alpha)
        if lora_freeze_a and getattr(layer, "lora_enabled", False):
            layer.lora_kernel_a.trainable = False
