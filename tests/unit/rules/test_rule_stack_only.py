"""Rule stack_only (``hangtrace attach``): verdicts from py-spy stacks alone, no flight records."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from synth import COLL_STACK, T0, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.diagnosis import Kind  # noqa: E402
from hangtrace.tracer.report.text import diagnosis_json, text_report  # noqa: E402
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot  # noqa: E402

QUEUE_GET = (
    "get queue.py:171",
    "next_batch loader.py:22",
    "train_step train.py:38",
    "main train.py:90",
    "<module> train.py:100",
)
BROADCAST = (
    "broadcast /site-packages/torch/distributed/distributed_c10d.py:2600",
    "wrapper /site-packages/torch/distributed/c10d_logger.py:80",
    "sync_params train.py:55",
    "main train.py:90",
    "<module> train.py:100",
)


def attached(stacks_by_rank, world):
    """A stacks-only snapshot as ``collect/attach.py`` builds it (reason 'attach')."""
    procs = [
        ProcessInfo(
            host="h0",
            pid=2000 + r,
            rank=r,
            local_rank=r,
            world_size=world,
            state="alive",
            stacks=stack(*fr) if fr else None,
            stack_source="py-spy" if fr else None,
            stack_error=None if fr else "py-spy failed",
            meta={"attached": True},
        )
        for r, fr in sorted(stacks_by_rank.items())
    ]
    return Snapshot(run_dir="/tmp/attach", taken_wall_ns=T0, reason="attach", processes=procs)


def check(s, kind, culprits, waiting=None):
    d = diagnose(s)
    assert (d.kind, d.culprit_ranks) == (kind, culprits), (d.kind, d.culprit_ranks, d.summary)
    if waiting is not None:
        assert d.waiting_ranks == waiting
    assert d.details["source"].startswith("stacks only")
    assert d.summary
    json.dumps(diagnosis_json(d))
    assert text_report(d, s)
    return d


def test_stack_only_rank_outside_collectives_is_stuck():
    d = check(
        attached({0: COLL_STACK, 1: COLL_STACK, 2: QUEUE_GET, 3: COLL_STACK}, 4),
        Kind.STUCK_OUTSIDE_COLLECTIVE,
        [2],
        waiting=[0, 1, 3],
    )
    assert d.op == "all_reduce"
    assert d.frames[0].startswith("get (queue.py")
    assert "rank 2 is not in any torch.distributed call" in d.summary


def test_stack_only_different_collectives_names_minority():
    d = check(
        attached({0: COLL_STACK, 1: COLL_STACK, 2: COLL_STACK, 3: BROADCAST}, 4),
        Kind.COLLECTIVE_MISMATCH,
        [3],
        waiting=[0, 1, 2],
    )
    assert [s["op"] for s in d.details["signatures"]] == ["broadcast", "all_reduce"]


def test_stack_only_mismatch_tie_names_all():
    check(attached({0: COLL_STACK, 1: BROADCAST}, 2), Kind.COLLECTIVE_MISMATCH, [0, 1], waiting=[])


def test_stack_only_missing_ranks_are_suspects():
    d = check(attached({0: COLL_STACK, 1: COLL_STACK}, 4), Kind.UNKNOWN, [2, 3], waiting=[0, 1])
    assert any("were not found on this host" in e for e in d.evidence)


def test_stack_only_everybody_in_same_collective_is_unknown():
    d = check(attached({0: COLL_STACK, 1: COLL_STACK}, 2), Kind.UNKNOWN, [], waiting=[0, 1])
    assert "stacks alone cannot tell" in d.summary


def test_stack_only_nobody_in_a_collective():
    d = check(attached({0: QUEUE_GET, 1: None}, 2), Kind.UNKNOWN, [])
    assert "ranks 1 have no stack" in d.summary


def test_stack_only_without_any_rank_keys_the_processes_by_pid():
    """attach found the processes through a child that inherited the torch variables they
    set in Python (collect/discover.py): no rank is known, the stacks still tell who waits."""
    procs = [
        ProcessInfo(
            host="h0",
            pid=pid,
            rank=-1,
            local_rank=-1,
            world_size=-1,
            state="alive",
            stacks=stack(*fr),
            stack_source="py-spy",
            meta={"attached": True},
        )
        for pid, fr in ((3001, COLL_STACK), (3002, QUEUE_GET))
    ]
    s = Snapshot(run_dir="/tmp/attach", taken_wall_ns=T0, reason="attach", processes=procs)
    d = check(s, Kind.STUCK_OUTSIDE_COLLECTIVE, [], waiting=[])
    assert d.details["culprit_pids"] == [3002] and d.details["waiting_pids"] == [3001], d.details
    assert d.summary.startswith("Rank unknown for every process") and "pid 3002 is not in any" in d.summary, (
        d.summary
    )
    assert "rank" not in d.summary.split("by pid:")[1], d.summary


CHECK_CALL = (
    "Popen._try_wait /usr/lib/python3.11/subprocess.py:2004",
    "Popen._wait /usr/lib/python3.11/subprocess.py:2046",
    "Popen.wait /usr/lib/python3.11/subprocess.py:1264",
    "call /usr/lib/python3.11/subprocess.py:391",
    "check_call /usr/lib/python3.11/subprocess.py:408",
    "pack_shard job.py:26",
    "<module> job.py:40",
)


def test_stack_only_names_the_child_a_stuck_process_waits_for():
    """attach on a job whose rank 2 runs `cp` of a FIFO with `check_call` (a job written
    from an incident, 2026-12-04): the stuck process is named, and so is its untraced child
    and the call it is blocked in, as the flight-record verdict does (analyze/stuck/childwait.py)."""

    def procs(rank_of):
        out = []
        for i, fr in enumerate((COLL_STACK, COLL_STACK, CHECK_CALL)):
            th = stack(*fr, active=False)
            kids = ()
            if fr is CHECK_CALL:
                th[0]["kernel"] = {"syscall": "wait4", "args": ["pid 4242"], "wchan": "do_wait"}
                kids = (
                    {
                        "pid": 4242,
                        "argv": ["cp", "/data/shard2/producer.fifo", "/out/shard2.bin"],
                        "state": "S",
                        "kernel": {
                            "syscall": "openat",
                            "args": ["'/data/shard2/producer.fifo'"],
                            "wchan": "wait_for_partner",
                        },
                    },
                )
            out.append(
                ProcessInfo(
                    host="h0",
                    pid=3000 + i,
                    rank=rank_of(i),
                    local_rank=rank_of(i),
                    world_size=3 if rank_of(i) >= 0 else -1,
                    state="alive",
                    stacks=th,
                    stack_source="py-spy",
                    meta={"attached": True},
                    children=kids,
                )
            )
        return Snapshot(run_dir="/tmp/attach", taken_wall_ns=T0, reason="attach", processes=out)

    d = check(procs(lambda i: i), Kind.STUCK_OUTSIDE_COLLECTIVE, [2], waiting=[0, 1])
    assert (
        "Rank 2 waits for its child process (check_call (subprocess.py:408)): pid 4242 (cp "
        "/data/shard2/producer.fifo /out/shard2.bin), not traced, state S: blocked in the system call "
        "openat('/data/shard2/producer.fifo'), kernel wait wait_for_partner"
    ) in d.summary, d.summary
    assert "Next: the rank waits for the child process named above" in d.summary, d.summary
    assert d.details["child_wait"] in d.evidence
    d = check(procs(lambda i: -1), Kind.STUCK_OUTSIDE_COLLECTIVE, [])
    assert "Pid 3002 waits for its child process" in d.summary and "Next: the process waits" in d.summary, (
        d.summary
    )


def test_stack_only_with_every_process_claiming_the_same_rank_keys_by_pid():
    """spawn children that inherited RANK=0 from their launcher all read as 'rank 0': the
    verdict said "rank 0 is not in any torch.distributed call ... while rank 0 wait in
    all_gather" (a blind job, 2026-12-04). Duplicate ranks are no ranks: keyed by pid."""
    procs = [
        ProcessInfo(
            host="h0",
            pid=pid,
            rank=0,
            local_rank=0,
            world_size=1,
            state="alive",
            stacks=stack(*fr),
            stack_source="py-spy",
            meta={"attached": True},
        )
        for pid, fr in ((3001, COLL_STACK), (3002, COLL_STACK), (3003, QUEUE_GET))
    ]
    s = Snapshot(run_dir="/tmp/attach", taken_wall_ns=T0, reason="attach", processes=procs)
    d = check(s, Kind.STUCK_OUTSIDE_COLLECTIVE, [], waiting=[])
    assert d.details["culprit_pids"] == [3003] and d.details["waiting_pids"] == [3001, 3002], d.details
    assert d.summary.startswith("Rank unknown for every process (several claim the same RANK); by pid:"), (
        d.summary
    )


def test_a_rank_whose_program_returned_and_whose_exit_waits_is_stuck_at_exit():
    """The job does not exit at the end: rank 0's main thread in threading._shutdown, its
    uploader thread in queue.get; rank 1 exited (not found). Was 'Unknown: no rank is inside
    a torch.distributed collective'."""
    s = attached({0: ("_shutdown threading.py:1590",)}, world=2)
    s.processes[0].stacks.append(
        {
            "thread_name": "metrics-uploader",
            "thread_id": 2,
            "active": False,
            "frames": [
                {"name": "Queue.get", "filename": "/usr/lib/python3.11/queue.py", "line": 171},
                {"name": "uploader", "filename": "/job/train.py", "line": 7},
                {"name": "Thread._bootstrap", "filename": "/usr/lib/python3.11/threading.py", "line": 1002},
            ],
        }
    )
    d = check(s, Kind.STUCK_OUTSIDE_COLLECTIVE, [0])
    assert d.summary.startswith(
        "Stuck at exit (in no collective): rank 0's program returned and the interpreter waits at exit "
        "(threading._shutdown) for its thread 'metrics-uploader', in uploader (train.py:7): queue.get/put"
    ), d.summary
    assert "Rank 1 was not found on this host" in d.summary and "Next: stop the thread" in d.summary, (
        d.summary
    )


# --- two samples a short interval apart (issue 38) -------------------------------------------
BACKWARD = (
    "_engine_run_backward /site-packages/torch/autograd/graph.py:979",
    "backward /site-packages/torch/autograd/__init__.py:395",
    "Tensor.backward /site-packages/torch/_tensor.py:623",
    "main /home/u/train.py:70",
    "<module> /home/u/train.py:100",
)
MP_QUEUE_GET = (
    "Connection._recv /usr/lib/python3.11/multiprocessing/connection.py:395",
    "Queue.get /usr/lib/python3.11/multiprocessing/queues.py:103",
    "main /home/u/train.py:67",
    "<module> /home/u/train.py:100",
)
FORWARD = (
    "forward /site-packages/torch/nn/modules/linear.py:125",
    "main /home/u/train.py:69",
    "<module> /home/u/train.py:100",
)
LOADER = (
    "_poll /usr/lib/python3.11/multiprocessing/connection.py:440",
    "main /home/u/train.py:64",
    "<module> /home/u/train.py:100",
)


def sampled(now, before, world, cpu=None, window_s=1.0):
    """``attached(now)`` with the earlier stacks ``before`` and the window of two samples."""
    import dataclasses

    from hangtrace.tracer.snapshot import ProgressWindow

    s = attached(now, world)
    procs = [
        dataclasses.replace(p, earlier_stacks=stack(*before[p.rank]) if before.get(p.rank) else None)
        for p in s.processes
    ]
    share = tuple(("h0:%d" % (2000 + r), c) for r, c in (cpu or {}).items())
    return dataclasses.replace(
        s, processes=procs, window=ProgressWindow(window_s=window_s, source="stacks", cpu_share=share)
    )


def test_two_still_samples_name_the_odd_one_out_with_its_library_call_in_the_headline():
    stacks = {0: BACKWARD, 1: BACKWARD, 2: MP_QUEUE_GET}
    d = check(sampled(stacks, stacks, 3), Kind.STUCK_OUTSIDE_COLLECTIVE, [2], waiting=[0, 1])
    head = d.summary.split(". ")[0]
    assert "rank 2" in head and "Queue.get (queues.py:103), called from main (train.py:67)" in head
    assert "ranks 0-1 wait in Tensor.backward (_tensor.py:623)" in head
    assert d.op is None and d.details["still_for_s"] == 1.0
    # one sample (the old attach): nobody in a collective, no verdict
    check(attached(stacks, 3), Kind.UNKNOWN, [])


def test_stacks_that_move_between_the_samples_are_a_working_job():
    now = {0: BACKWARD, 1: LOADER, 2: MP_QUEUE_GET}
    before = {0: FORWARD, 1: BACKWARD, 2: FORWARD}
    d = check(sampled(now, before, 3), Kind.PROGRESSING, [])
    assert "not hung" in d.summary and d.details["moved"] == [0, 1, 2]


def test_cpu_between_the_samples_is_work_even_at_the_same_line():
    stacks = {0: BACKWARD, 1: BACKWARD, 2: MP_QUEUE_GET}
    d = check(sampled(stacks, stacks, 3, cpu={0: 0.6, 1: 0.05, 2: 0.4}), Kind.PROGRESSING, [])
    assert d.details["moved"] == [0, 2]
    # below the working share: waiting, the odd one out stands
    check(sampled(stacks, stacks, 3, cpu={0: 0.05, 1: 0.05, 2: 0.02}), Kind.STUCK_OUTSIDE_COLLECTIVE, [2])


def test_one_rank_moving_while_its_peers_wait_in_a_collective_is_not_progress():
    now = {0: COLL_STACK, 1: COLL_STACK, 2: FORWARD}
    before = {0: COLL_STACK, 1: COLL_STACK, 2: LOADER}
    check(sampled(now, before, 3), Kind.STUCK_OUTSIDE_COLLECTIVE, [2], waiting=[0, 1])


def test_no_majority_among_still_stacks_names_nobody():
    stacks = {0: BACKWARD, 1: LOADER, 2: MP_QUEUE_GET}
    check(sampled(stacks, stacks, 3), Kind.UNKNOWN, [])
