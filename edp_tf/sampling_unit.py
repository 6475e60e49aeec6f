"""`SamplingUnit`: what one sampled unit is, said once by the sampler and once by the step.

Why a value of its own: the sensitivity S = C holds only when the batches' unit (an example, a
user's rows, an example's augmented copies, a BandMF group's cycle) is exactly what one
micro-batch of the step clips. The sampler and the step are built apart (a user may bring their
own sampler's dataset), so each describes its unit as this value and the ledger compares the two
by value, field by field, before the first step; `sampling.for_unit` makes the sampler from the
step's unit, so the library's own pairing cannot differ.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

# What to do when a field differs: the sampler and DPConfig knobs that must agree.
_REMEDY = {
    "privacy_unit": "user-level privacy needs a UserPoissonSampler and DPConfig("
                    "privacy_unit='user'), example-level neither",
    "user_rows": "DPConfig.microbatch_size must be the sampler's rows per user, so that a "
                 "micro-batch is exactly one user",
    "copies": "DPConfig.augment_copies must be the AugmentedPoissonSampler's copies, so that a "
              "micro-batch is exactly one example's copies",
    "bands": "BandMF's accounting holds only for batches of an edp_tf.sampling.BandMFSampler "
             "with DPConfig.bandmf_bands, and a BandMFSampler's batches only for a BandMF step",
}


@dataclasses.dataclass(frozen=True)
class SamplingUnit:
    """privacy_unit: "example" or "user"; user_rows: a user's rows in one micro-batch (user
    level only); copies: K rows per example (augmentation multiplicity); bands: b (BandMF's
    group cycle; 1 for independent steps)."""

    privacy_unit: str = "example"
    user_rows: Optional[int] = None
    copies: int = 1
    bands: int = 1

    @classmethod
    def of_step(cls, privacy_unit: str, microbatch_size: Optional[int], copies: int = 1,
                bands: int = 1) -> "SamplingUnit":
        """The unit of a step with these DPConfig / Mechanism fields: at user level a
        micro-batch is one user's `microbatch_size` rows."""
        user = privacy_unit == "user"
        return cls(privacy_unit, microbatch_size if user else None, int(copies), int(bands))

    def refuse_other(self, sampler_unit: "SamplingUnit", sampler_name: str) -> None:
        """Raises ValueError naming every field where the sampler's unit (`sampler_unit`) is
        not this step's, with what must agree."""
        differ = [f.name for f in dataclasses.fields(self)
                  if getattr(self, f.name) != getattr(sampler_unit, f.name)]
        if differ:
            raise ValueError(
                f"the {sampler_name}'s batches are not the step's unit: "
                + "; ".join(f"{name} {getattr(sampler_unit, name)!r} in the sampler vs "
                            f"{getattr(self, name)!r} in the step ({_REMEDY[name]})"
                            for name in differ))
