"""A live snapshot's stacks, and what it could not collect (issue 38, "bad input").

In: the processes of a live snapshot (``Snapshot.processes``), the pids whose Flight
Recorder agent took the snapshot's request and did not answer in time
(``frrequest.fr_into_snapshot``'s ``silent``). Out: the processes with their stacks
(:func:`stacks_for`: py-spy in parallel, the faulthandler fallback) and one
``Snapshot.errors`` line per thing not collected (:func:`gap_lines`), each naming the
process, what is missing and what the analysis does without it: a rank that exits during
the dump, a process stopped or holding the GIL in C code, an agent that does not answer.
The analysis then goes on with the rest (the rings are read either way). Never raises.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterable, List

from hangtrace.tracer.collect.ringprocs import gone_or_zombie
from hangtrace.tracer.snapshot import ProcessInfo


def stacks_for(procs: List[ProcessInfo], native: bool, run_dir: str) -> List[ProcessInfo]:
    """``procs`` with stacks of the alive ones: py-spy in parallel, faulthandler fallback;
    ``stack_error`` says why a process has none (py-spy's error and the fallback's)."""
    from hangtrace.tracer.collect import stacks as S
    from hangtrace.tracer.collect.faulthandler import request_faulthandler_dump

    alive = [p for p in procs if p.state == "alive"]
    if not alive:
        return procs
    try:
        res = S.dump_stacks([p.pid for p in alive], native=native)
    except Exception as e:  # py-spy missing or broken: use the fallback for all
        res = {p.pid: {"threads": None, "source": None, "error": str(e)} for p in alive}
    out = []
    for p in procs:
        if p.state != "alive":
            out.append(p)
            continue
        r = res.get(p.pid) or {}
        if r.get("threads"):
            out.append(
                dataclasses.replace(
                    p,
                    stacks=r["threads"],
                    stack_source=r.get("source", "py-spy"),
                    children=tuple(r.get("children") or ()),
                )
            )
            continue
        err = r.get("error") or "no stacks"
        stacks, source = p.stacks, p.stack_source
        sig = p.meta.get("dump_signal") or 0
        if sig:
            dump = os.path.join(run_dir, "stacks", "dump-%s-%d.txt" % (p.host, p.pid))
            try:
                threads = request_faulthandler_dump(p.pid, sig, dump)
            except Exception as e:
                threads = None
                err += "; faulthandler fallback failed: %s" % e
            if threads:
                stacks, source = threads, "faulthandler"
        else:
            err += "; no faulthandler fallback (the process registered no dump signal)"
        out.append(dataclasses.replace(p, stacks=stacks, stack_source=source, stack_error=err))
    return out


def _who(p: ProcessInfo) -> str:
    return "%s (pid %d)" % ("rank %d" % p.rank if p.rank is not None and p.rank >= 0 else "process", p.pid)


#: at most this many processes are named one line each per kind of gap; more are one line
#: (py-spy refused on every rank of a large job is one fact, not a line per rank)
MAX_LINES = 8


def gap_lines(
    procs: Iterable[ProcessInfo], host: str, silent_fr: Iterable[int], fr_timeout_s: float
) -> List[str]:
    """One line per thing this host's live snapshot could not collect: a process alive
    when its ring was read that has no stacks (``stack_error``; "it exited during the
    dump" when its pid is gone now), and a process of ``silent_fr`` (pids) whose Flight
    Recorder agent took the request and did not answer within ``fr_timeout_s`` seconds.
    Each says what the analysis goes on without; above :data:`MAX_LINES` processes of one
    kind, one line counts them and quotes the first. Never raises."""
    silent = set(silent_fr)
    nostack: List[str] = []
    noagent: List[str] = []
    for p in procs:
        if p.host != host:
            continue
        gone = (p.pid in silent or (p.state == "alive" and p.stacks is None)) and gone_or_zombie(p.pid)
        how = " - it exited during the dump" if gone else ""
        if p.state == "alive" and p.stacks is None and p.stack_error:
            nostack.append(
                "%s: no stacks (%s)%s; analysed from its ring alone" % (_who(p), p.stack_error, how)
            )
        if p.pid in silent:
            noagent.append(
                "%s: its Flight Recorder agent did not answer within %.1f s%s (a process stopped, "
                "exiting, or holding the GIL in C code); analysed without torch's record of its "
                "collectives" % (_who(p), fr_timeout_s, how)
            )
    return _capped(nostack) + _capped(noagent)


def _capped(lines: List[str]) -> List[str]:
    if len(lines) <= MAX_LINES:
        return lines
    return ["%d processes alike, the first: %s" % (len(lines), lines[0])]
