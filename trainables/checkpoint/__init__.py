"""A training run's checkpoints, one module per concern:

- ``files``: what a checkpoint folder holds, when it is complete, the resume scan, the model and
  optimizer state as torch.distributed.checkpoint sees it and its loading;
- ``state``: writing that state (``CheckpointWriter``: DCP, asynchronous by default; DeepSpeed);
- ``asynchronous``: which save a strategy gets and the stager of ``dcp.async_save``;
- ``in_bucket``: a run's checkpoints in the bucket of an output root on object storage (read by
  ``InBucket``, trainables/run_folder/place.py);
- ``delayed_writer``: a fault for tests, a writer that waits before writing.

The folders' and files' names are stage1_common/output_root.py's (``RunFolder``,
``CheckpointFolder``). Nothing is re-exported here: import the module that owns a name.
"""
