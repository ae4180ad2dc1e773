"""The recipe in the metadata: written and read back; a recipe that is not a JSON object is reported as malformed."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from raggedvit.exporter.metadata import RECIPE_KEY, read_recipe, write_recipe
from raggedvit.validators import ValidationInputError
from raggedvit.validators.reference import load_recipe


def _model(recipe_text: str | None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["images"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])  # fmt: skip
    model = helper.make_model(graph)
    if recipe_text is not None:
        entry = model.metadata_props.add()
        entry.key, entry.value = RECIPE_KEY, recipe_text
    return model


def test_the_recipe_round_trips():
    model = _model(None)
    write_recipe(model, {"model": "deit", "dtype": "fp16"})
    assert read_recipe(model) == {"model": "deit", "dtype": "fp16"}
    with pytest.raises(KeyError, match="not exported by raggedvit"):
        read_recipe(_model(None))


@pytest.mark.parametrize(
    ("text", "why"),
    [("{'model': 1}", "not JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
     ('{"model": ', "not JSON: Expecting value at line 1 column 11"),
     ("[1, 2]", "a JSON list, not an object")],
)  # fmt: skip
def test_a_malformed_recipe_says_so_and_what_to_do(tmp_path, text, why):
    with pytest.raises(ValueError, match="export it again") as info:
        read_recipe(_model(text))
    assert f"its 'raggedvit.recipe' metadata is malformed ({why})" in str(info.value)
    onnx.save(_model(text), tmp_path / "m.onnx")
    with pytest.raises(ValidationInputError, match=r"^m\.onnx: its 'raggedvit\.recipe' metadata is malformed"):
        load_recipe(tmp_path / "m.onnx")
