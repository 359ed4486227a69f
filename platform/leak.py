"""``python -m platform.leak PATH ...``: does memory grow with steps? The command line; the work is in ``platform.analysis.leak``."""

import sys

from platform.analysis.leak import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
