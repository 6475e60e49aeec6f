"""What a PrivateModel tells its ledger beyond the mechanism (`describe`), and the sentences on
what epsilon does not cover in this run, one rule per feature that moves something outside the
proof.

Why in one place: the ledger checks these facts against its sampler and plan, writes them into
privacy.json and sets `private` from the sentences; a new feature that releases something
epsilon does not count adds its sentence here (or in its own stage's `not_covered`).
"""
from __future__ import annotations

from typing import Sequence

from edp_tf import padding

TRAINING_STATISTICS_SENTENCE = (
    "fit showed the training loss, compiled metrics and clipping statistics (clipped_fraction, "
    "preclip_norm, nonfinite_microbatches) of every step (PrivateModel(training_statistics="
    "True)): they are computed on the private batches without noise and are not covered by "
    "epsilon (progress bar, History, TensorBoard, callbacks).")


def not_covered(plan, public_layers: Sequence[str], config, subspace,
                training_statistics: bool, cuts_padding: bool = False) -> list:
    """The sentences, in the order a reviewer reads them."""
    out = list(plan.not_covered) if plan is not None else []
    if cuts_padding:
        out.append(padding.TIMING_SENTENCE)
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


def describe(mechanism, config, clip_plan, variables: Sequence, *, frozen_until_epoch: int,
             subspace, layer_scales: Sequence[float], plan, public_layers: Sequence[str],
             training_statistics: bool, extra_events: Sequence, batch_source,
             validation_data: bool, cuts_padding: bool = False) -> dict:
    """The facts of a PrivateModel's step: its mechanism's, then what its features add."""
    sparse = None if clip_plan.selection is None else {
        "selection_clip": config.selection_clip,
        "selection_threshold": config.selection_threshold,
        "tables": [getattr(variables[i], "path", variables[i].name)
                   for i in clip_plan.selection.indices]}
    return mechanism.to_dict() | {
        "sparse_embeddings": sparse,  # informational: epsilon depends on z_c only
        "clipping": config.clipping,  # informational: flat or per layer, S is the same
        "local_epochs": config.local_epochs,  # DP-FedAvg's local epochs (0: DP-FedSGD)
        # freeze_until: until this epoch some variables got no signal and no noise
        "frozen_until_epoch": frozen_until_epoch,
        "public_subspace": subspace.facts(),
        "scaling": config.scaling,
        "layer_scales": list(layer_scales),
        "seed_fixed": config.seed_fixed,
        "secure_noise": config.secure_noise,  # informational: the same distribution
        "not_covered": not_covered(plan, public_layers, config, subspace, training_statistics,
                                   cuts_padding),
        # the model's own queries, then the plan's releases made before the first step
        "extra_events": [dict(e) for e in extra_events] + [
            e.to_dict() for e in (plan.releases if plan is not None else ())],
        # where the last fit's batches came from: the ledger checks it against its sampler
        "batch_source": batch_source.to_dict() if batch_source is not None else None,
        "validation_data": validation_data,
        "training_statistics": training_statistics,
        # what the plan's epsilon (and a target's calibration) assumed: the ledger checks it
        "plan": None if plan is None else {
            "dataset_size": plan.dataset_size, "sampling_rate": plan.sampling_rate,
            "delta": plan.delta},
    }
