"""Every environment variable hangtrace reads, with its default and meaning.

This module is imported inside every traced process: it imports only ``os``.
CLI flags map onto these variables (``hangtrace run --stall-s`` sets
``HANGTRACE_STALL_S`` for the watcher, and so on).
"""

from __future__ import annotations

import os
from typing import Dict, FrozenSet, Mapping, MutableMapping, Optional, Tuple

#: Turns tracing on in this process and every Python process it starts when set
#: to anything but "" or "0". Checked by the ``.pth`` file before anything is imported.
ENABLE = "HANGTRACE"
#: Run directory shared by all processes of one run. Default: a new folder
#: ``hangtrace-<run id>`` under the system temp dir, created by the first traced
#: process and exported to its children.
DIR = "HANGTRACE_DIR"
#: Run id (free text, <= 63 bytes). Default: ``<UTC time>-<pid of first process>``.
RUN_ID = "HANGTRACE_RUN_ID"
#: Number of record slots per ring file (128 bytes each). Default 16384 (2 MiB).
SLOTS = "HANGTRACE_SLOTS"
#: Slots of the small ring a process starts with (128 bytes each; default 256 = 32 KiB,
#: about 52 KiB on disk with its string table). It is replaced by the full ring
#: (``HANGTRACE_SLOTS``) when the process joins a process group, becomes a Ray actor or
#: uses the phase/step API, so helpers (DataLoader workers, resource tracker, compile
#: workers) cost kilobytes. "0" (or a value >= HANGTRACE_SLOTS): every process gets the
#: full ring at once. See hooks/record/ringsize.py.
HELPER_SLOTS = "HANGTRACE_HELPER_SLOTS"
#: Seconds without progress anywhere in the run before the watcher reports a stall.
STALL_S = "HANGTRACE_STALL_S"
#: Per-phase stall thresholds, ``name=seconds,name=seconds`` (e.g. ``checkpoint=1800``).
PHASE_STALL_S = "HANGTRACE_PHASE_STALL_S"
#: Stall threshold in seconds while a live ranked process has made no progress since it
#: started (still importing torch, or in rendezvous): ``import torch`` in several ranks
#: on a busy node takes many seconds and is no hang. The larger of this and the stall
#: threshold applies until every live ranked process made progress once.
STARTUP_STALL_S = "HANGTRACE_STARTUP_STALL_S"
#: Watcher poll period in seconds.
POLL_S = "HANGTRACE_POLL_S"
#: "1": the first traced process on a node starts a node watcher when none runs.
#: "0": never (``hangtrace run`` starts its own and sets this to 0 for the job).
AUTO_WATCH = "HANGTRACE_AUTO_WATCH"
#: Set by ``hooks/autowatch`` in the auto-started node watcher's environment only: the
#: terminal (``/dev/pts/N``) of the stderr of the traced process that started it, where it had
#: one; the watcher writes each verdict there as well as to its log (issue 38).
WATCH_TTY = "HANGTRACE_WATCH_TTY"
#: Set by hangtrace in the environment of its own helper processes (watcher,
#: py-spy): such processes never trace themselves.
HELPER = "HANGTRACE_HELPER"
#: Memory sampling (issue 5): "0" turns it off; anything else (default "1") samples host
#: RSS/swap, the process's memory cgroup, CUDA (when initialised) and registered gauges
#: into the ring at every phase entry/exit, every step and on a timer.
MEM = "HANGTRACE_MEM"
#: Seconds between timer memory samples (default 1.0). A timer tick writes no record when
#: a phase/step sample was taken within the interval; it still refreshes swap and limits.
MEM_INTERVAL_S = "HANGTRACE_MEM_INTERVAL_S"
#: "1": when CUDA is initialised, also record torch's allocator history
#: (``torch.cuda.memory._record_memory_history``) and dump a snapshot file into
#: ``RUN_DIR/memory/`` on a CUDA out-of-memory error. Default "0" (it costs allocator time).
MEM_CUDA_HISTORY = "HANGTRACE_MEM_CUDA_HISTORY"
#: "1": record with the pure-Python hot path even when the optional C extension
#: ``hangtrace.hooks._fastrec`` is built (same records; for tests and comparisons).
PURE_PYTHON = "HANGTRACE_PURE_PYTHON"
#: Ray workers: force the hook path for actor method phases, ``executor`` (default,
#: version-gated private Ray API), ``class`` (fallback) or ``off`` (identity only).
RAY_HOOK = "HANGTRACE_RAY_HOOK"
#: "0": a watcher that detects a stall in a Ray job collects this node only, instead of
#: every alive node through Ray tasks (as ``hangtrace dump --ray``).
RAY_COLLECT = "HANGTRACE_RAY_COLLECT"
#: "1": SIG_IGN (instead of SIG_DFL) under our fatal-signal faulthandler for SIGSEGV/SIGBUS/
#: SIGFPE/SIGILL, so that after the Python stacks are dumped the fault recurs and the kernel
#: logs the crashing library and offset (issue 12). Off by default: it changes the traced
#: program (a kill(2)-sent SIGSEGV is then ignored, and SIG_IGN is inherited across exec by
#: every child the program starts) - see ``hooks/process/faultline.fault_line_disposition``.
FAULT_LINE = "HANGTRACE_FAULT_LINE"
#: "0": the watcher and ``hangtrace run`` do not write ``timeline.json`` (a Perfetto trace
#: of every rank, issue 11) next to ``report.txt`` at each incident. Default "1".
TIMELINE = "HANGTRACE_TIMELINE"
#: Deep trace (issue 11), off by default: ``rank=1,phase=train`` runs viztracer with a
#: bounded ring buffer in the selected ranks (``rank=1|3`` or ``rank=1,rank=3``) and only
#: inside the selected phases (none named: the whole process); both keys optional, but
#: the variable must name at least one. ``hooks/deep.py`` is imported only when this is set.
DEEP = "HANGTRACE_DEEP"
#: Entries of the deep trace's ring buffer (viztracer ``tracer_entries``; oldest dropped).
DEEP_ENTRIES = "HANGTRACE_DEEP_ENTRIES"
#: "0": ``hangtrace run`` does not clean old run directories when it starts a run in the
#: default location (issue 13). Default "1": it applies the retention policy below there.
GC = "HANGTRACE_GC"
#: Retention (``hangtrace gc --keep``, and ``hangtrace run``'s automatic clean-up): the newest
#: this many runs in the default location are kept (default 20).
GC_KEEP = "HANGTRACE_GC_KEEP"
#: Retention (``hangtrace gc --max-mb``): MiB on disk all runs together may take (default 2000).
GC_MAX_MB = "HANGTRACE_GC_MAX_MB"
#: "0": a forked child of a traced process keeps the interpreter's cyclic garbage collector
#: as it was. Default "1": the child's after-fork handler first calls ``gc.freeze()`` (issue
#: 13), so that the child's collections never walk the objects it inherited (each walk
#: writes every object's header: a copy-on-write fault per page of the parent's heap,
#: measured +1,600 faults and several ms of CPU per DataLoader worker of a traced DDP rank).
#: Cyclic garbage inherited from the parent is then not collected in the child (it is shared
#: with the parent until the child exits); what the child creates is collected as usual.
FORK_GC_FREEZE = "HANGTRACE_FORK_GC_FREEZE"
#: Width in columns of what ``hangtrace run`` writes to the console (the verdict, the
#: incident lines); unset: the terminal's width, 80 when stderr is not a terminal (issue 41).
COLUMNS = "HANGTRACE_COLUMNS"
#: Test-only fault injection: "recorder" makes the collective recorder raise on
#: every call (the traced program must not notice).
FAULT = "HANGTRACE_FAULT_INJECT"

#: Multi-node torchrun jobs (issue 39): "0" keeps each node watcher to its own node; else
#: (default "1") node watchers of a job whose ranks' launcher says it spans several nodes
#: (``GROUP_WORLD_SIZE`` > 1) meet through the job's torch.distributed store
#: (``MASTER_ADDR:MASTER_PORT``) and give one job-wide verdict (docs/MULTINODE.md).
MULTINODE = "HANGTRACE_MULTINODE_MEET"
#: Seconds a node watcher waits for the other nodes' summaries (the assembler) or for the
#: job-wide verdict (the others) after an incident. Default 30.
NODE_WAIT_S = "HANGTRACE_NODE_WAIT_S"
#: Seconds one operation on the job's store may take before it is given up (connect, set,
#: get); no watcher ever blocks longer on the store. Default 5.
STORE_TIMEOUT_S = "HANGTRACE_STORE_TIMEOUT_S"
#: A directory every node can write (a shared file system), used when the job's store
#: cannot be reached: node summaries are written there as files (never mmapped).
SHARED_DIR = "HANGTRACE_SHARED_DIR"

DEFAULTS = {
    MULTINODE: "1",
    NODE_WAIT_S: 30.0,
    STORE_TIMEOUT_S: 5.0,
    SLOTS: 16384,
    HELPER_SLOTS: 256,
    STALL_S: 300.0,
    STARTUP_STALL_S: 60.0,
    POLL_S: 1.0,
    AUTO_WATCH: "1",
    MEM: "1",
    MEM_INTERVAL_S: 1.0,
    MEM_CUDA_HISTORY: "0",
    DEEP_ENTRIES: 200000,
    GC_KEEP: 20,
    GC_MAX_MB: 2000.0,
}


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``HANGTRACE`` asks for tracing and this is not one of our helpers."""
    env = os.environ if environ is None else environ
    return env.get(ENABLE, "") not in ("", "0") and not env.get(HELPER)


def get_int(name: str, environ: Optional[Mapping[str, str]] = None) -> int:
    """``name``'s value as an int; its default when unset or not a number."""
    env = os.environ if environ is None else environ
    try:
        return int(env.get(name, DEFAULTS[name]))
    except (TypeError, ValueError):
        return int(DEFAULTS[name])


def get_float(name: str, environ: Optional[Mapping[str, str]] = None) -> float:
    """``name``'s value as a float; its default when unset or not a number."""
    env = os.environ if environ is None else environ
    try:
        return float(env.get(name, DEFAULTS[name]))
    except (TypeError, ValueError):
        return float(DEFAULTS[name])


def phase_stall_s(environ: Optional[Mapping[str, str]] = None) -> Dict[str, float]:
    """Parse ``HANGTRACE_PHASE_STALL_S`` into ``{phase: seconds}``; bad items are ignored."""
    env = os.environ if environ is None else environ
    out = {}
    for item in env.get(PHASE_STALL_S, "").split(","):
        name, _, val = item.partition("=")
        try:
            if name.strip():
                out[name.strip()] = float(val)
        except ValueError:
            pass
    return out


def mem_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True unless ``HANGTRACE_MEM`` is "0" (memory sampling, issue 5)."""
    env = os.environ if environ is None else environ
    return env.get(MEM, "1").strip() not in ("0", "false", "no", "off")


def fault_line(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``HANGTRACE_FAULT_LINE`` is "1" (issue 12; off by default)."""
    env = os.environ if environ is None else environ
    return env.get(FAULT_LINE, "0").strip() in ("1", "true", "yes", "on")


def timeline_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True unless ``HANGTRACE_TIMELINE`` is "0" (timeline.json at each incident, issue 11)."""
    env = os.environ if environ is None else environ
    return env.get(TIMELINE, "1").strip() not in ("0", "false", "no", "off")


def fork_gc_freeze(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True unless ``HANGTRACE_FORK_GC_FREEZE`` is "0" (``gc.freeze()`` in forked children)."""
    env = os.environ if environ is None else environ
    return env.get(FORK_GC_FREEZE, "1").strip() not in ("0", "false", "no", "off")


def gc_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True unless ``HANGTRACE_GC`` is "0" (automatic clean-up of old runs, issue 13)."""
    env = os.environ if environ is None else environ
    return env.get(GC, "1").strip() not in ("0", "false", "no", "off")


def deep_selection(
    environ: Optional[Mapping[str, str]] = None,
) -> Optional[Tuple[FrozenSet[int], FrozenSet[str]]]:
    """Parse ``HANGTRACE_DEEP`` into ``(ranks, phases)`` (frozensets; empty = any), or None
    when unset, empty or naming nothing. ``"rank=1|3,phase=train"`` -> ({1, 3}, {"train"});
    unknown keys and non-integer ranks are ignored."""
    env = os.environ if environ is None else environ
    text = env.get(DEEP, "").strip()
    if not text or text == "0":
        return None
    ranks, phases = set(), set()
    for item in text.split(","):
        key, _, val = item.partition("=")
        for v in val.split("|"):
            v = v.strip()
            if not v:
                continue
            if key.strip() == "rank":
                try:
                    ranks.add(int(v))
                except ValueError:
                    pass
            elif key.strip() == "phase":
                phases.add(v)
    if not ranks and not phases:
        return None
    return frozenset(ranks), frozenset(phases)


def pure_python(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``HANGTRACE_PURE_PYTHON`` forces the pure-Python recording path."""
    env = os.environ if environ is None else environ
    return env.get(PURE_PYTHON, "") not in ("", "0")


def helper_env(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Environment for our own helper processes: tracing stripped, helper mark set."""
    env = dict(os.environ if environ is None else environ)
    env.pop(ENABLE, None)
    env[HELPER] = "1"
    return env


#: Flight Recorder capture (issue 10, ``hooks/torchdist/fr_agent.py``): "0" turns it off. Traced
#: processes turn torch's Flight Recorder on if the user has not configured it
#: (``TORCH_FR_BUFFER_SIZE`` / ``TORCH_NCCL_TRACE_BUFFER_SIZE`` unset: 2000 entries, torch's
#: own default); a process that joins a process group runs a thread that dumps it into
#: ``RUN_DIR/fr/`` on request, and every live snapshot (watcher, ``hangtrace dump``)
#: requests those dumps and keeps them in ``snapshots/<time>/fr/``.
FR = "HANGTRACE_FR"
#: torch's Flight Recorder size variable, its older alias, and the entries we set (torch
#: 2.13's own default: a gloo job without the variable records entries already; the
#: variable keeps it on where the default is 0 and documents our choice)
FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_ENV_ALIAS = "TORCH_NCCL_TRACE_BUFFER_SIZE"
FR_DEFAULT_ENTRIES = "2000"


def configure_fr_env(environ: Optional[MutableMapping[str, str]] = None) -> bool:
    """Turn torch's Flight Recorder on (``TORCH_FR_BUFFER_SIZE=2000``) unless the user
    configured it or ``HANGTRACE_FR=0``; call before a process group reads it (bootstrap).
    True when we set it. Here, not in ``hooks/torchdist/fr_agent.py``: every traced process calls it
    at start-up, few ever start an agent."""
    env = os.environ if environ is None else environ
    if env.get(FR, "1") == "0" or FR_BUFFER_ENV in env or FR_BUFFER_ENV_ALIAS in env:
        return False
    env[FR_BUFFER_ENV] = FR_DEFAULT_ENTRIES
    return True


#: Ray's library-internal actors, (module, class): data structures that serve their callers
#: (docs/RAY.md section 2). Their methods are not recorded as phases (``hooks/ray_hooks``:
#: a consumer polling ``Queue.get(timeout=...)`` is no progress of the job) and their
#: exceptions are never a failure (``Empty`` of a timed get is the caller's control flow).
RAY_INFRA_ACTORS: FrozenSet[Tuple[str, str]] = frozenset(
    {
        ("ray.util.queue", "_QueueActor"),
        ("ray.util.collective.util", "NCCLUniqueIDStore"),
        ("ray.util.collective.util", "Info"),
    }
)
#: exception types (``Type`` of a 'Type: message' text) that are an answer, not a failure:
#: a queue that is empty or full (``queue`` / ``ray.util.queue`` / ``asyncio``)
CONTROL_FLOW_ERRORS: FrozenSet[str] = frozenset({"Empty", "Full", "QueueEmpty", "QueueFull"})


def ray_infra_actor(module: Optional[str], cls: Optional[str]) -> bool:
    """Is the actor class ``module.cls`` one of :data:`RAY_INFRA_ACTORS`?"""
    return (str(module or ""), str(cls or "")) in RAY_INFRA_ACTORS
