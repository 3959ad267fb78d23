"""What to look at next: the advice texts per verdict kind, per cause (dead ranks) and per
finding of the analysis (pure data; ``nextstep.next_step`` chooses one for a diagnosis)."""

from typing import Dict, Optional

NEXT: Dict[str, Optional[str]] = {
    "collective-mismatch": (
        "look at the code that issues collectives on this group on the named "
        "rank(s): threads or coroutines sharing one group, data-dependent shapes or "
        "branches, groups created in a different order; rerun with "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL to have torch check shapes"
    ),
    "skipped-collective": (
        "look for the condition that makes the named rank(s) take another path "
        "(rank-0-only code such as checkpoint/logging, data-dependent loop lengths, "
        "early exit or an exception swallowed on that rank)"
    ),
    "cross-group-deadlock": (
        "make every rank enter these groups in the same order (the same sequence "
        "of collectives on every group), or separate them onto different streams/"
        "threads consistently"
    ),
    "stuck-outside-collective": (
        "find what the named rank waits for outside torch.distributed: the "
        "producer of its queue, the holder of its lock, its IO or Ray call; "
        "its top frames show where"
    ),
    "dead-rank": None,  # per cause, see DEAD_NEXT
    "actor-deadlock": (
        "break the cycle of blocking calls: do not ray.get an actor's result inside a "
        "method that actor calls back into; pass the value in the call, make the callee "
        "async (await) or give it max_concurrency > 1 / a concurrency group for the callback"
    ),
    "unschedulable-actor": (
        "give the actor what the cluster has (num_gpus/num_cpus/resources/memory in its "
        "options or @ray.remote), or add nodes that offer it; `ray status` shows the "
        "pending demand. Put a timeout on the ray.get that waits for it"
    ),
    "transport-error": (
        "check the network and the peer host named in the error (NIC, firewall, "
        "timeouts); if a rank on that host is missing from the snapshot, check it "
        "directly"
    ),
    "progressing": (
        "nothing to fix yet: take another snapshot later if the job still seems stuck, or "
        "lower the stall threshold"
    ),
    "unknown": (
        "collect more data: stacks of every rank (`hangtrace dump RUN_DIR` while the job is "
        "still hung, with py-spy installed; --native for in-kernel waits), and the ranks without record files"
    ),
}

DEAD_NEXT: Dict[str, str] = {
    "sigterm": "find who sent SIGTERM (scheduler preemption, Ray stopping the actor, a user, a health check)",
    "fatal-signal": "read the faulthandler dump of the fatal signal (segfault/abort) and the native stack",
    "exception": "read the exception and traceback of that rank (its events and log)",
    "killed-without-record": (
        "no handler ran: check the kernel log (dmesg) for the OOM killer, the "
        "cgroup's memory.events/memory.oom_control, Ray's memory monitor and the "
        "raylet log for who killed the pid"
    ),
    # issue 5 (memory attribution); the evidence-specific advice is in details['memory']['advice']
    "host-oom-kill": "see the memory ledger and trend: which phase grows, and the peak against the limit",
    "ray-memory-monitor": (
        "lower the memory use on that node (workers per node, batch sizes) or adjust "
        "RAY_memory_usage_threshold; see the memory figures of the rank"
    ),
    "cuda-oom": "see the memory ledger: memory kept by earlier phases or steps is what the failing phase could not get",
    "sigterm-external": (
        "not an OOM: find who sent SIGTERM (scheduler preemption, Ray stopping the actor, a "
        "user, a health check)"
    ),
}

#: a whole node of a multi-node job went away (analyze/nodes.py ``lost``, issue 39); %s: the node(s)
NODE_LOST_NEXT = (
    "look at %s itself, not at the ranks that failed after it: whether the machine went down or "
    "rebooted, the scheduler's record of the node (Slurm, Kubernetes events), its kernel log for "
    "the OOM killer or a panic, its network; the ranks seen here failed because their peers there were gone"
)

#: advice for 'unknown' / stalled-in-rendezvous
RENDEZVOUS_NEXT = (
    "compare what each rank's init_process_group asked for (the evidence: rank, world size, the "
    "store's address) and the ranks' MASTER_ADDR, MASTER_PORT and WORLD_SIZE (`hangtrace env-diff "
    "RUN_DIR`; the report's environment section), and check that every rank of WORLD_SIZE was "
    "started and can reach MASTER_ADDR"
)

#: advice for a dead rank whose cause is "exit-code N"
EXIT_CODE_NEXT = (
    "read that rank's log around its exit; a non-zero exit without an exception is often "
    "sys.exit or a launcher"
)


#: a rank raised because the kernel's OOM killer killed one of its DataLoader workers
HELPER_OOM_NEXT = (
    "find what the DataLoader worker holds on to (the dataset's __getitem__, its caches, collate_fn, "
    "transforms: every worker has its own copy); `hangtrace records RUN_DIR --memory` shows the "
    "worker's samples; fewer workers (num_workers), a smaller prefetch_factor or a larger memory "
    "limit buy room, the leak stays"
)


#: a rank raised because one of its DataLoader workers was SIGKILLed, not by the OOM killer
HELPER_KILLED_NEXT = (
    "find who sends SIGKILL to the job's processes (a node watchdog, the scheduler's preemption, "
    "a cleanup script, a person, the job's own code): the kernel's OOM killer did not"
)


#: a Ray actor without a rank is stuck in a method the others wait on (rules/actor_waits.py, actors.py)
ACTOR_STUCK_NEXT = (
    "find what the named actor's method waits for (its await chain or stack above: an event "
    "nobody sets, its queue, lock, IO or a Ray call); `hangtrace records RUN_DIR` shows its method "
    "phases"
)


#: a rank stuck outside collectives waits for a lock, and other threads of it do too (analyze/stuck/lockwait.py)
LOCK_NEXT = (
    "make the threads named above take their locks in one order (or never hold one while taking "
    "another): each holds the locks of the `with` blocks it is inside and waits at the line named"
)


#: a rank stuck outside collectives waits for a child process (analyze/stuck/childwait.py)
EXIT_NEXT = (
    "stop the thread named above before the program returns (a sentinel on its queue or an Event, "
    "then `join(timeout=...)`), or start it with `daemon=True` if its work may be lost; an exit "
    "handler that blocks (`atexit`, a logger's or tracker's final flush) needs a timeout"
)
PDB_NEXT = (
    "the rank stopped in the debugger: a `breakpoint()` or `pdb.set_trace()` left in the code ran where "
    "stdin is no terminal (torchrun, spawn, Ray), so pdb read end-of-input and raised BdbQuit; remove it, "
    "or run with PYTHONBREAKPOINT=0 to make `breakpoint()` a no-op"
)
RENDEZVOUS_LOCK_NEXT = (
    "call init_process_group on every rank before taking a lock the other ranks wait for (or "
    "release it before the call): a rank inside the rendezvous waits for all of them"
)
BEFORE_RENDEZVOUS_NEXT = (
    "find what the named ranks wait for before init_process_group (their lines above): the "
    "rendezvous completes only when every rank has called it"
)
HOLDER_NEXT = (
    "release the file lock before any wait for another rank (a collective, a barrier), or take it "
    "on every rank in one order; a lock that must span a collective needs a timeout (`filelock`'s "
    "`timeout=`, `fcntl.flock(..., LOCK_NB)` in a retry loop)"
)
PEER_CYCLE_NEXT = (
    "do not hold the lock named above across a collective or any other wait for another rank: "
    "copy what the server thread needs under the lock and release it before the collective (or "
    "serve from a snapshot); a timeout on the client only turns the hang into a failed step"
)
LOADER_WAIT_NEXT = (
    "every rank waits for its DataLoader workers: if they are starting or slow (a loaded machine, "
    "a slow first batch), this is no hang - raise `--stall-s` above the time a batch takes; else read "
    "the workers' stacks in the report (rank helpers) for where the batch is stuck"
)
HELPER_CRASH_NEXT = (
    "the worker crashed inside the line named above, in native code it calls (a C extension, a "
    "ctypes or cffi call): check what that line passes for the failing sample (a NULL or short "
    "buffer, a corrupt record); to reproduce, load that sample with `num_workers=0` under "
    "`python -X faulthandler` (or gdb)"
)
PEER_DEADLOCK_NEXT = (
    "make the threads of the process named above take their locks in one order everywhere (or "
    "hold one lock at a time): two of them each hold the lock the other waits for; and give the "
    "client's socket a timeout (`settimeout`) so that a silent server fails the step instead of the job"
)
ACTOR_PEER_NEXT = (
    "the actor waits on a connection to the process named above (its other end): find why that "
    "process does not answer - the threads of it named above, and what they wait for - and give the "
    "actor's client call a timeout so that a silent server fails the call instead of the job"
)
PEER_NEXT = (
    "the rank waits on a connection to the process named above: find why that process does not answer "
    "(its threads above: what the one serving the connection waits for), and give the client's socket a "
    "timeout (`settimeout`, `create_connection(..., timeout=...)`) so that a silent peer fails the step "
    "instead of the job"
)
#: by how the process is at exit (analyze/stuck/exitwait.py ``main_at_exit``)
EXIT_NEXTS = {
    "executor": (
        "give the work submitted to the ThreadPoolExecutor a timeout (its client or socket call): "
        "concurrent.futures joins its workers at exit however they were started; or wait for the futures "
        "with a timeout and `executor.shutdown(wait=False, cancel_futures=True)` before the program returns"
    ),
    "handler": (
        "give the exit handler's wait a timeout (`wait(futures, timeout=...)`, `join(timeout=...)`), and "
        "what it waits for (the thread named above) its own timeout"
    ),
}
SLEEP_NEXT = (
    "the rank sleeps at the line named above while the others wait for it in a collective (a fixed "
    "wait, a retry back-off, a slow stand-in): shorten it or move it out of the step, or let every rank "
    "sleep there alike"
)
THREADS_NEXT = (
    "issue each process group's collectives from one thread: give the background thread a group of "
    "its own (`dist.new_group(...)`, created in the same order on every rank) or hand its tensors to the "
    "thread that owns the group"
)
BUSY_NEXT = (
    "the rank is running, not waiting: read the loop or computation named above (an exit condition "
    "that never comes true, data that makes it far slower on this rank); `py-spy dump --pid PID` a few "
    "times shows whether it moves; if the work is legitimately long, call `tracer.heartbeat()` inside it "
    "or raise the stall threshold (HANGTRACE_STALL_S / --stall-s)"
)
SELF_CALL_NEXT = (
    "call the method directly on `self` (`self.method(...)`, not through the actor's own handle and "
    "ray.get), or give the actor a concurrency group (or max_concurrency > 1) for that method so that "
    "it can run while the calling method waits"
)
P2P_PEER_NEXT = (
    "check the peer of each send and recv of the named rank (previous/next stage arithmetic, the "
    "schedule's direction): every send needs the matching recv on its peer, in the same order; rerun "
    "with TORCH_DISTRIBUTED_DEBUG=DETAIL"
)
ASYNC_BLOCKING_NEXT = (
    "in the async actor named above, `await` the actor call (`await ref`, `await "
    "asyncio.gather(*refs)`) instead of `ray.get`: a blocking ray.get inside an `async def` method "
    "blocks the actor's event loop, so the call back into it never runs (Ray warns \"Using "
    "blocking ray.get inside async actor\" in the actor's log)"
)
POLL_CYCLE_NEXT = (
    "take the step the polling ranks wait for before the collective named above, or drop the "
    "collective there (the ranks it waits for never join it while they poll); better, let the "
    "waiting ranks wait in a collective (a barrier after that step) or a store key instead of "
    "polling, and give any polling loop a deadline that raises"
)
POLL_NEXT = (
    "find what makes the polling loop's condition named above true (the file, flag or service it checks) "
    "and why it did not happen; give the loop a deadline that raises, so that a condition that never "
    "comes fails the step instead of hanging the job"
)
CHILD_RANK_NEXT = (
    "start the child without the job's distributed variables (`env=` of subprocess.run without "
    "RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_*/GROUP_RANK) unless it is "
    "meant to join the job: it joined the job's process group as the rank that waits for it; give the "
    "wait a timeout too"
)
GROUP_ORDER_NEXT = (
    "make every rank call `dist.new_group` for every group, in one order, whatever its own role: "
    "build the list of groups from the same config on every rank (or one broadcast from rank 0), "
    "then take the groups this rank belongs to from that list"
)
CHILD_PIPE_NEXT = (
    "the rank, not its child, must change: it waits for the child before reading the child's pipes, "
    "and the child blocks once a pipe holds 64 KiB; read while it runs: `out, err = p.communicate("
    "timeout=...)` (or `subprocess.run(..., capture_output=True, timeout=...)`), or send the output "
    "to a file instead of a pipe"
)
CHILD_NEXT = (
    "the rank waits for the child process named above: fix what that child waits for (its call, "
    "file or peer), and give the wait a timeout (`subprocess.run(..., timeout=...)`, `communicate("
    "timeout=...)`, `Process.join(timeout)`) so that a hung child fails the step instead of the job"
)


def peer_next(role: str, actor: bool = False) -> str:
    """The advice for a culprit whose socket peer or file lock's holder is named
    (``details['peer_role']``, analyze/stuck/peerwait.py); ``actor``: the culprit is a Ray actor
    without a rank."""
    if role == "lock-holder":
        return HOLDER_NEXT
    if role == "socket-peer-cycle":
        return PEER_CYCLE_NEXT
    if role == "socket-peer-deadlock":
        return PEER_DEADLOCK_NEXT
    return ACTOR_PEER_NEXT if actor else PEER_NEXT


TASK_EXCEPTION_NEXT = (
    "fix the exception of the asyncio task named above, and never let a task fail unseen: keep "
    "a reference to each task you create and await it (or `asyncio.gather`/`TaskGroup`, or a "
    "done-callback that re-raises), so that a dead producer fails the step instead of starving "
    "its consumer"
)
THREAD_EXCEPTION_NEXT = (
    "fix the exception of the thread named above, and make a helper thread's death fail the "
    "job (join it and check, or `threading.excepthook` that stops the process) instead of "
    "starving what waits for it"
)
RESTART_ALONE_NEXT = (
    "restart every rank of the process group together when one dies (a Ray actor's "
    "`max_restarts` restarts one process, whose new `init_process_group` its peers never join: "
    "recreate the whole worker group and its process group, or set `max_restarts=0` and let the "
    "driver do it; `torchrun --max-restarts` restarts all ranks)"
)
RANKLESS_DEATH_NEXT = (
    "fix what stopped the process named above before it started the ranks (its exception or "
    "exit code); `hangtrace records RUN_DIR` shows its start record and exception"
)
AT_EXIT_COLLECTIVE_NEXT = (
    "a collective in an exit handler (atexit) runs only where that handler finds work, "
    "after other ranks may have destroyed their group and left: do the final collective "
    "in the program on every rank, before `destroy_process_group()` (or reduce nothing at "
    "exit)"
)
BROKEN_ORDER_NEXT = (
    "look for what made the named rank(s) take another path at this point while every rank had "
    "kept one order until then: an exception caught and passed over (`except ...: continue`) that "
    "skips a collective, an empty batch or shard, a switch turned on after warm-up; every rank must "
    "issue the same collectives on each group, in the same order"
)
DEPARTED_NEXT = (
    "find what ended the named rank's loop before its peers' (a shorter data shard, a `break`, a "
    "caught exception) and make every rank stop at the same step: no rank may return while its peers "
    "still call collectives"
)
PREEMPTED_NEXT = (
    "make the decision to stop collective: check the preemption flag on every rank at the same step "
    "(e.g. `flag = torch.tensor([int(stop)]); dist.all_reduce(flag, op=dist.ReduceOp.MAX)` and stop "
    "when it is 1), or have the agent signal every rank; a rank must not return while its peers "
    "still call collectives"
)
STACKS_NEXT = (
    "read the stack classes of the report: each alive rank's main thread is outside collectives there; "
    "the rank whose stack differs (an outlier) is the first to look at; ranks that exited are in the "
    "ranks table"
)  # (helpers 56 and 59 were told to take the stacks again)
