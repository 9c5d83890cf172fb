"""Declarative result tables: a spec in ``conf/report/<table>.yaml`` + committed run data → markdown and figures.

* :mod:`fedrun.reports.spec`: the spec file → :class:`~fedrun.reports.spec.Spec` (validated; one-line
  :class:`~fedrun.reports.spec.SpecError` naming a bad value).
* :mod:`fedrun.reports.build`: records + spec → cells (aggregated over seeds), tables, claims (pure).
* :mod:`fedrun.reports.figure`: per-round curves → a figure whose bytes depend on the data only.

``python -m fedrun.report <table>`` (:func:`fedrun.report.main`) ties them to the exports
(:mod:`fedrun.export`).
"""
