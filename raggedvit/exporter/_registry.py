"""One torchlib registry per process for torch.onnx.export(dynamo=True).

Every call of torch.onnx.export builds `ONNXRegistry.from_torchlib()` afresh: it resolves about a thousand torchlib
functions to torch overloads, a fixed cost of about 0.7 s per export on one CPU core whatever the model's size
(docs/decisions.md, "Export time"). The registry depends only on the opset and the installed torch / onnxscript, so
`reused_torchlib_registry()` builds it once and hands each export a copy: the export then registers raggedvit's
translations (its custom_translation_table) into the copy, never into the kept one.

This patches a private attribute of torch (`torch.onnx._internal.exporter._registration.ONNXRegistry`), inside the
context only and under a lock. Where the attribute is missing or shaped otherwise, the context does nothing and
exports build their registry as before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["registry_class", "reused_torchlib_registry"]

_LOCK = threading.RLock()
_KEPT: dict[Any, Any] = {}  # opset_version -> the registry from_torchlib built


def registry_class() -> type | None:
    """torch's ONNXRegistry class when it has the classmethod `from_torchlib` and the `functions` table this module
    copies, else None."""
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        return None
    cls = getattr(_registration, "ONNXRegistry", None)
    if cls is None or not isinstance(cls.__dict__.get("from_torchlib"), classmethod):
        return None
    return cls


def _copy(registry: Any) -> Any:
    """A registry equal to `registry` whose table (and each target's list of functions) is its own."""
    copy = type(registry).__new__(type(registry))
    copy.__dict__.update(registry.__dict__)
    copy.functions = {target: list(functions) for target, functions in registry.functions.items()}
    return copy


@contextlib.contextmanager
def reused_torchlib_registry() -> Iterator[None]:
    """Within the context, `ONNXRegistry.from_torchlib(opset_version)` builds the registry of an opset once per
    process and returns a copy of it on every call. Holds a lock for the whole context, so exports inside it run one
    at a time (they hold the GIL throughout anyway); the original classmethod is back on exit."""
    cls = registry_class()
    if cls is None:
        yield
        return
    with _LOCK:
        original = cls.__dict__["from_torchlib"]
        build = original.__func__

        def from_torchlib(klass: type, *args: Any, **kwargs: Any) -> Any:
            key = (klass, args, tuple(sorted(kwargs.items())))
            if key not in _KEPT:
                kept = build(klass, *args, **kwargs)
                if not isinstance(getattr(kept, "functions", None), dict):
                    return kept  # a registry shaped otherwise: not kept, not copied
                _KEPT[key] = kept
            return _copy(_KEPT[key])

        cls.from_torchlib = classmethod(from_torchlib)
        try:
            yield
        finally:
            cls.from_torchlib = original
