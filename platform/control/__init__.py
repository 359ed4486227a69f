"""Who decides which runs go on: the race, ASHA after a warm-up, the planned and Optuna
searchers, the stoppers, and Phase A -> B promotion."""
