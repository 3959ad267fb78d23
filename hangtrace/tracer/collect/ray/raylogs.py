"""Ray's own record of a worker's death, read from Ray's session logs on disk (issue 9).

Ray's state API answers only while the cluster is up; its session logs stay on each node
after the cluster ends (``<temp dir>/<session name>/logs/``, default ``/tmp/ray``). A
traced Ray worker's start record holds its command line, which names them
(``--temp-dir=/tmp/ray``, ``--session-name=session_...``, ``--worker-id=...``). Two
files are read (checked on Ray 2.60; the texts are the format strings of Ray's C++
sources, ``src/ray/gcs/gcs_worker_manager.cc`` and ``src/ray/raylet/node_manager.cc``):

* ``gcs_server.out`` (head node): one line per worker that ended, "Reporting worker exit,
  worker id = W, node id = N, address = A, exit_type = T, exit_detail = D" (D may go on
  over the following lines). ``exit_type`` NODE_OUT_OF_MEMORY is Ray's memory monitor
  (older Ray versions write the same line, with "Task was killed due to the node running
  low on memory" as the detail).
* ``raylet.out`` (each node): the memory monitor's decision, "Killing N worker(s), kill
  details: Memory on the node (...) was X used / Y limit (f)", "OOM kill reason: Memory
  usage ...B exceeded threshold of ...B (...)", the workers it considered, "Selected to
  kill: (Actor(...): ..., task name=T, ..., pid=P, actual memory used=M GB, worker ID=W)"
  for the chosen ones, and "Top 10 memory users:" (PID, MEM(GB), COMMAND) of the node.

``ray_log_facts`` returns, per dead traced Ray worker, ``{'ray_worker_exit': {...},
'ray_oom_kill': {...}}`` (the ``to_dict`` of the dataclasses below) for
``ProcessInfo.memory_facts``; the analysis (``analyze/memory/attribution.py``) reads them
back with ``from_dict``. Never raises; reads at most ``MAX_READ`` bytes of each file's end.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

#: bytes read from the end of each log file (a raylet.out rotates at 512 MB by default)
MAX_READ = 32 << 20
GCS_LOG = "gcs_server.out"
RAYLET_LOG = "raylet.out"
NODE_OUT_OF_MEMORY = "NODE_OUT_OF_MEMORY"

_REC = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
_EXIT = re.compile(r"Reporting worker exit, worker id = (\w+),.*?exit_type = (\w+), exit_detail = (.*)", re.S)
_KILL = re.compile(r"Killing (\d+) worker\(s\), kill details: (.*)")
_CAND = re.compile(
    r"\((?:Actor|Task)?\(?([0-9a-f]*)\)?:?.*?task name=([^,]*),.*?pid=(\d+), "
    r"actual memory used=([\d.]+)GB, worker ID=(\w+)\)"
)
_TOP = re.compile(r"^(\d+)\s+([\d.]+)\s+(.*)$")
_GB = 1 << 30


@dataclass(frozen=True)
class RayWorkerExit:
    """Ray's record of one worker's end (``gcs_server.out``): ``wall_ns`` ns since the
    epoch (the log's local time), ``source`` the file."""

    worker_id: str
    exit_type: str
    exit_detail: str
    wall_ns: int
    source: str

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "RayWorkerExit":
        return RayWorkerExit(
            str(d.get("worker_id") or ""),
            str(d.get("exit_type") or ""),
            str(d.get("exit_detail") or ""),
            int(d.get("wall_ns") or 0),
            str(d.get("source") or ""),
        )


@dataclass(frozen=True)
class RayOomWorker:
    """One worker the memory monitor considered: memory in bytes (Ray's "actual memory
    used", GB = 2**30 bytes in Ray's formatting), ``selected`` when it was killed."""

    pid: int
    worker_id: str
    task_name: str
    memory: int
    selected: bool


@dataclass(frozen=True)
class RayOomKill:
    """One decision of Ray's memory monitor (``raylet.out``): ``details`` Ray's "kill
    details" (node memory used / limit), ``reason`` its "OOM kill reason", ``workers`` the
    workers it considered, ``top`` the node's largest memory users (pid, bytes, command)."""

    wall_ns: int
    details: str
    reason: str
    workers: Tuple[RayOomWorker, ...]
    top: Tuple[Tuple[int, int, str], ...]
    source: str

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "RayOomKill":
        ws = tuple(
            RayOomWorker(
                int(w.get("pid") or 0),
                str(w.get("worker_id") or ""),
                str(w.get("task_name") or ""),
                int(w.get("memory") or 0),
                bool(w.get("selected")),
            )
            for w in d.get("workers") or ()
        )
        top = tuple((int(t[0]), int(t[1]), str(t[2])) for t in d.get("top") or () if len(t) == 3)
        return RayOomKill(
            int(d.get("wall_ns") or 0),
            str(d.get("details") or ""),
            str(d.get("reason") or ""),
            ws,
            top,
            str(d.get("source") or ""),
        )

    def selected(self, worker_id: str, pid: int) -> bool:
        """True when this decision killed the worker (by worker id, else by pid)."""
        return any(
            w.selected and ((worker_id and w.worker_id == worker_id) or (not worker_id and w.pid == pid))
            for w in self.workers
        )


def _records(text: str) -> Iterable[Tuple[int, str]]:
    """Log records of a glog-style Ray log: (wall ns, text with its continuation lines)."""
    cur: List[str] = []
    t = 0
    for line in text.splitlines():
        m = _REC.match(line)
        if m:
            if cur:
                yield t, "\n".join(cur)
            try:
                t = int(
                    (time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) * 1000 + int(m.group(2)))
                    * 1e6
                )
            except (ValueError, OverflowError):
                t = 0
            cur = [line]
        elif cur:
            cur.append(line)
    if cur:
        yield t, "\n".join(cur)


def parse_worker_exits(text: str, source: str = "") -> Dict[str, RayWorkerExit]:
    """``gcs_server.out`` text -> {worker id: RayWorkerExit} (the newest per worker)."""
    out: Dict[str, RayWorkerExit] = {}
    for t, rec in _records(text):
        if "Reporting worker exit" not in rec:
            continue
        m = _EXIT.search(rec)
        if m:
            out[m.group(1)] = RayWorkerExit(
                m.group(1), m.group(2), " ".join(m.group(3).split())[:2000], t, source
            )
    return out


def parse_oom_kills(text: str, source: str = "") -> List[RayOomKill]:
    """``raylet.out`` text -> the memory monitor's kill decisions, oldest first."""
    out: List[RayOomKill] = []
    for t, rec in _records(text):
        m = _KILL.search(rec)
        if not m:
            continue
        lines = rec.splitlines()
        reason = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("OOM kill reason:")), "")
        workers = []
        for ln in lines:
            c = _CAND.search(ln)
            if c:
                workers.append(
                    RayOomWorker(
                        int(c.group(3)),
                        c.group(5),
                        c.group(2).strip(),
                        int(float(c.group(4)) * _GB),
                        ln.lstrip().startswith("Selected to kill"),
                    )
                )
        top: List[Tuple[int, int, str]] = []
        if any(ln.startswith("Top 10 memory users") for ln in lines):
            start = next(i for i, ln in enumerate(lines) if ln.startswith("Top 10 memory users"))
            for ln in lines[start + 1 : start + 11]:
                x = _TOP.match(ln.strip())
                if x:
                    top.append((int(x.group(1)), int(float(x.group(2)) * _GB), x.group(3)[:120]))
        out.append(
            RayOomKill(
                t, " ".join(m.group(2).split())[:400], reason[:400], tuple(workers), tuple(top), source
            )
        )
    return out


def _tail(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - MAX_READ))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def _argv_opt(argv: Iterable[str], name: str) -> Optional[str]:
    for a in argv:
        if a.startswith(name + "="):
            return a.split("=", 1)[1] or None
    return None


def worker_identity(p: Any) -> Tuple[Optional[str], Optional[str]]:
    """(session logs directory, Ray worker id) of a traced Ray worker, from the start
    record's command line (``--temp-dir``, ``--session-name``, ``--worker-id``) and its
    ring meta; (None, None) for other processes."""
    argv: List[str] = []
    for e in p.events or ():
        if isinstance(e, dict) and e.get("event") == "start":
            argv = [str(a) for a in e.get("argv") or ()]
            break
    wid = (p.meta or {}).get("ray_worker_id") or _argv_opt(argv, "--worker-id")
    temp, session = _argv_opt(argv, "--temp-dir"), _argv_opt(argv, "--session-name")
    logs = os.path.join(temp, session, "logs") if temp and session else None
    return logs, (str(wid) if wid else None)


def _ending(p: Any) -> bool:
    """The process's own records say it was ending (an exit event, a signal received)."""
    return any(
        isinstance(e, dict) and e.get("event") in ("exit", "exiting", "signal") for e in p.events or ()
    )


def ray_log_facts(procs: Iterable[Any], cache: Optional[Dict[str, Any]] = None) -> Dict[str, Dict[str, Any]]:
    """{process key: {'ray_worker_exit': ..., 'ray_oom_kill': ...}} for the dead (or, by
    their own records, dying) traced Ray workers of ``procs`` whose session logs name them (module docstring). ``cache`` (a dict
    shared over one load) keeps each session's logs parsed once. Never raises."""
    cache = {} if cache is None else cache
    out: Dict[str, Dict[str, Any]] = {}
    for p in procs:
        try:
            # a stored snapshot may hold a worker as alive that was dying when it was taken
            # (its ring already says 'exit'): Ray's line for its worker id tells how it ended
            if p.state not in ("killed", "exited") and not _ending(p):
                continue
            logs, wid = worker_identity(p)
            if not logs or not wid:
                continue
            if logs not in cache:
                g, r = os.path.join(logs, GCS_LOG), os.path.join(logs, RAYLET_LOG)
                cache[logs] = (parse_worker_exits(_tail(g) or "", g), parse_oom_kills(_tail(r) or "", r))
            exits, kills = cache[logs]
            facts: Dict[str, Any] = {}
            if wid in exits:
                facts["ray_worker_exit"] = exits[wid].to_dict()
            kill = next((k for k in kills if k.selected(wid, p.pid)), None)
            if kill is not None:
                facts["ray_oom_kill"] = kill.to_dict()
            if facts:
                out[p.key] = facts
        except Exception:  # evidence gathering must not stop a load
            continue
    return out
