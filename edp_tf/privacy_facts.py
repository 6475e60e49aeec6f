"""What a PrivateModel tells its ledger beyond the mechanism: the sentences on what epsilon does
not cover in this run, one rule per feature that moves something outside the proof.

Why in one place: the ledger writes them into privacy.json and sets `private` from them; a new
feature that releases something epsilon does not count adds its sentence here.
"""
from __future__ import annotations

from typing import Sequence

TRAINING_STATISTICS_SENTENCE = (
    "fit showed the training loss, compiled metrics and clipping statistics (clipped_fraction, "
    "preclip_norm, nonfinite_microbatches) of every step (PrivateModel(training_statistics="
    "True)): they are computed on the private batches without noise and are not covered by "
    "epsilon (progress bar, History, TensorBoard, callbacks).")


def not_covered(plan, public_layers: Sequence[str], config, subspace,
                training_statistics: bool) -> list:
    """The sentences, in the order a reviewer reads them."""
    out = list(plan.not_covered) if plan is not None else []
    if public_layers:
        out.append(f"Layers {', '.join(public_layers)} hold state fitted by adapt(); epsilon "
                   "assumes it was fitted on public data, as the user declared.")
    if config.scaling == "first_batch":
        out.append("Per-layer scales were measured on the first private batch (the paper's "
                   "choice): that information is not covered by epsilon.")
    out += subspace.not_covered()
    if training_statistics:
        out.append(TRAINING_STATISTICS_SENTENCE)
    if config.seed_fixed:
        out.append(f"The noise seed was fixed (seed={config.seed}): the noise is predictable, so "
                   "the run is not private.")
    return out
