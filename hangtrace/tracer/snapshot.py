"""The snapshot: what collection hands to the analysis (collect -> analyze).

A :class:`Snapshot` is plain, frozen data (no files, no processes): the analysis takes
one and returns a Diagnosis, so it can be tested on synthetic snapshots of any size.
Collectors build new values with ``dataclasses.replace`` instead of mutating.

Per process the snapshot holds a :class:`~hangtrace.tracer.ring.summary.RingSummary` (the
records the analysis reads: newest per group and per peer, in flight, first failure,
last record, last progress, a recent tail, memory samples), never the whole ring.
``ProcessInfo.records`` is the summary's record subset in index order for collected
processes; synthetic snapshots (unit tests) may give every record instead, and the
summary is then computed from them. Record dicts: ``tracer/ring/records.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.ring.summary import RingSummary, summarize_records
from hangtrace.tracer.stragglerseen import SeenStraggler

Record = Mapping[str, Any]


#: ``meta`` keys written by collect/ray/rayjoin.py from Ray's own record (the rest of the
#: ``ray_*`` keys are the process's own identity, written by hooks/rayhooks/ray_hooks.py)
RAY_RECORD_PREFIXES = ("ray_death", "ray_actor_state", "ray_worker_", "ray_exit_", "ray_memory", "ray_state_")


class Role(str, enum.Enum):
    """What a traced process is in the job.

    :func:`role_of` gives the role known from one process's identity alone (a process with
    a rank or process-group records is ``rank``, a Ray actor ``ray-actor``, the rest
    ``other``); ``process_model.assign_roles`` gives the roles over the whole snapshot
    (which process IS rank r; launcher, rank helper such as a DataLoader worker, Ray task
    worker), which reports and analysis use.
    """

    LAUNCHER = "launcher"
    RANK = "rank"
    RANK_HELPER = "rank-helper"
    RAY_ACTOR = "ray-actor"
    RAY_TASK_WORKER = "ray-task-worker"
    OTHER = "other"


def role_of(
    rank: int, groups: List[Dict[str, Any]], summary: Optional[RingSummary], meta: Mapping[str, Any]
) -> Role:
    """The role known from identity alone (see :class:`Role`)."""
    if rank >= 0 or groups or (summary is not None and (summary.by_group or summary.by_peer)):
        return Role.RANK
    if meta.get("ray_actor_id"):
        return Role.RAY_ACTOR
    return Role.OTHER


@dataclass(frozen=True)
class PendingTask:
    """A pending asyncio task of a running event loop at snapshot time
    (``hooks/process/asyncio_tasks.py``): ``frames`` its await chain outermost first, each
    ``(func, file, line)``; ``awaits_task`` the task it waits for, else ``awaits_future`` a
    plain future's repr (both None when not known)."""

    name: str
    coro: str
    frames: Tuple[Tuple[str, str, int], ...] = ()
    awaits_task: Optional[str] = None
    awaits_future: Optional[str] = None


@dataclass(frozen=True)
class LoopTasks:
    """One running event loop of a process: its thread id and pending tasks."""

    thread_id: Optional[int]
    tasks: Tuple[PendingTask, ...] = ()
    wall_ns: int = 0


@dataclass(frozen=True)
class ProgressWindow:
    """Two readings of a live job taken ``window_s`` seconds apart (issue 38): a point in
    time catches healthy ranks a few milliseconds apart, so a live snapshot not taken at a
    detected stall is judged over a window.

    ``source`` 'rings': the ring headers and torch's collective counters were read twice
    (``watch/progress.py``, the watcher's definition of progress); ``advanced``: keys
    (``host:pid``) of the processes that made progress between the readings. ``source``
    'stacks' (``hangtrace attach``: no rings): each process's stacks were taken twice, the
    earlier ones in ``ProcessInfo.earlier_stacks``; ``advanced`` is empty (the analysis
    compares the stacks); ``cpu_share``: (key, CPU demand - run plus run-queue wait,
    ``watch/busy.cpu_demand_s`` - in seconds per second between the samples) per process,
    where it could be read. ``unread``: keys of the processes whose ring was read at the
    first reading and could not be at the second (deleted during the dump: the run
    directory removed): the window cannot say they were still.
    """

    window_s: float
    source: str = "rings"
    advanced: Tuple[str, ...] = ()
    cpu_share: Tuple[Tuple[str, float], ...] = ()
    unread: Tuple[str, ...] = ()


@dataclass(frozen=True)
class ProcessInfo:
    """One traced process as seen at snapshot time.

    ``state``: 'alive' (pid exists and is the same process), 'exited' (clean-exit record,
    see ``exit_code``), 'killed' (pid gone without a clean-exit record), 'unknown'
    (another host, or not checkable). Times are ns (wall = Unix epoch, mono = the
    host's CLOCK_MONOTONIC). ``role``: filled from identity when not given.
    ``summary``: computed from ``records`` when not given.
    """

    host: str
    pid: int
    rank: int = -1
    local_rank: int = -1
    world_size: int = -1
    run_id: str = ""
    state: str = "unknown"
    exit_code: Optional[int] = None
    exit_wall_ns: int = 0
    start_wall_ns: int = 0
    phase: Optional[str] = None
    step: Optional[int] = None
    progress_wall_ns: int = 0
    progress_mono_ns: int = 0
    inflight: Optional[Dict[str, Any]] = None
    records: List[Any] = field(default_factory=list)
    groups: List[Dict[str, Any]] = field(default_factory=list)
    events: List[Dict[str, Any]] = field(default_factory=list)
    # 'sigterm' / 'fatal' / 'dump' -> {'wall_ns': int, 'text': faulthandler output}
    signals: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    meta: Dict[str, Any] = field(default_factory=dict)
    # threads: [{'thread_name', 'thread_id', 'active', 'frames': [{'name','filename','line'}]}]
    # frames innermost first (py-spy's order)
    stacks: Optional[List[Dict[str, Any]]] = None
    stack_source: Optional[str] = None
    stack_error: Optional[str] = None
    ring_path: Optional[str] = None
    warnings: List[str] = field(default_factory=list)
    # memory samples decoded from the ring's memory records (analyze.memory.samples), and
    # facts gathered at collection time: 'cgroup_dir', 'cgroup_oom_kill_now',
    # 'kernel_oom' {'line', 'anon_rss', 'memcg', ...}, 'kernel_log' ('read' | why not),
    # 'host_mem_total' (issue 5)
    memory: Sequence[Dict[str, Any]] = field(default_factory=list)
    memory_facts: Dict[str, Any] = field(default_factory=dict)
    summary: Optional[RingSummary] = None
    role: Optional[Role] = None
    # running asyncio loops and their pending tasks (collect/asynciotasks.py), issue 9
    asyncio_loops: Tuple[LoopTasks, ...] = ()
    # its live child processes, traced or not, when its stacks were taken
    # (collect/kernelwait.children): [{'pid', 'argv', 'state', 'kernel'?}]
    children: Tuple[Dict[str, Any], ...] = ()
    # its stacks taken ``Snapshot.window.window_s`` before ``stacks`` (attach's two samples)
    earlier_stacks: Optional[List[Dict[str, Any]]] = None

    def __post_init__(self) -> None:
        if self.summary is None:
            object.__setattr__(self, "summary", summarize_records(self.records))
        if self.role is None:
            object.__setattr__(self, "role", role_of(self.rank, self.groups, self.summary, self.meta))

    @property
    def died(self) -> bool:
        """Killed, or exited with a non-zero code (a clean exit and a live process are not)."""
        return self.state == "killed" or (self.state == "exited" and self.exit_code not in (0, None))

    @property
    def key(self) -> str:
        """``"host:pid"``: the process's identity within a run."""
        return "%s:%d" % (self.host, self.pid)

    @property
    def exception(self) -> Optional[Dict[str, Any]]:
        """Its first ``exception`` event (type, message, traceback, wall_ns; the one a death
        is read from, ``analyze/failures/deaths.py``), or None."""
        return next(
            (e for e in self.events or () if isinstance(e, dict) and e.get("event") == "exception"), None
        )

    @property
    def exiting(self) -> Optional[Dict[str, Any]]:
        """Its newest ``exiting`` event (its main program returned: hooks/process/lifecycle.py), or None."""
        return next(
            (e for e in reversed(self.events or ()) if isinstance(e, dict) and e.get("event") == "exiting"),
            None,
        )

    @property
    def ray_identity(self) -> Dict[str, Any]:
        """What the process's own ring says of its Ray identity (``meta['ray_*']`` written by
        hooks/rayhooks/ray_hooks.py: job, node, actor id, class, name ...)."""
        return {
            k: v
            for k, v in self.meta.items()
            if k.startswith("ray_") and not k.startswith(RAY_RECORD_PREFIXES)
        }

    @property
    def ray_record(self) -> Dict[str, Any]:
        """Ray's own record of the process joined by collect/ray/rayjoin.py (actor state, death
        cause text ...): the ``meta`` keys it writes (``ray_actor_state``, ``ray_death*``)."""
        return {k: v for k, v in self.meta.items() if k.startswith(RAY_RECORD_PREFIXES)}


@dataclass(frozen=True)
class Snapshot:
    """A run at one moment: its traced processes, unreadable-file lines, where it is stored.

    ``reason``: 'stall' | 'death' | 'request' | 'offline' | 'attach'; ``path``: the stored
    snapshot folder (None when not stored); ``ray_nodes``: Ray nodes collected by
    ``dump --ray`` (list of dicts, ``ray_nodes.json``); ``ray_state``: Ray's own tables
    when they were reachable (``collect/ray/raystate.fetch``, ``ray_state.json``: ``actors``
    - pending ones too, which have no process -, ``placement_groups``,
    ``cluster_resources``), else empty.
    """

    run_dir: str
    taken_wall_ns: int = 0
    reason: str = "offline"
    processes: List[ProcessInfo] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)  # one line per unreadable file, with remedy
    path: Optional[str] = None
    ray_nodes: List[Dict[str, Any]] = field(default_factory=list)
    ray_state: Dict[str, Any] = field(default_factory=dict)
    # a live snapshot judged over a window (``dump``, ``attach``), else None
    window: Optional[ProgressWindow] = None
    # the nodes of a multi-node job joined into this snapshot (issue 39, collect/nodes/):
    # one dict per node, {'node_rank': int, 'host': str, 'ranks': [int], 'seen': bool,
    # 'why': str (what was not seen of it and why, '' when seen)}; empty for one node
    nodes: List[Dict[str, Any]] = field(default_factory=list)
    # the stragglers the run's node watchers saw, oldest first (issue 43, tracer/stragglerseen.py):
    # the start of a slowdown older than the rings' history
    stragglers_seen: Tuple[SeenStraggler, ...] = ()
