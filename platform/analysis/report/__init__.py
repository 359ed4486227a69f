"""report.html, one self-contained page per sweep (``python -m platform.report``): ``page``
assembles it (``write_report``, ``report_line``, ``SECTIONS``), a file per kind of section draws
it: ``sections`` (the tables and the sections across groups), ``plots`` (over steps and time),
``verdicts`` (performance cliffs, stability, memory leaks), on the building blocks of
``figures`` (HTML notes and tables, inlined PNGs, the folder's saved plots)."""
