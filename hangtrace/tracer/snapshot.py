"""The data model shared by collector and analysis: a Snapshot of a run, a Diagnosis.

A Snapshot is plain data (no files, no processes): the analysis takes one and returns a
Diagnosis, so it can be tested on synthetic snapshots of any size.

Record dicts (``ProcessInfo.records``) have the keys produced by
``tracer.ring.reader.decode_slots``: ``idx, kind ('collective'|'p2p'|'group'|'phase_enter'|
'phase_exit'|'step'|'heartbeat'|'event'|'memory'), op, group (group name, str), seq
(per-group sequence number; for p2p counted per (group, peer)), dtype, numel, shape,
peer (global rank, -1 none), async_op, thread, phase, step, t_mono_ns, t_wall_ns,
t_end_mono_ns, state ('issued'|'completed'|'failed'), error``.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class ProcessInfo:
    """One traced process as seen at snapshot time.

    ``state``: 'alive' (pid exists and is the same process), 'exited' (clean-exit record,
    see ``exit_code``), 'killed' (pid gone without a clean-exit record), 'unknown'
    (another host, or not checkable). Times are ns (wall = Unix epoch, mono = the
    host's CLOCK_MONOTONIC).
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
    records: List[Dict[str, Any]] = field(default_factory=list)
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
    # memory samples decoded from the ring's K_MEM records (tracer.memory.samples), and
    # facts gathered at collection time: 'cgroup_dir', 'cgroup_oom_kill_now',
    # 'kernel_oom' {'line', 'anon_rss', 'memcg', ...}, 'kernel_log' ('read' | why not),
    # 'host_mem_total' (issue 5)
    memory: List[Dict[str, Any]] = field(default_factory=list)
    memory_facts: Dict[str, Any] = field(default_factory=dict)

    @property
    def key(self):
        return "%s:%d" % (self.host, self.pid)


@dataclass
class Snapshot:
    run_dir: str
    taken_wall_ns: int = 0
    reason: str = "offline"  # 'stall' | 'death' | 'request' | 'offline'
    processes: List[ProcessInfo] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)  # one line per unreadable file, with remedy
    path: Optional[str] = None  # snapshot folder, when stored
