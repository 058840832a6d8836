"""Named datasets, one module each, registered in :data:`ziprl.registry.DATASETS` when first looked up.

A new dataset is one module here: register a :class:`ziprl.retrieval.datasets.DatasetSpec` (its questions, its
corpus or the name of the dataset whose corpus it shares, the shared-data files it reads) with
``DATASETS.register("name")(DatasetSpec(...))``; ``data.dataset=name``, ``demos.datasets`` and ``--dataset`` then
take it everywhere.
"""
