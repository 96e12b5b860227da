"""The release stage of the pipeline."""
