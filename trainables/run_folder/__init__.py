"""What a worker keeps in its run's folder (``runs/<run>/``, named by
stage1_common/output_root.py), one module per concern:

- ``run_files``: where a rank writes the folder, and its upload to an output root on object
  storage;
- ``run_state``: where a run stands, and that position into and out of a checkpoint;
- ``worker_logs``: each rank's log files and their tails.

Nothing is re-exported here: import the module that owns a name.
"""

__all__: list[str] = []
