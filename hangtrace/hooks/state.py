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
