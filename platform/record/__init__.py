"""What is written and printed while a sweep runs: the recorder, the run manifest, console
progress, the experiment loggers, failure tails and the Grafana board."""
