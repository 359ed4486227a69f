"""``python -m platform.analyze OUTPUT_ROOT``: a sweep's tables, best config and summary. The command line; the work is in ``platform.analysis.analyze``."""

import sys

from platform.analysis.analyze import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
