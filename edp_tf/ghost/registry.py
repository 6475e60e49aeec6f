"""The public registry of ghost rules, and the context that activates them for one trace.

A rule re-implements a layer class's `call` exactly while recording, through the `Capture` it
receives, how the layer uses each covered weight:

    def my_dense_call(cap: Capture, layer, inputs, training=None):
        w = cap.weight(layer.kernel, "matmul")        # None when the variable is not trained
        kernel = cap.read(w, layer.kernel)            # the one read its gradient may come from
        rows, z = flat_matmul(cap, inputs, kernel)    # a [P, Din] rows, z [P, Dout]
        cap.add(w, Use("matmul", rows, z, lambda dz: dz))
        ...                                           # the rest of the forward pass, unchanged
    register(MyDense, my_dense_call)

Only instances whose class's `call` is the one registered get the rule (a subclass with its own
`call` keeps exact per-example gradients), and only for the trace inside `capture`: the layers'
`call` is patched per instance and restored afterwards.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Dict, Optional, Sequence

from edp_tf.ghost.recording import Capture

Rule = Callable[..., object]  # (capture, layer, *call_args, **call_kwargs) -> outputs

_active = threading.local()  # the capture of the trace running on this thread, if any
_patch_lock = threading.Lock()
_RULES: Dict[type, Rule] = {}
_ORIGINAL_CALLS: Dict[type, Callable] = {}
_APPLIES: Dict[type, Callable[[object], bool]] = {}


def register(layer_class: type, rule: Rule,
             applies: Optional[Callable[[object], bool]] = None) -> None:
    """Registers `rule` for instances of `layer_class` (and of subclasses that keep its `call`).

    `applies(layer)` can decline an instance whose configuration the rule does not re-implement
    (e.g. an LSTMCell implementation other than 2): that layer keeps exact gradients.
    """
    if not isinstance(layer_class, type) or not callable(getattr(layer_class, "call", None)):
        raise ValueError(f"register needs a layer class with a call method, got {layer_class!r}")
    if not callable(rule):
        raise ValueError(f"register needs a callable rule, got {rule!r}")
    _RULES[layer_class] = rule
    _ORIGINAL_CALLS[layer_class] = layer_class.call
    _APPLIES[layer_class] = applies or (lambda layer: True)


def unregister(layer_class: type) -> None:
    """Removes the rule of `layer_class` (its layers fall back to exact gradients)."""
    for table in (_RULES, _ORIGINAL_CALLS, _APPLIES):
        table.pop(layer_class, None)


def registered() -> tuple:
    """The layer classes that have a ghost rule."""
    return tuple(_RULES)


def original_call(layer_class: type) -> Callable:
    """The `call` the rule of `layer_class` re-implements (for rules that delegate a case)."""
    return _ORIGINAL_CALLS[layer_class]


def rule_for(layer) -> Optional[Rule]:
    """The rule for `layer` if its forward pass is exactly the one the rule re-implements."""
    for cls in type(layer).__mro__:
        if cls in _RULES:
            if type(layer).call is not _ORIGINAL_CALLS[cls]:
                return None  # a subclass with its own call
            break
    else:
        return None
    if getattr(layer, "quantization_mode", None):
        return None
    if getattr(layer, "_remat_mode", None):
        return None
    return _RULES[cls] if _APPLIES[cls](layer) else None


def flatten_layers(model) -> list:
    """Every layer of `model`, nested ones included (the model itself first)."""
    if hasattr(model, "_flatten_layers"):
        return model._flatten_layers(include_self=True, recursive=True)
    return [model]


@contextlib.contextmanager
def capture(model, variables: Sequence):
    """Within: covered layers of `model` record their uses of `variables` (this thread only)."""
    cap = Capture(variables)
    patched = []
    with _patch_lock:
        for layer in flatten_layers(model):
            hook = rule_for(layer)
            if hook is None or "call" in layer.__dict__:
                continue
            original = layer.call

            def call(*args, __layer=layer, __hook=hook, __original=original, **kwargs):
                current = getattr(_active, "capture", None)
                if current is None:
                    return __original(*args, **kwargs)
                return __hook(current, __layer, *args, **kwargs)

            object.__setattr__(layer, "call", call)
            patched.append(layer)
    previous = getattr(_active, "capture", None)
    _active.capture = cap
    first_op = len(cap.graph.get_operations())
    try:
        yield cap
    finally:
        _active.capture = previous
        with _patch_lock:
            for layer in patched:
                layer.__dict__.pop("call", None)
    cap.disqualify_outside_reads(cap.graph.get_operations()[first_op:])
