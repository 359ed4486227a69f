"""``python -m platform.grafana [--out FILE]``: the Grafana dashboard of the ray_stage1_* gauges. The command line; the work is in ``platform.record.grafana``."""

import sys

from platform.record.grafana import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
