"""The ops stage of the pipeline."""
