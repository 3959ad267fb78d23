"""Facts that break a tie between ranks (issue 9): per-step collective counts and the
exceptions a rank survived."""

from hangtrace.tracer.analyze.failures.exceptions import survived
from hangtrace.tracer.analyze.graph.stepcounts import deviations, tie_breaker
from hangtrace.tracer.snapshot import ProcessInfo


def coll(step, group="0", state="completed"):
    return {"kind": "collective", "group": group, "step": step, "op": "all_reduce", "state": state}


def proc(rank, counts, extra=()):
    recs = [coll(s) for s, n in counts for _ in range(n)] + list(extra)
    return ProcessInfo(host="h", pid=100 + rank, rank=rank, records=recs)


def test_extra_collective_in_the_divergence_step_is_named():
    # rank 0's data-dependent loop ran once more in step 3; rank 1 went on to step 4
    procs = {
        0: proc(0, [(1, 4), (2, 4), (3, 4), (4, 5)]),
        1: proc(1, [(1, 4), (2, 4), (3, 4), (4, 4), (5, 1)]),
    }
    d = tie_breaker(procs, "0", [0, 1])
    assert (d.rank, d.step, d.count, d.baseline, d.extra) == (0, 4, 5, 4, True)
    assert "rank 0 issued one more collective(s) on group '0' in step 4" in d.line()


def test_skipped_collective_in_the_divergence_step_is_named():
    procs = {
        0: proc(0, [(1, 3), (2, 3), (3, 3), (4, 3)]),
        1: proc(1, [(1, 3), (2, 3), (3, 3), (4, 2), (5, 1)]),
    }
    d = tie_breaker(procs, "0", [0, 1])
    assert (d.rank, d.extra) == (1, False)


def test_no_baseline_no_answer():
    # per-step counts vary (eval every 2nd step): no baseline, the tie stands
    procs = {
        0: proc(0, [(1, 3), (2, 4), (3, 3), (4, 5)]),
        1: proc(1, [(1, 3), (2, 4), (3, 3), (4, 4), (5, 1)]),
    }
    assert deviations(procs, "0", [0, 1]) == []
    assert tie_breaker(procs, "0", [0, 1]) is None


def test_survived_exceptions_from_phases_threads_and_tasks():
    p = ProcessInfo(
        host="h",
        pid=1,
        rank=1,
        state="alive",
        records=[
            {
                "kind": "phase_exit",
                "phase": "train",
                "state": "failed",
                "step": 3,
                "error": "AssertionError: lr step 2 != 3",
                "t_wall_ns": 30,
            }
        ],
        events=[
            {
                "event": "thread_exception",
                "thread_name": "reward",
                "type": "RuntimeError",
                "message": "lost",
                "wall_ns": 10,
            },
            {
                "event": "task_exception",
                "coro": "feed",
                "type": "RuntimeError",
                "message": "503",
                "wall_ns": 20,
            },
        ],
    )
    got = [x.line() for x in survived(p)]
    assert got == [
        "thread 'reward' died of RuntimeError: lost",
        "asyncio task 'feed' raised RuntimeError: 503 and nobody retrieved it",
        "AssertionError: lr step 2 != 3 left phase 'train' at step 3",
    ]


def test_the_exception_that_ended_a_process_is_not_survived():
    p = ProcessInfo(
        host="h",
        pid=1,
        rank=1,
        state="exited",
        exit_code=1,
        events=[{"event": "exception", "type": "ValueError", "message": "x", "wall_ns": 5}],
    )
    assert survived(p) == []
