"""What progress is, in one place: the watcher's poll (``detector.py``) and a live
snapshot's window (``hangtrace dump``, issue 38) both judge it here.

A process made progress when its ring header's progress signature moved (:func:`signature`:
the progress counter - a collective completed, ``tracer.heartbeat()`` -, the phase, the
step, the state), unless it is a pooled worker that never worked (``headers.never_worked``);
or, for a rank whose ring did not move, when torch's own count of *completed* collectives
moved (``frprogress.completed``: DDP's and FSDP's C++ collectives never reach the ring).
Headers are 4 KiB reads; torch's counters are asked of the ranks' Flight Recorder agents
over their sockets (``collect/frrequest.fr_progress``, at most 0.5 s).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import socket
import time
import weakref
from typing import Callable, Dict, List, Mapping, Optional, Tuple, TypeVar

from hangtrace.tracer.collect.ringprocs import RING_GLOB, live_state
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.snapshot import ProgressWindow
from hangtrace.tracer.watch.frprogress import completed
from hangtrace.tracer.watch.headers import Header, never_worked

#: (progress_count, phase string id, step, state) of a ring header
Signature = Tuple[int, int, int, int]

#: the shortest and the default window of a live snapshot (s): two readings of the headers
#: this far apart; a healthy job's counters move many times a second, a second is far above
#: the few milliseconds by which healthy ranks are apart
MIN_WINDOW_S = 1.0
DEFAULT_WINDOW_S = 2.0

T = TypeVar("T")


def signature(h: Mapping[str, object]) -> Signature:
    """The part of a ring header that moves when its process makes progress."""
    return (int(h["progress_count"]), int(h["phase_strid"]), int(h["step"]), int(h["state"]))  # type: ignore[call-overload]


def advanced(before: Optional[Signature], h: Header) -> bool:
    """``h``'s process made progress since its signature was ``before`` (None: its ring was
    not there yet): the signature moved and it is not a pooled worker that never worked."""
    return before != signature(h) and not never_worked(h)


def counters_advanced(before: Optional[str], now: Optional[str]) -> bool:
    """torch's completed-collective counters (``fr_agent.progress_line``) moved between two
    answers of one rank's agent (an enqueued collective is not progress: the one a hung rank
    waits in is enqueued too)."""
    return before is not None and now is not None and completed(before) != completed(now)


def read_header(path: str) -> Header:
    """The ring header of ``path`` plus ``'phase'`` (its name, or None). Raises on a file
    being created or a foreign file."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        h = R.read_header(os.pread(fd, F.HEADER_SIZE, 0), path)
        h["phase"] = _phase_name(fd, h)
    finally:
        os.close(fd)
    return h


class HeaderCache:
    """``read_headers`` for a caller that reads the same run directory again and again (the
    node watcher's poll, issue 40 item 4): each ring file stays open, its header is one
    ``pread``, and decoded again only when its bytes changed (an unchanged header is the dict
    decoded before: do not modify it); a file replaced under its name (a new inode) is opened
    again. So a poll's work grows with the rings that changed, not with every ring. Holds at
    most :data:`MAX_OPEN` descriptors (the rest are read as ``read_header`` does)."""

    MAX_OPEN = 1024

    def __init__(self) -> None:
        self.open: Dict[str, Tuple[int, int, bytes, Header]] = {}  # path -> (inode, fd, bytes, header)
        weakref.finalize(self, _close_all, self.open)  # (a watcher dropped: its descriptors closed)

    def read(self, run_dir: str, final: Optional[Mapping[str, Header]] = None) -> Dict[str, Header]:
        """As ``read_headers(run_dir, final)``; files of gone processes (``final``) are closed."""
        out: Dict[str, Header] = {}
        try:
            with os.scandir(run_dir) as it:
                entries = [(e.name, e.inode()) for e in it if fnmatch.fnmatchcase(e.name, RING_GLOB)]
        except OSError:
            entries = []
        for name, ino in entries:
            path = os.path.join(run_dir, name)
            done = (final or {}).get(path)
            h = done if done is not None else self._one(path, ino)
            if h is not None:
                out[path] = h
        for path in [p for p in self.open if p not in out or (final or {}).get(p) is not None]:
            os.close(self.open.pop(path)[1])
        return out

    def _one(self, path: str, ino: int) -> Optional[Header]:
        """The header of ``path`` (inode ``ino``), or None when unreadable now (a file being
        created, a foreign file: as ``read_headers``)."""
        held = self.open.get(path)
        if held is not None and held[0] != ino:
            os.close(self.open.pop(path)[1])
            held = None
        if held is None and len(self.open) >= self.MAX_OPEN:
            try:
                return read_header(path)
            except Exception:
                return None
        try:
            fd = held[1] if held is not None else os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            raw = os.pread(fd, F.HEADER_SIZE, 0)
            if held is not None and raw == held[2]:
                return held[3]
            h = R.read_header(raw, path)
            same = held is not None and held[3]["phase_strid"] == h["phase_strid"]
            h["phase"] = held[3]["phase"] if held is not None and same else _phase_name(fd, h)
        except Exception:
            if held is None:
                os.close(fd)
            return None
        self.open[path] = (ino, fd, raw, h)
        return h


def _close_all(held: Dict[str, Tuple[int, int, bytes, Header]]) -> None:
    for _ino, fd, _raw, _h in held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    held.clear()


def _phase_name(fd: int, h: Header) -> Optional[str]:
    """The name of ``h``'s phase (its string table entry), or None when it has none."""
    if not h["phase_strid"]:
        return None
    off = h["strtab_off"] + h["phase_strid"]
    _tag, n = F.STR_ENTRY.unpack(os.pread(fd, F.STR_ENTRY.size, off))
    return os.pread(fd, min(n, 4096), off + F.STR_ENTRY.size).decode("utf-8", "replace")


def read_headers(run_dir: str, final: Optional[Mapping[str, Header]] = None) -> Dict[str, Header]:
    """{ring path: header} of every ring file of ``run_dir``; ``final`` headers (processes
    gone) are reused, not read; unreadable files are left out (the collector reports them)."""
    out: Dict[str, Header] = {}
    for path in glob.glob(os.path.join(run_dir, RING_GLOB)):
        done = (final or {}).get(path)
        if done is not None:
            out[path] = done
            continue
        try:
            out[path] = read_header(path)
        except Exception:
            continue
    return out


def live_ranks(headers: Mapping[str, Header]) -> Dict[int, str]:
    """{pid: ring path} of the live processes of this host that joined a group: those whose
    Flight Recorder agent can be asked for torch's counters."""
    host = socket.gethostname()
    out: Dict[int, str] = {}
    for path, h in headers.items():
        if h.get("host") != host or h.get("rank", -1) < 0 or h.get("rank_source", 0) != F.RANK_FROM_GROUP:
            continue
        try:
            if live_state(h) == "alive":
                out[h["pid"]] = path
        except (KeyError, TypeError, OSError):
            continue
    return out


def ask_counters(run_dir: str, by_pid: Mapping[int, str], timeout_s: float = 0.5) -> Dict[str, str]:
    """{ring path: torch's counters line} of the ranks ``by_pid`` ({pid: ring path}) whose
    agent answered; {} when the run has no agent directory or none answered. Never raises."""
    from hangtrace.hooks.torchdist.fr_agent import fr_dir

    if not by_pid or not os.path.isdir(fr_dir(run_dir)):
        return {}
    try:
        from hangtrace.tracer.collect.frrequest import fr_progress

        answers = fr_progress(run_dir, list(by_pid), timeout_s=timeout_s)
    except Exception:
        return {}
    return {by_pid[pid]: line for pid, line in answers.items() if pid in by_pid}


def key_of(h: Mapping[str, object]) -> str:
    """``host:pid`` of a header (``ProcessInfo.key``)."""
    return "%s:%s" % (h.get("host"), h.get("pid"))


def moved_between(
    before: Mapping[str, Header],
    after: Mapping[str, Header],
    fr_before: Mapping[str, str],
    fr_after: Mapping[str, str],
) -> List[str]:
    """Keys (``host:pid``) of the processes that made progress between two readings
    (:func:`advanced`, else :func:`counters_advanced`), sorted."""
    out = []
    for path, h in after.items():
        old = before.get(path)
        if advanced(None if old is None else signature(old), h) or counters_advanced(
            fr_before.get(path), fr_after.get(path)
        ):
            out.append(key_of(h))
    return sorted(out)


def window(
    run_dir: str,
    window_s: float = DEFAULT_WINDOW_S,
    during: Optional[Callable[[], T]] = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Tuple[ProgressWindow, Optional[T]]:
    """Read ``run_dir``'s ring headers and its ranks' torch counters, run ``during`` (the
    snapshot), wait until ``window_s`` seconds (at least :data:`MIN_WINDOW_S`) have passed
    since the first reading, and read them again. Returns the :class:`ProgressWindow`
    (``window_s``: the seconds between the readings; ``unread``: the processes whose ring
    file was there at the first reading and not at the second) and what ``during``
    returned."""
    window_s = max(MIN_WINDOW_S, float(window_s))
    t0 = clock()
    before = read_headers(run_dir)
    ranks = live_ranks(before)
    fr_before = ask_counters(run_dir, ranks)
    got = during() if during is not None else None
    left = window_s - (clock() - t0)
    if left > 0:
        sleep(left)
    after = read_headers(run_dir)
    fr_after = ask_counters(run_dir, ranks)
    moved = moved_between(before, after, fr_before, fr_after)
    unread = tuple(sorted(key_of(h) for path, h in before.items() if path not in after))
    w = ProgressWindow(window_s=round(clock() - t0, 3), source="rings", advanced=tuple(moved), unread=unread)
    return w, got
