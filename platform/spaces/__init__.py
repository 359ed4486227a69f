"""What to run: the search-space schema and ``--set`` overrides, grid and case expansion with
run names, the input checks made before anything starts, and the runbooks' variables."""
