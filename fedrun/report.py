"""``python -m fedrun.report``: the command line of :mod:`fedrun.reports` (its ``main``), kept at this name."""

import sys

from fedrun.reports import main, report_files  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
