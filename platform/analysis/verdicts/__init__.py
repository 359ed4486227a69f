"""A run's and a group's verdicts beyond ok or failed, each judged by one module that the
command, the summary and the report all call: ``stability`` (the Phase B check, ``python -m
platform.stability``), ``leak`` (memory growth per step, ``python -m platform.leak``), ``cliffs``
(the performance cliffs torch's compiler reports), and ``limits`` (the ``limits: --flag value``
line both checks print and the report reads back)."""
