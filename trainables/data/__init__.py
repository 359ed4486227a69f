"""A run's data path, one module per concern:

- ``loader``: the datasets (synthetic, and the manifest's through ``manifest``), the samplers
  (length buckets, shape buckets, over every epoch) and the run's ``DataLoader``;
- ``manifest``: ``ManifestDataset`` (utterances of a data_prep manifest, cropped as they are
  read) and ``collate_padded``;
- ``manifest_table``: a manifest as a pyarrow table, its missing files, its held-out speakers;
- ``crops``: a run's crop settings and every item's crop, and the full global batches of an
  epoch;
- ``durations``: batching duration's bins, each epoch's rank-batches within the budget, its
  steps and shapes;
- ``text``: the tokenizer of the transcripts.

``manifest_table``, ``crops``, ``durations`` and ``text`` import no torch: the driver reads manifests and checks
batches with them. So nothing is re-exported here: import the module that owns a name.
"""

__all__: list[str] = []
