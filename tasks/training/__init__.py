"""The training stage of the pipeline."""
