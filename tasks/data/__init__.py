"""The data stage of the pipeline."""
