"""Who decides which runs go on, the way Ray Tune splits schedulers, search and stoppers:
``race`` (the sweep's ``schedule.json`` and the noise-aware race), ``asha`` (ASHA after a
warm-up), ``searchers`` (the planned and Optuna searchers), ``stoppers`` (``run_timeout_s`` and
the race's stops) and ``promote`` (Phase A -> B promotion)."""
