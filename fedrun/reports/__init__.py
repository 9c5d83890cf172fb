"""Results tables as plain Python: one module per paper reads the committed exports (results/*/runs/) with pandas and
gives its markdown, figures and README.md claims block; :mod:`fedrun.reports.common` holds what they share.

:data:`REPORTS`: every report by name → (the function giving its files from a repository root, its exports).
``python -m fedrun.report`` (:mod:`fedrun.report`) builds or checks them.
"""

from __future__ import annotations

from functools import partial

from fedrun.reports import deploy, fbftl, fedsketch, foundation, fu21, kerkouche21

K, F = kerkouche21, fedsketch
REPORTS = {
    "kerkouche21_table3": (K.table3, [K.T3]),
    "kerkouche21_model_size": (K.model_size, [K.SIZE, K.T3]),
    "kerkouche21_server_lr": (K.server_lr, [K.LR]),
    "kerkouche21_stopping": (K.stopping, [K.T3, K.SIZE]),
    "kerkouche21_audit": (K.audit, [K.AUDIT]),
    "fu21_lending_club": (fu21.lending_club, [fu21.LC]),
    "fu21_lending_club_paper_unchecked": (partial(fu21.lending_club, sensitivity="paper_unchecked"), [fu21.LC]),
    "fu21_femnist": (fu21.femnist, [fu21.FEMNIST]),
    "fedsketch": (F.figures, [F.HOM, F.HET]),
    "fedsketch_tune": (F.tuning, [F.TUNE]),
    "fedsketch_gate_diag": (F.gate_diagnostics, [F.GATE]),
    "fedsketch_sketchedsgd_heavy": (F.sketchedsgd_heavy, [F.HEAVY]),
    "fbftl": (fbftl.table, [fbftl.FM, fbftl.MF]),
    "fbftl_tuned": (fbftl.tuned, [fbftl.TUNED, fbftl.FM, fbftl.MF]),
    "foundation_fl_std": (foundation.fl_std, [foundation.EXPORT]),
    "deploy": (deploy.deploy, [deploy.K, deploy.F]),
}
