"""Pure analysis of written results: run and group figures and the ranking (``stats``), the
sweep's tables and summary (``analyze``), its answer in words (``answer``), an interrupted
sweep's counts (``interrupted``), the platform's calibration against its references
(``calibration``); the verdicts (``verdicts/``: stability, leaks, performance cliffs) and the
report page (``report/``)."""
