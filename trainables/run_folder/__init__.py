"""What a worker keeps in its run's folder (``runs/<run>/``, named by
stage1_common/output_root.py), one module per concern:

- ``place``: where a run's files live: the folder every node mounts, or each node's scratch
  copy uploaded to the bucket of a root on object storage (its checkpoints too);
- ``run_files``: where a rank writes the folder, and what of it is published when;
- ``run_state``: where a run stands, and that position into and out of a checkpoint;
- ``worker_logs``: each rank's log files and their tails.

Nothing is re-exported here: import the module that owns a name.
"""

__all__: list[str] = []
