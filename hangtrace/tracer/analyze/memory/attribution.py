"""Attribution of a death to memory (pure).

Attribution (:func:`attribute`) refines the dead-rank cause found by the analysis from
its signals/exit code/events (see ``analyze/failures/deaths.py``), from evidence only:

* ``ray-memory-monitor``: Ray's own record says so (worker ``exit_type``
  NODE_OUT_OF_MEMORY, an ``oom_context`` death cause, or the memory monitor's text "killed
  due to ... low on memory"), from its state joined live or from its session logs on disk
  (``collect/raylogs.py``: the monitor's kill decision in raylet.out, the exit type in
  gcs_server.out), which outlive the cluster. Ray's generic "may have exceeded K8s pod memory limits" is
  never taken as evidence: Ray prints it for any SIGKILL/SIGTERM (Ray 2.60).
* ``cuda-oom``: torch's ``OutOfMemoryError`` (the exception type, "CUDA out of memory"),
  or a MEM_OOM record of a ``cuda:N`` device from the allocator's observer.
* ``host-oom-kill``: a death without a record (SIGKILL, exit -9) with a kernel OOM-killer
  line for that pid after its start, or its cgroup's ``oom_kill`` counter higher at
  collection than at its last sample.
* ``sigterm-external``: a SIGTERM (faulthandler dump / exit -15) while memory was well
  below the limit (< 75 %) and the OOM-kill counter unchanged: "not an OOM". Near the
  limit (>= 90 %) the cause stays ``sigterm`` with a memory-pressure note (kubelet
  evictions send SIGTERM).
* anything else keeps its cause (exception, fatal signal, exit code, killed without
  record) and gets the memory figures at death as evidence, or the reasons it was not an
  OOM kill (counter unchanged, no kernel line, memory low).
"""

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.memory.samples import (
    LOW,
    NEAR,
    Sample,
    _last_host,
    _level,
    _peak,
    _where,
    fmt_bytes,
    samples,
)
from hangtrace.tracer.collect.memfacts import dataloader_kills, exception_text, fatal_signal_name


def _ray_logs(facts: Optional[Dict[str, Any]]) -> Tuple[bool, Optional[str]]:
    """Ray's session logs (``collect/raylogs.py``, in ``memory_facts``) say its memory
    monitor killed the worker: its decision in raylet.out, else the worker's exit type
    NODE_OUT_OF_MEMORY in gcs_server.out. (True, Ray's text) or (False, None)."""
    from hangtrace.tracer.collect.raylogs import NODE_OUT_OF_MEMORY, RayOomKill, RayWorkerExit

    f = facts or {}
    if f.get("ray_oom_kill"):
        k = RayOomKill.from_dict(f["ray_oom_kill"])
        return True, "Ray's raylet log: %s; OOM kill reason: %s" % (
            re.sub(r" \(IP: [^)]*\)", "", k.details),
            k.reason or "?",
        )
    if f.get("ray_worker_exit"):
        x = RayWorkerExit.from_dict(f["ray_worker_exit"])
        if x.exit_type == NODE_OUT_OF_MEMORY:
            return True, "Ray's GCS log: worker exit type %s: %s" % (x.exit_type, x.exit_detail[:300])
    return False, None


def _ray_memory_monitor(
    meta: Optional[Dict[str, Any]], facts: Optional[Dict[str, Any]] = None
) -> Tuple[bool, Optional[str]]:
    """Ray's own record (its state, joined live, in ``meta``; else its session logs in
    ``facts``) says its memory monitor killed the worker: (True, why) or (False, None)."""
    logs = _ray_logs(facts)
    if logs[0]:
        return logs
    m = meta or {}
    rd = m.get("ray_death")
    cands = {
        "exit_type": m.get("ray_exit_type"),
        "exit_detail": m.get("ray_exit_detail"),
        "death_cause": m.get("ray_death_cause"),
        "text": rd if isinstance(rd, str) else None,
    }
    if isinstance(rd, dict):  # {'death_cause', 'exit_type', 'exit_detail'} form
        for k in ("exit_type", "exit_detail", "death_cause"):
            cands[k] = cands[k] or rd.get(k)
    if str(cands["exit_type"] or "").upper() in ("NODE_OUT_OF_MEMORY", "4"):
        return True, "Ray recorded worker exit type NODE_OUT_OF_MEMORY"
    dc = cands["death_cause"]
    if isinstance(dc, dict) and ("oom_context" in dc or "oomContext" in dc):
        return True, "Ray's death cause is an oom_context (its memory monitor)"
    for k in ("exit_detail", "text"):
        t = str(cands[k] or "").lower()
        if (
            "memory monitor" in t
            or ("killed" in t and "low on memory" in t)
            or "ray_memory_usage_threshold" in t
        ):
            return True, "Ray's %s: %s" % (k.replace("_", " "), " ".join(str(cands[k]).split())[:200])
    return False, None


def _cuda_oom(proc: Any, ss: List[Sample]) -> Optional[Dict[str, Any]]:
    """A CUDA OOM of ``proc``: dict or None."""
    for e in proc.events or ():
        if not isinstance(e, dict):
            continue
        if e.get("event") == "cuda_oom":
            return {
                "source": "allocator observer",
                "phase": e.get("phase"),
                "step": e.get("step"),
                "requested": e.get("requested"),
                "device_free": e.get("device_free"),
                "device": e.get("device"),
                "snapshot": e.get("snapshot"),
            }
    for e in proc.events or ():
        if isinstance(e, dict) and e.get("event") == "exception":
            t, msg = str(e.get("type") or ""), str(e.get("message") or "")
            if t == "OutOfMemoryError" or "CUDA out of memory" in msg:
                o = [s for s in ss if s["source"] == "oom"]
                at = o[-1] if o else None
                return {
                    "source": "exception",
                    "type": t,
                    "message": " ".join(msg.split())[:300],
                    "phase": at["phase"] if at else proc.phase,
                    "step": at["step"] if at else proc.step,
                }
    for s in ss:
        if s["source"] == "oom" and s["what"].startswith("cuda:"):
            return {
                "source": "allocator observer",
                "phase": s["phase"],
                "step": s["step"],
                "requested": s.get("requested"),
                "device_free": s.get("device_free"),
                "device": s["what"],
            }
    return None


def _pct(v: Optional[float], lim: Optional[float]) -> str:
    return "%d%%" % round(100.0 * v / lim) if v is not None and lim else "?"


@dataclass(frozen=True)
class _Level:
    """A dead process's memory at its last host sample and the OOM facts gathered at
    collection (bytes; ``frac``: value / limit)."""

    h: Optional[Dict[str, Any]]
    metric: Optional[str]
    val: Optional[int]
    lim: Optional[int]
    frac: Optional[float]
    facts: Dict[str, Any]
    kern: Optional[Dict[str, Any]]
    now_ctr: Optional[int]
    last_ctr: Optional[int]
    mem_line: Optional[str]

    @property
    def ctr_up(self) -> bool:
        """The cgroup's oom_kill counter rose after the last sample."""
        return self.now_ctr is not None and self.last_ctr is not None and self.now_ctr > self.last_ctr

    @property
    def ctr_same(self) -> bool:
        """The cgroup's oom_kill counter is unchanged since the last sample."""
        return self.now_ctr is not None and self.last_ctr is not None and self.now_ctr == self.last_ctr


def _level_of(proc: Any, ss: List[Dict[str, Any]]) -> Tuple[_Level, Dict[str, Any]]:
    """The memory level at death and the ``at_death`` dict."""
    facts = getattr(proc, "memory_facts", None) or {}
    h = _last_host(ss)
    metric, val, lim = _level(h)
    frac = (float(val) / lim) if val is not None and lim else None
    at: Dict[str, Any] = {}
    mem_line = None
    if h is not None:
        at = {
            "t_wall_ns": h["t_wall_ns"],
            "phase": h["phase"],
            "step": h["step"],
            "rss": h["values"].get("rss"),
            "cgroup_usage": h["values"].get("cgroup"),
            "limit": lim,
            "oom_kills": h.get("oom_kills"),
            "swap": h.get("swap"),
            "fraction_of_limit": round(frac, 3) if frac is not None else None,
        }
        pk = _peak(ss, metric) if metric else None
        if pk:
            at["peak"] = pk[0]
            at["peak_where"] = _where(pk[1])
        if lim:
            mem_line = "%s %s of limit %s (%s) at its last sample (%s)" % (
                "cgroup usage" if metric == "cgroup" else "RSS",
                fmt_bytes(val),
                fmt_bytes(lim),
                _pct(val, lim),
                _where(h),
            )
        else:
            total = facts.get("host_mem_total")
            mem_line = "RSS %s at its last sample (%s); no memory limit on its cgroup%s" % (
                fmt_bytes(h["values"].get("rss")),
                _where(h),
                ", host memory %s" % fmt_bytes(total) if total else "",
            )
    lv = _Level(
        h,
        metric,
        val,
        lim,
        frac,
        facts,
        facts.get("kernel_oom"),
        facts.get("cgroup_oom_kill_now"),
        h.get("oom_kills") if h else None,
        mem_line,
    )
    return lv, at


def _ray_case(proc: Any, lv: _Level, ray_why: Optional[str], ev: List[str]) -> Tuple[str, str]:
    ev.append("rank killed by Ray's memory monitor: %s" % ray_why)
    if lv.mem_line:
        ev.append("this process: " + lv.mem_line)
    if (proc.meta or {}).get("ray_memory_used_bytes_at_death"):
        ev.append(
            "Ray: node memory used at death %s" % fmt_bytes(proc.meta["ray_memory_used_bytes_at_death"])
        )
    return "ray-memory-monitor", "killed by Ray's memory monitor (%s)" % ray_why


def _cuda_case(coom: Dict[str, Any], ss: List[Dict[str, Any]], ev: List[str]) -> Tuple[str, str]:
    where = _where(coom)
    if coom["source"] == "exception":
        text = "%s in %s: %s" % (coom.get("type") or "OutOfMemoryError", where, coom.get("message") or "")
    else:
        text = "CUDA out of memory on %s in %s: %s requested, %s free" % (
            coom.get("device"),
            where,
            fmt_bytes(coom.get("requested")),
            fmt_bytes(coom.get("device_free")),
        )
    ev.append("out-of-memory error recorded in %s (%s)" % (where, coom["source"]))
    if coom.get("snapshot"):
        ev.append("torch memory snapshot: %s" % coom["snapshot"])
    o = [s for s in ss if s["source"] == "oom"]
    for s in o[-3:]:
        for m, v in s["values"].items():
            ev.append(
                "at the OOM: %s = %s%s"
                % (m, fmt_bytes(v), " of %s" % fmt_bytes(s["limits"][m]) if s["limits"].get(m) else "")
            )
    return "cuda-oom", text


def _kernel_kill(lv: _Level, ev: List[str]) -> Optional[str]:
    """The cause text of a kernel OOM kill proven by a kernel line or the counter, or None."""
    kern = lv.kern
    if kern:
        line = kern.get("line", "")
        short = line[: line.index(")") + 1] if ")" in line else line[:160]
        ev.append("kernel log: %s" % kern.get("line", "")[:300])
        if kern.get("anon_rss"):
            ev.append(
                "kernel: anon RSS %s at the kill%s"
                % (
                    fmt_bytes(kern["anon_rss"]),
                    " of memory cgroup limit %s" % fmt_bytes(lv.lim) if lv.lim else "",
                )
            )
        return "killed by the kernel OOM killer (%s): '%s'%s" % (
            "memory cgroup limit" if kern.get("scope") == "cgroup" else "host out of memory",
            short,
            ", anon RSS %s" % fmt_bytes(kern["anon_rss"]) if kern.get("anon_rss") else "",
        )
    last, now = lv.last_ctr, lv.now_ctr
    if lv.ctr_up and last is not None and now is not None:
        ev.append(
            "cgroup %s: oom_kill %d at the last sample, %d now" % (lv.facts.get("cgroup_dir"), last, now)
        )
        return (
            "SIGKILLed while its memory cgroup's oom_kill counter rose from %d (last sample) to %d "
            "(collection): the kernel OOM killer" % (last, now)
        )
    return None


def _killed_case(proc: Any, lv: _Level, cause: str, cause_text: str, ev: List[str]) -> Tuple[str, str]:
    text = _kernel_kill(lv, ev)
    if text is not None:
        if lv.mem_line:
            ev.append(lv.mem_line)
        if lv.frac is not None and lv.frac < NEAR:
            ev.append(
                "memory was below %d%% of the limit at the last sample (taken up to one sampling "
                "interval before the kill): it rose fast, or another process of the cgroup grew"
                % (NEAR * 100)
            )
        return "host-oom-kill", text
    why = []
    if lv.ctr_same:
        why.append("its cgroup's oom_kill counter is unchanged (%s)" % lv.now_ctr)
    if lv.facts.get("kernel_log") == "read":
        why.append("the kernel log has no OOM-killer line for pid %d" % proc.pid)
    if lv.frac is not None and lv.frac < LOW:
        why.append("memory well below the limit (%s)" % _pct(lv.val, lv.lim))
    if why and (lv.ctr_same or lv.facts.get("kernel_log") == "read"):
        ev.append("not a host OOM-kill: %s" % "; ".join(why))
    elif lv.frac is not None and lv.frac >= NEAR:
        ev.append(
            "memory was at %s of the limit at the last sample: an OOM kill is likely; "
            "confirm in the kernel log (dmesg) or the cgroup's oom_kill counter" % _pct(lv.val, lv.lim)
        )
    if lv.mem_line:
        ev.append(lv.mem_line)
    return cause, cause_text


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


def _sigterm_case(lv: _Level, cause: str, cause_text: str, ev: List[str]) -> Tuple[str, str]:
    if lv.h is not None and (lv.frac is None or lv.frac < LOW) and not lv.ctr_up and not lv.kern:
        parts = [lv.mem_line]
        if lv.last_ctr is not None:
            parts.append(
                "cgroup oom_kill counter %s"
                % (
                    "unchanged (%d)" % lv.last_ctr
                    if lv.now_ctr is None or lv.ctr_same
                    else "%d" % lv.last_ctr
                )
            )
        ev.append("not an OOM: %s" % "; ".join(p for p in parts if p))
        return "sigterm-external", "%s; not an OOM: %s" % (cause_text, "; ".join(p for p in parts if p))
    if lv.frac is not None and lv.frac >= NEAR:
        ev.append(
            "SIGTERM with memory at %s of the limit: a memory-pressure eviction (e.g. the kubelet) "
            "is possible" % _pct(lv.val, lv.lim)
        )
    if lv.mem_line:
        ev.append(lv.mem_line)
    return cause, cause_text


def attribute(
    proc: Any,
    cause: Any,
    cause_text: Any,
    ss: Optional[List[Dict[str, Any]]] = None,
    helpers: Sequence[Any] = (),
) -> Dict[str, Any]:
    """Refine a dead process's ``cause`` from memory evidence.

    ``proc``: ProcessInfo (``meta``, ``events``, ``memory_facts``, ``exit_code``);
    ``cause``/``cause_text``: what ``analyze/deaths.fill_death`` found; ``ss``: its samples
    (default from ``proc.memory`` or its records); ``helpers``: ProcessInfo of the process's
    helper processes (its DataLoader workers: their own memory and OOM facts). Returns ``{'cause', 'cause_text',
    'evidence': [str], 'at_death': {...}, 'base_cause', 'helper_text': the verdict's sentence on a
    helper (DataLoader worker) the OOM killer killed or something else SIGKILLed, or '',
    'helper_kill': 'oom' | 'not-oom' | ''}``; ``cause`` is unchanged where
    the evidence does not support another.
    """
    if ss is None:
        ss = getattr(proc, "memory", None) or samples(proc.records)
    lv, at = _level_of(proc, ss)
    ev: List[str] = []
    new, text, helper_text, helper_kill = cause, cause_text, "", ""
    exit_code_cause = str(cause).startswith("exit-code")
    ray_mm, ray_why = _ray_memory_monitor(proc.meta, getattr(proc, "memory_facts", None))
    coom = _cuda_oom(proc, ss)
    if ray_mm and (cause in ("killed-without-record", "sigterm", "fatal-signal") or exit_code_cause):
        new, text = _ray_case(proc, lv, ray_why, ev)
    elif coom is not None and (
        cause in ("exception", "killed-without-record", "fatal-signal") or exit_code_cause
    ):
        new, text = _cuda_case(coom, ss, ev)
    elif cause == "killed-without-record" or proc.exit_code == -9:
        new, text = _killed_case(proc, lv, cause, cause_text, ev)
    elif cause == "sigterm":
        new, text = _sigterm_case(lv, cause, cause_text, ev)
    elif cause == "exception" and (workers := dataloader_kills(exception_text(proc) or cause_text)):
        helper_text, helper_kill = _worker_case(lv, workers, helpers, ev)
    elif lv.mem_line:
        ev.append("memory at death: " + lv.mem_line)
    return {
        "cause": new,
        "cause_text": text,
        "evidence": ev,
        "at_death": at,
        "base_cause": cause,
        "cuda_oom": coom,
        "ray_memory_monitor": ray_why if ray_mm else None,
        "helper_text": helper_text,
        "helper_kill": helper_kill,
    }
