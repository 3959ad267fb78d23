"""Trace events of one traced process: slices, instants and counters (pure).

Per process (see ``docs/TIMELINE.md``):

* one thread track per recording thread: phase slices (nested as the phases nest),
  and inside them one slice per synchronous collective / p2p from issue to completion;
* async collectives (``async_op=True``) as async slices (they may outlive the phase);
* a ``steps`` thread track: one slice per step, from ``step(n)`` to the next step;
* instants for lifecycle events (start, exit, exception, CUDA OOM, ...), group creation,
  faulthandler files (SIGTERM, fatal signal, stack dump request) and death;
* counters ``memory [bytes]`` (RSS, cgroup usage, CUDA, gauges).

Anything still open (in-flight collective, phase not left) ends at the process's end:
its last record when it was killed (nothing after it is known), its exit time when it
exited, the snapshot time when it was alive; such slices carry ``args.open = true``.
"""

from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.report.timeline.model import Clock, Event, FlowRefs, Mark, Threads
from hangtrace.tracer.ring.frrecords import FR_SOURCE
from hangtrace.tracer.snapshot import ProcessInfo


_SIGNAL_NAMES = {
    "sigterm": "SIGTERM received (stacks written)",
    "fatal": "fatal signal (stacks written)",
    "dump": "stack dump requested",
}


def _group_desc(p: ProcessInfo) -> Dict[str, str]:
    return {str(g.get("name")): str(g.get("desc") or "") for g in p.groups or () if g.get("name") is not None}


def _coll_name(r: Dict[str, Any], desc: Dict[str, str]) -> str:
    g = r.get("group")
    gname = desc.get(str(g)) or "group %s" % g
    cpp = ""
    if r.get("source") == FR_SOURCE:  # seen by torch's Flight Recorder alone
        cpp = " [in %s]" % r["within_op"] if r.get("within_op") else " [C++]"
    if r["kind"] == "p2p":
        return "%s peer %d %s #%d%s" % (r["op"], r.get("peer", -1), gname, r.get("seq") or 0, cpp)
    return "%s %s #%d%s" % (r["op"], gname, r.get("seq") or 0, cpp)


def _flow_key(rank: int, r: Dict[str, Any]) -> Optional[Tuple[Any, ...]]:
    if r.get("group") is None or rank < 0:
        return None
    if r["kind"] == "p2p":
        peer = r.get("peer", -1)
        if peer < 0:
            return None
        return ("p2p", r["group"], min(rank, peer), max(rank, peer), r.get("seq"))
    return ("coll", r["group"], r.get("seq"))


def _coll_args(r: Dict[str, Any], desc: Dict[str, str], rank: int) -> Dict[str, Any]:
    """The ``args`` of a collective's or p2p's slice (record fields; Flight Recorder ones
    when the record came from torch: its entry id, torch's state, how it was issued)."""
    args = {
        "group": r.get("group"),
        "group_desc": desc.get(str(r.get("group"))) or r.get("group_desc") or None,
        "seq": r.get("seq"),
        "op": r["op"],
        "dtype": r.get("dtype") or None,
        "numel": r.get("numel"),
        "shape": r.get("shape"),
        "state": r.get("state"),
        "phase": r.get("phase"),
        "step": r.get("step"),
        "rank": rank,
        "record": r.get("idx"),
    }
    if r["kind"] == "p2p":
        args["peer"] = r.get("peer")
    if r.get("error"):
        args["error"] = r["error"]
    if r.get("source"):
        args["source"] = r["source"]
    if r.get("fr_op"):
        args.update(fr_op=r["fr_op"], fr_state=r.get("fr_state"), fr_retired=r.get("fr_retired"))
        args["fr_record_id"] = r.get("fr_record_id")
    for k in ("issued_by", "within_op", "end_unknown", "phase_from"):
        if r.get(k):
            args[k] = r[k]
    if r.get("source") == FR_SOURCE:
        args["record"] = None  # torch's entry, not a record of our ring (fr_record_id)
    return args


class ProcessEvents:
    """Builds the events of one process onto its track (``pid``, ``threads``).

    ``end_ns``: wall ns where open slices end; ``mark``: the verdict's collective or None;
    ``helper``: prefix for thread names of a helper process grouped under a rank;
    ``rank``: the rank this process holds (-1: none, e.g. a helper that inherited RANK):
    only a rank's collectives carry the verdict's mark and the flow arrows.
    """

    def __init__(
        self,
        p: ProcessInfo,
        clock: Clock,
        pid: int,
        threads: Threads,
        end_ns: int,
        mark: Optional[Mark] = None,
        helper: str = "",
        rank: Optional[int] = None,
    ) -> None:
        self.p, self.clock, self.pid, self.threads = p, clock, pid, threads
        self.rank = p.rank if rank is None else rank
        self.end_us = clock.wall_us(end_ns)
        self.mark, self.helper = mark, helper
        self.desc = _group_desc(p)
        self.out: List[Event] = []
        self.flows: FlowRefs = {}
        self.first_us = self.end_us

    def us(self, mono_ns: int) -> float:
        return self.clock.mono_us(self.p.host, mono_ns)

    def tid(self, thread: Optional[str]) -> int:
        return self.threads.tid(self.helper + (thread or "thread ?"))

    def build(self, records: List[Dict[str, Any]]) -> Tuple[List[Event], FlowRefs]:
        """Events for ``records`` (a subset of ``p.records`` in index order)."""
        phase_stack: Dict[str, List[Dict[str, Any]]] = {}
        step_open: Optional[Dict[str, Any]] = None
        mem: List[Dict[str, Any]] = []
        if records:
            self.first_us = min(self.us(r["t_mono_ns"]) for r in records)
        for r in records:
            k = r["kind"]
            if k in ("collective", "p2p"):
                self._collective(r)
            elif k == "phase_enter":
                phase_stack.setdefault(r.get("thread") or "", []).append(r)
            elif k == "phase_exit":
                st = phase_stack.get(r.get("thread") or "")
                enter = None
                while st:
                    cand = st.pop()
                    if cand.get("phase") == r.get("phase"):
                        enter = cand
                        break
                    self._phase(cand, None)  # an inner phase never left: ends where its parent did
                self._phase(enter, r)
            elif k == "step":
                if step_open is not None:
                    self._step(step_open, self.us(r["t_mono_ns"]))
                step_open = r
            elif k == "group":
                self._instant(
                    r,
                    "%s %s" % (r["op"], self.desc.get(str(r.get("group"))) or r.get("group")),
                    "group",
                    {"group": r.get("group")},
                )
            elif k == "heartbeat":
                self._instant(r, "heartbeat", "progress", {})
            elif k == "memory":
                mem.append(r)
        for st in phase_stack.values():
            for enter in reversed(st):
                self._phase(enter, None)
        if step_open is not None:
            self._step(step_open, self.end_us)
        self._counters(mem)
        self._lifecycle()
        return self.out, self.flows

    # -- slices -------------------------------------------------------------------------
    def _slice(
        self,
        name: str,
        cat: str,
        ts: float,
        end: float,
        tid: int,
        args: Dict[str, Any],
        cname: Optional[str] = None,
    ) -> Event:
        ev = {
            "ph": "X",
            "name": name,
            "cat": cat,
            "ts": ts,
            "dur": round(max(0.0, end - ts), 3),
            "pid": self.pid,
            "tid": tid,
            "args": args,
        }
        if cname:
            ev["cname"] = cname
        self.out.append(ev)
        return ev

    def _collective(self, r: Dict[str, Any]) -> None:
        ts = self.us(r["t_mono_ns"])
        done = r.get("t_end_mono_ns")
        open_ = r.get("state") == "issued" or (not done and not r.get("end_unknown"))
        end = self.end_us if open_ else (self.us(int(done)) if done else ts)
        args = _coll_args(r, self.desc, self.rank)
        name = _coll_name(r, self.desc)
        cname = None
        if open_:
            args["open"] = True
            name += " (in flight)"
            cname = "terrible"
        elif r["state"] == "failed":
            name += " (failed)"
            cname = "bad"
        m = self.mark
        if (
            m is not None
            and self.rank in m.ranks
            and str(r.get("group")) == str(m.group)
            and r.get("seq") == m.seq
        ):
            args["verdict"] = m.kind
            name = "VERDICT %s: %s" % (m.kind, name)
            cname = "terrible"
        tid = self.tid(r.get("thread"))
        if r.get("async_op"):
            aid = "%d.%d" % (self.pid, r["idx"])
            b = {
                "ph": "b",
                "name": name,
                "cat": "collective-async",
                "id": aid,
                "ts": ts,
                "pid": self.pid,
                "tid": tid,
                "args": args,
            }
            self.out += [
                b,
                {
                    "ph": "e",
                    "name": name,
                    "cat": "collective-async",
                    "id": aid,
                    "ts": max(ts, end),
                    "pid": self.pid,
                    "tid": tid,
                },
            ]
        else:
            self._slice(name, r["kind"], ts, end, tid, args, cname)
            key = _flow_key(self.rank, r)
            if key is not None:
                self.flows.setdefault(key, []).append((ts, self.pid, tid, self.rank))

    def _phase(self, enter: Optional[Dict[str, Any]], exit_: Optional[Dict[str, Any]]) -> None:
        if enter is None and exit_ is None:
            return
        r: Dict[str, Any] = enter or exit_ or {}
        ts = self.us(enter["t_mono_ns"]) if enter else None
        end = self.us(exit_["t_mono_ns"]) if exit_ else self.end_us
        args: Dict[str, Any] = {"step": r.get("step")}
        if ts is None:  # its entry was overwritten in the ring (or cut by sampling)
            ts, args["entry_lost"] = min(self.first_us, end), True
        if exit_ is None:
            args["open"] = True
        if exit_ is not None and exit_.get("error"):
            args["error"] = exit_["error"]
        self._slice(
            str(r.get("phase")),
            "phase",
            ts,
            end,
            self.tid(r.get("thread")),
            args,
            "bad" if args.get("error") else None,
        )

    def _step(self, r: Dict[str, Any], end: float) -> None:
        self._slice(
            "step %s" % r.get("seq"),
            "step",
            self.us(r["t_mono_ns"]),
            end,
            self.threads.tid(self.helper + "steps"),
            {"step": r.get("seq")},
        )

    # -- instants and counters ------------------------------------------------------------
    def _instant(self, r: Dict[str, Any], name: str, cat: str, args: Dict[str, Any]) -> None:
        self.out.append(
            {
                "ph": "i",
                "s": "t",
                "name": name,
                "cat": cat,
                "ts": self.us(r["t_mono_ns"]),
                "pid": self.pid,
                "tid": self.tid(r.get("thread")),
                "args": args,
            }
        )

    def _counters(self, mem: List[Dict[str, Any]]) -> None:
        if not mem:
            return
        from hangtrace.tracer.ring.memsamples import samples

        for r, s in zip(mem, samples(mem)):
            vals = s.get("values") or {}
            if not vals:
                continue
            name = "memory [bytes]" if s["what"] == "host" else "%s [bytes]" % s["what"]
            self.out.append(
                {
                    "ph": "C",
                    "name": self.helper + name,
                    "ts": self.us(r["t_mono_ns"]),
                    "pid": self.pid,
                    "args": {k.replace(s["what"] + " ", ""): v for k, v in vals.items()},
                }
            )

    def _lifecycle(self) -> None:
        p = self.p
        for e in p.events or ():
            kind = str(e.get("event"))
            if isinstance(e.get("mono_ns"), int):
                ts = self.us(e["mono_ns"])
            elif isinstance(e.get("wall_ns"), int):
                ts = self.clock.wall_us(e["wall_ns"])
            else:
                continue
            args = {k: v for k, v in e.items() if k not in ("event", "wall_ns", "mono_ns", "thread")}
            name = kind
            if kind in ("exception", "thread_exception"):
                name = "%s: %s" % (kind, e.get("type"))
            elif kind == "exit":
                name = "exit %s" % e.get("code")
            self.out.append(
                {
                    "ph": "i",
                    "s": "p" if kind in ("exit", "start") else "t",
                    "name": self.helper + name,
                    "cat": "lifecycle",
                    "ts": ts,
                    "pid": self.pid,
                    "tid": self.tid(e.get("thread")),
                    "args": args,
                }
            )
        for kind, s in sorted((p.signals or {}).items()):
            if isinstance(s.get("wall_ns"), int):
                self.out.append(
                    {
                        "ph": "i",
                        "s": "p",
                        "name": self.helper + _SIGNAL_NAMES.get(kind, kind),
                        "cat": "signal",
                        "ts": self.clock.wall_us(s["wall_ns"]),
                        "pid": self.pid,
                        "tid": self.tid("MainThread"),
                        "args": {"text": (s.get("text") or "")[:2000]},
                    }
                )
        if p.state == "killed":
            self.out.append(
                {
                    "ph": "i",
                    "s": "p",
                    "name": self.helper + "died: no exit record (killed)",
                    "cat": "death",
                    "ts": self.end_us,
                    "pid": self.pid,
                    "tid": self.tid("MainThread"),
                    "args": {"state": p.state, "note": "track ends at the last record"},
                }
            )
        elif p.state == "exited" and p.exit_code not in (0, None):
            self.out.append(
                {
                    "ph": "i",
                    "s": "p",
                    "name": self.helper + "exited with code %s" % p.exit_code,
                    "cat": "death",
                    "ts": self.end_us,
                    "pid": self.pid,
                    "tid": self.tid("MainThread"),
                    "args": {"exit_code": p.exit_code},
                }
            )
