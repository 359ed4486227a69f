"""A trial's typed configuration, one module per concern:

- ``trial_config``: ``TrialConfig``, every key with its doc (the workload's keys first, then how
  the run runs), its conversions at the Ray boundary, the coercion of a value to its key, and
  ``global_batch`` (the batch three of its keys make);
- ``checks``: the checks ``TrialConfig.__post_init__`` runs (ranges, rules across keys, type
  matching), each a one-line ``ConfigError``;
- ``choices``: the values each enumerated key accepts (its ``Literal`` type).

The public names are re-exported here: ``from trainables.config import TrialConfig``.
"""

from trainables.config.trial_config import (
    MAX_TEXT_TOKENS,
    ConfigError,
    TrialConfig,
    check_known_key,
    coerce_value,
    field_doc,
    field_names,
    global_batch,
)

__all__ = [
    "ConfigError",
    "MAX_TEXT_TOKENS",
    "TrialConfig",
    "check_known_key",
    "coerce_value",
    "field_doc",
    "field_names",
    "global_batch",
]
