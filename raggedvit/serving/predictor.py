"""An export run on batches of request images: what one Serve replica holds (no Ray here).

    p = Predictor("deit_tiny.onnx", ServeOptions(device="cpu"))
    x = p.prepare(body, "image/jpeg")            # [3, S, S] float32: decoded, the export's timm eval transform
    answers = p.predict(np.stack([x, ...]))      # one Answer per image: top-5, token counts, model name

The preprocessing is the export's recipe: timm's eval transform of the recipe's model at its image size
(raggedvit.images.eval_transform), the one `validate` and `bench` use. The session is validate's
(raggedvit.validators.session.open_session: the op library registered, an unloadable library an OpLibraryMissing
naming its path). On CUDA a static-shape export runs as CUDA graphs (raggedvit.runtime.GraphRunner), one per
captured batch size: a batch of n runs at the smallest captured size >= n, its other rows zeros, their answers
dropped (images are independent sequences of the ragged layout, so padding changes no answer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from raggedvit.serving.decode import decode_request
from raggedvit.serving.options import ServeInputError, ServeOptions

__all__ = ["Answer", "Predictor", "answer", "top5"]

TOP_K = 5


class Answer(TypedDict):
    """The JSON body of a /predict answer."""

    top5: list[list[int | float]]  # [[class index, probability], ...], most probable first
    token_counts: list[int]  # tokens kept at each pruning stage (none for policy "none")
    model: str


def top5(logits: np.ndarray) -> list[list[int | float]]:
    """logits [classes] -> the TOP_K most probable classes as [[index, probability], ...] (softmax in float64),
    most probable first, ties by index. ValueError for non-finite logits."""
    z = np.asarray(logits, dtype=np.float64)
    if not np.all(np.isfinite(z)):
        raise ValueError(f"the model gave non-finite logits ({int(np.sum(~np.isfinite(z)))} of {z.size})")
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")[:TOP_K]
    return [[int(i), float(p[i])] for i in order]


def answer(logits: np.ndarray, token_counts: np.ndarray, model: str) -> Answer:
    """One image's Answer from its logits [classes] and token counts [stages]."""
    return {"top5": top5(logits), "token_counts": [int(c) for c in token_counts], "model": model}


class Predictor:
    """One export's sessions, preprocessing and answers (see the module docstring).

    ServeInputError / ValidationInputError for a file that is not a classifier export, OpLibraryMissing when the op
    library cannot be loaded (its path in the message)."""

    def __init__(self, onnx_path: str | Path, options: ServeOptions | None = None) -> None:
        from raggedvit.exporter.checks import recipe_static_shapes
        from raggedvit.images import eval_transform, meta_model
        from raggedvit.validators.reference import load_recipe
        from raggedvit.validators.session import open_session

        path = Path(onnx_path)
        self.options = options or ServeOptions()
        self.name = self.options.name or path.stem
        recipe = load_recipe(path)
        self.session = open_session(path, self.options.device, recipe=recipe, intra_op_threads=self.options.threads)
        outputs = [o.name for o in self.session.get_outputs()]
        if "logits" not in outputs:
            raise ServeInputError(f"{path.name} outputs {', '.join(outputs)}: serving needs a classifier's logits")
        self.outputs = ["logits", *(["token_counts"] if "token_counts" in outputs else [])]
        image_input = self.session.get_inputs()[0]
        if isinstance(image_input.shape[0], int):
            raise ServeInputError(f"{path.name} has a fixed batch size {image_input.shape[0]}: export it again")
        self.input_name = image_input.name
        self.size = int(recipe["img_size"])
        self.transform = eval_transform(meta_model(str(recipe["model"]), self.size))
        self.runners: dict[int, Any] = {}
        if self.options.device == "cuda" and recipe_static_shapes(recipe):
            from raggedvit.runtime import GraphRunner

            self.runners = {b: GraphRunner(path, b) for b in self.options.batch_sizes}

    def prepare(self, body: bytes, content_type: str | None) -> np.ndarray:
        """A request body -> the model input [3, S, S] float32; RequestError (4xx) for a body that is no image."""
        image = decode_request(body, content_type)
        return self.transform(image).numpy().astype(np.float32, copy=False)

    def run(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """images [B, 3, S, S] float32 -> (logits [B, classes] float32, token_counts [B, stages] int64)."""
        n = images.shape[0]
        if tuple(images.shape[1:]) != (3, self.size, self.size):
            raise ValueError(f"images: expected [B, 3, {self.size}, {self.size}], got {list(images.shape)}")
        if self.runners:
            return self._run_graph(images)
        outs = self.session.run(self.outputs, {self.input_name: np.ascontiguousarray(images, dtype=np.float32)})
        counts = outs[1] if len(outs) > 1 else np.zeros((n, 0), np.int64)
        return outs[0], counts

    def _run_graph(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch

        n = images.shape[0]
        fits = [b for b in self.runners if b >= n]
        if not fits:
            raise ValueError(f"a batch of {n} is over the largest captured batch size {max(self.runners)}")
        size = min(fits)
        padded = np.zeros((size, *images.shape[1:]), np.float32)
        padded[:n] = images
        logits, counts = self.runners[size](torch.from_numpy(padded))
        return logits[:n].cpu().numpy(), counts[:n].cpu().numpy()

    def predict(self, images: np.ndarray) -> list[Answer | ValueError]:
        """images [B, 3, S, S] float32 -> an Answer per image, or the ValueError of an image whose logits are not
        finite (the others still answered)."""
        logits, counts = self.run(images)
        out: list[Answer | ValueError] = []
        for lg, tc in zip(logits, counts):
            try:
                out.append(answer(lg, tc, self.name))
            except ValueError as e:
                out.append(e)
        return out
