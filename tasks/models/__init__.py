"""The shared model layer: the MLflow registry, who is champion, loading a logged model."""
