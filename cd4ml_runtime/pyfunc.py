"""The MLflow pyfunc of a cd4ml model: a loader that runs the runtime copied into the model.

``log_pyfunc_model`` (tasks.training.model) pickles this class by value, so unpickling imports nothing of
the project, and stores a copy of this package as the artifact ``runtime``. ``load_context``
imports that copy under a private module name derived from its contents
(``_cd4ml_runtime_<sha256>``): a model registered months ago runs the preprocessing and network
code it was trained with, in a fresh process and in one that has already imported today's
project (a gate, a scorer), and it never puts anything on ``sys.path``.

Bad input (bytes that are not an image, base64 of text, a frame without an ``image`` column) is
an ``MlflowException`` with ``INVALID_PARAMETER_VALUE``: MLflow's scoring server (``cd4ml serve``)
answers it with HTTP 400 and the message, which names the failing position (``image 2: ...``);
the runtime's ``ImageDecodeError`` stays attached as ``__cause__`` for in-process callers.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException

RUNTIME_ARTIFACT = "runtime"
META_ARTIFACT = "model_meta"
WEIGHTS_ARTIFACT = "state_dict"


def load_bundled_runtime(folder: str | Path) -> Any:
    """Import the runtime package copied into a model, under a name of its own; returns its ``predictor``."""
    root = Path(folder)
    digest = hashlib.sha256()
    for path in sorted(root.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    name = f"_cd4ml_runtime_{digest.hexdigest()[:16]}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, root / "__init__.py", submodule_search_locations=[str(root)])
        if spec is None or spec.loader is None:
            raise ImportError(f"no runtime package in {root}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    return importlib.import_module(f"{name}.predictor")


class CD4MLImageClassifier(mlflow.pyfunc.PythonModel):
    """Raw image bytes in (column ``image``), ``label`` and ``confidence`` out."""

    def load_context(self, context: Any) -> None:
        predictor = load_bundled_runtime(context.artifacts[RUNTIME_ARTIFACT])
        self.predictor = predictor.Predictor.from_files(context.artifacts[META_ARTIFACT], context.artifacts[WEIGHTS_ARTIFACT])
        self.decode_error = predictor.ImageDecodeError  # the bundled runtime's class, not the project's

    def predict(self, context, model_input, params=None):  # no type hints: MLflow would validate inputs by them
        columns = getattr(model_input, "columns", None)
        if columns is None or "image" not in columns:
            raise MlflowException.invalid_parameter_value(
                "input must be a DataFrame with a column 'image' of PNG/JPEG bytes (base64 in JSON); "
                f"got {'columns ' + str(list(columns)) if columns is not None else type(model_input).__name__}"
            )
        try:
            return self.predictor.predict_frame(model_input)
        except self.decode_error as exc:  # names the position: "image 2: not a decodable image: ..."
            raise MlflowException.invalid_parameter_value(str(exc)) from exc
