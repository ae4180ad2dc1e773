"""raggedvit.exporter._registry: the torchlib registry is built once per process and each export gets its own copy;
exports with the reused registry are byte-identical to exports that build their own."""

from __future__ import annotations

import contextlib

import onnx_ir as ir

import raggedvit.exporter.export as export_module
from raggedvit.exporter._registry import registry_class, reused_torchlib_registry
from raggedvit.pruning import PruneSpec
from raggedvit.weights import load_vit


def test_the_supported_torch_has_the_registry_it_patches():
    # inside the supported torch range the reuse is active; a torch that reshaped the class would fail here
    cls = registry_class()
    assert cls is not None
    assert isinstance(cls.from_torchlib(), cls)


def test_each_call_gets_its_own_copy_and_the_classmethod_is_restored():
    cls = registry_class()
    original = cls.__dict__["from_torchlib"]
    with reused_torchlib_registry():
        first, second = cls.from_torchlib(), cls().from_torchlib()  # torch calls it on an instance
        assert first is not second and first.functions is not second.functions
        assert first.functions.keys() == second.functions.keys() and len(first.functions) > 500
        target = next(iter(first.functions))
        first.functions[target].insert(0, "a custom translation")  # what register_op does to a copy
        first.functions["raggedvit::only_here"] = []
        third = cls.from_torchlib()
        assert third.functions[target] == second.functions[target] != first.functions[target]
        assert "raggedvit::only_here" not in third.functions
        assert first.opset_version == third.opset_version
    assert cls.__dict__["from_torchlib"] is original
    with contextlib.suppress(RuntimeError), reused_torchlib_registry():
        raise RuntimeError("an export that fails")
    assert cls.__dict__["from_torchlib"] is original


def test_exports_with_the_reused_registry_equal_fresh_ones(monkeypatch):
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 2, "img_size": 64})
    spec = PruneSpec(policy="topk-l2", prune_at=(1,), keep=0.5)

    def serialized() -> bytes:
        return ir.serde.serialize_model(export_module.build_model(vit, spec, dtype="fp16")).SerializeToString()

    reused = [serialized(), serialized()]
    monkeypatch.setattr(export_module, "reused_torchlib_registry", contextlib.nullcontext)
    assert reused[0] == reused[1] == serialized()
