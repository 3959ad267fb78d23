"""Human and machine renderings of a ``Diagnosis`` (see ``tracer.analysis``).

* :func:`verdict_paragraph` - one paragraph: which rank(s), which group (name, desc,
  ranks), which seq/op, phase, step, what the culprit is doing (top frames), why the
  others wait, and what to look at next.
* :func:`text_report` - verdict, evidence lines, cascade, stack classes, a per-rank table
  and the errors (unreadable files) of the snapshot.
* :func:`diagnosis_json` - ``Diagnosis.to_dict()`` plus ``schema_version`` (documented in
  docs/DIAGNOSIS.md).

Pure functions: no I/O.
"""
import textwrap

from hangtrace.tracer.analyze.stacktree import NO_STACK, format_ranks

__all__ = ["verdict_paragraph", "text_report", "diagnosis_json", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1

_NEXT = {
    "collective-mismatch": ("look at the code that issues collectives on this group on the named "
                            "rank(s): threads or coroutines sharing one group, data-dependent shapes or "
                            "branches, groups created in a different order; rerun with "
                            "TORCH_DISTRIBUTED_DEBUG=DETAIL to have torch check shapes"),
    "skipped-collective": ("look for the condition that makes the named rank(s) take another path "
                           "(rank-0-only code such as checkpoint/logging, data-dependent loop lengths, "
                           "early exit or an exception swallowed on that rank)"),
    "cross-group-deadlock": ("make every rank enter these groups in the same order (the same sequence "
                             "of collectives on every group), or separate them onto different streams/"
                             "threads consistently"),
    "stuck-outside-collective": ("find what the named rank waits for outside torch.distributed: the "
                                 "producer of its queue, the holder of its lock, its IO or Ray call; "
                                 "its top frames show where"),
    "dead-rank": None,  # per cause, see _DEAD_NEXT
    "transport-error": ("check the network and the peer host named in the error (NIC, firewall, "
                        "timeouts); if a rank on that host is missing from the snapshot, check it "
                        "directly"),
    "progressing": ("nothing to fix yet: take another snapshot later if the job still seems stuck, or "
                    "lower the stall threshold"),
    "unknown": ("collect more data: stacks of every rank (`hangtrace dump RUN_DIR` while the job is "
                "still hung, with py-spy installed; --native for in-kernel waits), and the ranks without record files"),
}

_DEAD_NEXT = {
    "sigterm": "find who sent SIGTERM (scheduler preemption, Ray stopping the actor, a user, a health check)",
    "fatal-signal": "read the faulthandler dump of the fatal signal (segfault/abort) and the native stack",
    "exception": "read the exception and traceback of that rank (its events and log)",
    "killed-without-record": ("no handler ran: check the kernel log (dmesg) for the OOM killer, the "
                              "cgroup's memory.events/memory.oom_control, Ray's memory monitor and the "
                              "raylet log for who killed the pid"),
    # issue 5 (memory attribution); the evidence-specific advice is in details['memory']['advice']
    "host-oom-kill": "see the memory ledger and trend: which phase grows, and the peak against the limit",
    "ray-memory-monitor": ("lower the memory use on that node (workers per node, batch sizes) or adjust "
                           "RAY_memory_usage_threshold; see the memory figures of the rank"),
    "cuda-oom": "see the memory ledger: memory kept by earlier phases or steps is what the failing phase could not get",
    "sigterm-external": ("not an OOM: find who sent SIGTERM (scheduler preemption, Ray stopping the actor, a "
                         "user, a health check)"),
}


def _ranks(rs):
    rs = list(rs or ())
    if not rs:
        return "no rank"
    return ("rank " if len(rs) == 1 else "ranks ") + format_ranks(rs, 12)


def _waiters_text(diag, coll):
    direct = (diag.details or {}).get("direct_waiters") or diag.waiting_ranks
    s = "%s %s for it in %s" % (_ranks(direct), _verb(direct), coll)
    extra = len(diag.waiting_ranks) - len(direct)
    if extra > 0:
        s += " (%d more rank(s) wait through a chain of collectives)" % extra
    return s + "."


def _verb(rs, one="waits", many="wait"):
    return one if len(rs or ()) == 1 else many


def _group_text(diag):
    if diag.group is None:
        return None
    d = diag.details or {}
    desc = d.get("group_desc")
    s = "group '%s'" % diag.group
    if desc and desc != diag.group:
        s += " (%s)" % desc
    if diag.group_ranks:
        s += " [ranks %s]" % format_ranks(diag.group_ranks, 8)
    return s


def _where(diag):
    parts = []
    if diag.phase:
        parts.append("phase '%s'" % diag.phase)
    if diag.step is not None:
        parts.append("step %s" % diag.step)
    return " at " + ", ".join(parts) if parts else ""


def _sig_where(sig):
    """' in phase 'rollout', step 4' for one signature class of a mismatch ('' if unknown)."""
    parts = []
    if sig.get("phase"):
        parts.append("phase '%s'" % sig["phase"])
    if sig.get("step") is not None:
        parts.append("step %s" % sig["step"])
    return " in " + ", ".join(parts) if parts else ""


def _doing(diag):
    if not diag.frames:
        return ""
    return "; it is in %s" % " < ".join(diag.frames[:3])


def _coll(diag):
    s = ""
    if diag.op:
        s += diag.op
    if diag.seq is not None:
        s += " seq %s" % diag.seq
    g = _group_text(diag)
    if g:
        s += " on " + g
    return s.strip()


# --- Ray (issue 4): actor identity of the culprits, and Ray's own death text as Ray's ---
def _ray_actor_label(a):
    return "%s%s" % (a.get("class") or "actor", " '%s'" % a["name"] if a.get("name") else "")


def _ray_text(diag):
    d = diag.details or {}
    out = ""
    acts = d.get("culprit_actors") or []
    if acts:
        out += " Ray actor%s: %s." % ("s" if len(acts) > 1 else "", ", ".join(
            "rank %s = %s" % (a.get("rank"), _ray_actor_label(a)) for a in acts[:4]))
    says = d.get("ray_says") or {}
    for r in diag.culprit_ranks[:2]:
        x = says.get(str(r))
        if x:
            out += " Ray says (rank %s): \"%s\"." % (r, " ".join(str(x.get("text")).split())[:240])
    return out
# --- end Ray ---


# --- memory (issue 5): attribution figures, kept-across flags, trends, the ledger ---
def _fb(n):
    from hangtrace.tracer.analyze.memory import fmt_bytes
    return fmt_bytes(n)


def _memory_text(diag):
    mem = (diag.details or {}).get("memory") or {}
    if not mem:
        return ""
    out = ""
    for r in diag.culprit_ranks[:2]:
        a = (mem.get("attribution") or {}).get(str(r)) or {}
        at = a.get("at_death") or {}
        if at.get("limit") and (at.get("cgroup_usage") is not None or at.get("rss") is not None):
            v = at.get("cgroup_usage") if at.get("cgroup_usage") is not None else at.get("rss")
            out += " Memory (rank %s): %s of limit %s at its last sample (%s%s), peak %s." % (
                r, _fb(v), _fb(at["limit"]), "phase '%s', " % at["phase"] if at.get("phase") else "",
                "step %s" % at.get("step"), _fb(at.get("peak")))
    from hangtrace.tracer.analyze.memory import significant
    flags, trends = significant(mem, diag.cause)  # small kept/grown bytes: text report only
    for f in flags[:1]:
        out += (" Memory kept across phases (rank %s): %s of %s kept across %s on step%s %s, released on "
                "step%s %s." % (f["rank"], _fb(f["bytes_kept_median"]), f["metric"], " -> ".join(f["sequence"]),
                                "s" if len(f["kept_steps"]) > 1 else "", ", ".join(map(str, f["kept_steps"][:6])),
                                "s" if len(f["released_steps"]) > 1 else "",
                                ", ".join(map(str, f["released_steps"][:6]))))
    for t in trends[:1]:
        out += " Memory growth (rank %s): %s +%s/step%s%s." % (
            t["rank"], t["metric"], _fb(t["bytes_per_step"]),
            " in phase '%s'" % t["growing_phase"] if t.get("growing_phase") else "",
            "; limit %s reached at about step %s" % (_fb(t["limit"]), t["projected_limit_step"])
            if t.get("projected_limit_step") is not None else "")
    adv = mem.get("advice") or []
    if adv and (flags or trends or diag.cause in ("host-oom-kill", "ray-memory-monitor", "cuda-oom")):
        out += " Memory advice: %s." % adv[0]
    return out


def _memory_section(diag, max_rows=60):
    mem = (diag.details or {}).get("memory") or {}
    if not mem:
        return []
    out = ["Memory:"]
    for r, a in sorted((mem.get("attribution") or {}).items(), key=lambda kv: int(kv[0]))[:4]:
        if a.get("cause") != a.get("base_cause"):
            out.append("  rank %s: cause %s (from %s): %s" % (r, a.get("cause"), a.get("base_cause"),
                                                             (a.get("cause_text") or "")[:300]))
    for ln in mem.get("evidence") or ():
        out.append("  - %s" % ln)
    for ln in mem.get("advice") or ():
        out.append("  advice: %s" % ln)
    rows = mem.get("ledger") or []
    if rows:
        flagged = {(f["rank"], f["metric"]) for f in mem.get("kept_across") or ()}
        trending = {(t["rank"], t["metric"]) for t in mem.get("trends") or ()}
        marks = {}
        for f in mem.get("kept_across") or ():
            for st in f["kept_steps"]:
                marks[(f["rank"], f["metric"], st, f["grown_in"])] = "!"
        pick = flagged | trending
        if not pick:
            for r in {x["rank"] for x in rows}:
                ms = [x["metric"] for x in rows if x["rank"] == r]
                pick.add((r, "cgroup" if "cgroup" in ms else ms[0]))
        sel = [x for x in rows if (x["rank"], x["metric"]) in pick]
        focus = [int(c) for c in diag.culprit_ranks]
        sel.sort(key=lambda x: (x["rank"] not in focus, x["rank"], x["metric"]))
        out.append("  Ledger (memory just after entering / just before leaving each phase; '!' = kept across "
                   "the phase boundary):")
        header = ("rank", "step", "phase", "metric", "enter", "exit", "delta", "")
        table = []
        for x in sel[-max_rows:] if len(sel) > max_rows else sel:
            table.append((str(x["rank"]), "-" if x["step"] is None else str(x["step"]),
                          "  " * (x.get("depth") or 0) + str(x["phase"]), x["metric"], _fb(x["enter"]),
                          _fb(x["exit"]) if x["exit"] is not None else "(open: %s)" % _fb(x.get("last")),
                          "" if x["delta"] is None else ("+" if x["delta"] >= 0 else "-") + _fb(abs(x["delta"])),
                          marks.get((x["rank"], x["metric"], x["step"], x["phase"]), "")))
        widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(header)]
        fmt = "  ".join("%%-%ds" % w for w in widths)
        out.append(("    " + fmt % header).rstrip())
        out.extend(("    " + fmt % t).rstrip() for t in table)
        if len(sel) > max_rows:
            out.append("    ... %d earlier rows in the JSON (details.memory.ledger)" % (len(sel) - max_rows))
    out.append("")
    return out
# --- end memory ---


def verdict_paragraph(diag):
    """One paragraph (a str, no trailing newline) a human reads first."""
    k = diag.kind
    d = diag.details or {}
    who = _ranks(diag.culprit_ranks)
    waiting = (" %s %s for it" % (_ranks(diag.waiting_ranks), _verb(diag.waiting_ranks))) if diag.waiting_ranks else ""
    reasons = d.get("culprit_reasons") or {}
    reason = ""
    if diag.culprit_ranks and str(diag.culprit_ranks[0]) in reasons:
        reason = reasons[str(diag.culprit_ranks[0])]
    coll = _coll(diag)
    if k == "collective-mismatch":
        if diag.cause == "sequence-diverged":
            s = ("Collective mismatch: %s %s in %s, which the other members already passed: the "
                 "sequence of collectives on this group diverged%s%s." % (
                     who, _verb(diag.culprit_ranks), coll, _where(diag), _doing(diag)))
        else:
            sigs = d.get("signatures") or []
            # each side's phase/step only when they differ (e.g. rank 0 in 'checkpoint' of
            # step 3 while the others are in 'rollout' of step 4)
            differ = len({(x.get("phase"), x.get("step")) for x in sigs}) > 1
            sig_txt = "; ".join("%s: %s%s%s%s" % (_ranks(x["ranks"]), x["op"],
                                                  " %s" % x["dtype"] if x.get("dtype") else "",
                                                  " numel=%s" % x["numel"] if x.get("numel") is not None else "",
                                                  _sig_where(x) if differ else "")
                                for x in sigs[:4])
            if coll:
                s = ("Collective mismatch: %s issued a different operation than the other members at %s"
                     "%s%s%s; the group cannot complete it." % (
                         who, coll, " (%s)" % sig_txt if sig_txt else "", _where(diag), _doing(diag)))
            else:  # group/sequence number unknown (e.g. stacks only: hangtrace attach)
                s = ("Collective mismatch: %s %s blocked in a different collective than the other ranks"
                     "%s (group and sequence number unknown)%s%s; they cannot complete it." % (
                         who, "is" if len(diag.culprit_ranks or ()) == 1 else "are",
                         " (%s)" % sig_txt if sig_txt else "", _where(diag), _doing(diag)))
    elif k == "skipped-collective":
        ex = d.get("extra_collective")
        if diag.cause == "extra-collective" and ex:
            n_c = max((ex.get("culprit_counts") or {}).values() or [0])
            base = ex.get("majority_count")
            more = n_c - base if isinstance(base, int) else 1
            others = ex.get("other_group_ranks") or []
            s = ("Skipped collective (extra collective): %s issued %s more %s on %s than %s %s%s "
                 "(%s vs %s): %s %s in %s%s, which %s never %s%s; the other waits are cascade%s." % (
                     who, "one" if more == 1 else more, ex.get("op") or "collective",
                     ex.get("group_desc") or coll, "its peer" if len(ex.get("peers") or ()) == 1 else "its peers",
                     _ranks(ex.get("peers")),
                     (" and than the other %s group(s)' %s" % (ex.get("role"), _ranks(others))) if others else "",
                     n_c, base, who, _verb(diag.culprit_ranks), coll, _where(diag),
                     _ranks(ex.get("peers")), _verb(ex.get("peers"), "issues", "issue"), _doing(diag),
                     (" (%s %s)" % (_ranks(diag.waiting_ranks), _verb(diag.waiting_ranks)))
                     if diag.waiting_ranks else ""))
        elif diag.cause == "extra-collective":
            s = ("Skipped collective: %s alone entered %s%s%s; the other members never call it and "
                 "went on, so %s %s forever." % (who, coll, _where(diag), _doing(diag), who,
                                                 _verb(diag.culprit_ranks)))
        else:
            s = ("Skipped collective: %s never reached %s%s: %s%s.%s" % (
                who, coll or "the collective the others wait in", _where(diag), reason or "it took another path",
                _doing(diag), waiting and waiting[:1].upper() + waiting[1:] + "."))
    elif k == "cross-group-deadlock":
        cyc = d.get("cycle") or {}
        groups = ", ".join("'%s'" % g for g in cyc.get("groups", []))
        s = ("Cross-group deadlock: ranks %s wait on each other in a cycle over groups %s "
             "(entered in different orders); named: %s, waiting in %s%s%s." % (
                 format_ranks(cyc.get("ranks", diag.culprit_ranks), 12), groups or "?", who, coll,
                 _where(diag), _doing(diag)))
    elif k == "stuck-outside-collective":
        s = ("Stuck outside collectives: %s is not in any collective%s: %s%s. %s" % (
            who, _where(diag), reason or "it made no progress", _doing(diag),
            _waiters_text(diag, coll) if diag.waiting_ranks and coll else
            ("Others wait for it in %s." % coll if coll else "")))
    elif k == "dead-rank":
        text = d.get("cause_text") or ""
        casc = diag.cascade or []
        s = ("Dead rank: %s died first (cause: %s%s)%s%s%s." % (
            who, diag.cause, (": " + text) if text else "", _where(diag),
            (" during/after %s" % coll) if coll else "", _doing(diag)))
        if casc:
            s += " %d other rank(s) failed after it (cascade, e.g. rank %d: %s)." % (
                len(casc), casc[0]["rank"], (casc[0].get("text") or casc[0].get("cause") or "")[:100])
        elif diag.waiting_ranks:
            s += " %s %s for it." % (_ranks(diag.waiting_ranks), _verb(diag.waiting_ranks))
    elif k == "transport-error":
        s = ("Transport error: %s failed first in %s with '%s', and no rank is dead%s." % (
            who, coll or "a collective", (d.get("cause_text") or "")[:160], _where(diag)))
        if diag.cascade:
            s += " %d more rank(s) failed after it." % len(diag.cascade)
    elif k == "progressing":
        age = d.get("last_progress_age_s")
        s = "Progressing: no rank waits for a missing or diverged rank%s." % (
            "; last progress %.1f s before the snapshot" % age if age is not None else "")
    else:
        why = {"no-data": "no traced process with a rank in the snapshot",
               "no-record-file": "the ranks everyone waits for left no record file",
               "stalled-inside-collective": "every member entered the collective and it does not complete",
               "stalled-outside-collectives": "nothing progressed but no rank is in a collective"}.get(
                   diag.cause, diag.cause or "not enough data")
        s = "Unknown: %s" % why
        if diag.culprit_ranks:
            s += "; suspects: %s" % who
        if coll:
            s += " (%s)" % coll
        s += "."
    s += _ray_text(diag)  # issue 4
    s += _memory_text(diag)  # issue 5
    nxt = _DEAD_NEXT.get(diag.cause if diag.cause in _DEAD_NEXT else "", None) if k == "dead-rank" else _NEXT.get(k)
    if k == "dead-rank" and nxt is None and (diag.cause or "").startswith("exit-code"):
        nxt = "read that rank's log around its exit; a non-zero exit without an exception is often sys.exit or a launcher"
    if nxt:
        s += " Next: %s." % nxt
    return " ".join(s.split())


def _last_coll(proc):
    for rec in reversed(proc.records or ()):
        if rec.get("kind") in ("collective", "p2p"):
            return rec
    return None


def _coll_cell(rec):
    if rec is None:
        return "-"
    s = "%s/%s/%s/%s" % (rec.get("group"), rec.get("seq"), rec.get("op"), rec.get("state"))
    if rec.get("kind") == "p2p" and rec.get("peer") not in (None, -1):
        s += "(peer %s)" % rec.get("peer")
    return s


def _rank_rows(diag, snapshot, max_rows):
    cls = {}
    for i, c in enumerate(diag.stack_classes or ()):
        tag = "-" if c.get("frames") == [NO_STACK] else "#%d%s" % (i, "!" if c.get("outlier") else "")
        for r in c.get("ranks", ()):
            cls[r] = tag
    procs = {}
    unranked = []
    for p in snapshot.processes:
        if p.rank is None or p.rank < 0:
            unranked.append(p)
        else:
            procs.setdefault(p.rank, p)
    missing = set((diag.details or {}).get("missing_ranks") or ())
    ranks = sorted(set(procs) | missing)
    culp = set(diag.culprit_ranks)
    if max_rows is not None and len(ranks) > max_rows:
        keep = [r for r in ranks if r in culp] + [r for r in ranks if r not in culp][:max(0, max_rows - len(culp))]
        omitted = len(ranks) - len(keep)
        ranks = sorted(keep)
    else:
        omitted = 0
    header = ("rank", "host:pid", "state", "phase", "step", "last collective (group/seq/op/state)", "stack")
    rows = []
    for r in ranks:
        p = procs.get(r)
        mark = "*" if r in culp else ""
        if p is None:
            rows.append(("%d%s" % (r, mark), "-", "no file", "-", "-", "-", "-"))
            continue
        st = p.state + (" (%s)" % p.exit_code if p.exit_code not in (None,) and p.state == "exited" else "")
        rows.append(("%d%s" % (r, mark), p.key, st, str(p.phase or "-"),
                     "-" if p.step is None else str(p.step), _coll_cell(_last_coll(p)), cls.get(r, "-")))
    for p in unranked[:20]:
        rows.append(("?", p.key, p.state, str(p.phase or "-"), "-" if p.step is None else str(p.step),
                     _coll_cell(_last_coll(p)), "-"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join("%%-%ds" % w for w in widths)
    out = [fmt % header] + [fmt % row for row in rows]
    if omitted:
        out.append("... %d more ranks not shown" % omitted)
    return [ln.rstrip() for ln in out]


def text_report(diag, snapshot, max_rows=512, width=100):
    """The full text report (str, ends with a newline).

    ``snapshot``: the ``Snapshot`` the diagnosis came from (for the per-rank table and
    its errors). ``max_rows``: at most this many rank rows (culprits always shown; None =
    all). ``width``: wrap width of the verdict paragraph. Culprit ranks are marked ``*``
    in the table; stack ``#i`` is the index in the stack classes, ``!`` an outlier class.
    """
    out = []
    out.append("hangtrace verdict: %s   culprit %s" % (diag.kind, _ranks(diag.culprit_ranks)))
    out.append("")
    out.extend(textwrap.wrap(diag.summary or verdict_paragraph(diag), width=width))
    out.append("")
    if diag.frames:
        out.append("Culprit top frames (innermost first):")
        out.extend("  %s" % f for f in diag.frames)
        out.append("")
    if diag.evidence:
        out.append("Evidence:")
        out.extend("  - %s" % e for e in diag.evidence)
        out.append("")
    if diag.cascade:
        out.append("Cascade (later failures, by time):")
        for c in diag.cascade[:50]:
            out.append("  - rank %s: %s%s" % (c.get("rank"), c.get("cause"),
                                             (": " + str(c.get("text"))[:160]) if c.get("text") else ""))
        if len(diag.cascade) > 50:
            out.append("  ... %d more" % (len(diag.cascade) - 50))
        out.append("")
    if diag.stack_classes:
        out.append("Stack classes (outer > inner; '!' = outlier):")
        for i, c in enumerate(diag.stack_classes[:12]):
            frames = c.get("frames") or []
            shown = frames if len(frames) <= 4 else ["..."] + frames[-4:]
            out.append("  #%d%s %d rank(s) [%s]: %s" % (i, "!" if c.get("outlier") else "", c["count"],
                                                         format_ranks(c["ranks"], 8), " > ".join(shown)))
        if len(diag.stack_classes) > 12:
            out.append("  ... %d more classes" % (len(diag.stack_classes) - 12))
        out.append("")
    acts = (diag.details or {}).get("ray_actors") or {}
    if acts:  # issue 4
        out.append("Ray actors:")
        says = (diag.details or {}).get("ray_says") or {}
        for r in sorted(acts, key=int)[:64]:
            a = acts[r]
            out.append("  rank %s: %s (actor id %s, node %s, pid %s)%s" % (
                r, _ray_actor_label(a), (a.get("actor_id") or "?")[:16], (a.get("node_id") or "?")[:12],
                a.get("pid"), "; Ray says: %s" % " ".join(str(says[r]["text"]).split())[:300] if r in says else ""))
        out.append("")
    out.extend(_memory_section(diag))  # issue 5
    out.append("Ranks:")
    out.extend("  " + ln for ln in _rank_rows(diag, snapshot, max_rows))
    out.append("")
    errors = list(diag.errors or snapshot.errors or [])
    if errors:
        out.append("Errors (unreadable files; their ranks are missing above):")
        out.extend("  - %s" % e for e in errors)
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def diagnosis_json(diag):
    """``diag.to_dict()`` plus ``schema_version`` (int, currently 1): a JSON-ready dict."""
    d = diag.to_dict()
    d["schema_version"] = SCHEMA_VERSION
    return d
