"""What to run: the search-space schema and ``--set`` overrides, grid and case expansion with
run names, the input checks made before anything starts, and the runbooks' variables.

``space`` (SearchSpace, --set, YAML) and ``plans`` (data, scheduler, search) hold the schema;
``load`` reads and checks space files; ``expand`` turns a space into RunSpecs, named by
``names``; ``preflight`` checks the inputs; ``describe`` writes the dry run's plan; ``keys``
lists the config keys by family (``--keys``); ``runbook`` maps the runbooks' variables to --set;
``_validate`` holds the small checks the others share."""
