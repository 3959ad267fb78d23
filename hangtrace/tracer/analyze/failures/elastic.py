"""torchelastic's error files as a rank's cause of death (issue 9, item 2; pure).

The ``elastic_error`` events (``hooks/process/elastic_errors.py``; docs/FORMAT.md) are the
launcher's own record of a worker's failure: written by the worker's ``@record``-decorated
main (``seen_by='worker'``), or by a child of it that inherited its
``TORCHELASTIC_ERROR_FILE``, or read by the torchrun agent from a failed worker's file
(``seen_by='agent'``, with the worker's ``pid``). ``deaths.fill_death`` uses the earliest
one of a rank's process where our own records of that process hold no exception (it died
before our hook could record, a child of the rank raised, an untraced child wrote the
file), and says where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

#: Words the cause text ends with when it came from an error file.
FROM_FILE = "read from torchelastic's error file"


@dataclass(frozen=True)
class ElasticError:
    """One error file's content as recorded. ``wall_ns``: when it was recorded (ns since
    the epoch); ``timestamp_s``: the file's own (s); ``recorded_by``: the process key
    (``host:pid``) whose ring holds the event; ``pid``: the worker the file belongs to."""

    type: Optional[str]
    message: str
    traceback: str
    timestamp_s: Optional[int]
    error_file: str
    wall_ns: int
    pid: Optional[int]
    seen_by: str
    recorded_by: str

    def event(self) -> Dict[str, Any]:
        """As an ``exception`` event for ``fill_death`` (``caught_by='torchelastic'``)."""
        wall = self.wall_ns or (self.timestamp_s or 0) * 1_000_000_000
        return {
            "event": "exception",
            "type": self.type or "Exception",
            "message": self.message,
            "traceback": self.traceback,
            "wall_ns": wall,
            "caught_by": "torchelastic",
            "error_file": self.error_file,
        }

    def text(self) -> str:
        """``Type: message (read from torchelastic's error file PATH)``."""
        return "%s: %s (%s %s%s)" % (
            self.type or "Exception",
            self.message.strip(),
            FROM_FILE,
            self.error_file,
            ", as the agent read it" if self.seen_by == "agent" else "",
        )


def _of(key: str, e: Mapping[str, Any]) -> Optional[ElasticError]:
    if e.get("event") != "elastic_error":
        return None
    try:
        pid = int(e["pid"]) if e.get("pid") is not None else None
        ts = int(e["timestamp"]) if e.get("timestamp") is not None else None
    except (TypeError, ValueError):
        pid, ts = None, None
    return ElasticError(
        type=e.get("type") or None,
        message=str(e.get("message") or ""),
        traceback=str(e.get("traceback") or ""),
        timestamp_s=ts,
        error_file=str(e.get("error_file") or ""),
        wall_ns=int(e.get("wall_ns") or 0),
        pid=pid,
        seen_by=str(e.get("seen_by") or "worker"),
        recorded_by=key,
    )


def index(
    processes: Iterable[Any],
) -> Tuple[Dict[str, List[ElasticError]], Dict[Tuple[str, int], List[ElasticError]]]:
    """``(by recording process key, by (host, worker pid))`` of every ``elastic_error``
    event of ``processes`` (``ProcessInfo``), oldest first."""
    by_key: Dict[str, List[ElasticError]] = {}
    by_pid: Dict[Tuple[str, int], List[ElasticError]] = {}
    for p in processes:
        for e in p.events or ():
            x = _of(p.key, e) if isinstance(e, dict) else None
            if x is None:
                continue
            by_key.setdefault(p.key, []).append(x)
            if x.pid is not None:
                by_pid.setdefault((p.host, x.pid), []).append(x)
    for lst in list(by_key.values()) + list(by_pid.values()):
        lst.sort(key=lambda x: x.wall_ns)
    return by_key, by_pid


def for_rank(
    p: Any,
    helpers: Iterable[str],
    by_key: Mapping[str, List[ElasticError]],
    by_pid: Mapping[Tuple[str, int], List[ElasticError]],
) -> Optional[ElasticError]:
    """The earliest error file recorded for rank process ``p``: by ``p`` itself or the
    agent (its pid), else by one of its helpers (keys ``helpers``: a child that inherited
    its error file)."""
    own = list(by_pid.get((p.host, p.pid), ())) + [x for x in by_key.get(p.key, ()) if x.pid in (None, p.pid)]
    if own:
        return min(own, key=lambda x: x.wall_ns)
    kids = [x for k in helpers for x in by_key.get(k, ())]
    return min(kids, key=lambda x: x.wall_ns) if kids else None
