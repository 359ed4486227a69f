"""Pure analysis of written results: run and group figures, ranking, stability and leak
verdicts, and the report page."""
