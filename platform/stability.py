"""``python -m platform.stability``: the Phase B acceptance check of the runbooks. The command line; the work is in ``platform.analysis.stability``."""

import sys

from platform.analysis.stability import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
