"""The private step's stages for one geometry, decided together before tracing.

Why one object: the clip plan, the noise mechanism, the normaliser and the post-processing chain
all read the same `Mechanism` (k, D, S, the noise std), so they are made from it in one place
and replaced together whenever the geometry changes (another batch size, frozen variables
joining). `PrivateModel.train_step` runs them in order (docs/design.md, section 2):
    1-2. `clip`            micro-batch gradients, scaled and clipped (edp_tf/microbatch.py)
    3.   `noise`           Gaussian, BandMF or sparse rows, each owning its state
    4.   `normaliser`      back to gradient space over the expected denominator D
    5.   `post_processing` functions of the release, in order (edp_tf/post_processing.py)
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from edp_tf import local_training, microbatch, noise_stage, post_processing, selection
from edp_tf.config import DPConfig
from edp_tf.mechanism import Mechanism


@dataclasses.dataclass(frozen=True)
class StepStages:
    """What one traced step runs; `mechanism` is what the ledger charges for it."""

    mechanism: Mechanism
    clip: microbatch.ClipPlan
    noise: object  # a noise_stage mechanism: add(clip, std) -> (noisy sums, selected rows)
    normaliser: object  # noise_stage.normaliser(mechanism)
    post_processing: tuple


def make(config: DPConfig, mechanism: Mechanism, model, variables: Sequence,
         scales: Sequence[float], method: str, generator, strategy, optimizer,
         projection: Optional[Callable] = None) -> StepStages:
    """The stages of `mechanism` for the `variables` the step trains now, with their scales
    alpha; `projection`: stage 5's public-subspace projection, when one is asked."""
    replicas = strategy.num_replicas_in_sync
    k = config.microbatch_rows  # an example's augmented copies are one micro-batch of K rows
    rows = selection.for_config(config, model, variables, mechanism.sensitivity, replicas)
    clip = microbatch.ClipPlan(
        k, mechanism.expected_examples_per_microbatch, tuple(scales), config.l2_norm_clip,
        method, config.physical_batch_size, local_training.for_config(config, k), rows,
        config.clipping == "per_layer")
    # a fresh noise stage each time: BandMF's history restarts with the groups' cycle
    noise = noise_stage.for_mechanism(mechanism, generator, variables, replicas, strategy, rows)
    return StepStages(mechanism, clip, noise, noise_stage.normaliser(mechanism), tuple(
        post_processing.chain(replicas, rows is not None, projection, optimizer)))
