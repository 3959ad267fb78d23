"""Stall and death detection over the ring headers of a run directory (``Watcher``):
headers polled in, an ``Incident`` (stall or death) out, and notes and memory early
warnings in the watcher log. Split from ``watcher.py``, which runs it as a process.

Progress is judged from the ring headers alone (4 KiB each per poll; its definition is
``progress.py``, shared with ``hangtrace dump``'s window): a process made
progress when its progress counter moved (a collective completed, a phase or step
changed, ``tracer.heartbeat()``), unless every record since its last move is a framework's
heartbeat (``beattail.py``, ``ring/heartbeats.py``: Ray Train's ``poll_status``). A ring whose process exited or was killed, and is gone, is final:
its header is kept and the file not read again (a job that re-creates DataLoader workers
every epoch leaves hundreds of them). torch's own collective counters (``_fr_moved``) are
asked only of ranks whose ring did not move in this poll: a moving ring is progress already. A stall is *no progress anywhere in the run* for the
threshold: ``HANGTRACE_STALL_S``, or the largest per-phase threshold
(``HANGTRACE_PHASE_STALL_S``) among the phases the live processes are in. A slow job
whose counters move is progressing and is never reported.

A dead rank — a process that vanished without a clean-exit record, or exited with a
non-zero code — is reported at the next poll (a rank helper's: ``helpergrace.py``; a quiet
death while the job's root lives waits for a clean shutdown: ``shutdown.py``).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from hangtrace.tracer import config
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.collect.ringprocs import live_state, read_signal_files
from hangtrace.tracer.watch.beattail import BeatTail
from hangtrace.tracer.watch.busy import STARTUP_BUSY_MAX, BusyClock
from hangtrace.tracer.watch.frprogress import in_flight
from hangtrace.tracer.watch.progress import HeaderCache, counters_advanced, signature, Signature
from hangtrace.tracer.watch.headers import Header, at_startup, is_rank, never_worked, ranks_ended, starting
from hangtrace.tracer.watch.helpergrace import HelperGrace
from hangtrace.tracer.watch.notes import Death, busy_note, death_lines
from hangtrace.tracer.watch.shutdown import ShutdownGrace
from hangtrace.tracer.watch.stragglerwatch import StragglerWatch
from hangtrace.tracer.watch.stragglerfr import FrLook
from hangtrace.tracer.stragglerseen import seen_path

#: seconds between two memory-trend checks of the live rings (each reads every ring once)
MEM_CHECK_S = 5.0


class Incident:
    """What the watcher saw: ``kind`` 'stall' or 'death'; ``detail`` a human line (of a
    death: its ``lines``, one per process that died, joined by '; '). ``follows``: it belongs to
    the incident reported before (issue 38: no live rank progressed since - in a job without
    ranks, no live process; a launcher exiting after its ranks died, the survivors of a death
    hanging): its verdict replaces that incident's when it differs (``watch/verdictbook.py``)."""

    def __init__(
        self,
        kind: str,
        detail: str,
        keys: Iterable[str] = (),
        lines: Iterable[str] = (),
        follows: bool = False,
    ) -> None:
        self.kind, self.detail, self.keys = kind, detail, list(keys)
        self.lines: List[str] = list(lines) or [detail]
        self.follows = follows


class _Scan:
    """What one poll's scan of the ring headers found (``Watcher._scan_one`` fills it)."""

    __slots__ = ("progressed", "alive_progressed", "rank_progressed", "alive_any", "deaths", "ranks_still")

    def __init__(self) -> None:
        self.progressed = False
        self.alive_progressed = False
        self.rank_progressed = False  # a live process that joined a group as a rank moved
        self.alive_any = False
        self.deaths: List[Death] = []
        self.ranks_still: Dict[str, Header] = {}  # live processes that joined a group, ring unchanged


class Watcher:
    """Stall/death detector over the ring headers of ``run_dir``.

    ``stall_s``: seconds without progress anywhere before a stall; ``phase_stall``:
    {phase name: seconds}; ``clock``: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        run_dir: str,
        stall_s: Optional[float] = None,
        phase_stall: Optional[Mapping[str, float]] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_dir = run_dir
        self.stall_s = config.get_float(config.STALL_S) if stall_s is None else float(stall_s)
        self.phase_stall = config.phase_stall_s() if phase_stall is None else dict(phase_stall)
        self.startup_stall_s = config.get_float(config.STARTUP_STALL_S)
        self.clock = clock
        self.seen: Dict[str, Signature] = {}  # path -> (progress_count, phase, step, state)
        self.dead: Set[str] = set()
        self.created = self.last_progress = clock()
        self.startup_busy_at = float("-inf")  # the last poll where a process was busy at the start
        self.reported_stall = False
        self.in_incident = False  # an incident was reported and no live process progressed since
        self.headers: Dict[str, Header] = {}
        self.header_cache = HeaderCache()
        # memory early warnings (issue 5): checked every MEM_CHECK_S, once per process and metric
        self.mem_warned: Set[Tuple[str, str]] = set()  # (ring path, metric key)
        self.mem_next = clock() + MEM_CHECK_S
        self.mem_log: Optional[Callable[[str], None]] = None  # default: append to RUN_DIR/watcher-<host>.log
        self.log: Optional[Callable[[str], None]] = None  # other notes; default: the same log file
        # the note of a quiet spell while processes work on CPU (why no stall yet); default: self.log
        self.say: Optional[Callable[[str], None]] = None
        self.fr_seen: Dict[str, str] = {}  # ring path -> torch's collective counters (issue 10)
        self.fr_started: Set[str] = set()  # ring paths whose counters moved: past start-up
        self.final: Dict[str, Header] = {}  # exited or killed, process gone: the header never changes
        self.mem_idx: Dict[str, int] = {}  # ring path -> next_idx at its last memory check
        self.busy_clock = BusyClock()
        self.busy: List[int] = []  # pids busy on CPU outside collectives at the last poll (watch/busy.py)
        self.busy_noted = False  # the grace was logged in this spell without progress
        self.grace = HelperGrace()  # helpers' deaths held for their rank (watch/helpergrace.py)
        self.beats = BeatTail()  # which ring moves were only heartbeats (watch/beattail.py)
        self.shutdown = ShutdownGrace(run_dir)  # quiet deaths held for the job's end (watch/shutdown.py)
        # issue 43: a line in the watcher log file when a straggler starts, one when it ends
        self.straggler_echo: Optional[Callable[[str], None]] = None  # also there (hangtrace run: stderr)
        host = socket.gethostname()  # its episodes, for dump/analyze's "since when" (stragglerseen.py)
        self.stragglers = StragglerWatch(
            self._straggler_log, clock, seen_path(run_dir, host), host=host, fr=FrLook(run_dir, clock)
        )

    def _read_headers(self) -> Dict[str, Header]:
        return self.header_cache.read(self.run_dir, self.final)  # (only changed headers decoded)

    def threshold(self) -> float:
        """Stall threshold in seconds for the phases live processes are in now."""
        t = self.stall_s
        joined = frozenset(
            h["rank"] for h in self.headers.values() if h.get("rank_source", 0) == F.RANK_FROM_GROUP
        )
        working = frozenset(
            h["rank"]
            for p, h in self.headers.items()
            if h.get("rank_source", 0) == F.RANK_FROM_GROUP
            and h["progress_count"] > 1
            and p not in self.final
            and _alive(h)
        )
        if self.headers and not any(
            h.get("rank", -1) >= 0 or h["progress_count"] > 1 or h["phase_strid"]
            for h in self.headers.values()
        ):
            # only launchers so far, none has made progress (torchrun's agent importing
            # torch and spawning the ranks on a loaded machine): the run is starting
            t = max(t, self.startup_stall_s)
        if ranks_ended(self.headers):  # the ranks ended: launchers reaping, interpreters finalizing
            t = max(t, self.startup_stall_s)
        for path, h in self.headers.items():
            if h["state"] == F.ST_EXITED:
                continue
            ph = h.get("phase")
            if ph in self.phase_stall:
                t = max(t, self.phase_stall[ph])
            if starting(h, joined, working) and path not in self.fr_started:
                t = max(t, self.startup_stall_s)
        if self.busy:  # working, not waiting: importing, building (busy.py)
            waiting = any(
                h.get("inflight_idx") for p, h in self.headers.items() if p not in self.final
            ) or any(
                in_flight(line) for p, line in self.fr_seen.items() if p not in self.final
            )  # (DDP's C++ all-reduce)
            t = max(t, self.startup_stall_s) if waiting else float("inf")  # a straggler, or a start
        return t

    def poll(self) -> Optional[Incident]:
        """One poll. Returns an Incident or None."""
        now = self.clock()
        self.headers = self._read_headers()
        scan = _Scan()
        for path, h in self.headers.items():
            if path in self.final:
                continue  # seen at an earlier poll: exited, gone, its death (if any) reported
            self._scan_one(path, h, scan)
        if self._fr_moved(scan.ranks_still):
            scan.progressed = scan.alive_progressed = scan.rank_progressed = True
        startup, live = (  # (the start's grace ends STARTUP_BUSY_MAX start-up thresholds in)
            at_startup(self.headers) and now - self.created < STARTUP_BUSY_MAX * self.startup_stall_s,
            {p: h for p, h in self.headers.items() if p not in self.final},
        )
        self.busy, quiet = self.busy_clock.busy(live, startup), now - self.last_progress
        if scan.progressed:
            self.busy_noted = False
        elif self.busy and not self.busy_noted and not self.reported_stall and quiet >= self.stall_s:
            self.busy_noted = True  # once per quiet spell
            (self.say or self._log)(busy_note(self.headers, self.busy, quiet, self.threshold))
        if scan.progressed:
            self.last_progress = now
        if startup and self.busy:  # the start going on (busy.py): the quiet spell begins after it
            self.startup_busy_at = now
        if scan.alive_progressed:
            # only a process that is still alive and moved is progress after a stall: the
            # state change of a process dying (stopped by the user or the launcher) is not
            self.reported_stall = False
        if scan.rank_progressed or (scan.alive_progressed and not any(map(is_rank, self.headers.values()))):
            # a launcher or a helper reacting to a death (torchrun's agent recording its
            # workers' failure) is not the job moving on; in a job without ranks, anything is
            self.in_incident = False
        if now >= self.mem_next:
            self.mem_next = now + MEM_CHECK_S
            self.memory_warnings()
        self.stragglers.check(
            {p: h for p, h in self.headers.items() if p not in self.final}, lambda p, h: _alive(h)
        )
        deaths = self.grace.deaths(scan.deaths, self.headers, now)  # (a helper's waits for its rank)
        deaths = self.shutdown.deaths(deaths, self.headers, now, self._log)  # (a clean shutdown is none)
        if deaths:
            return self._death_incident(deaths)
        if scan.alive_any and not self.reported_stall and self.quiet(now) >= self.threshold():
            self.reported_stall = True
            what = "no progress in any traced process for %.1f s (threshold %.1f s)"
            return self._opened(Incident("stall", what % (self.quiet(now), self.threshold())))
        return None

    def quiet(self, now: float) -> float:
        """Seconds of the quiet spell at ``now``: since the last progress, or since the last
        poll where a process was busy at the run's start (``busy.py``), the later."""
        return now - max(self.last_progress, self.startup_busy_at)

    def _opened(self, inc: Incident) -> Incident:
        """``inc``, marked as following the incident reported before when no live process
        progressed since (``Incident.follows``)."""
        inc.follows, self.in_incident = self.in_incident, True
        return inc

    def _scan_one(self, path: str, h: Header, scan: "_Scan") -> None:
        """One ring header of ``poll`` not final yet: records its move, finality and death in
        the watcher's state and in ``scan``."""
        sig = signature(h)
        old = self.seen.get(path)
        changed = old != sig
        idle = never_worked(h)
        if changed:
            self.seen[path] = sig
            if old is not None and self.beats.heartbeat_only(path, h, old, sig):
                # only a framework's periodic call (Ray Train's poll_status): alive, not
                # progress (ring/heartbeats.py); torch's counters still tell (ranks_still)
                changed = False
            else:
                scan.progressed = scan.progressed or not idle
                # torch's counters given before this move are stale: compared with the
                # ring's own progress they would read as progress once more when the ring
                # stops (one poll of detection latency); the next ask is a fresh baseline
                self.fr_seen.pop(path, None)
        st = live_state(h)
        if (st == "exited" and h["state"] == F.ST_EXITED) or st == "killed":
            self.final[path] = h  # the process is gone: its ring never changes again
        if path in self.dead:
            return
        if st == "alive":
            scan.alive_any = True
            if changed and not idle:
                scan.alive_progressed = True
                scan.rank_progressed = scan.rank_progressed or is_rank(h)
            elif h.get("rank", -1) >= 0 and h.get("rank_source", 0) == F.RANK_FROM_GROUP:
                scan.ranks_still[path] = h
        elif st == "killed" or (st == "exited" and h["exit_code"] != 0):
            self._note_death(path, h, st, idle, scan.deaths)

    def _note_death(self, path: str, h: Header, st: str, idle: bool, deaths: List[Death]) -> None:
        """A process of ``path`` killed (``st``) or exited non-zero: marks it dead and appends
        it to ``deaths``, unless it is a pooled worker retired before any work (logged)."""
        self.dead.add(path)
        if st == "killed" and idle and "fatal" not in read_signal_files(self.run_dir, h["host"], h["pid"]):
            self._log(
                "pid %d on %s vanished before it did any work (a pooled worker retired by its "
                "launcher, such as Ray's idle workers): not an incident" % (h["pid"], h["host"])
            )
            return
        deaths.append((path, h, st))

    def _death_incident(self, deaths: List[Death]) -> Optional[Incident]:
        """The 'death' Incident of ``deaths`` (path, header, live state), or None (logged)
        when they follow a reported stall."""
        lines = death_lines(deaths, self.headers)
        if self.reported_stall:
            # a stall was reported and nothing progressed since: these deaths are the
            # hung job being stopped (user's signal, launcher, --stop-on-stall), not a
            # new incident; the stall verdict and its snapshot stay the newest
            for line in lines:
                self._log("%s: stopped after the stall" % line)
            return None
        return self._opened(Incident("death", "; ".join(lines), [p for p, _, _ in deaths], lines))

    def _fr_moved(self, ranks: Mapping[str, Header]) -> bool:
        """True when torch's own count of completed collectives (``fr_agent.progress_line``:
        per group, enqueued and completed) of a live rank of this host moved since it was
        last asked: C++-issued collectives (DDP's reducer, FSDP) are progress the rings
        never record. A collective enqueued is not progress (the one a hung rank waits in
        is enqueued too), as a collective started is not in the rings. ``poll`` passes only
        the ranks whose ring did not move in this poll (a moving ring is progress already,
        and forgets the rank's counters: the first ask after its ring stops is a new
        baseline, so the hang is dated from the ring's last move, not one poll later).
        Ranks whose counters moved at all (enqueued or completed) no longer hold the
        start-up threshold (``fr_started``). Never raises."""
        from hangtrace.hooks.torchdist.fr_agent import fr_dir

        if not ranks or not os.path.isdir(fr_dir(self.run_dir)):
            return False
        try:
            import socket
            from hangtrace.tracer.collect.frrequest import fr_progress

            host = socket.gethostname()
            by_pid = {h["pid"]: path for path, h in ranks.items() if h.get("host") == host}
            answers = fr_progress(self.run_dir, list(by_pid), timeout_s=0.5)
        except Exception:
            return False
        moved = False
        for pid, line in answers.items():
            path = by_pid[pid]
            old = self.fr_seen.get(path)
            self.fr_seen[path] = line
            if old is not None and old != line:
                self.fr_started.add(path)
                moved = moved or counters_advanced(old, line)
        return moved

    def memory_warnings(self) -> List[str]:
        """Early warning before an OOM kill (issue 5): for every live process whose memory
        grows steadily step after step (tracer.memory.watch_lines), one line per process
        and metric in the watcher log. Returns the new lines; never raises."""
        new: List[str] = []
        try:
            from hangtrace.tracer.analyze.memory import watch_lines

            for path, h in self.headers.items():
                if (
                    h["state"] == F.ST_EXITED
                    or self.mem_idx.get(path) == h["next_idx"]
                    or live_state(h) != "alive"
                ):
                    continue  # exited, or no record written since its last check: same lines
                try:
                    ring = R.read_ring(path, records=False)
                except Exception:
                    continue
                label = (
                    "rank %d (pid %d on %s)" % (h["rank"], h["pid"], h["host"])
                    if h["rank"] >= 0
                    else "pid %d on %s" % (h["pid"], h["host"])
                )
                self.mem_idx[path] = ring.header["next_idx"]
                for key, line in watch_lines(list(ring.summary.memory), label):
                    if (path, key) in self.mem_warned:
                        continue
                    self.mem_warned.add((path, key))
                    new.append(line)
            for line in new:
                self._mem_log(line)
        except Exception:
            pass
        return new

    def _log(self, line: str) -> None:
        """Watcher log line: ``self.log`` (callable) if set, else the watcher log file."""
        (self.log or self._write_log)(line)

    def _straggler_log(self, line: str) -> None:
        """A straggler line: always the watcher log file, and ``straggler_echo`` if set."""
        self._write_log(line)
        if self.straggler_echo is not None:
            self.straggler_echo(line)

    def _mem_log(self, line: str) -> None:
        (self.mem_log or self._write_log)(line)

    def note(self, line: str) -> None:
        """One line appended to the watcher log file, ``RUN_DIR/watcher-<host>.log`` (never raises)."""
        self._write_log(line)

    def _write_log(self, line: str) -> None:
        try:
            with open(os.path.join(self.run_dir, "watcher-%s.log" % socket.gethostname()), "a") as f:
                f.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), line))
        except OSError:
            pass

    def any_alive(self) -> bool:
        return any(path not in self.final and live_state(h) == "alive" for path, h in self.headers.items())


def _alive(h: Header) -> bool:
    """The header's process is alive on this host (False when that cannot be told)."""
    try:
        return live_state(h) == "alive"
    except (KeyError, TypeError, OSError):
        return False
