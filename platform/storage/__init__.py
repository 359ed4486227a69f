"""The output root: its files' names and schemas, atomic writes and the readers of what was
written."""
