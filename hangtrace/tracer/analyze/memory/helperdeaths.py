"""The deaths of a rank's DataLoader workers, told from their memory and OOM facts (pure).

In: the rank's memory level (``deathlevel._Level``), the workers torch reported dead
(``collect/memfacts.dataloader_kills``: ``(pid, signal name or None)``) and the rank's
helper processes (ProcessInfo: their own samples, OOM facts, fatal-signal stacks). Out:
evidence lines, and the verdict's sentence on the first worker the kernel's OOM killer
killed ('oom'), else one proven SIGKILLed by something else ('not-oom'), else one killed by
a fatal signal in the user's code ('fatal') (:func:`_worker_case`); where a worker crashed
(:func:`crash_site`).
"""

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.memory.deathlevel import _Level, _level_of
from hangtrace.tracer.analyze.memory.samples import fmt_bytes
from hangtrace.tracer.ring.memsamples import samples
from hangtrace.tracer.collect.memfacts import fatal_signal_name


def _worker_case(
    lv: _Level, workers: List[Tuple[int, Optional[str]]], helpers: Sequence[Any], ev: List[str]
) -> Tuple[str, str]:
    """The rank raised because torch saw DataLoader worker(s) ``(pid, signal name or None)``
    die (``memfacts.dataloader_kills``): for each (at most 3), whether the kernel's OOM killer
    killed it (its kernel line: the worker's own facts when it kept a ring, else the rank's
    ``helper_kernel_oom``) or what its cgroup's counter says, and what its own memory did (its
    samples, among ``helpers``: the rank's helper processes). The cause stays the rank's
    exception; the rank's own memory comes last, as the rank's. Returns the verdict's sentence
    and its kind: ('...', 'oom') for the first worker the kernel's OOM killer killed, else
    ('...', 'not-oom') for the first SIGKILLed with the kernel log read, no line for it and
    its cgroup's oom_kill counter not risen, else ('...', 'fatal') for the first killed by a
    fatal signal whose stack names the user's line, else ('', '')."""
    by_pid = {getattr(h, "pid", None): h for h in helpers}
    hk = lv.facts.get("helper_kernel_oom") or {}
    text, kind = "", ""
    for pid, sig in workers[:3]:
        found = _one_worker(lv, pid, sig, by_pid.get(pid), hk, ev)
        if _KIND_RANK[found[1]] > _KIND_RANK[kind]:  # the first 'oom' wins, else the first 'not-oom'
            text, kind = found
    if lv.mem_line:
        ev.append("the rank's own memory at death: " + lv.mem_line)
    return text, kind


_KIND_RANK = {"": 0, "fatal": 1, "not-oom": 2, "oom": 3}


def crash_site(h: Any) -> str:
    """``"__getitem__ (job.py:57): `return lib.decode(ptr, n)`"``: the innermost frame of the
    user's code in process ``h``'s last stacks (a fatal-signal dump), '' when none."""
    from hangtrace.tracer.analyze.stuck.blocking import code_text
    from hangtrace.tracer.stackmodel.usercode import user_frame
    from hangtrace.tracer.analyze.stuck.stacktree import frame_label, process_frames

    f = user_frame(process_frames(h)[0] or [])
    return frame_label(f) + code_text(f) if f is not None else ""


def _one_worker(
    lv: _Level, pid: int, sig: Optional[str], h: Any, hk: Dict[str, Any], ev: List[str]
) -> Tuple[str, str]:
    """One dead DataLoader worker (its ProcessInfo ``h`` or None; ``hk`` the rank's
    ``helper_kernel_oom``): its evidence lines added to ``ev``; returns (sentence, kind) or ('', '')."""
    who = "its DataLoader worker (pid %d)" % pid
    sig = sig or (
        fatal_signal_name(h) if h is not None else None
    )  # ("exited unexpectedly": its own dump says)
    wss = (getattr(h, "memory", None) or samples(h.records)) if h is not None else []
    wlv = _level_of(h, wss)[0] if h is not None else None
    k = (wlv.kern if wlv is not None else None) or (hk if hk.get("pid") == pid else None)
    how = (
        ("was killed by SIGKILL" if sig.lower() == "killed" else "was killed by signal %s" % sig)
        if sig
        else "exited unexpectedly"
        + (" (no exit record: killed)" if h is not None and h.state == "killed" else "")
    )
    grew = _growth(wss)
    found = ("", "")
    if k:
        ev.append("%s was killed by the kernel's OOM killer: %s" % (who, str(k.get("line") or "")[:200]))
        m = re.search(r"anon-rss:(\d+)kB", str(k.get("line") or ""))
        found = (
            "%s was killed by the kernel's OOM killer (kernel log%s)%s"
            % (
                who,
                ": anon-rss %s at the kill" % fmt_bytes(int(m.group(1)) << 10) if m else "",
                ("; the worker's memory: %s%s" % (grew + ", " if grew else "", wlv.mem_line))
                if wlv is not None and wlv.mem_line
                else "",
            ),
            "oom",
        )
    elif sig is None or sig.lower() == "killed":
        found = _worker_sigkill(who, how, sig, wlv if wlv is not None and wlv.now_ctr is not None else lv, ev)
    else:  # a fatal signal: where the worker crashed (its fatal-stack dump, hooks/process/workersignals.py)
        at = crash_site(h) if h is not None else ""
        ev.append("%s %s (a helper of this rank)%s" % (who, how, ", in " + at if at else ""))
        found = ("%s %s in %s" % (who, how, at), "fatal") if at else found
        wlv = None if at else wlv  # (its memory says nothing of a crash in native code)
    if wlv is not None and wlv.mem_line:
        ev.append("the worker's memory: %s%s" % (grew + "; " if grew else "", wlv.mem_line))
    return found


def _worker_sigkill(who: str, how: str, sig: Optional[str], c: _Level, ev: List[str]) -> Tuple[str, str]:
    """A worker SIGKILLed or gone without a signal, judged by the OOM facts ``c`` (its own, else the
    rank's): its evidence line added to ``ev``; ('...', 'not-oom') when proven not the OOM killer, else ('', '')."""
    why = []
    if c.ctr_up:
        why.append(
            "its cgroup's oom_kill counter rose (%s -> %s): an OOM kill in its cgroup is likely"
            % (c.last_ctr, c.now_ctr)
        )
    elif c.ctr_same:
        why.append("its cgroup's oom_kill counter is unchanged (%s)" % c.now_ctr)
    no_line = c.facts.get("kernel_log") == "read" and not c.ctr_up  # (the log read, nothing for it)
    if no_line:
        why.append("the kernel log has no OOM-killer line for it")
    ev.append(
        "%s %s (a helper of this rank)%s"
        % (
            who,
            how,
            (": " + "; ".join(why))
            if why
            else "; whether by the OOM killer is unknown here (no kernel log, no cgroup counter)",
        )
    )
    if no_line and sig:
        return "%s %s, not by the kernel's OOM killer (%s)" % (who, how, "; ".join(why)), "not-oom"
    return "", ""


def _growth(ss: List[Dict[str, Any]]) -> str:
    """'RSS 235.0 MiB -> 415.0 MiB in 2.1 s' between a process's first and last host samples
    when it grew by 16 MiB or more, else ''."""
    hs = [x for x in ss if "rss" in (x.get("values") or {})]
    if len(hs) < 2:
        return ""
    a, b = hs[0]["values"]["rss"], hs[-1]["values"]["rss"]
    if a is None or b is None or b - a < 16 << 20:
        return ""
    dt = ((hs[-1].get("t_wall_ns") or 0) - (hs[0].get("t_wall_ns") or 0)) / 1e9
    return "RSS %s -> %s in %.1f s" % (fmt_bytes(a), fmt_bytes(b), dt)
