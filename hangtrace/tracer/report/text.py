"""The text report of a ``Diagnosis``: verdict, evidence lines, cascade, stack classes,
Ray actors, memory, a per-rank table and the errors (unreadable files) of the snapshot.

The verdict paragraph is ``report.paragraph``, the JSON form ``report.json``; both are
re-exported here (the names the CLI, watcher and collectors import). Pure: no I/O.
"""

import os
import textwrap
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from hangtrace.tracer.analyze.stuck.stacktree import NO_STACK, format_ranks
from hangtrace.tracer.diagnosis import Cause, Diagnosis
from hangtrace.tracer.process_model import ProcessRoles, assign_roles, process_argv
from hangtrace.tracer.report.clip import clip
from hangtrace.tracer.report.json import SCHEMA_VERSION, diagnosis_json
from hangtrace.tracer.report.memorytext import fb
from hangtrace.tracer.report.paragraph import verdict_paragraph
from hangtrace.tracer.report.rayparagraph import ray_actor_label
from hangtrace.tracer.report.words import ranks_text as _ranks
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot

__all__ = ["verdict_paragraph", "text_report", "diagnosis_json", "SCHEMA_VERSION"]


# --- memory (issue 5): the ledger ---
def _ledger_rows(
    diag: Diagnosis, mem: Dict[str, Any]
) -> Tuple[List[Dict[str, Any]], Dict[Tuple[Any, ...], str]]:
    """The ledger rows shown (flagged or trending metrics, else one metric per rank;
    culprits first) and the '!' marks of kept-across steps."""
    rows = mem.get("ledger") or []
    flagged = {(f["rank"], f["metric"]) for f in mem.get("kept_across") or ()}
    trending = {(t["rank"], t["metric"]) for t in mem.get("trends") or ()}
    marks: Dict[Tuple[Any, ...], str] = {}
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
    return sel, marks


def _ledger_cells(x: Dict[str, Any], marks: Dict[Tuple[Any, ...], str]) -> Tuple[str, ...]:
    return (
        str(x["rank"]),
        "-" if x["step"] is None else str(x["step"]),
        "  " * (x.get("depth") or 0) + str(x["phase"]),
        x["metric"],
        fb(x["enter"]),
        fb(x["exit"]) if x["exit"] is not None else "(open: %s)" % fb(x.get("last")),
        "" if x["delta"] is None else ("+" if x["delta"] >= 0 else "-") + fb(abs(x["delta"])),
        marks.get((x["rank"], x["metric"], x["step"], x["phase"]), ""),
    )


def _ledger_table(diag: Diagnosis, mem: Dict[str, Any], max_rows: int) -> List[str]:
    sel, marks = _ledger_rows(diag, mem)
    out = [
        "  Ledger (memory just after entering / just before leaving each phase; '!' = kept across "
        "the phase boundary):"
    ]
    header = ("rank", "step", "phase", "metric", "enter", "exit", "delta", "")
    table = [_ledger_cells(x, marks) for x in (sel[-max_rows:] if len(sel) > max_rows else sel)]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(header)]
    fmt = "  ".join("%%-%ds" % w for w in widths)
    out.append(("    " + fmt % header).rstrip())
    out.extend(("    " + fmt % t).rstrip() for t in table)
    if len(sel) > max_rows:
        out.append(
            "    ... %d earlier rows in the JSON (details.memory.ledger; `hangtrace records RUN_DIR --memory`)"
            % (len(sel) - max_rows)
        )
    if any(
        t[3] == "cgroup" for t in table
    ):  # (blind job tr_dl_leak: a reader blamed the ranks' shared growth)
        out.append(
            "    cgroup: the usage of the process's memory cgroup, shared by every process in it (the ranks "
            "of a container): its growth is not one rank's"
        )
    return out


#: causes of a verdict about memory: the ledger is shown in full (up to ``max_rows``)
_MEMORY_CAUSES = frozenset({Cause.HOST_OOM_KILL.value, Cause.CUDA_OOM.value, Cause.RAY_MEMORY_MONITOR.value})
_LEDGER_BRIEF = 6


def _memory_section(diag: Diagnosis, max_rows: int = 60) -> List[str]:
    """The 'Memory:' section: changed causes, evidence, advice, the ledger table."""
    mem = (diag.details or {}).get("memory") or {}
    if not mem:
        return []
    out = ["Memory:"]
    for r, a in sorted((mem.get("attribution") or {}).items(), key=lambda kv: int(kv[0]))[:4]:
        if a.get("cause") != a.get("base_cause"):
            out.append(
                "  rank %s: cause %s (from %s): %s"
                % (r, a.get("cause"), a.get("base_cause"), clip(a.get("cause_text") or "", 300))
            )
    for ln in mem.get("evidence") or ():
        out.append("  - %s" % ln)
    for ln in mem.get("advice") or ():
        out.append("  advice: %s" % ln)
    if mem.get(
        "ledger"
    ):  # (a verdict not about memory: its newest rows only; helpers 53, 57, 65 and 68 found it noise)
        out.extend(_ledger_table(diag, mem, max_rows if str(diag.cause) in _MEMORY_CAUSES else _LEDGER_BRIEF))
    out.append("")
    return out


# --- end memory ---


def _last_coll(proc: ProcessInfo) -> Optional[Dict[str, Any]]:
    rec = proc.summary.last_comm if proc.summary is not None else None
    return dict(rec) if rec is not None else None


def _coll_cell(rec: Optional[Dict[str, Any]]) -> str:
    if rec is None:
        return "-"
    s = "%s/%s/%s/%s" % (rec.get("group"), rec.get("seq"), rec.get("op"), rec.get("state"))
    if rec.get("kind") == "p2p" and rec.get("peer") not in (None, -1):
        s += "(peer %s)" % rec.get("peer")
    return s


def _rank_cells(r: int, proc: Optional[ProcessInfo], culprit: bool, cls: Dict[int, str]) -> Tuple[str, ...]:
    mark = "*" if culprit else ""
    if proc is None:
        return ("%d%s" % (r, mark), "-", "no file", "-", "-", "-", "-")
    st = proc.state + (
        " (%s)" % proc.exit_code if proc.exit_code not in (None,) and proc.state == "exited" else ""
    )
    return (
        "%d%s" % (r, mark),
        proc.key,
        st,
        str(proc.phase or "-"),
        "-" if proc.step is None else str(proc.step),
        _coll_cell(_last_coll(proc)),
        cls.get(r, "-"),
    )


def _stack_tags(diag: Diagnosis) -> Dict[int, str]:
    """The diagnosis in; {rank: its stack class cell (``#i``, ``#i!`` outlier, ``-`` no stack)} out."""
    cls: Dict[int, str] = {}
    for i, c in enumerate(diag.stack_classes or ()):
        tag = "-" if c.get("frames") == [NO_STACK] else "#%d%s" % (i, "!" if c.get("outlier") else "")
        for r in c.get("ranks", ()):
            cls[r] = tag
    return cls


def _shown_ranks(ranks: List[int], culp: Set[int], max_rows: Optional[int]) -> Tuple[List[int], int]:
    """Sorted ranks in; (the ranks shown: culprits always, at most ``max_rows``; how many omitted) out."""
    if max_rows is None or len(ranks) <= max_rows:
        return ranks, 0
    keep = [r for r in ranks if r in culp] + [r for r in ranks if r not in culp][
        : max(0, max_rows - len(culp))
    ]
    return sorted(keep), len(ranks) - len(keep)


def _unranked_cells(p: ProcessInfo, roles: ProcessRoles, culprits: Set[str]) -> Tuple[str, ...]:
    """A process that is no rank in; its table row (its role or Ray actor, ``*`` if a culprit) out."""
    of = roles.helper_of.get(p.key)
    oom = " (OOM killer)" if (p.memory_facts or {}).get("kernel_oom") else ""  # (its own kernel line)
    m = p.meta or {}
    what = "%s%s" % (roles.role(p).value, "" if of is None else " of %d" % of)
    if m.get("ray_actor_class"):  # a Ray actor by its class (and name), as the verdict names it
        what = "%s %s" % (
            m["ray_actor_class"],
            "'%s'" % m["ray_actor_name"] if m.get("ray_actor_name") else "",
        )
    elif roles.role(p).value in ("other", "launcher"):  # what it runs: Ray's dashboard, a launcher script
        what += _program(process_argv(p))
    return (
        what.strip() + ("*" if p.key in culprits else ""),
        p.key,
        p.state + oom,
        str(p.phase or "-"),
        "-" if p.step is None else str(p.step),
        _coll_cell(_last_coll(p)),
        "-",
    )


def _more_processes(rest: List[ProcessInfo], roles: ProcessRoles) -> str:
    """The unranked processes beyond the table in; the '... N more processes' line (counts by role) out."""
    by_role: Dict[str, int] = {}
    for p in rest:
        by_role[roles.role(p).value] = by_role.get(roles.role(p).value, 0) + 1
    return "... %d more processes not shown (%s)" % (
        len(rest),
        ", ".join("%d %s" % (n, r) for r, n in sorted(by_role.items())),
    )


def _rank_rows(diag: Diagnosis, snapshot: Snapshot, max_rows: Optional[int]) -> List[str]:
    """The per-rank table: at most ``max_rows`` rank rows (culprits always), then up to
    20 unranked processes."""
    cls = _stack_tags(diag)
    # the process that IS each rank (process model: a spawn parent or DataLoader worker with
    # the rank in its environment is not it); every other process is listed with its role
    roles = assign_roles(snapshot.processes)
    procs: Dict[int, ProcessInfo] = dict(roles.ranks)
    chosen = {p.key for p in procs.values()}
    unranked: List[ProcessInfo] = [p for p in snapshot.processes if p.key not in chosen]
    missing = set((diag.details or {}).get("missing_ranks") or ())
    culp = set(diag.culprit_ranks)
    ranks, omitted = _shown_ranks(sorted(set(procs) | missing), culp, max_rows)
    header = ("rank", "host:pid", "state", "phase", "step", "last collective (group/seq/op/state)", "stack")
    rows = [_rank_cells(r, procs.get(r), r in culp, cls) for r in ranks]
    named, culprits = _named_processes(diag)
    unranked.sort(key=lambda p: (p.key not in named, _ROLE_ORDER.get(roles.role(p).value, 9)))
    rows += [_unranked_cells(p, roles, culprits) for p in unranked[:_UNRANKED_ROWS]]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join("%%-%ds" % w for w in widths)
    out = [fmt % header] + [fmt % row for row in rows]
    if omitted:
        out.append("... %d more ranks not shown" % omitted)
    if len(unranked) > _UNRANKED_ROWS:
        out.append(_more_processes(unranked[_UNRANKED_ROWS:], roles))
    return [ln.rstrip() for ln in out]


def _program(argv: List[str]) -> str:
    """``' (dashboard.py)'``, ``' (-m torch.distributed.run)'``, ``' (-c)'``: what a process runs,
    from its ``sys.argv`` (the start record), or ''."""
    if not argv:
        return ""
    if argv[0] == "-m" and len(argv) > 1:
        return " (-m %s)" % argv[1][:40]
    if argv[0] == "-c":
        return " (python -c)"
    return " (%s)" % os.path.basename(argv[0])[:40]


_UNRANKED_ROWS = 20
#: unranked processes by what they are to the job: actors and rank helpers before Ray's and the launcher's
_ROLE_ORDER = {"ray-actor": 0, "rank-helper": 1, "ray-task-worker": 2, "launcher": 3, "other": 4}


def _named_processes(diag: Diagnosis) -> Tuple[Set[str], Set[str]]:
    """The keys (``host:pid``) of the processes the verdict names (a rank-less actor, the
    members of an actor cycle or chain and their waiters: listed first) and of its culprits
    among them (the actor, the cycle's members: marked ``*``)."""
    d = diag.details or {}
    culprits = {d["culprit_process"]} if d.get("culprit_process") else set()
    culprits |= {x["process"] for x in d.get("actor_cycle") or () if isinstance(x, dict) and x.get("process")}
    keys = set(culprits)
    for k in ("actor_chain", "actor_waiters"):
        keys |= {x["process"] for x in d.get(k) or () if isinstance(x, dict) and x.get("process")}
    return keys, culprits


def _headline(diag: Diagnosis) -> str:
    """The diagnosis in; the first line (``hangtrace verdict: KIND   culprit RANKS or Ray actors``) out."""
    return "hangtrace verdict: %s   culprit %s" % (
        diag.kind,
        _ranks(diag.culprit_ranks)
        if diag.culprit_ranks or not diag.culprit_actors
        else "Ray actor%s %s"
        % ("s" if len(diag.culprit_actors) > 1 else "", ", ".join(diag.culprit_actors[:4])),
    )


def _cascade_section(diag: Diagnosis) -> List[str]:
    """The diagnosis in; the 'Cascade' section lines (up to 50 later failures), or [] out."""
    if not diag.cascade:
        return []
    out = ["Cascade (later failures, by time):"]
    for c in diag.cascade[:50]:
        out.append(
            "  - rank %s: %s%s"
            % (c.get("rank"), c.get("cause"), (": " + str(c.get("text"))[:160]) if c.get("text") else "")
        )
    if len(diag.cascade) > 50:
        out.append("  ... %d more" % (len(diag.cascade) - 50))
    out.append("")
    return out


def _stack_section(diag: Diagnosis) -> List[str]:
    """The diagnosis in; the 'Stack classes' section lines (up to 12 classes), or [] out."""
    if not diag.stack_classes:
        return []
    out = ["Stack classes (outer > inner; '!' = outlier):"]
    unit = "pid" if "culprit_pids" in (diag.details or {}) else "rank"  # (attach keyed by pid: no rank known)
    for i, c in enumerate(diag.stack_classes[:12]):
        frames = c.get("frames") or []
        shown = frames if len(frames) <= 4 else ["..."] + frames[-4:]
        out.append(
            "  #%d%s %d %s%s [%s]: %s"
            % (
                i,
                "!" if c.get("outlier") else "",
                c["count"],
                unit,
                "" if c["count"] == 1 else "s",
                format_ranks(c["ranks"], 8),
                " > ".join(shown),
            )
        )
    if len(diag.stack_classes) > 12:
        out.append("  ... %d more classes" % (len(diag.stack_classes) - 12))
    out.append("")
    return out


def _ray_section(diag: Diagnosis) -> List[str]:
    """The diagnosis in; the 'Ray actors' section lines (issue 4: up to 64 ranks' actors), or [] out."""
    acts = (diag.details or {}).get("ray_actors") or {}
    if not acts:
        return []
    out = ["Ray actors:"]
    says = (diag.details or {}).get("ray_says") or {}
    for r in sorted(acts, key=int)[:64]:
        a = acts[r]
        out.append(
            "  rank %s: %s (actor id %s, node %s, pid %s)%s"
            % (
                r,
                ray_actor_label(a),
                (a.get("actor_id") or "?")[:16],
                (a.get("node_id") or "?")[:12],
                a.get("pid"),
                "; Ray says: %s" % " ".join(str(says[r]["text"]).split())[:300] if r in says else "",
            )
        )
    out.append("")
    return out


def _list_section(title: str, items: Sequence[Any], fmt: str = "  - %s") -> List[str]:
    """A title and its items in; the section lines (title, one line per item, a blank), or [] when no items."""
    return [title] + [fmt % x for x in items] + [""] if items else []


def text_report(diag: Diagnosis, snapshot: Snapshot, max_rows: Optional[int] = 512, width: int = 100) -> str:
    """The full text report (str, ends with a newline).

    ``snapshot``: the ``Snapshot`` the diagnosis came from (for the per-rank table and
    its errors). ``max_rows``: at most this many rank rows (culprits always shown; None =
    all). ``width``: wrap width of the verdict paragraph. Culprit ranks are marked ``*``
    in the table; stack ``#i`` is the index in the stack classes, ``!`` an outlier class.
    """
    out = [_headline(diag), ""]
    out.extend(textwrap.wrap(diag.summary or verdict_paragraph(diag), width=width))
    out.append("")
    out.extend(_list_section("Culprit top frames (innermost first):", diag.frames, "  %s"))
    out.extend(_list_section("Evidence:", diag.evidence))
    out.extend(_cascade_section(diag))
    out.extend(_stack_section(diag))
    out.extend(_ray_section(diag))  # issue 4
    out.extend(_memory_section(diag))  # issue 5
    out.append("Ranks:")
    out.extend("  " + ln for ln in _rank_rows(diag, snapshot, max_rows))
    out.append("")
    out.extend(
        _list_section(
            "Errors (unreadable files; their ranks are missing above):",
            list(diag.errors or snapshot.errors or []),
        )
    )
    return "\n".join(out).rstrip("\n") + "\n"
