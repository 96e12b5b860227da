"""cd4ml's inference runtime: preprocessing, networks and the predictor every model carries a copy of.

Small on purpose (torch, numpy, Pillow; no import of ``tasks``, Airflow or MLflow outside
``pyfunc``): ``tasks.training.model.log_pyfunc_model`` copies these files into each model, and the model
runs its copy, so serving preprocesses exactly as training did, whatever the serving process
has imported. Imports inside the package are relative, so the copy works under any name.
"""

from .preprocess import ChannelStats, ImageDecodeError, PreprocessSpec, decode, decode_many, normalise

__all__ = ["ChannelStats", "ImageDecodeError", "PreprocessSpec", "decode", "decode_many", "normalise"]
