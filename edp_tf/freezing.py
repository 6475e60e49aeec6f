"""`freeze_until`: which trainable variables the step trains now, a selector of variables.

DP linear probing then fine-tuning (Ke et al. 2024): fresh heads learn before they drive the
backbone's updates. The frozen variables get no gradient, no clipped signal and no noise (their
update is exactly zero), so each step stays the same Gaussian mechanism, sensitivity C over what
trains, and the accounting is unchanged. Decided by epoch, so a resumed `fit(initial_epoch=...)`
freezes exactly when the uninterrupted run would.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


class Freeze:
    """The variables frozen until `epoch`; `active` while they are."""

    def __init__(self, epoch: int, variables: Sequence):
        self.epoch = int(epoch)
        self.variables = tuple(variables)
        self.active = False

    @classmethod
    def nothing(cls) -> "Freeze":
        """Every trainable variable trains from the start."""
        return cls(0, ())

    @property
    def planned(self) -> bool:
        """Some variables wait for a later epoch."""
        return self.epoch > 0

    @classmethod
    def checked(cls, epoch, variables: Sequence, trainable: Sequence) -> "Freeze":
        """A Freeze of `variables` (among `trainable`) until `epoch` (nothing for epoch 0 or no
        variable); ValueError for what no step could run."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"freeze_until: epoch must be an integer >= 0, got {epoch!r}")
        known = {id(v) for v in trainable}
        variables = list(variables)
        for v in variables:
            if id(v) not in known:
                raise ValueError(f"freeze_until: {getattr(v, 'path', v)} is not a trainable "
                                 "variable of the wrapped model")
        if epoch and len({id(v) for v in variables}) >= len(trainable):
            raise ValueError("freeze_until would freeze every trainable variable: nothing "
                             "would train in the first epochs")
        return cls(epoch, variables) if epoch and variables else cls.nothing()

    def start(self, initial_epoch: int) -> None:
        """At a fit's start: frozen if it starts before the freeze's end."""
        self.active = int(initial_epoch or 0) < self.epoch

    def joins(self, epoch: int) -> bool:
        """True once, at the first epoch the frozen variables train (the step is re-planned)."""
        if self.active and epoch >= self.epoch:
            self.active = False
            return True
        return False

    def build_optimizer(self, optimizer, trainable: Sequence, strategy) -> None:
        """One optimizer throughout, built with every trainable variable before the step is
        traced: variables that join later need their slots (an optimizer builds them once),
        and the weights' seal watches the slots from the first step (edp_tf/weight_seal.py)."""
        if not optimizer.built:
            with strategy.scope():
                optimizer.build(trainable)

    def trained_indices(self, trainable: Sequence) -> list:
        """Indices into `trainable` of the variables the step trains now."""
        if not self.active:
            return list(range(len(trainable)))
        frozen = {id(v) for v in self.variables}
        return [i for i, v in enumerate(trainable) if id(v) not in frozen]
