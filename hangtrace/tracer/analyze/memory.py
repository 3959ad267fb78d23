"""Memory analysis (issue 5): samples, ledger, trends, kept-across flags, death attribution.

Pure functions on plain data (``ProcessInfo.memory`` samples, ``ProcessInfo.memory_facts``
gathered at collection time, ``ProcessInfo.meta``): no I/O, unit-testable on synthetic
processes. Bytes are ints; times are ns since the Unix epoch.

Samples (:func:`samples`, from the K_MEM ring records, layout in ``tracer/ring/layout.py``)::

    {"t_wall_ns", "source": 'timer'|'phase_enter'|'phase_exit'|'step'|'oom',
     "what": 'host'|'cuda:N'|'gauge:<name>', "phase", "step", "thread",
     "values": {metric: bytes}, "limits": {metric: bytes}, "oom_kills": int|None,
     "swap": int|None}

Metrics: ``rss`` and ``cgroup`` (usage, limited by the cgroup limit) from 'host';
``cuda:N allocated`` / ``cuda:N reserved`` (limit: device total); ``gauge:<name>``
(limit: the registered budget).

Ledger (:func:`ledger`): one row per (rank, step, phase, metric): the value sampled just
after the phase was entered and just before it was left, ``delta`` = exit - enter (a
phase still open when the process died has ``exit`` None and its newest sample in
``last``).

Kept across phase boundaries (:func:`kept_across`): per rank and metric, a step *kept*
memory when its last phase ended more than a threshold above where its first phase began
(threshold: max(1 MiB, 1 % of the metric's peak)), and *released* it when within the
threshold. A flag is raised when some steps keep and others release and a phase is present
in every keeping step but not in every releasing one (e.g. validation on steps 2, 4 with a
checkpoint every step): it names the steps, the phase where the memory grew and the phases
after it in those steps (the sequence, e.g. ``validation -> checkpoint``), and the bytes
kept per step.

Trends (:func:`trend`): per metric, the level at the first sample of each step; least
squares bytes/step; *steady* when at least 3 steps, the slope is above the threshold and
at least 75 % of step-to-step changes are increases; mean growth per phase from the
ledger; the step at which the limit is reached at that rate.

Attribution (:func:`attribute`) refines the dead-rank cause found by the analysis from
its signals/exit code/events (see ``analysis._death``), from evidence only:

* ``ray-memory-monitor``: Ray's own record says so (worker ``exit_type``
  NODE_OUT_OF_MEMORY, an ``oom_context`` death cause, or the memory monitor's text "killed
  due to ... low on memory"). Ray's generic "may have exceeded K8s pod memory limits" is
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
import math

from hangtrace.tracer.ring import layout as F

__all__ = ["significant", "significant_bytes", "samples", "ledger", "kept_across", "trend", "attribute", "summarize", "watch_lines",
           "fmt_bytes", "NEAR", "LOW"]

#: memory at or above this fraction of the limit is "near the limit"
NEAR = 0.90
#: below this fraction it is "well below the limit"
LOW = 0.75
MIB = 1 << 20
_SRC = {i: n for i, n in enumerate(F.MEM_SOURCES)}
LEDGER_MAX_STEPS = 16
LEDGER_MAX_RANKS = 8


def fmt_bytes(n):
    """1536 -> '1.5 KiB'; None/negative -> '?'."""
    if n is None or n < 0:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "?"


def _sb(n):
    """Signed bytes: '+20.0 MiB' / '-1.0 GiB'."""
    if n is None:
        return "?"
    return ("+" if n >= 0 else "-") + fmt_bytes(abs(n))


def _v(x):
    return None if x is None or x < 0 else int(x)


def _source(op):
    if isinstance(op, int):
        return _SRC.get(op, str(op))
    i = F.OP_IDS.get(op)
    if i is None:
        try:
            i = int(op)
        except (TypeError, ValueError):
            return str(op)
    return _SRC.get(i, str(op))


def samples(records):
    """Memory samples (dicts, see module doc) of a record list, in record order."""
    out = []
    for r in records or ():
        if r.get("kind") != "memory":
            continue
        a = tuple(r.get("a") or (-1, -1, -1, -1, -1))
        what = r.get("what") or r.get("group") or "?"  # MemorySample; older dicts: group/op
        src = _source(r.get("source") or r.get("op"))
        s = {"t_wall_ns": r.get("t_wall_ns") or 0, "source": src, "what": what,
             "phase": r.get("phase"), "step": r.get("step"), "thread": r.get("thread"),
             "values": {}, "limits": {}, "oom_kills": None, "swap": None, "raw": a}
        if what == "host":
            rss, swap, usage, limit, oom = a
            if _v(rss) is not None:
                s["values"]["rss"] = rss
            if _v(usage) is not None:
                s["values"]["cgroup"] = usage
                if limit and limit > 0:
                    s["limits"]["cgroup"] = limit
            s["swap"], s["oom_kills"] = _v(swap), _v(oom)
            s["limit"] = limit if limit and limit > 0 else (0 if limit == 0 else None)
        elif what.startswith("cuda:"):
            if src == "oom":
                s["requested"], s["device_allocated"], s["device_free"] = _v(a[0]), _v(a[1]), _v(a[3])
                s["device_total"] = _v(a[4])
            else:
                for name, x in (("allocated", a[0]), ("reserved", a[1])):
                    if _v(x) is not None:
                        s["values"]["%s %s" % (what, name)] = x
                        if a[4] and a[4] > 0:
                            s["limits"]["%s %s" % (what, name)] = a[4]
                s["peak"], s["device_free"], s["device_total"] = _v(a[2]), _v(a[3]), _v(a[4])
        elif what.startswith("gauge:"):
            if _v(a[0]) is not None:
                s["values"][what] = a[0]
                if a[1] and a[1] > 0:
                    s["limits"][what] = a[1]
        out.append(s)
    return out


def _host(ss):
    return [s for s in ss if s["what"] == "host"]


def ledger(ss, rank=None):
    """Ledger rows of one process's samples (see module doc), in phase-entry order."""
    rows = []
    stacks = {}  # (thread, metric) -> [row, ...] open phases
    for s in ss:
        src = s["source"]
        if src not in ("phase_enter", "phase_exit"):
            # timer/step/oom samples: the newest value seen inside the open phases
            for (_th, mm), st in stacks.items():
                if st and mm in s["values"]:
                    st[-1]["last"] = s["values"][mm]
            continue
        for m, val in s["values"].items():
            key = (s["thread"], m)
            st = stacks.setdefault(key, [])
            if src == "phase_enter":
                row = {"rank": rank, "step": s["step"], "phase": s["phase"], "metric": m, "enter": val,
                       "exit": None, "delta": None, "last": val, "depth": len(st),
                       "t_enter_ns": s["t_wall_ns"], "limit": s["limits"].get(m)}
                st.append(row)
                rows.append(row)
            else:
                for i in range(len(st) - 1, -1, -1):
                    if st[i]["phase"] == s["phase"]:
                        row = st[i]
                        row["exit"] = val
                        row["last"] = val
                        row["delta"] = val - row["enter"]
                        if s["limits"].get(m):
                            row["limit"] = s["limits"][m]
                        del st[i:]
                        break
    return rows


def _thr(values):
    peak = max([abs(v) for v in values if v is not None] or [0])
    return max(MIB, int(0.01 * peak))


def _by_metric(rows):
    out = {}
    for r in rows:
        out.setdefault(r["metric"], []).append(r)
    return out


def _steps_of(rows):
    """{step: [top-level rows in order]} for rows with a step."""
    steps = {}
    for r in rows:
        if r["step"] is None or r["depth"] != 0:
            continue
        steps.setdefault(r["step"], []).append(r)
    return steps


def _period(steps):
    steps = sorted(set(steps))
    if len(steps) < 2:
        return None
    diffs = {b - a for a, b in zip(steps, steps[1:])}
    return diffs.pop() if len(diffs) == 1 else None


def kept_across(rows, rank=None):
    """Kept-across-phase-boundary flags of one process's ledger rows (see module doc)."""
    flags = []
    for metric, mrows in _by_metric(rows).items():
        if metric == "cgroup":
            continue  # shared by the ranks of a container: its growth is nobody's in particular
        steps = _steps_of(mrows)
        thr = _thr([r["enter"] for r in mrows] + [r["exit"] for r in mrows])
        if metric in ("rss", "cgroup"):  # host figures move with allocator arenas, page cache
            thr = max(thr, 8 * MIB, int(2 * thr))
        net, seqs = {}, {}
        order = sorted(steps)
        for st, rs in steps.items():
            seqs[st] = [r["phase"] for r in rs]
            if rs[-1]["exit"] is None:
                continue  # the step did not finish (died in it)
            if len(order) > 2 and (st == order[-1] or (st == order[0] and metric in ("rss", "cgroup"))):
                continue  # the newest step may be cut short by a failure; host memory warms up in the first
            net[st] = rs[-1]["exit"] - rs[0]["enter"]
        kept = sorted(s for s, n in net.items() if n > thr)
        released = sorted(s for s, n in net.items() if abs(n) <= thr)
        if not kept or not released:
            continue
        in_all_kept = set.intersection(*(set(seqs[s]) for s in kept))
        in_all_rel = set.intersection(*(set(seqs[s]) for s in released))
        only = sorted(in_all_kept - in_all_rel)
        if not only:
            continue
        # where it grew: after the last phase that began at the step's starting level, the
        # first phase that ended above it (growth later given back, e.g. an engine's
        # wake_up undone by its sleep, is not what was kept); majority over keeping steps
        grow = {}
        for s in kept:
            rs = steps[s]
            base = rs[0]["enter"]
            i0 = max([i for i, r in enumerate(rs) if r["enter"] <= base + thr] or [0])
            for r in rs[i0:]:
                if r["exit"] is not None and r["exit"] > base + thr:
                    grow[r["phase"]] = grow.get(r["phase"], 0) + 1
                    break
        grown_in = max(grow.items(), key=lambda kv: kv[1])[0] if grow else only[0]
        s0 = kept[0]
        seq0 = seqs[s0]
        i = seq0.index(grown_in) if grown_in in seq0 else 0
        sequence = seq0[i:]
        # the step after a keeping step: the first phase that begins with the memory held
        carried = []
        for s in kept:
            nxt = steps.get(s + 1)
            if nxt:
                carried.append({"step": s + 1, "phase": nxt[0]["phase"], "enter": nxt[0]["enter"]})
        held_by = sequence[1:]
        flags.append({
            "rank": rank, "metric": metric, "kept_steps": kept, "released_steps": released,
            "bytes_kept": {str(s): net[s] for s in kept}, "bytes_kept_median": sorted(net[s] for s in kept)[len(kept) // 2],
            "grown_in": grown_in, "sequence": sequence, "held_by": held_by, "only_in_kept_steps": only,
            "kept_sequence": seq0, "released_sequence": seqs[released[0]], "carried_into": carried[:4],
            "periods": {ph: _period([s for s, q in seqs.items() if ph in q]) for ph in set(sequence) | set(only)},
            "threshold": thr})
    return flags


def _series(ss, metric):
    """[(step, value, limit)] - the first sample of each step."""
    out = {}
    for s in ss:
        v = s["values"].get(metric)
        if v is None or s["step"] is None or s["source"] == "oom":
            continue
        if s["step"] not in out:
            out[s["step"]] = (v, s["limits"].get(metric))
    return sorted((st, v, lim) for st, (v, lim) in out.items())


def trend(ss, rows, metric):
    """Growth of ``metric`` per step (dict) or None with fewer than 3 steps."""
    ser = _series(ss, metric)
    if len(ser) < 3:
        return None
    xs = [float(s) for s, _v, _l in ser]
    ys = [float(v) for _s, v, _l in ser]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    thr = _thr(ys)
    ups = sum(1 for a, b in zip(ys, ys[1:]) if b - a > 0.25 * max(slope, 1))
    steady = slope > thr and ups >= 0.75 * (n - 1)
    per_phase = {}
    for r in rows:
        if r["metric"] == metric and r["delta"] is not None and r["depth"] == 0:
            per_phase.setdefault(r["phase"], []).append(r["delta"])
    phase_growth = {ph: int(sum(d) / len(d)) for ph, d in per_phase.items()}
    limit = None
    headroom_base = None  # the level the limit is compared with (default: this metric's)
    for s in reversed(ss):
        if s["limits"].get(metric):
            limit = s["limits"][metric]
            break
        if metric == "rss" and s["limits"].get("cgroup") and s["values"].get("cgroup") is not None:
            # RSS has no limit of its own: the (possibly shared) cgroup's limit bounds it;
            # this rank's growth eats the cgroup's remaining headroom
            limit, headroom_base = s["limits"]["cgroup"], s["values"]["cgroup"]
            break
    last_step, last_v = ser[-1][0], ser[-1][1]
    newest = last_v
    for s in reversed(ss):
        if metric in s["values"]:
            newest = s["values"][metric]
            break
    proj = None
    if steady and limit and slope > 0:
        proj = last_step + max(0, int(math.ceil((limit - (last_v if headroom_base is None else headroom_base))
                                                / slope)))
    growing = max(phase_growth.items(), key=lambda kv: kv[1])[0] if phase_growth else None
    return {"metric": metric, "steps": [ser[0][0], last_step], "nsteps": n, "bytes_per_step": int(slope),
            "steady": bool(steady), "first": int(ys[0]), "last": int(newest), "limit": limit,
            "projected_limit_step": proj, "phase_growth": phase_growth,
            "growing_phase": growing if growing is not None and phase_growth.get(growing, 0) > thr else None}


def _last_host(ss):
    for s in reversed(ss):
        if s["what"] == "host":
            return s
    return None


def _peak(ss, metric):
    best = None
    for s in ss:
        v = s["values"].get(metric)
        if v is not None and (best is None or v > best[0]):
            best = (v, s)
    return best


def _level(h):
    """(metric, value, limit) judging a host sample against its limit."""
    if h is None:
        return None, None, None
    lim = h.get("limit")
    if "cgroup" in h["values"] and lim:
        return "cgroup", h["values"]["cgroup"], lim
    return "rss", h["values"].get("rss"), lim or None


def _where(s):
    parts = []
    if s.get("phase"):
        parts.append("phase '%s'" % s["phase"])
    if s.get("step") is not None:
        parts.append("step %s" % s["step"])
    return ", ".join(parts) or "no phase"


def _ray_memory_monitor(meta):
    """Ray's own record says its memory monitor killed the worker: (True, why) or (False, None)."""
    m = meta or {}
    rd = m.get("ray_death")
    cands = {"exit_type": m.get("ray_exit_type"), "exit_detail": m.get("ray_exit_detail"),
             "death_cause": m.get("ray_death_cause"), "text": rd if isinstance(rd, str) else None}
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
        if "memory monitor" in t or ("killed" in t and "low on memory" in t) or "ray_memory_usage_threshold" in t:
            return True, "Ray's %s: %s" % (k.replace("_", " "), " ".join(str(cands[k]).split())[:200])
    return False, None


def _cuda_oom(proc, ss):
    """A CUDA OOM of ``proc``: dict or None."""
    for e in proc.events or ():
        if not isinstance(e, dict):
            continue
        if e.get("event") == "cuda_oom":
            return {"source": "allocator observer", "phase": e.get("phase"), "step": e.get("step"),
                    "requested": e.get("requested"), "device_free": e.get("device_free"),
                    "device": e.get("device"), "snapshot": e.get("snapshot")}
    for e in proc.events or ():
        if isinstance(e, dict) and e.get("event") == "exception":
            t, msg = str(e.get("type") or ""), str(e.get("message") or "")
            if t == "OutOfMemoryError" or "CUDA out of memory" in msg:
                o = [s for s in ss if s["source"] == "oom"]
                at = o[-1] if o else None
                return {"source": "exception", "type": t, "message": " ".join(msg.split())[:300],
                        "phase": at["phase"] if at else proc.phase, "step": at["step"] if at else proc.step}
    for s in ss:
        if s["source"] == "oom" and s["what"].startswith("cuda:"):
            return {"source": "allocator observer", "phase": s["phase"], "step": s["step"],
                    "requested": s.get("requested"), "device_free": s.get("device_free"),
                    "device": s["what"]}
    return None


def _pct(v, lim):
    return "%d%%" % round(100.0 * v / lim) if v is not None and lim else "?"


def attribute(proc, cause, cause_text, ss=None):
    """Refine a dead process's ``cause`` from memory evidence.

    ``proc``: ProcessInfo (``meta``, ``events``, ``memory_facts``, ``exit_code``);
    ``cause``/``cause_text``: what ``analysis._death`` found; ``ss``: its samples (default
    from ``proc.memory`` or its records). Returns ``{'cause', 'cause_text', 'evidence':
    [str], 'at_death': {...}, 'base_cause'}``; ``cause`` is unchanged where the evidence
    does not support another.
    """
    if ss is None:
        ss = getattr(proc, "memory", None) or samples(proc.records)
    facts = getattr(proc, "memory_facts", None) or {}
    ev = []
    h = _last_host(ss)
    metric, val, lim = _level(h)
    frac = (float(val) / lim) if val is not None and lim else None
    at = {}
    if h is not None:
        at = {"t_wall_ns": h["t_wall_ns"], "phase": h["phase"], "step": h["step"],
              "rss": h["values"].get("rss"), "cgroup_usage": h["values"].get("cgroup"),
              "limit": lim, "oom_kills": h.get("oom_kills"), "swap": h.get("swap"),
              "fraction_of_limit": round(frac, 3) if frac is not None else None}
        pk = _peak(ss, metric) if metric else None
        if pk:
            at["peak"] = pk[0]
            at["peak_where"] = _where(pk[1])
    kern = facts.get("kernel_oom")
    now_ctr = facts.get("cgroup_oom_kill_now")
    last_ctr = h.get("oom_kills") if h else None
    ctr_up = now_ctr is not None and last_ctr is not None and now_ctr > last_ctr
    ctr_same = now_ctr is not None and last_ctr is not None and now_ctr == last_ctr
    mem_line = None
    if h is not None:
        if lim:
            mem_line = "%s %s of limit %s (%s) at its last sample (%s)" % (
                "cgroup usage" if metric == "cgroup" else "RSS", fmt_bytes(val), fmt_bytes(lim),
                _pct(val, lim), _where(h))
        else:
            total = facts.get("host_mem_total")
            mem_line = "RSS %s at its last sample (%s); no memory limit on its cgroup%s" % (
                fmt_bytes(h["values"].get("rss")), _where(h),
                ", host memory %s" % fmt_bytes(total) if total else "")
    new = cause
    text = cause_text
    base_norecord = cause == "killed-without-record"
    ray_mm, ray_why = _ray_memory_monitor(proc.meta)
    coom = _cuda_oom(proc, ss)
    if ray_mm and cause in ("killed-without-record", "sigterm", "fatal-signal") or (
            ray_mm and str(cause).startswith("exit-code")):
        new = "ray-memory-monitor"
        text = "killed by Ray's memory monitor (%s)" % ray_why
        ev.append("rank killed by Ray's memory monitor: %s" % ray_why)
        if mem_line:
            ev.append("this process: " + mem_line)
        if (proc.meta or {}).get("ray_memory_used_bytes_at_death"):
            ev.append("Ray: node memory used at death %s" % fmt_bytes(proc.meta["ray_memory_used_bytes_at_death"]))
    elif coom is not None and cause in ("exception", "killed-without-record", "fatal-signal") or (
            coom is not None and str(cause).startswith("exit-code")):
        new = "cuda-oom"
        where = _where(coom)
        if coom["source"] == "exception":
            text = "%s in %s: %s" % (coom.get("type") or "OutOfMemoryError", where, coom.get("message") or "")
        else:
            text = "CUDA out of memory on %s in %s: %s requested, %s free" % (
                coom.get("device"), where, fmt_bytes(coom.get("requested")), fmt_bytes(coom.get("device_free")))
        ev.append("out-of-memory error recorded in %s (%s)" % (where, coom["source"]))
        if coom.get("snapshot"):
            ev.append("torch memory snapshot: %s" % coom["snapshot"])
        o = [s for s in ss if s["source"] == "oom"]
        for s in o[-3:]:
            for m, v in s["values"].items():
                ev.append("at the OOM: %s = %s%s" % (m, fmt_bytes(v), " of %s" % fmt_bytes(s["limits"][m])
                                                       if s["limits"].get(m) else ""))
    elif base_norecord or proc.exit_code == -9:
        if kern:
            new = "host-oom-kill"
            line = kern.get("line", "")
            short = line[:line.index(")") + 1] if ")" in line else line[:160]
            text = "killed by the kernel OOM killer (%s): '%s'%s" % (
                "memory cgroup limit" if kern.get("scope") == "cgroup" else "host out of memory", short,
                ", anon RSS %s" % fmt_bytes(kern["anon_rss"]) if kern.get("anon_rss") else "")
            ev.append("kernel log: %s" % kern.get("line", "")[:300])
            if kern.get("anon_rss"):
                ev.append("kernel: anon RSS %s at the kill%s" % (fmt_bytes(kern["anon_rss"]),
                                                                 " of memory cgroup limit %s" % fmt_bytes(lim) if lim else ""))
        elif ctr_up:
            new = "host-oom-kill"
            text = ("SIGKILLed while its memory cgroup's oom_kill counter rose from %d (last sample) to %d "
                    "(collection): the kernel OOM killer" % (last_ctr, now_ctr))
            ev.append("cgroup %s: oom_kill %d at the last sample, %d now" % (facts.get("cgroup_dir"), last_ctr, now_ctr))
        if new == "host-oom-kill":
            if mem_line:
                ev.append(mem_line)
            if frac is not None and frac < NEAR:
                ev.append("memory was below %d%% of the limit at the last sample (taken up to one sampling "
                          "interval before the kill): it rose fast, or another process of the cgroup grew"
                          % (NEAR * 100))
        else:
            why = []
            if ctr_same:
                why.append("its cgroup's oom_kill counter is unchanged (%d)" % now_ctr)
            if facts.get("kernel_log") == "read":
                why.append("the kernel log has no OOM-killer line for pid %d" % proc.pid)
            if frac is not None and frac < LOW:
                why.append("memory well below the limit (%s)" % _pct(val, lim))
            if why and (ctr_same or facts.get("kernel_log") == "read"):
                ev.append("not a host OOM-kill: %s" % "; ".join(why))
            elif frac is not None and frac >= NEAR:
                ev.append("memory was at %s of the limit at the last sample: an OOM kill is likely; "
                          "confirm in the kernel log (dmesg) or the cgroup's oom_kill counter" % _pct(val, lim))
            if mem_line:
                ev.append(mem_line)
    elif cause == "sigterm":
        if h is not None and (frac is None or frac < LOW) and not ctr_up and not kern:
            new = "sigterm-external"
            parts = [mem_line]
            if last_ctr is not None:
                parts.append("cgroup oom_kill counter %s" % ("unchanged (%d)" % last_ctr if now_ctr is None or ctr_same
                                                             else "%d" % last_ctr))
            text = "%s; not an OOM: %s" % (cause_text, "; ".join(p for p in parts if p))
            ev.append("not an OOM: %s" % "; ".join(p for p in parts if p))
        elif frac is not None and frac >= NEAR:
            ev.append("SIGTERM with memory at %s of the limit: a memory-pressure eviction (e.g. the kubelet) "
                      "is possible" % _pct(val, lim))
            if mem_line:
                ev.append(mem_line)
        elif mem_line:
            ev.append(mem_line)
    elif mem_line:
        ev.append("memory at death: " + mem_line)
    return {"cause": new, "cause_text": text, "evidence": ev, "at_death": at, "base_cause": cause,
            "cuda_oom": coom, "ray_memory_monitor": ray_why if ray_mm else None}


def _metrics(ss):
    ms = []
    for s in ss:
        for m in s["values"]:
            if m not in ms:
                ms.append(m)
    return ms


def _primary(ss, metric):
    """Metrics worth a per-rank trend: rss, CUDA, gauges. Never the cgroup usage: the
    cgroup is usually shared by every rank of a container, so its growth is not one rank's
    (it is only compared against its limit, see :func:`attribute`)."""
    return metric != "cgroup"


def analyse_process(proc, rank=None):
    """Samples, ledger rows, kept flags and trends of one process (dict)."""
    ss = getattr(proc, "memory", None) or samples(proc.records)
    rows = ledger(ss, rank)
    flags = kept_across(rows, rank)
    trends = {}
    for m in _metrics(ss):
        if not _primary(ss, m):
            continue
        t = trend(ss, rows, m)
        if t is not None:
            trends[m] = t
    return {"samples": ss, "rows": rows, "kept": flags, "trends": trends}


def _flag_text(f):
    seq = " -> ".join(f["sequence"])
    rel = f["released_steps"]
    s = ("rank %s: %s kept %s across %s on step%s %s (grown in '%s'%s), released on step%s %s (%s)" % (
        f["rank"], f["metric"], fmt_bytes(f["bytes_kept_median"]), seq,
        "s" if len(f["kept_steps"]) > 1 else "", ", ".join(map(str, f["kept_steps"][:8])), f["grown_in"],
        ", not given back by %s" % " / ".join("'%s'" % p for p in f["held_by"]) if f["held_by"] else "",
        "s" if len(rel) > 1 else "", ", ".join(map(str, rel[:8])), " -> ".join(f["released_sequence"])))
    if f["carried_into"]:
        c = f["carried_into"][0]
        s += "; step %s began '%s' with %s" % (c["step"], c["phase"], fmt_bytes(c["enter"]))
    return s


def _trend_text(who, t):
    s = "%s: %s grows %s/step over steps %s-%s (%s -> %s)" % (
        who, t["metric"], fmt_bytes(t["bytes_per_step"]), t["steps"][0], t["steps"][1], fmt_bytes(t["first"]),
        fmt_bytes(t["last"]))
    if t.get("growing_phase"):
        s += ", in phase '%s' (%s/step)" % (t["growing_phase"], _sb(t["phase_growth"][t["growing_phase"]]))
    if t.get("limit"):
        s += "; limit %s" % fmt_bytes(t["limit"])
        if t.get("projected_limit_step") is not None:
            s += ", reached at about step %s" % t["projected_limit_step"]
    return s


def _advice(att, flags, trends, rank):
    out = []
    cause = att.get("cause") if att else None
    for f in flags[:2]:
        per = f.get("periods") or {}
        only = f["only_in_kept_steps"]
        txt = ("rank %s, phase '%s': memory grown there is still held after %s on steps %s only; free it before "
               "the step ends (or have %s give it back)" % (
                   rank, f["grown_in"], " -> ".join(f["sequence"]), ", ".join(map(str, f["kept_steps"][:6])),
                   " / ".join("'%s'" % p for p in f["held_by"]) or "'%s'" % f["grown_in"]))
        knobs = ["%s every %s steps" % (p, per[p]) for p in f["sequence"] + only if per.get(p)]
        if knobs:
            txt += "; the pattern follows the periods (%s): schedule them on different steps or align the " \
                   "periods so the extra memory is freed before the next phase" % ", ".join(dict.fromkeys(knobs))
        out.append(txt)
    for m, t in trends.items():
        if t["steady"]:
            txt = "rank %s: %s grows steadily (%s/step)" % (rank, m, fmt_bytes(t["bytes_per_step"]))
            if t.get("growing_phase"):
                txt += "; look at what phase '%s' keeps from step to step (lists of outputs/tensors, caches)" % \
                       t["growing_phase"]
            if t.get("limit") and t.get("projected_limit_step") is not None:
                txt += "; at this rate the limit %s is reached at step %s" % (fmt_bytes(t["limit"]),
                                                                             t["projected_limit_step"])
            out.append(txt)
    if cause == "host-oom-kill":
        a = att.get("at_death") or {}
        out.append("rank %s was OOM-killed in %s: peak %s vs limit %s; raising the limit only postpones the kill "
                   "if memory grows every step" % (rank, _where(a), fmt_bytes(a.get("peak")), fmt_bytes(a.get("limit"))))
    elif cause == "ray-memory-monitor":
        out.append("Ray's memory monitor killed rank %s: lower the memory use on its node (fewer workers per node, "
                   "smaller batches) or adjust RAY_memory_usage_threshold / RAY_memory_monitor_refresh_ms" % rank)
    elif cause == "cuda-oom":
        c = att.get("cuda_oom") or {}
        out.append("rank %s ran out of device memory in %s; compare the ledger rows before it: memory kept by "
                   "earlier phases is what the failing phase could not get" % (rank, _where(c)))
    elif cause == "sigterm-external":
        out.append("not an OOM: find who sent SIGTERM to rank %s (scheduler preemption, Ray stopping the actor, "
                   "a user, a health check)" % rank)
    return out


def summarize(procs_by_rank, focus, attributions=None, max_ranks=LEDGER_MAX_RANKS, max_steps=LEDGER_MAX_STEPS):
    """``details['memory']`` of a diagnosis (dict) or None when nothing was sampled.

    ``procs_by_rank``: {rank: ProcessInfo}; ``focus``: ranks to report first (culprits,
    then cascade); ``attributions``: {rank: attribute() result}. Ledger rows are kept for
    at most ``max_ranks`` ranks (focus first, then ranks with flags or steady growth) and
    their newest ``max_steps`` steps. Keys: ``ranks`` {str(rank): {'last', 'peak', 'limit',
    'trends'}}, ``ledger`` [rows], ``kept_across`` [flags], ``trends`` [steady trends],
    ``attribution`` {str(rank): ...}, ``advice`` [str], ``evidence`` [str].
    """
    attributions = attributions or {}
    per = {}
    for r, p in procs_by_rank.items():
        if not (getattr(p, "memory", None) or any(rec.get("kind") == "memory" for rec in (p.records or ()))):
            continue
        per[r] = analyse_process(p, r)
    if not per:
        return None
    interesting = [r for r in focus if r in per]
    interesting += [r for r in sorted(per) if r not in interesting and (per[r]["kept"] or any(
        t["steady"] for t in per[r]["trends"].values()))]
    interesting += [r for r in sorted(per) if r not in interesting]
    shown = interesting[:max_ranks]
    out = {"ranks": {}, "ledger": [], "kept_across": [], "trends": [], "attribution": {}, "advice": [],
           "evidence": []}
    for r in sorted(per):
        a = per[r]
        h = _last_host(a["samples"])
        metric, val, lim = _level(h)
        pk = _peak(a["samples"], metric) if metric else None
        out["ranks"][str(r)] = {"metric": metric, "last": val, "limit": lim, "peak": pk[0] if pk else None,
                                "peak_where": _where(pk[1]) if pk else None, "samples": len(a["samples"]),
                                "trends": a["trends"]}
    for r in shown:
        a = per[r]
        steps = sorted({row["step"] for row in a["rows"] if row["step"] is not None})[-max_steps:]
        keep = set(steps)
        for row in a["rows"]:
            if row["step"] in keep or (row["step"] is None and row["exit"] is None):
                out["ledger"].append({k: row[k] for k in ("rank", "step", "phase", "metric", "enter", "exit",
                                                          "delta", "last", "depth", "limit")})
    for r in interesting:
        for f in per[r]["kept"]:
            out["kept_across"].append(f)
            out["evidence"].append(_flag_text(f))
        for t in per[r]["trends"].values():
            if t["steady"]:
                out["trends"].append(dict(t, rank=r))
                out["evidence"].append(_trend_text("rank %s" % r, t))
    for r in focus:
        att = attributions.get(r)
        if att is not None:
            out["attribution"][str(r)] = {k: att[k] for k in ("cause", "base_cause", "cause_text", "at_death",
                                                              "evidence", "cuda_oom", "ray_memory_monitor")}
    for r in interesting[:4]:
        if r in per:
            out["advice"] += _advice(attributions.get(r), per[r]["kept"], per[r]["trends"], r)
    out["advice"] = list(dict.fromkeys(out["advice"]))[:6]
    out["evidence"] = out["evidence"][:12]
    return out


#: Kept/grown memory below both figures is not worth a line in a verdict (allocator noise,
#: caches): at least this many bytes ...
SIGNIFICANT_BYTES = 64 * MIB
#: ... or this fraction of the limit.
SIGNIFICANT_FRACTION = 0.05
#: Death causes for which memory always matters.
MEMORY_CAUSES = ("host-oom-kill", "ray-memory-monitor", "cuda-oom")


def significant_bytes(n, limit=None):
    """True when ``n`` bytes kept/grown matter: >= SIGNIFICANT_BYTES or >=
    SIGNIFICANT_FRACTION of ``limit``."""
    if n is None:
        return False
    return n >= SIGNIFICANT_BYTES or bool(limit and n >= SIGNIFICANT_FRACTION * limit)


def significant(mem, cause=None):
    """``(flags, trends)`` of a ``summarize`` result worth showing in a verdict: kept
    flags / steady trends whose bytes are significant (:func:`significant_bytes`);
    everything when ``cause`` is memory-related (MEMORY_CAUSES)."""
    if not mem:
        return [], []
    flags, trends = mem.get("kept_across") or [], mem.get("trends") or []
    if cause in MEMORY_CAUSES:
        return list(flags), list(trends)
    ranks = mem.get("ranks") or {}

    def lim(r):
        return (ranks.get(str(r)) or {}).get("limit")
    return ([f for f in flags if significant_bytes(f.get("bytes_kept_median"), lim(f.get("rank")))],
            [t for t in trends if significant_bytes((t.get("last") or 0) - (t.get("first") or 0),
                                                    t.get("limit") or lim(t.get("rank")))])


def watch_lines(records, label):
    """Early-warning lines for the watcher: one per steadily growing metric (list of
    ``(key, line)``; ``key`` identifies the metric so the watcher warns once)."""
    ss = samples(records)
    if not ss:
        return []
    rows = ledger(ss)
    out = []
    for m in _metrics(ss):
        if not _primary(ss, m):
            continue
        t = trend(ss, rows, m)
        if t is None or not t["steady"] or t["nsteps"] < 4:
            continue
        out.append((m, "memory warning: " + _trend_text(label, t)))
    return out
