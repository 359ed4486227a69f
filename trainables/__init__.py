"""Everything that runs inside Ray processes: the Tune trial function and the per-worker training
loop at the top, the rest in a folder per concern (config, data, model, observe, run_folder,
checkpoint, engine, resident). Nothing here imports ``platform`` (the driver package)."""

from trainables.config import ConfigError, TrialConfig

__all__ = ["ConfigError", "TrialConfig"]
