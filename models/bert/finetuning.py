"""Which BERT weights train: all, all but the embedding tables, or biases (BitFit).

Why: under DP the noise is drawn for every trained weight, so its norm grows with sqrt(d) while the
clipped signal does not; freezing what fine-tuning barely needs (the 11.7M-entry token table is
half of MiniLM's weights) or training only the biases (Bu et al., DP-BiTFiT) keeps most of the
signal and drops most of the noise. The task heads, the pooler and every LayerNormalization always
train.

Not offered yet: LoRA. Keras' `enable_lora` layers are not covered by ghost norms, so their
factors take the exact per-example path, which measured 10 s/step at batch 16 on CPU and failed
inside pfor at batch 128 (an UnsortedSegmentSum of the first-piece gather). It needs a ghost rule
for the two factors first.
"""
from __future__ import annotations

import keras

FINETUNE = ("all", "no_embeddings", "bias")


def _transformer_projections(backbone) -> list:
    """Dense / EinsumDense layers inside the transformer layers (attention and feed-forward)."""
    found = []
    for block in backbone.transformer_layers:
        for layer in block._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
                found.append(layer)
    return found


def set_finetuning(joint, policy: str) -> None:
    """Freezes the part of `joint.backbone` that `policy` does not train (before compiling)."""
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
    for layer in _transformer_projections(backbone):  # "bias": every projection kernel frozen
        layer._kernel.trainable = False
