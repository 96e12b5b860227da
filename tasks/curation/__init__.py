"""The curation stage of the pipeline."""
