"""``python -m platform.report OUTPUT_ROOT``: one self-contained report.html per sweep. The command line; the work is in ``platform.analysis.report``."""

import sys

from platform.analysis.report import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
