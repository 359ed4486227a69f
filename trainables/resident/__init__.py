"""Resident worker groups: a sweep's runs trained in Ray Train workers kept alive across runs,
and the protocol between the group pool and the trials that submit runs to it.

One module per part: ``shape`` (a group's resources: ``GroupKey``, ``GroupShape``,
``group_cpus``), ``messages`` (the protocol: the pool's states of groups and runs, what a poll
returns, what a rank is given), ``pool`` (the sweep's ``GroupPool`` actor and each group's
``GroupHost``), ``serve`` (a group's ``TorchTrainer`` and train function) and ``relay`` (a
trial's side: submit, relay windows to Tune, cancel). Nothing here imports the trial function
(trainables/trial.py imports this package, never the reverse) or ``platform``.

Import the modules themselves: ``pool`` and ``serve`` bring Ray and torch, which the driver's
imports of ``shape`` must not pay for.
"""

__all__: list[str] = []
