"""The analyze -> report contract: one Diagnosis per snapshot (docs/DIAGNOSIS.md).

``Kind`` is the closed verdict vocabulary (JSON ``kind``), ``Cause`` the closed cause
vocabulary (JSON ``cause``) except the open family "exit-code N" built by
:func:`exit_code_cause`. Both are ``str``-valued Enums: a member compares equal to its
string and serialises as it, so JSON schema 1 is unchanged.
"""

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Union


class _StrEnum(str, Enum):
    """A str-valued Enum whose ``str()`` and ``format()`` are the value (as
    ``enum.StrEnum`` of Python 3.11; ``python_requires`` is 3.9)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __hash__(self) -> int:  # the value's hash: a member is a dict key equal to its string
        return str.__hash__(self)


class Kind(_StrEnum):
    """What broke (``Diagnosis.kind``). Each member: what it means, when it fires."""

    #: Ranks at the same sequence number of one group issued different collectives (op,
    #: dtype, numel, root/peer), or a rank is blocked at a seq its group already passed.
    #: Fires in rules ``mismatch`` (frontier) and ``diverged`` (sequence numbers diverged),
    #: and ``stack_only`` (ranks blocked in different collectives, stacks only).
    COLLECTIVE_MISMATCH = "collective-mismatch"
    #: A rank never reached the collective its peers wait in (it moved on, exited cleanly,
    #: is in another, untraced collective), or issued one collective more than its peers.
    #: Fires in rules ``chain`` (chain end that moved on), ``minority`` and ``extra_collective``.
    SKIPPED_COLLECTIVE = "skipped-collective"
    #: The waits form a cycle over two or more groups (or p2p): groups entered in
    #: different orders. Fires in rule ``deadlock``.
    CROSS_GROUP_DEADLOCK = "cross-group-deadlock"
    #: The rank the others wait for is in no collective: blocked in a queue, lock, IO,
    #: sleep, Ray call, or making no progress. Fires in rules ``chain`` and ``stack_only``.
    STUCK_OUTSIDE_COLLECTIVE = "stuck-outside-collective"
    #: The first rank to die (by time) that is not a transport victim; ``cause`` says how.
    #: Fires in rule ``dead_rank`` (and ``chain`` when the chain end is dead).
    DEAD_RANK = "dead-rank"
    #: Collectives failed with transport errors (peer closed, timeout) and no rank is
    #: dead and nobody hangs. Fires in rule ``transport``.
    TRANSPORT_ERROR = "transport-error"
    #: Nobody waits for a missing or diverged rank and progress is recent. Fires in rule
    #: ``idle``.
    PROGRESSING = "progressing"
    #: Ray actors wait on each other's methods in a cycle (``ray.get``/``ray.wait`` inside a
    #: method on a call of the next actor's method, back to the first): none can go on.
    #: Fires in rule ``actor_waits`` (``culprit_actors``: the cycle; ``details['actor_cycle']``).
    ACTOR_DEADLOCK = "actor-deadlock"
    #: A Ray actor that never got a process is waited on, and the resources it asks for
    #: exceed every node of the cluster. Fires in rule ``unschedulable``
    #: (``culprit_actors``: the actor; ``details['actor_request']``, ``['cluster_nodes']``).
    UNSCHEDULABLE_ACTOR = "unschedulable-actor"
    #: Not enough data to name a kind (no ranks, culprits without record files, a stall
    #: with every member inside one collective). Fires in rules ``no_record_file``,
    #: ``idle`` and ``stack_only``, and for an empty snapshot.
    UNKNOWN = "unknown"


class Cause(_StrEnum):
    """Why (``Diagnosis.cause``), refining a kind. "exit-code N" is built by
    :func:`exit_code_cause`."""

    #: collective-mismatch: signatures differ at one seq (or a p2p pair both sent/both received).
    MISMATCH = "mismatch"
    #: collective-mismatch: a rank is blocked at a seq every other member already passed.
    SEQUENCE_DIVERGED = "sequence-diverged"
    #: cross-group-deadlock: a cycle in the wait-for graph.
    CYCLE = "cycle"
    #: skipped-collective: the named rank issued a collective its peers never issue (an
    #: extra collective on a role group, or a minority alone in a collective the others skipped).
    EXTRA_COLLECTIVE = "extra-collective"
    #: skipped-collective: the named rank went on without the collective the others wait in.
    SKIPPED = "skipped"
    #: stuck-outside-collective: its stack top is a blocking non-collective call.
    BLOCKED = "blocked"
    #: stuck-outside-collective: no activity since the others began waiting (stack running or unknown).
    NO_PROGRESS = "no-progress"
    #: stuck-outside-collective: running on the CPU outside collectives (py-spy: its main
    #: thread active) and recording nothing in a stall while others wait for it: a loop that
    #: does not end, or a computation far longer on this rank (a straggler).
    BUSY = "busy"
    #: dead-rank: SIGTERM (faulthandler dump or exit code -15).
    SIGTERM = "sigterm"
    #: dead-rank: fatal signal (faulthandler fatal dump, or exit code -6/-11/-7/-4/-8).
    FATAL_SIGNAL = "fatal-signal"
    #: dead-rank: an uncaught exception event (type and message in details['cause_text']).
    EXCEPTION = "exception"
    #: dead-rank: the pid vanished without a record (SIGKILL, OOM kill, stop).
    KILLED_WITHOUT_RECORD = "killed-without-record"
    #: dead-rank (memory evidence, docs/MEMORY.md): the kernel's OOM killer or the cgroup's oom_kill counter.
    HOST_OOM_KILL = "host-oom-kill"
    #: dead-rank (memory evidence): Ray's memory monitor killed the worker (Ray's own record).
    RAY_MEMORY_MONITOR = "ray-memory-monitor"
    #: dead-rank (memory evidence): torch's OutOfMemoryError / the allocator's OOM observer.
    CUDA_OOM = "cuda-oom"
    #: dead-rank (memory evidence): SIGTERM with memory well below the limit (not an OOM).
    SIGTERM_EXTERNAL = "sigterm-external"
    #: transport-error: the first failure was a transport error.
    TRANSPORT_ERROR = "transport-error"
    #: unknown: no traced process with a rank in the snapshot.
    NO_DATA = "no-data"
    #: unknown: the ranks everyone waits for left no record file.
    NO_RECORD_FILE = "no-record-file"
    #: unknown: every member entered the collective and it does not complete (stalled).
    STALLED_INSIDE_COLLECTIVE = "stalled-inside-collective"
    #: unknown: nothing progressed and no rank is in a collective.
    STALLED_OUTSIDE_COLLECTIVES = "stalled-outside-collectives"
    #: unknown: nothing progressed, no process group was ever created, and every rank with a
    #: stack is inside ``init_process_group`` (the rendezvous: the store or the other members
    #: never came; compare MASTER_ADDR / MASTER_PORT / WORLD_SIZE across ranks).
    STALLED_IN_RENDEZVOUS = "stalled-in-rendezvous"


#: The prefix of a ``details['culprit_reasons']`` value (analyze/stuck/chainends.py) for a rank
#: whose stack is blocked outside collectives; the text after it says on what
#: (``analyze/stuck/blocking.py``: "asleep in time.sleep ...", "waiting on a lock ...").
BLOCKED_OUTSIDE = "blocked outside collectives: "


#: What ``blocked_on`` of a culprit reason starts with when the rank's asyncio event loop
#: idles in its selector: the await chain follows (``analyze/asynctasks.await_chain``).
LOOP_IDLE = "its asyncio event loop is idle: "


def blocked_on(reason: str) -> Optional[str]:
    """What a ``culprit_reasons`` value says a rank is blocked on (the text after
    ``BLOCKED_OUTSIDE``), or None when it is not such a reason."""
    return reason[len(BLOCKED_OUTSIDE) :] if reason.startswith(BLOCKED_OUTSIDE) else None


#: The prefix of the open cause family "exit-code N" (dead-rank: non-zero exit without a
#: signal or exception).
EXIT_CODE_PREFIX = "exit-code "


def exit_code_cause(code: int) -> str:
    """The cause string of a rank that exited with non-zero ``code`` without a signal
    or exception: ``'exit-code 1'``."""
    return "%s%d" % (EXIT_CODE_PREFIX, code)


CauseText = Union[Cause, str]


@dataclass
class Diagnosis:
    """The verdict (JSON schema 1, docs/DIAGNOSIS.md).

    ``kind``: a :class:`Kind`; ``cause``: a :class:`Cause`, an "exit-code N" string, or
    None; ``culprit_ranks``: global ranks; ``culprit_actors``: Ray actors without a rank
    named as culprits (filled by Ray-actor rules); ``group``: process group name;
    ``seq``: sequence number; times in ``details`` are ns since the epoch.
    """

    kind: Kind
    culprit_ranks: List[int] = field(default_factory=list)
    summary: str = ""
    group: Optional[str] = None
    group_ranks: Optional[List[int]] = None
    seq: Optional[int] = None
    op: Optional[str] = None
    phase: Optional[str] = None
    step: Optional[int] = None
    cause: Optional[CauseText] = None
    frames: List[str] = field(default_factory=list)
    evidence: List[str] = field(default_factory=list)
    waiting_ranks: List[int] = field(default_factory=list)
    cascade: List[Dict[str, Any]] = field(default_factory=list)
    stack_classes: List[Dict[str, Any]] = field(default_factory=list)
    details: Dict[str, Any] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)
    culprit_actors: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready dict; enums become their string values."""
        d = asdict(self)
        d["kind"] = _plain(self.kind)
        d["cause"] = _plain(self.cause)
        return d


def _plain(v: Optional[CauseText]) -> Optional[str]:
    return v.value if isinstance(v, Enum) else v


#: Every kind's string (schema 1), in the order of ``Kind``.
KINDS = tuple(k.value for k in Kind)
