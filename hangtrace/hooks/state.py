"""This process's tracing state shared by the activation and the instrumentors: the active
``Runtime`` (``bootstrap.Runtime``, or None when tracing is off), and the run id format.

In: ``set_active(runtime)`` from ``hooks/bootstrap.py`` (at activation, and None when a forked
child's ring could not be created). Out: ``active()`` for every hook that records outside
its instrumentor's entry points (the environment record, tools and tests), so that nothing
imports ``bootstrap`` but the ``.pth`` line. Standard library only; imported in every
traced process.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    from hangtrace.hooks.bootstrap import Runtime

_active: Optional["Runtime"] = None  # the Runtime of this process, or None


def active() -> Optional["Runtime"]:
    """The Runtime of this process, or None when tracing is off."""
    return _active


def set_active(runtime: Optional["Runtime"]) -> None:
    """Make ``runtime`` this process's Runtime (None: tracing off). Called by bootstrap only."""
    global _active
    _active = runtime


def default_run_id() -> str:
    """``<UTC yyyymmdd-HHMMSS>-<pid>``: the run id when HANGTRACE_RUN_ID is not set."""
    return "%s-%d" % (time.strftime("%Y%m%d-%H%M%S", time.gmtime()), os.getpid())


_OPTS_WITH_ARG = ("-W", "-X", "-Q")  # interpreter options that take the next word


def is_own_cli(orig_argv: "tuple[str, ...] | list[str]") -> bool:
    """True when this interpreter runs hangtrace's own command line (``hangtrace ...``, the
    console script, or ``python -m hangtrace ...``): the CLI of a shell that exported
    ``HANGTRACE=1`` is a tool looking at the run, not a process of the job, so it records
    nothing (issue 38). ``orig_argv``: ``sys.orig_argv`` (Python 3.10+; the interpreter's
    own argv, set before the ``.pth`` line runs, while ``sys.argv`` still says ``-m``)."""
    words = list(orig_argv[1:])
    i = 0
    while i < len(words):
        w = words[i]
        if w == "-m" or (w.startswith("-m") and len(w) > 2):
            mod = words[i + 1] if w == "-m" and i + 1 < len(words) else w[2:]
            return mod in ("hangtrace", "hangtrace.cli")
        if w in ("-c", "-") or not w.startswith("-"):
            return w not in ("-c", "-") and os.path.basename(w) == "hangtrace"
        i += 2 if w in _OPTS_WITH_ARG else 1
    return False
