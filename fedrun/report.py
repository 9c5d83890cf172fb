"""``python -m fedrun.report``: the command line of :mod:`fedrun.reports` (its ``main``), kept at this name."""

import sys

from fedrun.export import mlflow_records  # noqa: F401 - its former place here; the MLflow reader is fedrun.export's
from fedrun.reports import default_root, main, refresh_exports, report_files, save  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
