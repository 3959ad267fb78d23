"""Attribution of a death to memory (pure).

Attribution (:func:`attribute`) refines the dead-rank cause found by the analysis from
its signals/exit code/events (see ``analyze/failures/deaths.py``), from evidence only:

* ``ray-memory-monitor``: Ray's own record says so (worker ``exit_type``
  NODE_OUT_OF_MEMORY, an ``oom_context`` death cause, or the memory monitor's text "killed
  due to ... low on memory"), from its state joined live or from its session logs on disk
  (``collect/ray/raylogs.py``: the monitor's kill decision in raylet.out, the exit type in
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
  OOM kill (counter unchanged, no kernel line, memory low); an exception over dead
  DataLoader workers gets the sentence on them of ``helperdeaths``.

The process's memory level at death is ``deathlevel``'s.
"""

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.memory.samples import (
    LOW,
    NEAR,
    _where,
    fmt_bytes,
)
from hangtrace.tracer.ring.memsamples import Sample, samples
from hangtrace.tracer.analyze.memory.deathlevel import _Level, _level_of, _pct
from hangtrace.tracer.analyze.memory.helperdeaths import _worker_case
from hangtrace.tracer.collect.memfacts import dataloader_kills, exception_text


def _ray_logs(facts: Optional[Dict[str, Any]]) -> Tuple[bool, Optional[str]]:
    """Ray's session logs (``collect/ray/raylogs.py``, in ``memory_facts``) say its memory
    monitor killed the worker: its decision in raylet.out, else the worker's exit type
    NODE_OUT_OF_MEMORY in gcs_server.out. (True, Ray's text) or (False, None)."""
    from hangtrace.tracer.collect.ray.raylogs import NODE_OUT_OF_MEMORY, RayOomKill, RayWorkerExit

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
