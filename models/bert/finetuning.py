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
"no_embeddings" while the noise covers r (Din + Dout) entries per kernel instead of Din Dout.
Keras starts B at 0 (the model starts as the pretrained one).
"""
from __future__ import annotations

import keras

FINETUNE = ("all", "no_embeddings", "bias", "lora")


def _transformer_projections(backbone) -> list:
    """Dense / EinsumDense layers inside the transformer layers (attention and feed-forward)."""
    found = []
    for block in backbone.transformer_layers:
        for layer in block._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
                found.append(layer)
    return found


def set_finetuning(joint, policy: str, lora_rank: int = 8, lora_alpha: float = 16.0) -> None:
    """Freezes the part of `joint.backbone` that `policy` does not train, or adds LoRA factors
    (before compiling)."""
    if policy not in FINETUNE:
        raise ValueError(f"--config.bert.finetune={policy!r} is invalid: expected one of {FINETUNE}")
    if policy == "all":
        return
    backbone = joint.backbone
    for table in (backbone.token_embedding, backbone.position_embedding,
                  backbone.segment_embedding):
        table.trainable = False
    if policy == "no_embeddings":
        return
    if policy == "lora":
        if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 1:
            raise ValueError(f"--config.bert.lora_rank={lora_rank!r} must be an integer >= 1")
        for layer in _transformer_projections(backbone):  # freezes the kernel itself
            layer.enable_lora(lora_rank, lora_alpha=lora_alpha)
        return
    for layer in _transformer_projections(backbone):  # "bias": every projection kernel frozen
        layer._kernel.trainable = False
