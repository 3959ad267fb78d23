"""A rank helper's death waits a few seconds for its rank to notice it (the watcher's clock).

A DataLoader worker that dies (the kernel's OOM killer, a SIGKILL, a segfault in a native
decoder) is noticed by its rank within torch's status check interval
(``MP_STATUS_CHECK_INTERVAL`` = 5 s, torch/utils/data/_utils/__init__.py): the rank raises
"DataLoader worker (pid N) is killed by signal: ...". A snapshot taken at the worker's death
finds the rank still polling its workers, and its verdict ("waits for its child process")
is not the one the rank's exception gives seconds later; the run then shows two verdicts
for one incident (blind corpus job tr_dl_oom under load, 2026-12-04: the first verdict
called rank 1 stuck waiting for a child, the second dead of the worker's OOM kill).

So deaths that are all helpers of live ranks (children of a process that joined a group,
``headers.is_rank``) are held for up to :data:`HELPER_GRACE_S`; any other death in that
time (the rank's own, usually), or the end of the grace, reports them all together.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

from hangtrace.tracer.collect.ringprocs import live_state
from hangtrace.tracer.watch.headers import Header, is_rank
from hangtrace.tracer.watch.notes import Death

#: seconds a helper-only death is held (torch's MP_STATUS_CHECK_INTERVAL, 5 s, and a poll)
HELPER_GRACE_S = 6.0


def _helper_of_live_rank(h: Header, parents: Mapping[Tuple[Any, Any], Header]) -> bool:
    parent = parents.get((h.get("host"), h.get("ppid")))
    return parent is not None and is_rank(parent) and not is_rank(h) and live_state(parent) == "alive"


class HelperGrace:
    """Holds helper-only deaths (module docstring). ``held``: the deaths held so far;
    ``until``: when the grace of the first of them ends (watcher clock, s)."""

    def __init__(self) -> None:
        self.held: List[Death] = []
        self.until = 0.0

    def deaths(self, new: List[Death], headers: Mapping[str, Header], now: float) -> List[Death]:
        """The deaths to report at this poll: the held ones and ``new`` (this poll's), or []
        while every death so far is a helper of a live rank and the grace runs (``now``:
        the watcher's clock, s; ``headers``: this poll's, by ring path)."""
        parents: Dict[Tuple[Any, Any], Header] = {(x.get("host"), x.get("pid")): x for x in headers.values()}
        if new and all(_helper_of_live_rank(h, parents) for _path, h, _st in new):
            if not self.held:
                self.until = now + HELPER_GRACE_S
            self.held.extend(new)
            return []
        if new or (self.held and now >= self.until):
            out, self.held = self.held + new, []
            return out
        return []
