"""One verdict per incident (issue 38, item 2): which diagnosed incident is a new verdict, the
same one again, or a later, different verdict that replaces the one given.

In: each ``pipeline.Result`` a watcher (``watch/watcher.py``, ``hangtrace run``'s
``watch/supervise.py``) got for an incident, and whether that incident follows the one
before (``detector.Incident.follows``: no live process progressed since it). Out: a
:data:`Judgement` ("new", "same" or "revised") that tells the caller to give the verdict,
keep quiet (one line in the watcher log) or give it as replacing the one before.

Two verdicts are the same when their kind, cause, culprit ranks and paragraph agree once
what changes from one snapshot of the same incident to the next is masked
(:func:`verdict_key`): durations and ages, pids, paths, pipe and socket inodes, addresses,
timestamps. Pure but for :func:`drop_repeat`, which removes the snapshot folder of a verdict
found again (one snapshot per verdict).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from hangtrace.tracer.diagnosis import Diagnosis

#: what :meth:`VerdictBook.judge` says of a verdict
NEW, SAME, REVISED = "new", "same", "revised"

_MASKS = (
    (re.compile(r"\b(pid|pids|process) \d+"), r"\1 #"),
    (re.compile(r"(pipe|socket|anon_inode):\[\d+\]"), r"\1:[#]"),
    (re.compile(r"\bfd \d+"), "fd #"),
    (re.compile(r"0x[0-9a-fA-F]+"), "0x#"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d\b"), "<time>"),
    (re.compile(r"(?<![\w.])/[^\s,;:)'\"]+"), "<path>"),
    (re.compile(r"\b\d+(\.\d+)?\s?(ns|us|ms|s|min|h|seconds?|minutes?)\b"), "<dur>"),
)


def mask(text: str) -> str:
    """``text`` with what differs between snapshots of one incident masked (module docstring)."""
    for pat, rep in _MASKS:
        text = pat.sub(rep, text)
    return " ".join(text.split())


@dataclass(frozen=True)
class VerdictKey:
    """What makes two verdicts the same: ``kind`` and ``cause`` (``tracer/diagnosis.py``
    values), ``culprits`` (global ranks, sorted) and the masked ``summary``."""

    kind: str
    cause: str
    culprits: Tuple[int, ...]
    summary: str


def verdict_key(diag: Diagnosis, paragraph: Optional[str] = None) -> VerdictKey:
    """The :class:`VerdictKey` of ``diag`` (its ``paragraph`` when given, else its summary)."""
    return VerdictKey(
        str(diag.kind),
        str(diag.cause or ""),
        tuple(sorted(diag.culprit_ranks or ())),
        mask(paragraph if paragraph is not None else (diag.summary or "")),
    )


class VerdictBook:
    """The verdicts one watcher gave, one per incident (module docstring)."""

    def __init__(self) -> None:
        self.current: Optional[VerdictKey] = None
        #: the snapshot folder of the verdict in force ('' when it had none)
        self.snapshot: str = ""

    def judge(self, res: Any, follows: bool) -> str:
        """:data:`NEW` for the first verdict of an incident, :data:`SAME` when ``res`` (a
        ``pipeline.Result``) of an incident that ``follows`` the one before says what its
        verdict said, :data:`REVISED` when it says something else: it replaces it."""
        key = verdict_key(res.diagnosis, res.paragraph)
        before, self.current = self.current, key
        if not follows or before is None:
            self.snapshot = res.snapshot.path or ""
            return NEW
        if key == before:
            return SAME  # the verdict in force keeps its snapshot
        self.snapshot = res.snapshot.path or ""
        return REVISED


def drop_repeat(res: Any) -> bool:
    """Remove the snapshot folder of ``res`` (a ``pipeline.Result`` judged :data:`SAME`): the
    verdict in force keeps its own, and the incident keeps one snapshot per verdict. Only a
    folder of its run's ``snapshots/``; True when removed. Never raises."""
    path = res.snapshot.path or ""
    try:
        parent = os.path.realpath(os.path.join(res.snapshot.run_dir, "snapshots"))
        if not path or os.path.dirname(os.path.realpath(path)) != parent:
            return False
        shutil.rmtree(path)
        return True
    except (OSError, TypeError, AttributeError):
        return False
