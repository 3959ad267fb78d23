"""Pure analysis: a ``Snapshot`` in, one ``Diagnosis`` out (no I/O, no processes).

Vocabulary (``Diagnosis.kind``): 'collective-mismatch', 'skipped-collective',
'cross-group-deadlock', 'stuck-outside-collective', 'dead-rank', 'transport-error',
'progressing', 'unknown'. Ranks are global ranks; times are ns since the Unix epoch
(``*_wall_ns``) unless a name says ``_s`` (seconds).

How the verdict is reached
==========================

1. **Index** (one pass over each process's records, O(records)): per group the record
   with the highest ``seq`` of kind 'collective' (the ring may have wrapped: only the
   per-group maximum is trusted, never history from seq 1); per ``(group, peer)`` the
   highest p2p record; the record the rank is *blocked* in: ``ProcessInfo.inflight``, else
   its newest collective/p2p record if that is still 'issued' (not async), or 'failed'
   with a transport error (it was waiting there when the transport gave up). Group
   membership comes from the group definitions of every process (``groups``); a group
   nobody defined gets the ranks seen using it (the default group ``'0'`` / 'default_pg'
   gets ``range(world_size)``). Processes with ``rank < 0`` are ignored; of two processes
   claiming one rank the later-started one is used. Ranks of ``range(world_size)`` with no
   process are reported as "no record file".

2. **Wait-for graph**. An *instance* is one collective ``(group, seq)`` some rank is
   blocked in, or one p2p op ``(group, seq, waiter, peer)``. A member of the instance's
   group is *missing* when it has no process, its highest seq in the group is lower
   (*behind*; includes "no record of the group in its ring"), or it is dead. Members
   whose highest seq is higher are *ahead* (they passed it: sequence numbers diverged);
   members at the same seq have posted it. For p2p the peer is missing when its highest
   seq with the waiter is lower. Edges: rank -> instance it is blocked in -> missing
   ranks. The graph is linear in ranks + group sizes (never ranks x ranks).

3. **Frontier mismatch** (first, it is definitive): in an instance, the ranks at the same
   seq are compared on (op, dtype, numel, root/peer); numel/dtype are not compared for ops
   whose sizes legitimately differ per rank (object ops, all_to_all, gather/scatter).
   Two or more signatures -> 'collective-mismatch'; the culprits are the ranks outside the
   largest signature class, or every rank when the largest classes tie ("name all").
   P2P: both sides posted the pair seq in the same direction (send/send, recv/recv) or
   with different sizes -> 'collective-mismatch' on both ranks.

4. **Cycles** (Tarjan's SCC over the wait-for graph): a cycle of ranks waiting on each
   other through instances of two or more groups (or p2p) -> 'cross-group-deadlock'.
   Culprits: every rank of the cycle, except when the ranks of one group/instance form a
   strict minority (e.g. rank 0 alone in a world barrier while 1..7 wait in a DP
   all_reduce for it): then that minority diverged and is named; the whole cycle stays in
   ``details['cycle']``.
   *Extra collective first*: a cycle can be the cascade of one rank issuing one
   collective more than its peers on a group that has a role (same description once a
   trailing index is stripped, 'cp0'/'cp1' -> 'cp'; without descriptions, disjoint
   groups of one size created consecutively). If a strict majority of the role's ranks
   issued N collectives on their group of the role, the waiter issued more and the
   members it waits for issued N, the waiter is named: 'skipped-collective', cause
   'extra-collective', with ``details['extra_collective']`` (counts per rank). Example:
   CP {0,1},{2,3}: rank 1 waits in an extra cp0 all_reduce, rank 0 went on into the world
   all_reduce, rank 3 waits in dp1 for rank 1 - a cycle 0 -> 1 -> 0, but rank 1 issued
   N+1 on cp0 where ranks 0, 2, 3 issued N. A genuine deadlock (groups entered in
   opposite orders) has no such majority and stays 'cross-group-deadlock'.

5. **Chain ends**: following edges from every waiting rank, the ranks reached that are
   not waiting themselves are the culprits (rank A waits in G for B, B waits in H for C,
   C is not in any collective -> C). Each is classified:

   * dead (see 7) -> 'dead-rank';
   * exited cleanly (code 0) -> 'skipped-collective' (it left the loop without it);
   * its main-thread stack top is a blocking non-collective call (queue.get, lock,
     event/condition wait, socket/pipe read, subprocess, future, ray.get, sleep, asyncio
     idle) or py-spy says the thread is idle -> 'stuck-outside-collective';
   * its stack is inside a torch.distributed call that was not recorded -> skipped
     (it is in some other, untraced collective);
   * it moved on: recorded activity after the waiters began waiting (a record issued,
     or progress not explained by the completion of its last record), a later step, or
     another phase than the waiters -> 'skipped-collective';
   * otherwise (no activity since the others began to wait, stack running or unknown)
     -> 'stuck-outside-collective'.

   *Minority flip*: when every missing member of the main instance was classified as
   having moved on ('skipped') and the waiting ranks are fewer than the missing ones,
   the waiting minority is what diverged (rank 0 alone in a checkpoint barrier the
   others never call): it becomes the culprit ('skipped-collective', evidence says so).
   A chain end that is itself blocked in an instance whose other members are all
   *ahead* -> 'collective-mismatch' (its sequence numbers diverged from the group).
   Ranks without a process are chain ends too; they are named only when no rank with a
   process is a chain end (then kind 'unknown', cause 'no-record-file').

6. **Everybody at the frontier**: if waiting ranks exist but every instance has all its
   members (a collective in progress), the run is 'progressing' when the last progress
   anywhere is younger than ``stall_s`` (default 300 s) and the snapshot reason is not
   'stall'; otherwise 'unknown' (a transport-level or in-kernel stall). No rank waiting
   at all -> 'progressing' (or 'unknown' if stalled: nobody is in a collective).

7. **Deaths** take precedence: a rank is dead when ``state == 'killed'``, or 'exited'
   with a non-zero exit code, or it has an 'exception' event. Cause: 'sigterm' (a SIGTERM
   dump or exit code -15), 'fatal-signal' (a fatal-error dump, or exit code -6/-11/-7/-4/
   -8), 'exception' (type and message in ``details['cause_text']``), 'exit-code N',
   else 'killed-without-record' (SIGKILL? host OOM-kill? - no handler ran). A death whose
   only reason is a transport error ("Connection closed by peer", "Timed out waiting",
   "connection reset", ...) is a *victim*, never the root when a non-victim death exists.
   Failure time: exception/signal/exit time, else the failed record's end, else the last
   sign of life (last record, progress) - a lower bound for SIGKILL. The root is the
   earliest non-victim death; every other failure (dead ranks, failed records) goes to
   ``cascade``. The hang verdict wins over a death only when its culprit is not the dead
   rank and the death happened after the hang began (e.g. the user SIGTERMed a hung job);
   a death without a record (SIGKILL) counts as later only when the rank issued something
   after the hang began - its last sign of life is only a lower bound, and the
   completion of its last collective just after a peer entered the next one is not
   "moving on".
   Transport failures with no dead rank and no hang culprit -> 'transport-error' naming
   the first rank to fail; the rest are cascade.
   *Memory evidence* (issue 5, ``tracer/analyze/memory.py``, ``docs/MEMORY.md``) then refines a
   death's cause: 'host-oom-kill' (kernel OOM-killer line for the pid, or its cgroup's
   oom_kill counter rose after its last sample), 'ray-memory-monitor' (Ray's own record),
   'cuda-oom' (torch's OutOfMemoryError / the allocator's OOM observer),
   'sigterm-external' (SIGTERM with memory well below the limit: not an OOM); a death
   without a record keeps its lower-bound failure time. ``details['memory']`` carries
   the ledger, kept-across flags, trends, attribution and advice.

Performance: one pass over every record list plus work linear in the group sizes of the
instances ranks are blocked in; 4,096 ranks x 2,000 records is a few seconds in CPython.
"""
import re
import time

from hangtrace.tracer.diagnosis import Diagnosis
from hangtrace.tracer.analyze.roles import assign_roles
from hangtrace.tracer.analyze.stacktree import (blocking_reason, classes as stack_classes_of, collective_frame,
                        format_ranks, frame_label, merge_stacks, missing_from_common_frame,
                        process_frames)

__all__ = ["diagnose", "TRANSPORT_MARKERS", "is_transport_error", "DEFAULT_STALL_S"]

DEFAULT_STALL_S = 300.0
_INF = float("inf")
MAX_EVIDENCE = 40
MAX_FRAMES = 8
#: progress stamped within this many ns after the end of a rank's last record is that
#: record's completion, not new activity (the recorder stamps both at completion)
_COMPLETION_SLACK_NS = 50_000_000

#: Lower-case substrings of error texts that mean "the transport (peer, socket) failed".
#: gloo: "Connection closed by peer" (peer SIGKILLed), "Timed out waiting ...ms for recv
#: operation to complete" (timeout); NCCL: "NCCL communicator was aborted", watchdog.
TRANSPORT_MARKERS = ("connection closed by peer", "timed out waiting", "connection reset",
                     "broken pipe", "connection refused", "socket timeout",
                     "nccl communicator was aborted", "watchdog caught collective operation timeout",
                     "ncclremoteerror", "ncclsystemerror", "read error", "write error",
                     "no route to host", "peer closed", "ecconnreset", "econnreset")

_SEND = {"send": "send", "isend": "send", "recv": "recv", "irecv": "recv"}
# ops whose dtype/numel legitimately differ between ranks
_VARSIZE_OPS = frozenset(("all_gather_object", "gather_object", "broadcast_object_list",
                          "scatter_object_list", "all_to_all", "all_to_all_single", "gather",
                          "scatter", "batch_isend_irecv"))
_ROOTED_OPS = frozenset(("broadcast", "reduce", "gather", "scatter", "broadcast_object_list",
                         "gather_object", "scatter_object_list"))
_SIGNAL_CAUSES = {-15: "sigterm", -6: "fatal-signal", -11: "fatal-signal", -7: "fatal-signal",
                  -4: "fatal-signal", -8: "fatal-signal"}


def is_transport_error(text):
    """True when ``text`` (an error message) names a transport failure (see
    ``TRANSPORT_MARKERS``)."""
    if not text:
        return False
    t = str(text).lower()
    return any(m in t for m in TRANSPORT_MARKERS)


class _View:
    """What the analysis needs of one rank (built in one pass over its records)."""

    __slots__ = ("rank", "proc", "last", "p2p", "blocked", "blocked_failed", "last_wall",
                 "activity_wall", "last_rec", "failed", "dead", "cause", "cause_text", "victim", "fail_wall",
                 "phase", "step", "nrec", "mem")

    def __init__(self, rank, proc):
        self.rank, self.proc = rank, proc
        self.last, self.p2p = {}, {}
        self.blocked = None
        self.blocked_failed = False
        self.last_wall = 0
        self.activity_wall = 0
        self.last_rec = None
        self.failed = None
        self.dead = False
        self.cause = self.cause_text = None
        self.victim = False
        self.fail_wall = 0
        self.phase = self.step = None
        self.nrec = 0
        self.mem = None  # memory attribution (tracer.memory.attribute), issue 5


def _index(rank, proc):
    v = _View(rank, proc)
    last, p2p = v.last, v.p2p
    lastcp = None
    first_failed = None
    last_wall = 0
    recs = proc.records or ()
    for rec in recs:
        kind = rec.get("kind")
        if kind == "collective":
            g = rec.get("group")
            cur = last.get(g)
            if cur is None or rec.get("seq", 0) >= cur.get("seq", 0):
                last[g] = rec
            lastcp = rec
            if first_failed is None and rec.get("state") == "failed":
                first_failed = rec
        elif kind == "p2p":
            k = (rec.get("group"), rec.get("peer"))
            cur = p2p.get(k)
            if cur is None or rec.get("seq", 0) >= cur.get("seq", 0):
                p2p[k] = rec
            lastcp = rec
            if first_failed is None and rec.get("state") == "failed":
                first_failed = rec
    activity = 0
    prog = proc.progress_wall_ns or 0
    if recs:
        lr = recs[-1]
        v.last_rec = lr
        last_wall = lr.get("t_wall_ns") or 0
        activity = last_wall
        # progress stamped by the completion of the last record is not new activity
        if prog and not (lr.get("state") in ("completed", "failed")
                         and prog <= _rec_fail_wall(lr) + _COMPLETION_SLACK_NS):
            activity = max(activity, prog)
    else:
        activity = prog
    v.nrec = len(recs)
    v.last_wall = max(last_wall, prog)
    v.activity_wall = activity
    v.failed = first_failed
    inf = proc.inflight
    if isinstance(inf, dict) and inf.get("kind") in ("collective", "p2p") and inf.get("state", "issued") == "issued":
        v.blocked = inf
    elif lastcp is not None:
        st = lastcp.get("state")
        if st == "issued" and not lastcp.get("async_op"):
            v.blocked = lastcp
        elif st == "failed" and is_transport_error(lastcp.get("error")):
            v.blocked = lastcp
            v.blocked_failed = True
    v.phase = proc.phase if proc.phase is not None else (v.last_rec or {}).get("phase")
    v.step = proc.step if proc.step is not None else (v.last_rec or {}).get("step")
    _death(v)
    return v


def _death_after(v, start):
    """True when dead rank ``v`` provably lived on after ``start`` (ns): its death time
    is exact (signal dump, exception, exit record) and later, or - for a death without a
    record, whose time is only a lower bound - it issued something after ``start``
    (the completion of its last collective does not count)."""
    if v.cause == "killed-without-record" or (v.mem or {}).get("base_cause") == "killed-without-record":
        return bool(v.activity_wall and v.activity_wall > start)
    return bool(v.fail_wall and v.fail_wall > start)


#: A culprit that died within this many ns of the moment the others began waiting for it
#: died *into* the hang (killed mid-step just after issuing its collective): the death is
#: the root. Later deaths of a hung culprit (a user's kill of a stuck job) leave the hang
#: verdict standing.
DIED_INTO_HANG_NS = 2_000_000_000


def _died_soon_after(v, start):
    last = max(v.activity_wall or 0, v.fail_wall or 0)
    return bool(last) and last - start < DIED_INTO_HANG_NS


def _rec_fail_wall(rec):
    if not rec:
        return 0
    w = rec.get("t_wall_ns") or 0
    end, start = rec.get("t_end_mono_ns"), rec.get("t_mono_ns")
    if w and end and start and end >= start:
        return w + (end - start)
    return w


def _death(v):
    """Fill v.dead / cause / cause_text / victim / fail_wall from state, events, signals."""
    p = v.proc
    exc = None
    for e in p.events or ():
        if isinstance(e, dict) and e.get("event") == "exception":
            exc = e
            break
    code = p.exit_code
    dead = p.state == "killed" or (p.state == "exited" and code not in (0, None)) or exc is not None
    if not dead:
        return
    v.dead = True
    sig = p.signals or {}
    times = []
    if "sigterm" in sig or code == -15:
        v.cause = "sigterm"
        v.cause_text = "SIGTERM received (faulthandler dump present)" if "sigterm" in sig else "exit code -15"
        times.append((sig.get("sigterm") or {}).get("wall_ns") or 0)
    elif "fatal" in sig or code in _SIGNAL_CAUSES:
        v.cause = "fatal-signal"
        text = (sig.get("fatal") or {}).get("text") or ""
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        v.cause_text = first or "exit code %s" % code
        times.append((sig.get("fatal") or {}).get("wall_ns") or 0)
    elif exc is not None:
        v.cause = "exception"
        v.cause_text = "%s: %s" % (exc.get("type") or "Exception", (exc.get("message") or "").strip())
        v.victim = is_transport_error(exc.get("message"))
        times.append(exc.get("wall_ns") or 0)
    elif p.state == "exited" and code is not None:
        v.cause = "exit-code %d" % code
        v.cause_text = "exited with code %d" % code
        v.victim = bool(v.failed and is_transport_error(v.failed.get("error")))
    else:
        v.cause = "killed-without-record"
        v.cause_text = ("no exit record (SIGKILL, OOM kill, or stopped): the pid vanished without a "
                        "clean-exit record or signal dump (a SIGTERM leaves a stacks/sigterm-* "
                        "dump only where that folder is kept)")
        if code == -9:
            v.cause_text = "exit code -9 (SIGKILL; host OOM-kill or an external kill)"
        oom = [k for k, val in (p.meta or {}).items() if "oom" in str(k).lower() and val]
        if oom:
            v.cause_text += "; meta: %s" % ", ".join("%s=%s" % (k, p.meta[k]) for k in oom)
    if v.failed is not None:
        times.append(_rec_fail_wall(v.failed))
    if p.exit_wall_ns:
        times.append(p.exit_wall_ns)
    times = [t for t in times if t]
    v.fail_wall = min(times) if times else v.last_wall
    b = v.blocked
    if v.cause == "sigterm" and b is not None and times and v.fail_wall > (b.get("t_wall_ns") or 0):
        # SIGTERMed while waiting in a collective (e.g. the user stopped a hung job): a
        # victim of the hang, not its root
        v.victim = True
    _memory_cause(v)  # issue 5: host OOM-kill, Ray memory monitor, CUDA OOM, external SIGTERM


def _memory_cause(v):
    """Refine ``v.cause`` from memory evidence (tracer/analyze/memory.py); keeps the cause when the
    evidence supports no other. Never raises."""
    try:
        from hangtrace.tracer.analyze.memory import attribute
        att = attribute(v.proc, v.cause, v.cause_text)
    except Exception as e:  # a bug here must not cost the verdict
        v.mem = {"base_cause": v.cause, "evidence": ["memory attribution failed: %r" % (e,)]}
        return
    v.mem = att
    if att["cause"] != v.cause:
        v.cause, v.cause_text = att["cause"], att["cause_text"]


def _rk(rs, limit=12):
    """'rank 3' / 'ranks 0-2,5' for a rank list."""
    rs = list(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + format_ranks(rs, limit)


def _vb(rs, one="waits", many="wait"):
    return one if len(list(rs)) == 1 else many


def _ts(wall_ns):
    """ns since the epoch -> '2023-11-14T22:13:20.005Z' (UTC)."""
    if not wall_ns:
        return "?"
    sec, ns = divmod(int(wall_ns), 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + ".%03dZ" % (ns // 1_000_000)


def _sig(rec):
    op = rec.get("op")
    if op in _VARSIZE_OPS or rec.get("dtype") == "object":
        return (op, None, None, rec.get("peer") if op in _ROOTED_OPS else None)
    return (op, rec.get("dtype"), rec.get("numel"), rec.get("peer") if op in _ROOTED_OPS else None)


def _desc_rec(rec):
    s = "%s" % rec.get("op")
    if rec.get("dtype"):
        s += " %s" % rec.get("dtype")
    if rec.get("numel") is not None:
        s += " numel=%s" % rec.get("numel")
    if rec.get("shape"):
        s += " shape=%s" % rec.get("shape")
    if rec.get("peer") not in (None, -1):
        s += " peer=%s" % rec.get("peer")
    return s


def _where(rec):
    parts = []
    if rec.get("step") is not None:
        parts.append("step %s" % rec.get("step"))
    if rec.get("phase"):
        parts.append("phase %s" % rec.get("phase"))
    return ", ".join(parts)


#: Larger world sizes (and ranks) in a ring header are corrupt/implausible: ignored, so
#: that one bad header cannot make the analysis allocate per-rank structures unboundedly.
MAX_WORLD = 1 << 20
#: At most this many ranks without a record file are listed (``missing_ranks``).
MAX_MISSING_LISTED = 65536


def _plausible_world(ws):
    """``ws`` when it is a plausible world size (1..MAX_WORLD), else 0 (unknown)."""
    try:
        ws = int(ws)
    except (TypeError, ValueError):
        return 0
    return ws if 0 < ws <= MAX_WORLD else 0


class _Ctx:
    """Shared state of one diagnose() call."""

    def __init__(self, snapshot, now_wall_ns, stall_s):
        self.snap = snapshot
        self.views = {}
        self.evidence = []
        self.dups = []
        self.unranked = 0
        self.bad = []  # evidence lines: implausible rank/world_size in a ring header
        worlds = []
        valid = set()
        for p in snapshot.processes:
            ws = _plausible_world(p.world_size)
            if p.world_size is not None and p.world_size > MAX_WORLD:
                self.bad.append("process %s: implausible world_size %s in its ring header: ignored "
                                "(world size treated as unknown)" % (p.key, p.world_size))
            rank = p.rank
            if rank is not None and (rank < -1 or rank >= MAX_WORLD or (ws and rank >= ws)):
                self.bad.append("process %s: implausible rank %s%s in its ring header: "
                                "treated as unranked" % (p.key, rank, " (world size %d)" % ws if ws else ""))
                rank = None
            if rank is None or rank < 0:
                self.unranked += 1
                continue
            valid.add(p.key)
            if ws:
                worlds.append(ws)
        # issue 9: the process that joined a group as rank r is rank r; helpers that
        # inherited RANK (DataLoader workers, resource trackers) never stand for it
        self.roles = assign_roles([p for p in snapshot.processes if p.key in valid])
        chosen = dict(self.roles.ranks)
        for c in self.roles.claims:
            self.dups.append((c.rank, c.kind, c.kept, c.others))
        self.procs = chosen
        for r, p in chosen.items():
            self.views[r] = _index(r, p)
        self.world = max(worlds + [0])
        if self.views:
            self.world = max(self.world, max(self.views) + 1)
        self.groups = self._groups()
        # ranks of range(world) without a record file; at most MAX_MISSING_LISTED listed
        # (self.nmissing counts them all) - never a set of range(world)
        self.nmissing = max(0, self.world - len(self.views))
        self.nofile = []
        if self.nmissing:
            have = self.views
            for r in range(self.world):
                if r not in have:
                    self.nofile.append(r)
                    if len(self.nofile) >= MAX_MISSING_LISTED:
                        break
        times = [v.last_wall for v in self.views.values() if v.last_wall]
        self.last_progress = max(times) if times else 0
        self.now = now_wall_ns or snapshot.taken_wall_ns or self.last_progress
        self.age_s = (self.now - self.last_progress) / 1e9 if self.last_progress and self.now else None
        self.stall_s = DEFAULT_STALL_S if stall_s is None else stall_s
        self.stalled = snapshot.reason in ("stall",) or (self.age_s is not None and self.age_s >= self.stall_s)

    def _groups(self):
        groups = {}
        seen = {}
        for r, v in self.views.items():
            for g in v.last:
                seen.setdefault(g, []).append(r)
            for (g, _peer) in v.p2p:
                seen.setdefault(g, []).append(r)
        for p in self.procs.values():
            for gd in p.groups or ():
                if not isinstance(gd, dict) or gd.get("name") is None:
                    continue
                name = str(gd["name"])
                if name in groups and groups[name].get("ranks"):
                    continue
                ranks = gd.get("ranks")
                groups[name] = {"name": name, "desc": gd.get("desc"), "backend": gd.get("backend"),
                                "ranks": sorted(int(x) for x in ranks) if ranks else None,
                                "inferred": False, "order": gd.get("order")}
        for name, rs in seen.items():
            gd = groups.get(name)
            if gd is None:
                gd = groups[name] = {"name": name, "desc": None, "backend": None, "ranks": None,
                                     "inferred": True, "order": None}
            if not gd["ranks"]:
                if (name in ("0", "default_pg", "WORLD") or gd.get("desc") == "default_pg") and self.world:
                    gd["ranks"] = list(range(self.world))
                else:
                    gd["ranks"] = sorted(set(rs))
                    gd["inferred"] = True
        return groups

    def members(self, g):
        gd = self.groups.get(g)
        return gd["ranks"] if gd and gd["ranks"] else []

    def gdesc(self, g):
        gd = self.groups.get(g) or {}
        d = "group '%s'" % g
        if gd.get("desc") and gd.get("desc") != g:
            d += " (%s)" % gd["desc"]
        return d

    def add(self, line):
        self.evidence.append(line)


class _Inst:
    __slots__ = ("key", "group", "seq", "waiters", "missing", "behind", "nofile", "deadm",
                 "ahead", "at", "p2p", "peer", "mismatch", "start")

    def __init__(self, key, group, seq):
        self.key, self.group, self.seq = key, group, seq
        self.waiters = []
        self.missing = []
        self.behind, self.nofile, self.deadm, self.ahead, self.at = [], [], [], [], []
        self.p2p = False
        self.peer = None
        self.mismatch = None
        self.start = 0


def _build_instances(ctx):
    """Instances ranks are blocked in, with missing/ahead members and mismatches."""
    insts = {}
    inst_of = {}
    views = ctx.views
    for r, v in views.items():
        b = v.blocked
        if b is None or (v.dead and not v.victim):
            continue  # a dead rank waits for nobody: others wait for it
        g, s = b.get("group"), b.get("seq") or 0
        if b.get("kind") == "p2p":
            key = ("p", g, s, r, b.get("peer"))
            inst = insts[key] = _Inst(key, g, s)
            inst.p2p = True
            inst.peer = b.get("peer")
        else:
            key = ("c", g, s)
            inst = insts.get(key)
            if inst is None:
                inst = insts[key] = _Inst(key, g, s)
        inst.waiters.append(r)
        t = b.get("t_wall_ns") or 0
        if t and (not inst.start or t < inst.start):
            inst.start = t
        inst_of[r] = inst
    for inst in insts.values():
        if inst.p2p:
            _fill_p2p(ctx, inst)
        else:
            _fill_coll(ctx, inst)
    return insts, inst_of


def _fill_coll(ctx, inst):
    g, s = inst.group, inst.seq
    views = ctx.views
    waiting = set(inst.waiters)
    sigs = {}
    for m in ctx.members(g) or inst.waiters:
        v = views.get(m)
        if v is None:
            inst.nofile.append(m)
            continue
        if m in waiting:
            rec = v.blocked
        else:
            rec = v.last.get(g)
            if rec is None or (rec.get("seq") or 0) < s:
                inst.behind.append(m)
                continue
            if (rec.get("seq") or 0) > s:
                inst.ahead.append(m)
                continue
        inst.at.append(m)
        if v.dead and not v.victim:
            inst.deadm.append(m)
        sigs.setdefault(_sig(rec), []).append(m)
    inst.missing = inst.behind + inst.nofile + inst.deadm
    if len(sigs) > 1:
        inst.mismatch = sigs


def _fill_p2p(ctx, inst):
    g, s = inst.group, inst.seq
    w = inst.waiters[0]
    peer = inst.peer
    v = ctx.views.get(peer)
    if v is None:
        inst.nofile.append(peer)
    else:
        rec = v.p2p.get((g, w))
        if rec is None or (rec.get("seq") or 0) < s:
            inst.behind.append(peer)
        elif (rec.get("seq") or 0) > s:
            inst.ahead.append(peer)
        else:
            inst.at.append(peer)
            mine = ctx.views[w].blocked
            d1, d2 = _SEND.get(mine.get("op")), _SEND.get(rec.get("op"))
            bad = (d1 and d2 and d1 == d2) or (
                mine.get("numel") != rec.get("numel") or mine.get("dtype") != rec.get("dtype"))
            if (bad and peer != w and mine.get("op") != "batch_isend_irecv"
                    and rec.get("op") != "batch_isend_irecv"):
                # one side each (keys differ by rank even when both sides sent)
                inst.mismatch = {_sig(mine) + (d1, w): [w], _sig(rec) + (d2, peer): [peer]}
            if v.dead and not v.victim:
                inst.deadm.append(peer)
    inst.missing = inst.behind + inst.nofile + inst.deadm


def _tarjan(adj, starts):
    """Strongly connected components (size > 1) reachable from ``starts``; iterative."""
    index = {}
    low = {}
    onstack = set()
    stack = []
    out = []
    counter = 0
    for s in starts:
        if s in index:
            continue
        work = [(s, iter(adj.get(s, ())))]
        index[s] = low[s] = counter
        counter += 1
        stack.append(s)
        onstack.add(s)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    onstack.add(nxt)
                    work.append((nxt, iter(adj.get(nxt, ()))))
                    advanced = True
                    break
                elif nxt in onstack:
                    if index[nxt] < low[node]:
                        low[node] = index[nxt]
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                if low[node] < low[parent]:
                    low[parent] = low[node]
            if low[node] == index[node]:
                comp = []
                while True:
                    x = stack.pop()
                    onstack.discard(x)
                    comp.append(x)
                    if x == node:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def _wrapper_frame(f):
    """True for call-forwarding wrappers that say nothing about the program: hangtrace's
    own hooks (``hangtrace/hooks/*.py``) and torch's c10d logging decorators
    (``torch/distributed/c10d_logger.py``: ``_exception_logger``/``_time_logger``)."""
    fn = (f.get("filename") or "").replace("\\", "/")
    if "/hangtrace/hooks/" in fn:
        return True
    if fn.endswith("ray/util/tracing/tracing_helper.py"):  # Ray's actor-method span wrapper (issue 4)
        return True
    return fn.endswith("torch/distributed/c10d_logger.py") and "wrapper" in (f.get("name") or "")


def _frames_of(ctx, r):
    """(display labels, raw frames, active) of rank ``r``'s analysed thread; the labels
    skip wrapper frames (``_wrapper_frame``), so they start at the torch.distributed op
    or the blocking call and go on into the user's code."""
    p = ctx.procs.get(r)
    if p is None:
        return [], None, None
    frames, thread = process_frames(p)
    frames = frames or []
    shown = [f for f in frames if not _wrapper_frame(f)] or frames
    return [frame_label(f) for f in shown[:MAX_FRAMES]], frames, (thread or {}).get("active")


def _classify_end(ctx, r, insts_for):
    """Kind and reason for a chain-end rank ``r`` that others wait for (see module doc)."""
    v = ctx.views[r]
    p = v.proc
    start = min([i.start for i in insts_for if i.start] or [0])
    later = ""
    if v.dead and not v.victim:
        if not (start and _death_after(v, start)):
            return "dead-rank", "died: %s" % v.cause_text
        later = " (killed later: %s)" % v.cause
    kind, why = _classify_alive(ctx, r, insts_for, start)
    return kind, why + later


def _classify_alive(ctx, r, insts_for, start):
    v = ctx.views[r]
    p = v.proc
    if p.state == "exited" and not v.dead:
        return "skipped-collective", "exited cleanly (code %s) without entering it" % p.exit_code
    labels, frames, active = _frames_of(ctx, r)
    if frames:
        coll = collective_frame(frames)
        if coll:
            return "skipped-collective", "its stack is inside %s, a collective hangtrace did not record" % coll
        why = blocking_reason(frames, active)
        if why:
            return "stuck-outside-collective", "blocked outside collectives: %s" % why
    wsteps = set()
    wphases = set()
    for i in insts_for:
        for w in i.waiters[:64]:
            b = ctx.views[w].blocked
            if b.get("step") is not None:
                wsteps.add(b.get("step"))
            if b.get("phase"):
                wphases.add(b.get("phase"))
    if start and v.activity_wall > start:
        return "skipped-collective", "moved on: recorded activity after the others began waiting"
    if v.step is not None and wsteps and v.step > max(wsteps):
        return "skipped-collective", "moved on to step %s (waiters are at step %s)" % (
            v.step, format_ranks(wsteps))
    if v.phase and wphases and v.phase not in wphases:
        return "skipped-collective", "moved on to phase %s (waiters are in %s)" % (
            v.phase, ", ".join(sorted(wphases)))
    if frames:
        return "stuck-outside-collective", "not in any collective and no progress since the others began waiting; running %s" % labels[0]
    return "stuck-outside-collective", "not in any collective and no progress since the others began waiting (no stack)"


def _rank_line(ctx, r, g):
    """'rank 1: last all_reduce on group 'cp' seq 7 completed at step 3, phase train'."""
    v = ctx.views.get(r)
    if v is None:
        return "rank %d: no record file (state unknown)" % r
    rec = v.last.get(g)
    if rec is None:
        s = "rank %d: no collective on %s in its last %d records" % (r, ctx.gdesc(g), v.nrec)
    else:
        s = "rank %d: last %s on %s seq %s %s" % (r, rec.get("op"), ctx.gdesc(g), rec.get("seq"),
                                               rec.get("state"))
        w = _where(rec)
        if w:
            s += " at " + w
    s += "; now %s" % v.proc.state
    if v.phase or v.step is not None:
        s += ", phase %s step %s" % (v.phase, v.step)
    return s


def _inst_text(ctx, inst):
    if inst.p2p:
        return "p2p on %s pair seq %s with rank %s" % (ctx.gdesc(inst.group), inst.seq, inst.peer)
    return "%s seq %s" % (ctx.gdesc(inst.group), inst.seq)


def _fill_common(ctx, d, culprits, inst):
    """Group/seq/op/phase/step/frames of the verdict from the main instance and culprit."""
    d.culprit_ranks = sorted(set(culprits))
    if inst is not None:
        d.group = inst.group
        d.group_ranks = list(ctx.members(inst.group)) or None
        d.details["group_desc"] = (ctx.groups.get(inst.group) or {}).get("desc")
        d.seq = inst.seq
        w = inst.waiters[0] if inst.waiters else None
        if w is not None:
            d.op = ctx.views[w].blocked.get("op")
    if d.culprit_ranks:
        c = d.culprit_ranks[0]
        v = ctx.views.get(c)
        if v is not None:
            d.phase, d.step = v.phase, v.step
            labels, _frames, _a = _frames_of(ctx, c)
            d.frames = labels


def _chain(ctx, inst_of, insts, culprit):
    """Longest wait chain ending at ``culprit``: [(rank, inst or None), ...]."""
    # reverse BFS: culprit <- instances that miss it <- their waiters <- ...
    rev = {}
    for inst in insts.values():
        for m in inst.missing:
            rev.setdefault(m, []).append(inst)
    parent = {culprit: None}
    frontier = [culprit]
    last = culprit
    steps = 0
    while frontier and steps < 64:
        nxt = []
        for m in frontier:
            for inst in rev.get(m, ()):
                for w in inst.waiters:
                    if w not in parent:
                        parent[w] = m
                        nxt.append(w)
        if nxt:
            last = min(nxt)
        frontier = nxt
        steps += 1
    out = []
    r = last
    while r is not None:
        out.append((r, inst_of.get(r)))
        r = parent[r]
    return out


def _chain_text(ctx, chain):
    parts = []
    for r, inst in chain:
        if inst is None:
            parts.append("rank %d (not in a collective)" % r if r in ctx.views else "rank %d (no record file)" % r)
        else:
            op = ctx.views[r].blocked.get("op")
            parts.append("rank %d waits in %s %s" % (r, _inst_text(ctx, inst), op))
    return "wait chain: " + " -> ".join(parts)


def _stall_note(ctx):
    if ctx.age_s is None:
        return None
    return "last progress anywhere %.1f s before the snapshot%s" % (
        ctx.age_s, "" if ctx.stalled else " (below the %.0f s stall threshold: may still move)" % ctx.stall_s)


def _mismatch_verdict(ctx, inst, d):
    sigs = inst.mismatch
    sizes = sorted(((len(rs), k) for k, rs in sigs.items()), key=lambda x: -x[0])
    top = sizes[0][0]
    tied = [k for n, k in sizes if n == top]
    if len(tied) > 1:
        culprits = [r for rs in sigs.values() for r in rs]
        tie_note = "no majority: %d signatures with %d rank(s) each; naming all" % (len(tied), top)
    else:
        culprits = [r for k, rs in sigs.items() if k != tied[0] for r in rs]
        tie_note = None
    if not culprits:
        culprits = [r for rs in sigs.values() for r in rs]
    d.kind = "collective-mismatch"
    _fill_common(ctx, d, culprits, inst)
    c0 = d.culprit_ranks[0]
    rec_c = ctx.views[c0].blocked if c0 in inst.waiters else (
        ctx.views[c0].p2p.get((inst.group, inst.waiters[0])) if inst.p2p else ctx.views[c0].last.get(inst.group))
    d.op = (rec_c or {}).get("op") or d.op
    d.cause = "mismatch"
    where = {}
    for k, rs in sorted(sigs.items(), key=lambda kv: -len(kv[1])):
        r0 = rs[0]
        v = ctx.views[r0]
        if inst.p2p:
            rec = v.blocked if r0 in inst.waiters else v.p2p.get((inst.group, inst.waiters[0]))
        else:
            rec = v.blocked if r0 in inst.waiters else v.last.get(inst.group)
        where[k] = ((rec or {}).get("phase"), (rec or {}).get("step"))
        ctx.add("%s at %s: %s (%s)%s%s" % (_rk(rs, 8), _inst_text(ctx, inst), _desc_rec(rec),
                                           rec.get("state"), " in " + _where(rec) if _where(rec) else "",
                                           " [minority]" if set(rs) & set(culprits) and not tie_note else ""))
    if tie_note:
        ctx.add(tie_note)
    if inst.behind or inst.nofile:
        ctx.add("also not at this seq: behind %s; no file %s" % (format_ranks(inst.behind, 8),
                                                                  format_ranks(inst.nofile, 8)))
    d.details["signatures"] = [{"op": k[0], "dtype": k[1], "numel": k[2], "peer": k[3],
                                "ranks": sorted(rs), "phase": where.get(k, (None, None))[0],
                                "step": where.get(k, (None, None))[1]} for k, rs in sigs.items()]
    return d


def diagnose(snapshot, now_wall_ns=None, stall_s=None):
    """Diagnose ``snapshot`` (a ``model.Snapshot``); return a ``model.Diagnosis``.

    ``now_wall_ns``: "now" for ages (ns since the epoch); default the snapshot's
    ``taken_wall_ns``, else the newest time in the records. ``stall_s``: seconds without
    progress anywhere after which "everybody inside one collective" is a stall rather than
    'progressing' (default 300, the watcher's default). Pure: no I/O; never raises on odd
    records (missing keys read as None). See the module docstring for the rules.
    """
    ctx = _Ctx(snapshot, now_wall_ns, stall_s)
    d = Diagnosis(kind="unknown")
    d.errors = list(snapshot.errors or [])
    d.details["world_size"] = ctx.world
    d.details["ranks_with_records"] = len(ctx.views)
    d.details["missing_ranks"] = ctx.nofile
    d.details["last_progress_wall_ns"] = ctx.last_progress
    d.details["last_progress_age_s"] = ctx.age_s
    d.details["stalled"] = ctx.stalled

    if not ctx.views:
        d.kind = "unknown"
        d.cause = "no-data"
        d.summary = "No traced process with a rank in the snapshot%s." % (
            " (%d unreadable file(s), see errors)" % len(d.errors) if d.errors else "")
        ctx.add("%d process(es), %d without a rank" % (len(snapshot.processes), ctx.unranked))
        for ln in ctx.bad[:10]:
            ctx.add(ln)
        return _finish(ctx, d)

    for ln in ctx.bad[:10]:
        ctx.add(ln)
    if len(ctx.bad) > 10:
        ctx.add("... %d more processes with an implausible rank/world size" % (len(ctx.bad) - 10))
    if ctx.nofile:
        ctx.add("%s: no record file (world size %d): not traced, or file lost/unreadable"
                % ((_rk(ctx.nofile, 12) if ctx.nmissing == len(ctx.nofile) else
                    "%d ranks (first: %s)" % (ctx.nmissing, format_ranks(ctx.nofile[:12], 12))), ctx.world))
    for r, kind, kept, others in ctx.dups[:5]:
        if kind == "restart":
            ctx.add("rank %d: restarted (earlier process %s); the newest, %s, is analysed"
                    % (r, ", ".join(others), kept))
        else:
            ctx.add("rank %d: several live processes joined as this rank (%s and %s): conflicting "
                    "launches; %s is analysed" % (r, ", ".join(others), kept, kept))

    tree = merge_stacks(ctx.procs[r] for r in sorted(ctx.procs))
    if tree.ranks:
        d.stack_classes = stack_classes_of(tree)
        miss = missing_from_common_frame(tree)
        if miss:
            d.details["missing_from_common_frame"] = miss
    insts, inst_of = _build_instances(ctx)
    hang = _hang(ctx, insts, inst_of)  # (Diagnosis-like dict) or None
    stopped = _stopped_after_stall(ctx) if hang is None or hang["kind"] == "dead-rank" else None
    if stopped is not None:
        # every rank was killed at about the same time long after its last progress: the
        # job was stopped because it hung; the hang is the verdict, the deaths cascade
        for v in ctx.views.values():
            v.victim = True
        i2, o2 = _build_instances(ctx)
        h2 = _hang(ctx, i2, o2)
        if h2 is not None and h2["kind"] != "dead-rank":
            insts, inst_of, hang = i2, o2, h2
            ctx.add("every rank died within %.0f s, at least %.0f s after its last progress: the job was "
                    "stopped after it hung; the deaths are listed as cascade" % stopped[:2])
        else:
            for r, was in stopped[2].items():
                ctx.views[r].victim = was
    d.waiting_ranks = sorted(inst_of)
    dead = [v for v in ctx.views.values() if v.dead]
    roots = sorted((v for v in dead if not v.victim), key=lambda v: (v.fail_wall or 0, v.rank))
    failures = _failures(ctx)

    if roots:
        root = roots[0]
        hang_wins = (hang is not None and hang["kind"] != "dead-rank"
                     and (hang["kind"] != "chain" or hang["kinds"].get(root.rank, ("",))[0] != "dead-rank")
                     and hang.get("start") and _death_after(root, hang["start"])
                     and not (root.rank in hang.get("culprits", ()) and _died_soon_after(root, hang["start"])))
        if not hang_wins:
            return _finish(ctx, _dead_verdict(ctx, d, root, roots, failures, insts, inst_of))
        ctx.add("rank %d died (%s) after the hang had begun: listed as cascade" % (root.rank, root.cause))
    if hang is not None:
        _apply_hang(ctx, d, hang, insts, inst_of)
        d.cascade = [c for c in failures if c["rank"] not in d.culprit_ranks]
        return _finish(ctx, d)
    if failures:
        return _finish(ctx, _transport_verdict(ctx, d, failures))
    return _finish(ctx, _idle_verdict(ctx, d, insts, tree))


#: "Stopped after a stall": every rank dead within this window (s) ...
STOPPED_WINDOW_S = 30.0
#: ... and each at least this long (s) after its last progress.
STOPPED_GAP_S = 60.0
_PROGRESS_KINDS = ("collective", "p2p", "step", "phase_enter", "phase_exit", "group")


def _stopped_after_stall(ctx):
    """``(spread_s, min_gap_s, {rank: victim})`` when every rank died without an exception
    or exit code (killed without record / SIGTERM) within STOPPED_WINDOW_S of each other,
    each at least STOPPED_GAP_S after its last progress (its records show it alive: memory
    samples, progress stamps, dumps); else None."""
    vs = list(ctx.views.values())
    if len(vs) < 2 or not all(v.dead for v in vs):
        return None
    alive_at, gaps = [], []
    for v in vs:
        base = (v.mem or {}).get("base_cause") or v.cause
        if base not in ("killed-without-record", "sigterm"):
            return None
        recs = v.proc.records or ()
        prog = max([r.get("t_wall_ns") or 0 for r in recs if r.get("kind") in _PROGRESS_KINDS] or [0])
        seen = max([v.last_wall or 0, v.proc.exit_wall_ns or 0]
                   + [(x or {}).get("wall_ns") or 0 for x in (v.proc.signals or {}).values()])
        if not prog or not seen:
            return None
        alive_at.append(seen)
        gaps.append((seen - prog) / 1e9)
    spread = (max(alive_at) - min(alive_at)) / 1e9
    if spread > STOPPED_WINDOW_S or min(gaps) < STOPPED_GAP_S or spread > min(gaps) / 2:
        return None
    return spread, min(gaps), {v.rank: v.victim for v in vs}


def _failures(ctx):
    """Every failure: dead ranks and ranks with a failed collective/p2p record, by time."""
    out = []
    for r, v in ctx.views.items():
        if v.dead:
            out.append({"rank": r, "cause": v.cause, "wall_ns": v.fail_wall, "text": v.cause_text,
                        "victim": v.victim})
        elif v.failed is not None:
            err = v.failed.get("error") or ""
            out.append({"rank": r, "cause": "transport-error" if is_transport_error(err) else "collective-failed",
                        "wall_ns": _rec_fail_wall(v.failed), "text": err[:300], "victim": is_transport_error(err),
                        "group": v.failed.get("group"), "seq": v.failed.get("seq"), "op": v.failed.get("op")})
    out.sort(key=lambda c: (c["wall_ns"] or 0, c["rank"]))
    return out


def _dead_verdict(ctx, d, root, roots, failures, insts, inst_of):
    d.kind = "dead-rank"
    d.cause = root.cause
    d.details["cause_text"] = root.cause_text
    d.details["fail_wall_ns"] = root.fail_wall
    # the instance others wait in for the root, if any
    inst = None
    for i in insts.values():
        if root.rank in i.missing and (inst is None or len(i.waiters) > len(inst.waiters)):
            inst = i
    _fill_common(ctx, d, [root.rank], inst)
    if inst is not None:
        d.details["direct_waiters"] = sorted(inst.waiters)
    if inst is None:
        b = root.blocked or root.last_rec
        if root.last:
            g = max(root.last.items(), key=lambda kv: kv[1].get("idx") or 0)[0]
            rec = root.last[g]
            d.group, d.group_ranks, d.seq, d.op = g, list(ctx.members(g)) or None, rec.get("seq"), rec.get("op")
        elif b:
            d.op = b.get("op")
    p = root.proc
    ctx.add("rank %d (%s): %s; cause %s: %s" % (root.rank, p.key, p.state + (
        " exit code %s" % p.exit_code if p.exit_code is not None else ""), root.cause, root.cause_text))
    if root.fail_wall:
        ctx.add("rank %d failed first (at %s%s)" % (
            root.rank, _ts(root.fail_wall), ", its last sign of life" if (root.mem or {}).get("base_cause", root.cause)
            == "killed-without-record" else ""))
    if d.group is not None:
        ctx.add(_rank_line(ctx, root.rank, d.group))
    if inst is not None:
        ctx.add("%s %s at %s for it" % (_rk(inst.waiters), _vb(inst.waiters), _inst_text(ctx, inst)))
    d.cascade = [c for c in failures if c["rank"] != root.rank]
    if d.cascade:
        vict = [c for c in d.cascade if c.get("victim")]
        ctx.add("%d later failure(s) (cascade)%s: first rank %d (%s)" % (
            len(d.cascade), ", %d transport error(s)" % len(vict) if vict else "",
            d.cascade[0]["rank"], (d.cascade[0]["text"] or d.cascade[0]["cause"])[:120]))
    if len(roots) > 1:
        ctx.add("other non-transport deaths after the root: ranks %s" % format_ranks([v.rank for v in roots[1:]], 12))
    return d


def _transport_verdict(ctx, d, failures):
    first = failures[0]
    d.kind = "transport-error"
    t0 = first["wall_ns"]
    culprits = [c["rank"] for c in failures if c["wall_ns"] == t0]
    _fill_common(ctx, d, culprits, None)
    d.group, d.seq, d.op = first.get("group"), first.get("seq"), first.get("op")
    if d.group is not None:
        d.group_ranks = list(ctx.members(d.group)) or None
    d.cause = "transport-error"
    d.details["cause_text"] = first["text"]
    ctx.add("rank %d failed first: %s on %s seq %s: %s" % (first["rank"], first.get("op"), ctx.gdesc(first.get("group")),
                                                         first.get("seq"), (first["text"] or "")[:200]))
    d.cascade = [c for c in failures if c["rank"] not in culprits]
    if d.cascade:
        ctx.add("%d more rank(s) failed later: %s" % (len(d.cascade), format_ranks([c["rank"] for c in d.cascade], 12)))
    ctx.add("no rank is dead: the transport (network, peer socket, timeout) failed; check the hosts' network "
            "and the peer named in the error")
    return d


def _idle_verdict(ctx, d, insts, tree):
    note = _stall_note(ctx)
    if insts:
        busy = sorted(insts.values(), key=lambda i: -len(i.waiters))[0]
        if not ctx.stalled:
            d.kind = "progressing"
            d.cause = None
            ctx.add("every waiting rank is in a collective all its members entered (e.g. %s, ranks %s)"
                    % (_inst_text(ctx, busy), format_ranks(busy.waiters, 8)))
        else:
            d.kind = "unknown"
            d.cause = "stalled-inside-collective"
            _fill_common(ctx, d, [], busy)
            ctx.add("all members of %s entered it (ranks %s) and it does not complete: a transport or "
                    "in-kernel stall; take native stacks (py-spy --native) of these ranks"
                    % (_inst_text(ctx, busy), format_ranks(busy.waiters, 8)))
    else:
        if not ctx.stalled:
            d.kind = "progressing"
            ctx.add("no rank is blocked in a collective or p2p op")
        else:
            d.kind = "unknown"
            d.cause = "stalled-outside-collectives"
            ctx.add("no rank is in a collective, yet nothing progressed: every rank waits outside "
                    "collectives (queue, IO, Ray); see the stack classes")
            outl = [c for c in d.stack_classes if c.get("outlier")]
            for c in outl[:3]:
                ctx.add("outlier stack (ranks %s): %s" % (format_ranks(c["ranks"], 8), " > ".join(c["frames"][-3:])))
    if note:
        ctx.add(note)
    return d


def _hang(ctx, insts, inst_of):
    """Hang analysis over the wait-for graph; returns a dict or None (nobody stuck on anyone)."""
    if not insts:
        return None
    # 1. frontier mismatch
    mism = [i for i in insts.values() if i.mismatch]
    if mism:
        main = max(mism, key=lambda i: (len(i.waiters), -(i.start or 0)))
        return {"kind": "collective-mismatch", "inst": main, "others": [i for i in mism if i is not main],
                "culprits": [], "start": main.start}
    # 2. graph: rank node = ('r', rank), instance node = inst key
    adj = {}
    for r, inst in inst_of.items():
        adj[("r", r)] = (inst.key,)
    for inst in insts.values():
        if inst.missing:
            adj[inst.key] = [("r", m) for m in inst.missing]
    starts = [("r", r) for r in sorted(inst_of)]
    sccs = _tarjan(adj, starts)
    if sccs:
        comp = max(sccs, key=len)
        ranks = sorted(n[1] for n in comp if n[0] == "r")
        cinsts = [insts[n] for n in comp if n[0] != "r"]
        extra = _extra_collective(ctx, cinsts)
        if extra is not None:
            extra["cycle_ranks"] = ranks
            return extra
        return {"kind": "cross-group-deadlock", "cycle_ranks": ranks, "cycle_insts": cinsts,
                "culprits": ranks, "start": min([i.start for i in cinsts if i.start] or [0]),
                "ncycles": len(sccs)}
    # 3. chain ends reachable from waiters
    reach = set()
    stack = list(inst_of)
    ends = set()
    while stack:
        r = stack.pop()
        if r in reach:
            continue
        reach.add(r)
        inst = inst_of.get(r)
        if inst is None:
            ends.add(r)
            continue
        for m in inst.missing:
            if m not in reach:
                stack.append(m)
    waited = set()
    for inst in insts.values():
        waited.update(inst.missing)
    ends &= waited
    # blocked ranks whose instance has only *ahead* members missing (diverged sequence)
    diverged = [r for r, i in inst_of.items()
                if r in reach and not i.missing and i.ahead and (r in waited or not waited)]
    present_ends = sorted(e for e in ends if e in ctx.views)
    if not present_ends and not diverged:
        nofile_ends = sorted(e for e in ends if e not in ctx.views)
        if nofile_ends:
            return {"kind": "unknown", "culprits": nofile_ends, "nofile": True,
                    "start": min([i.start for i in insts.values() if i.start] or [0])}
        return None
    if not present_ends:
        return {"kind": "collective-mismatch", "diverged": diverged, "culprits": diverged,
                "start": min([inst_of[r].start for r in diverged if inst_of[r].start] or [0])}
    insts_for = {}
    for inst in insts.values():
        for m in inst.missing:
            if m in ctx.views and m in ends:
                insts_for.setdefault(m, []).append(inst)
    kinds = {}
    for e in present_ends:
        kinds[e] = _classify_end(ctx, e, insts_for.get(e, []))
    return {"kind": "chain", "ends": present_ends, "kinds": kinds, "insts_for": insts_for,
            "culprits": present_ends, "nofile_ends": sorted(e for e in ends if e not in ctx.views),
            "start": min([i.start for e in present_ends for i in insts_for.get(e, []) if i.start] or [0])}


_DESC_INDEX = re.compile(r"[_\-.:]?\d+$")
_NO_DESC = frozenset(("", "undefined", "default_pg"))


def _role_stem(desc):
    """'cp0' / 'cp_1' / 'cp' -> 'cp'; None for no usable description."""
    if not desc or str(desc) in _NO_DESC:
        return None
    stem = _DESC_INDEX.sub("", str(desc))
    return stem or None


def _disjoint(groups):
    seen = set()
    for gd in groups:
        rs = set(gd["ranks"])
        if seen & rs:
            return False
        seen |= rs
    return True


def _role_groups(ctx, g):
    """Names of the groups that play the same role as group ``g`` (``g`` included), or [].

    Same role: the same description once a trailing index is stripped ('cp0', 'cp1' ->
    'cp'); without usable descriptions, the run of groups created consecutively
    (``order``) with the same size as ``g``. Either way the groups must be pairwise
    disjoint (one group per rank, like the CP or DP groups of a mesh) and at least two.
    """
    gd = ctx.groups.get(g)
    if not gd or not gd.get("ranks") or len(gd["ranks"]) < 2:
        return []
    stem = _role_stem(gd.get("desc"))
    if stem is not None:
        same = [h for h in ctx.groups.values() if h.get("ranks") and _role_stem(h.get("desc")) == stem]
    elif gd.get("order") is not None:
        size = len(gd["ranks"])
        by_order = sorted((h for h in ctx.groups.values()
                           if h.get("ranks") and h.get("order") is not None and _role_stem(h.get("desc")) is None),
                          key=lambda h: h["order"])
        i = next(k for k, h in enumerate(by_order) if h["name"] == gd["name"])
        lo = hi = i
        while lo > 0 and len(by_order[lo - 1]["ranks"]) == size and by_order[lo - 1]["order"] == by_order[lo]["order"] - 1:
            lo -= 1
        while (hi + 1 < len(by_order) and len(by_order[hi + 1]["ranks"]) == size
               and by_order[hi + 1]["order"] == by_order[hi]["order"] + 1):
            hi += 1
        run = by_order[lo:hi + 1]
        # a run can hold several layouts back to back (CP groups, then DP groups): cut it
        # into blocks of consecutive groups that each partition the run's ranks
        union = set()
        for h in run:
            union |= set(h["ranks"])
        k = len(union) // size
        same = []
        if k >= 2 and len(run) % k == 0:
            for j in range(0, len(run), k):
                block = run[j:j + k]
                if any(h["name"] == gd["name"] for h in block):
                    same = block
        if not same or not _disjoint(same):
            same = [gd]   # greedy: the disjoint neighbours of g
            for h in run[i - lo + 1:]:
                if not _disjoint(same + [h]):
                    break
                same.append(h)
            for h in reversed(run[:i - lo]):
                if not _disjoint(same + [h]):
                    break
                same.insert(0, h)
    else:
        return []
    if len(same) < 2 or not _disjoint(same):
        return []
    return sorted(h["name"] for h in same)


def _role_counts(ctx, role):
    """{rank: (group, highest seq issued on its group of the role)} for ranks with a record file."""
    out = {}
    for h in role:
        for m in ctx.members(h):
            v = ctx.views.get(m)
            if v is None:
                continue
            rec = v.last.get(h)
            n = (rec.get("seq") or 0) if rec else 0
            b = v.blocked
            if b is not None and b.get("kind") == "collective" and b.get("group") == h:
                n = max(n, b.get("seq") or 0)
            out[m] = (h, n)
    return out


def _extra_collective(ctx, cinsts):
    """An apparent cycle explained by one rank's extra collective, or None.

    For each collective instance of the cycle whose missing members are *behind* (they
    never issued that seq): when the group belongs to a role (``_role_groups``, e.g. the
    CP groups cp0, cp1) and a strict majority of the role's ranks issued the same number
    N of collectives on their group of the role, while the waiter issued more and the
    members it waits for issued exactly N, the waiter issued an extra collective the
    others never issue (an extra micro-batch, an extra loop iteration): it is the
    culprit, and the cycle only arises because its peers moved on to other groups. A
    genuine cross-group deadlock (groups entered in opposite orders) has no such
    majority: every rank issues the same number of collectives per group.
    """
    found = []
    for inst in cinsts:
        if inst.p2p or not inst.behind or inst.nofile or inst.deadm:
            continue
        role = _role_groups(ctx, inst.group)
        if not role:
            continue
        counts = _role_counts(ctx, role)
        if len(counts) < 3:
            continue
        freq = {}
        for _h, n in counts.values():
            freq[n] = freq.get(n, 0) + 1
        base, nbase = max(freq.items(), key=lambda kv: (kv[1], -kv[0]))
        if nbase * 2 <= len(counts):
            continue
        waiters = [w for w in inst.waiters if counts.get(w, (None, 0))[1] > base]
        if not waiters or any(counts.get(b, (None, -1))[1] != base for b in inst.behind):
            continue
        found.append((inst, waiters, role, counts, base))
    if not found:
        return None
    inst, waiters, role, counts, base = max(found, key=lambda f: (len(ctx.members(f[0].group)), -(f[0].start or 0)))
    culprits = sorted(set(w for f in found for w in f[1]))
    return {"kind": "extra-collective", "inst": inst, "culprits": culprits, "role": role,
            "counts": counts, "base": base, "found": found, "start": inst.start}


def _extra_verdict(ctx, d, hang, inst_of):
    inst, role, counts, base = hang["inst"], hang["role"], hang["counts"], hang["base"]
    culprits = hang["culprits"]
    d.kind = "skipped-collective"
    d.cause = "extra-collective"
    _fill_common(ctx, d, culprits, inst)
    w = inst.waiters[0]
    op = ctx.views[w].blocked.get("op")
    d.op = op
    stem = _role_stem((ctx.groups.get(inst.group) or {}).get("desc"))
    role_name = stem or "same-role"
    peers = sorted(inst.behind)
    others = sorted(r for r, (h, _n) in counts.items() if h != inst.group)
    extra = {"role": role_name, "groups": [{"name": h, "desc": (ctx.groups.get(h) or {}).get("desc"),
                                            "ranks": list(ctx.members(h))} for h in role],
             "counts": {str(r): n for r, (_h, n) in sorted(counts.items())}, "majority_count": base,
             "culprit_counts": {str(r): counts[r][1] for r in culprits}, "peers": peers,
             "other_group_ranks": others, "op": op, "group_desc": ctx.gdesc(inst.group)}
    d.details["extra_collective"] = extra
    d.details["cycle"] = {"ranks": hang.get("cycle_ranks", []), "groups": sorted({f[0].group for f in hang["found"]}),
                          "explained_by": "extra-collective"}
    n_c = counts[culprits[0]][1]
    ctx.add("%s issued %d collective(s) on %s, %d more than %s on the same group (%d) and than %s "
            "on the other %s group(s) (%d each): an extra %s the others never issue"
            % (_rk(culprits, 8), n_c, ctx.gdesc(inst.group), n_c - base, _rk(peers, 8), base,
               _rk(others, 8) if others else "no rank", role_name, base, op))
    for b in peers[:3]:
        ctx.add(_rank_line(ctx, b, inst.group))
    # the rest of the apparent cycle is cascade of the extra collective
    for r in sorted(inst_of):
        if r in culprits:
            continue
        i = inst_of[r]
        ctx.add("rank %d waits in %s (%s) for %s (cascade)" % (
            r, _inst_text(ctx, i), ctx.views[r].blocked.get("op"), format_ranks(i.missing, 8) if i.missing else "nobody"))
    d.details["direct_waiters"] = sorted(r for r, i in inst_of.items() if set(i.missing) & set(culprits))
    d.details["culprit_kinds"] = {str(r): "skipped-collective" for r in culprits}
    d.details["culprit_reasons"] = {str(r): "issued an extra %s on %s (%d vs %d on its peers and on the other %s groups)"
                                    % (op, ctx.gdesc(inst.group), counts[r][1], base, role_name) for r in culprits}


def _apply_hang(ctx, d, hang, insts, inst_of):
    kind = hang["kind"]
    if kind == "extra-collective":
        _extra_verdict(ctx, d, hang, inst_of)
    elif kind == "collective-mismatch" and "inst" in hang:
        _mismatch_verdict(ctx, hang["inst"], d)
        for i in hang["others"][:5]:
            ctx.add("another mismatch: %s (ranks %s)" % (_inst_text(ctx, i), format_ranks(
                [r for rs in i.mismatch.values() for r in rs], 8)))
    elif kind == "collective-mismatch":
        rs = hang["diverged"]
        inst = inst_of[rs[0]]
        d.kind = kind
        d.cause = "sequence-diverged"
        _fill_common(ctx, d, rs, inst)
        ctx.add("%s %s at %s (%s), which %s already passed: their sequence numbers diverged "
                "(an extra or missing collective earlier on this group)"
                % (_rk(rs, 8), _vb(rs), _inst_text(ctx, inst), ctx.views[rs[0]].blocked.get("op"),
                   _rk(inst.ahead, 8)))
        for a in inst.ahead[:3]:
            ctx.add(_rank_line(ctx, a, inst.group))
    elif kind == "cross-group-deadlock":
        _deadlock_verdict(ctx, d, hang, inst_of)
    elif kind == "unknown":
        d.kind = "unknown"
        d.cause = "no-record-file"
        inst = max((i for i in insts.values() if set(i.missing) & set(hang["culprits"])),
                   key=lambda i: len(i.waiters))
        _fill_common(ctx, d, hang["culprits"], inst)
        ctx.add("%s %s at %s (%s) for %s, which left no record file: state unknown "
                "(not traced, or file lost); check them directly"
                % (_rk(inst.waiters), _vb(inst.waiters), _inst_text(ctx, inst),
                   ctx.views[inst.waiters[0]].blocked.get("op"), _rk(hang["culprits"])))
    else:
        _chain_verdict(ctx, d, hang, insts, inst_of)
    if hang.get("start"):
        d.details["hang_start_wall_ns"] = hang["start"]
    note = _stall_note(ctx)
    if note:
        ctx.add(note)


def _deadlock_verdict(ctx, d, hang, inst_of):
    ranks = hang["cycle_ranks"]
    cinsts = hang["cycle_insts"]
    parts = {}
    for r in ranks:
        parts.setdefault(inst_of[r].key, []).append(r)
    sizes = sorted(len(v) for v in parts.values())
    culprits = ranks
    minority = None
    if len(sizes) > 1 and sizes[0] < sizes[1]:
        minority = min(parts.values(), key=len)
        culprits = minority
    d.kind = "cross-group-deadlock"
    d.cause = "cycle"
    main = inst_of[culprits[0]]
    _fill_common(ctx, d, culprits, main)
    groups = sorted({i.group for i in cinsts})
    d.details["cycle"] = {"ranks": ranks, "groups": groups,
                          "instances": [{"group": i.group, "seq": i.seq, "waiters": sorted(i.waiters),
                                         "missing": sorted(i.missing), "p2p": i.p2p} for i in cinsts]}
    d.details["groups"] = groups
    for key, rs in sorted(parts.items(), key=lambda kv: len(kv[1])):
        i = inst_of[rs[0]]
        ctx.add("%s %s in %s (%s) for %s" % (
            _rk(rs, 8), _vb(rs), _inst_text(ctx, i), ctx.views[rs[0]].blocked.get("op"),
            _rk(i.missing, 8)))
    ctx.add("the waits form a cycle over %s: each side holds what the other needs "
            "(groups entered in different orders)" % ", ".join("'%s'" % g for g in groups))
    if minority is not None:
        ctx.add("%s: the minority side of the cycle, diverged from the others (cycle ranks %s)" % (
            _rk(minority, 8), format_ranks(ranks, 8)))
    if hang.get("ncycles", 1) > 1:
        ctx.add("%d separate cycles; the largest is shown" % hang["ncycles"])


def _chain_verdict(ctx, d, hang, insts, inst_of):
    ends = hang["ends"]
    kinds = hang["kinds"]
    insts_for = hang["insts_for"]
    # main instance: the one with most waiters that misses a chain end
    # main instance: the first collective a chain end failed to join (earliest wait start;
    # in program order the others block there first), then the one with most waiters
    main = None
    for e in ends:
        for i in insts_for.get(e, ()):
            if main is None or (i.start or _INF, -len(i.waiters)) < (main.start or _INF, -len(main.waiters)):
                main = i
    # minority flip: everyone missing moved on, and the waiters are fewer
    flip = False
    if main is not None and not main.p2p:
        miss_present = [m for m in main.missing if m in ctx.views]
        all_moved = miss_present and all(kinds.get(m, ("",))[0] == "skipped-collective" for m in miss_present)
        waited = set()
        for i in insts.values():
            waited.update(i.missing)
        if (all_moved and len(main.waiters) < len(main.missing) and not (set(main.waiters) & waited)
                and set(miss_present) <= set(ends)):
            flip = True
    if flip:
        d.kind = "skipped-collective"
        d.cause = "extra-collective"
        _fill_common(ctx, d, main.waiters, main)
        ctx.add("%s alone entered %s (%s); %s never called it and moved on: the minority "
                "took a different path (e.g. a rank-0-only checkpoint/barrier)" % (
                    _rk(main.waiters, 8), _inst_text(ctx, main),
                    ctx.views[main.waiters[0]].blocked.get("op"), _rk(main.missing, 8)))
        for m in main.missing[:3]:
            ctx.add(_rank_line(ctx, m, main.group) + " (%s)" % kinds[m][1] if m in kinds else _rank_line(ctx, m, main.group))
        d.details["culprit_kinds"] = {str(r): "skipped-collective" for r in main.waiters}
        return
    # kind: the kind of the end the most waiters wait for
    weight = {e: sum(len(i.waiters) for i in insts_for.get(e, ())) for e in ends}
    lead = max(ends, key=lambda e: (weight[e], -e))
    d.kind = kinds[lead][0]
    if d.kind == "dead-rank":
        d.cause = ctx.views[lead].cause
    _fill_common(ctx, d, ends, main)
    if main is not None:
        d.details["direct_waiters"] = sorted(main.waiters)
    d.details["culprit_kinds"] = {str(e): kinds[e][0] for e in ends}
    d.details["culprit_reasons"] = {str(e): kinds[e][1] for e in ends}
    if d.kind == "skipped-collective" and d.cause is None:
        d.cause = "skipped"
    elif d.kind == "stuck-outside-collective":
        d.cause = "blocked" if kinds[lead][1].startswith("blocked") else "no-progress"
    if main is not None:
        for e in ends[:6]:
            ctx.add(_rank_line(ctx, e, main.group) + "; %s %s at %s (%s)" % (
                _rk(main.waiters, 8), _vb(main.waiters), "seq %s" % main.seq if not main.p2p else "pair seq %s" % main.seq,
                ctx.views[main.waiters[0]].blocked.get("op")) if main.waiters else _rank_line(ctx, e, main.group))
    for e in ends[:6]:
        ctx.add("rank %d: %s" % (e, kinds[e][1]))
        labels, _f, _a = _frames_of(ctx, e)
        if labels:
            ctx.add("rank %d stack (innermost first): %s" % (e, " < ".join(labels[:4])))
    if len(ends) > 6:
        ctx.add("... and %d more chain-end ranks: %s" % (len(ends) - 6, format_ranks(ends[6:], 8)))
    ch = _chain(ctx, inst_of, insts, lead)
    if len(ch) > 2:
        ctx.add(_chain_text(ctx, ch))
    if hang.get("nofile_ends"):
        ctx.add("%s: waited for too, but left no record file" % _rk(hang["nofile_ends"], 8))
    if len(set(k for k, _ in kinds.values())) > 1:
        ctx.add("chain ends differ in kind: %s" % ", ".join("%d=%s" % (e, kinds[e][0]) for e in ends[:8]))


# --- Ray identity and Ray's own death record (issue 4; meta from hooks/ray_hooks.py and
# tracer/collect/raystate.join). Ray's text is reported as Ray's, beside the cause found above. ---
def _ray_actor(p):
    m = p.meta or {}
    if not (m.get("ray_actor_class") or m.get("ray_actor_name") or m.get("ray_actor_id")):
        return None
    return {"class": m.get("ray_actor_class"), "name": m.get("ray_actor_name") or None,
            "actor_id": m.get("ray_actor_id"), "node_id": m.get("ray_node_id"),
            "job_id": m.get("ray_job_id"), "pid": p.pid}


def _ray_label(a):
    return "%s%s" % (a.get("class") or "actor", " '%s'" % a["name"] if a.get("name") else "")


def _ray_details(ctx, d):
    actors = {}
    for r, p in ctx.procs.items():
        a = _ray_actor(p)
        if a is not None:
            actors[str(r)] = a
    if actors:
        d.details["ray_actors"] = actors
        d.details["culprit_actors"] = [dict(actors[str(r)], rank=r) for r in d.culprit_ranks if str(r) in actors]
        for a in d.details["culprit_actors"][:4]:
            ctx.add("rank %d is Ray actor %s (actor id %s, node %s, pid %d)" % (
                a["rank"], _ray_label(a), (a.get("actor_id") or "?")[:16], (a.get("node_id") or "?")[:12], a["pid"]))
    says = {}
    for r in list(d.culprit_ranks) + [c.get("rank") for c in d.cascade or ()]:
        p = ctx.procs.get(r)
        m = (p.meta or {}) if p is not None else {}
        if m.get("ray_death") and str(r) not in says:
            says[str(r)] = {"text": m["ray_death"], "actor_state": m.get("ray_actor_state"),
                            "exit_type": m.get("ray_exit_type"), "exit_detail": m.get("ray_exit_detail")}
    if says:
        d.details["ray_says"] = says
        for r in d.culprit_ranks[:4]:
            x = says.get(str(r))
            if x:
                ctx.add("rank %d: Ray says: %s%s" % (r, " ".join(str(x["text"]).split())[:400],
                                                    " [worker exit %s]" % x["exit_type"] if x.get("exit_type") else ""))
                if d.kind == "dead-rank":
                    ctx.add("rank %d: Ray's text is Ray's own record; the cause hangtrace's evidence supports "
                            "is '%s'" % (r, d.cause))
# --- end Ray ---


# --- memory (issue 5): ledger, trends, kept-across flags, attribution evidence ---
def _memory_details(ctx, d):
    """``details['memory']`` (tracer.memory.summarize) and memory evidence lines for the
    culprits. Skipped silently when no process sampled memory; never raises."""
    try:
        from hangtrace.tracer.analyze.memory import summarize
        focus = list(d.culprit_ranks) + [c.get("rank") for c in d.cascade or () if c.get("rank") not in d.culprit_ranks]
        atts = {r: ctx.views[r].mem for r in focus if r in ctx.views and ctx.views[r].mem}
        mem = summarize(ctx.procs, focus, atts)
    except Exception as e:
        ctx.add("memory analysis failed: %r" % (e,))
        return
    if mem is None:
        return
    d.details["memory"] = mem
    if d.kind == "dead-rank" and d.culprit_ranks:
        a = atts.get(d.culprit_ranks[0]) or {}
        c = a.get("cuda_oom") or {}
        if d.phase is None and c.get("phase"):  # the phase the OOM left, not the (empty) current one
            d.phase = c["phase"]
        if d.step is None and c.get("step") is not None:
            d.step = c["step"]
    lines = []
    for r in d.culprit_ranks[:4]:
        a = atts.get(r)
        if a:
            lines += ["rank %d: %s" % (r, e) for e in a.get("evidence") or ()]
    try:
        from hangtrace.tracer.analyze.memory import significant
        flags, trends = significant(mem, d.cause)
    except Exception:
        flags, trends = (), ()
    if flags or trends:  # small kept/grown bytes stay in details['memory'] (text report)
        lines += mem.get("evidence") or []
    for ln in lines[:10]:
        if ln not in ctx.evidence:
            ctx.add(ln)
# --- end memory ---


def _finish(ctx, d):
    _ray_details(ctx, d)  # issue 4
    _memory_details(ctx, d)  # issue 5
    for r in d.culprit_ranks[:4]:
        v = ctx.views.get(r)
        for e in (v.proc.events or ()) if v else ():
            if isinstance(e, dict) and e.get("event") == "thread_exception":
                ctx.add("rank %d: thread %s died earlier with %s: %s (a dead producer/helper thread?)" % (
                    r, e.get("thread") or "?", e.get("type") or "Exception", str(e.get("message") or "")[:160]))
    miss = d.details.get("missing_from_common_frame")
    if miss and miss["missing"] and len(miss["missing"]) <= 16:
        ctx.add("stacks: %d ranks share %s; ranks %s are not in it" % (
            miss["ranks_in"], miss["frames"][-1] if miss["frames"] else "?", format_ranks(miss["missing"], 8)))
    if d.culprit_ranks and d.waiting_ranks:
        cs = set(d.culprit_ranks)
        d.waiting_ranks = [r for r in d.waiting_ranks if r not in cs]
    ev = ctx.evidence
    if len(ev) > MAX_EVIDENCE:
        ev = ev[:MAX_EVIDENCE - 1] + ["... %d more evidence lines" % (len(ev) - MAX_EVIDENCE + 1)]
    d.evidence = ev
    from hangtrace.tracer.report.text import verdict_paragraph
    d.summary = verdict_paragraph(d)
    return d
