"""Everything that runs inside Ray processes: the Tune trial function, the per-worker training
loop, model, data and timing. Nothing here imports ``platform`` (the driver package)."""

from trainables.config import ConfigError, TrialConfig

__all__ = ["ConfigError", "TrialConfig"]
