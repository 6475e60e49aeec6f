"""The wrapper as the one object a Keras user keeps using: save, checkpoint, summary.

Why the wrapper delegates instead of becoming the user's model: Keras' `fit` runs the model
class's own `train_step`, so making the user's model private in place would change its class,
and every saved file would then need edp_tf to load. Delegating keeps the user's model untouched:
`save`, `save_weights` (so `ModelCheckpoint`, full or weights only, and `BackupAndRestore`),
`load_weights`, `export` and `summary` act on it, each file loads into the user's architecture
with Keras alone and holds no privacy machinery, and the wrapper has no config of its own. Each
saved path is told to the listeners (a ledger lists it among the covered artifacts).
"""
from __future__ import annotations

from edp_tf.untracked import Untracked

NO_CONFIG = (
    "a PrivateModel has no config of its own: private.save('model.keras') saves the model it "
    "trains (the same weights, no privacy machinery inside), which loads with Keras alone")

TRAIN_ON_BATCH_REFUSED = (
    "PrivateModel.train_on_batch is refused: its batch is not a Poisson sample and no ledger "
    "charges it; train with fit(sampler.dataset(x, y), steps_per_epoch=k) (make_private's "
    "fit(x, y) samples itself)")


class OneObject:
    """Mixin of PrivateModel: what is saved is `self.wrapped_model`."""

    def _init_one_object(self) -> None:
        self._saved = Untracked([])  # paths save / save_weights / export wrote
        self._after_save = Untracked([])

    def save(self, filepath, *args, **kwargs):
        """Saves the trained model (`wrapped_model`): epsilon covers it, and the ledger's
        headline counts every step before the save (an open epoch's too)."""
        result = self.wrapped_model.save(filepath, *args, **kwargs)
        self._note_saved(filepath)
        return result

    def save_weights(self, filepath, *args, **kwargs):
        """The trained model's weights (they load into the user's model)."""
        result = self.wrapped_model.save_weights(filepath, *args, **kwargs)
        self._note_saved(filepath)
        return result

    def load_weights(self, filepath, *args, **kwargs):
        return self.wrapped_model.load_weights(filepath, *args, **kwargs)

    def export(self, filepath, *args, **kwargs):
        """A SavedModel of the trained model, for serving."""
        result = self.wrapped_model.export(filepath, *args, **kwargs)
        self._note_saved(filepath)
        return result

    def summary(self, *args, **kwargs):
        return self.wrapped_model.summary(*args, **kwargs)

    def get_config(self):
        raise ValueError(NO_CONFIG)

    def train_on_batch(self, *args, **kwargs):
        """Refused: a batch the caller chose is no Poisson sample, and a step outside `fit`
        runs without the ledger's durable charge before it."""
        raise ValueError(TRAIN_ON_BATCH_REFUSED)

    @property
    def saved_files(self) -> tuple:
        """What `save`, `save_weights` and `export` wrote (a ledger lists them as covered)."""
        return tuple(self._saved.value)

    def add_after_save(self, listener) -> None:
        """Calls `listener()` after each `save`, `save_weights` or `export` (once per one)."""
        if listener not in self._after_save.value:
            self._after_save.value.append(listener)

    def _note_saved(self, filepath) -> None:
        if str(filepath) not in self._saved.value:
            self._saved.value.append(str(filepath))
        for listener in self._after_save.value:  # a ledger lists the file at once
            listener()
