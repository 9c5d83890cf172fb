"""The code a run was made from: the commit, whether the working tree had uncommitted changes, the diff against the
commit (untracked files included, :func:`fedrun.tracking.git_state`), and one hash that names both.

:func:`source` reads it; :func:`log_source` puts it on a tracked run: the tag ``fedrun.source_hash`` (with
``git_commit`` and ``git_dirty``) and, for a dirty tree, the diff as the artifact ``source.diff``. Checking a run's
code out again is ``git checkout <commit> && git apply source.diff``; :func:`source_hash` of the two must give the
tag back.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

TAG = "fedrun.source_hash"
ARTIFACT = "source.diff"


class Source(NamedTuple):
    commit: str     # the checked-out commit ("unknown" outside a git checkout)
    dirty: bool     # uncommitted changes to tracked files, or untracked files git does not ignore
    diff: str       # git diff HEAD plus each such untracked file as a new-file diff ("" when clean)
    hash: str       # source_hash(commit, diff)


def source_hash(commit: str, diff: str) -> str:
    """sha256 of the commit and the diff: the same code gives the same hash, any change to either another one."""
    return hashlib.sha256(f"{commit}\n{diff}".encode("utf-8")).hexdigest()


def source(path: Path | None = None, state: tuple[str, bool, str] | None = None) -> Source:
    """The source of the checkout at ``path`` (default: fedrun's own), or of a ``(commit, dirty, diff)`` already read
    by :func:`fedrun.tracking.git_state`."""
    from fedrun.tracking import git_state

    commit, dirty, diff = state if state is not None else git_state(path)
    return Source(commit, dirty, diff, source_hash(commit, diff))


def log_source(tracker, out_dir: Path, state: tuple[str, bool, str] | Source | None = None) -> Source:
    """Tag the tracker's current run with its source (``fedrun.source_hash``, ``git_commit``, ``git_dirty``) and,
    for a dirty tree, write the diff to ``out_dir/source.diff`` and log it as an artifact. ``tracker``: a fedrun
    tracker (:class:`fedrun.tracking.MlflowTracker`, or anything with ``set_tags`` and ``log_artifact``)."""
    src = state if isinstance(state, Source) else source(state=state)
    tracker.set_tags({TAG: src.hash, "git_commit": src.commit + ("+dirty" if src.dirty else ""),
                      "git_dirty": str(src.dirty).lower()})
    if src.dirty:
        path = Path(out_dir) / ARTIFACT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src.diff)
        tracker.log_artifact(path)
    return src
