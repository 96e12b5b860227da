"""The training stage of the pipeline.

``train`` (what the DAG calls: reuse, lineage, the run's request) -> ``launch`` (this process or
torchrun ranks) -> ``loop`` (the epochs, as phases around one ``TrainState``; with
``checkpoint``, ``tracking`` for MLflow and ``distributed`` for DDP). The data path:
``data_cache`` (decoded once per curated version) -> ``loader`` (this rank's batches) with
``augment`` and the ``device`` plan. ``request`` is what crosses into a training process;
``tune`` runs trials through the same loop.
"""
